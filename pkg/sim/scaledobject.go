package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// ScaledObject is the part of a KEDA ScaledObject pulse-sim reads: its
// target, replica bounds, polling, cooldown, fallback, HPA behavior and its
// one trigger, pulse's (type external-push). KEDA's own defaults apply to
// what is absent.
//
// It is read strictly: a field KEDA v2.21's ScaledObject has not (a
// misspelt maxReplicaCount, a behavior's stabilisationWindowSeconds), or
// one given twice, is refused, where it had been ignored and the run
// scored under KEDA's default. KEDA's fields pulse-sim does not model
// (labels, a trigger's name or authenticationRef, the status) are read and
// left.
type ScaledObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Status     json.RawMessage   `json:"status,omitempty"`
	Spec       struct {
		ScaleTargetRef struct {
			APIVersion             string `json:"apiVersion"`
			Kind                   string `json:"kind"`
			Name                   string `json:"name"`
			EnvSourceContainerName string `json:"envSourceContainerName"`
		} `json:"scaleTargetRef"`
		MinReplicaCount       *int32    `json:"minReplicaCount"`
		MaxReplicaCount       *int32    `json:"maxReplicaCount"`
		PollingInterval       *int32    `json:"pollingInterval"`
		CooldownPeriod        *int32    `json:"cooldownPeriod"`
		InitialCooldownPeriod *int32    `json:"initialCooldownPeriod"`
		Fallback              *Fallback `json:"fallback"`
		// IdleReplicaCount and Advanced.ScalingModifiers change what KEDA
		// does, and pulse-sim does not simulate them: read to be refused
		// (they were ignored without a word).
		IdleReplicaCount *int32 `json:"idleReplicaCount"`
		Advanced         *struct {
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
			RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount"`
			ScalingModifiers              any  `json:"scalingModifiers"`
		} `json:"advanced"`
		Triggers []Trigger `json:"triggers"`
	} `json:"spec"`
}

// Fallback is KEDA's fallback: after FailureThreshold failed fetches the
// metric is a replica count's worth of the target (KEDA v2.21
// pkg/fallback's doFallback): Replicas (Behavior static, the default),
// the target's replicas now (currentReplicas), the more of the two
// (currentReplicasIfHigher) or the fewer (currentReplicasIfLower).
type Fallback struct {
	FailureThreshold int32  `json:"failureThreshold"`
	Replicas         int32  `json:"replicas"`
	Behavior         string `json:"behavior"`
}

// FallbackReplicas is the replica count f's metric is worth with the
// target at current replicas (doFallback).
func (f *Fallback) FallbackReplicas(current int32) int32 {
	switch f.Behavior {
	case "currentReplicas":
		return current
	case "currentReplicasIfHigher":
		return max(current, f.Replicas)
	case "currentReplicasIfLower":
		return min(current, f.Replicas)
	}
	return f.Replicas
}

// fallbackErrors is what KEDA refuses of a fallback (CheckFallbackValid,
// the CRD's enum), and what pulse-sim does not simulate.
func fallbackErrors(f *Fallback) []error {
	if f == nil {
		return nil
	}
	var errs []error
	if f.FailureThreshold < 0 || f.Replicas < 0 {
		errs = append(errs, fmt.Errorf("fallback failureThreshold %d and replicas %d: want both 0 or more", f.FailureThreshold, f.Replicas))
	}
	switch f.Behavior {
	case "", "static", "currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower":
	case "scalingModifiers":
		errs = append(errs, errors.New("fallback behavior scalingModifiers: pulse-sim does not simulate scalingModifiers"))
	default:
		errs = append(errs, fmt.Errorf("fallback behavior %q: static, currentReplicas, currentReplicasIfHigher or currentReplicasIfLower", f.Behavior))
	}
	return errs
}

// Trigger is one ScaledObject trigger.
type Trigger struct {
	Type       string            `json:"type"`
	MetricType string            `json:"metricType"` // AverageValue (default) or Value
	Metadata   map[string]string `json:"metadata"`
	// Read and left: a trigger's name, its TriggerAuthentication.
	Name              string          `json:"name"`
	AuthenticationRef json.RawMessage `json:"authenticationRef,omitempty"`
	// UseCachedMetrics changes what KEDA does (the HPA reads the value
	// KEDA's last poll cached, up to a pollingInterval old), and pulse-sim
	// does not simulate it: read to be refused (it was read and left).
	UseCachedMetrics bool `json:"useCachedMetrics"`
}

// KEDA's defaults (keda.sh/v1alpha1 ScaledObject).
const (
	defaultPollingInterval = 30 * time.Second
	defaultCooldown        = 300 * time.Second
	defaultMaxReplicas     = 100
)

// ReadScaledObject reads a ScaledObject YAML file.
func ReadScaledObject(path string) (*ScaledObject, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read ScaledObject: %w", err)
	}
	return ParseScaledObject(raw)
}

// ParseScaledObject parses a ScaledObject and checks what pulse-sim needs.
func ParseScaledObject(raw []byte) (*ScaledObject, error) {
	var so ScaledObject
	if err := yaml.UnmarshalStrict(raw, &so); err != nil {
		return nil, fmt.Errorf("parse ScaledObject: %w", err)
	}
	var errs []error
	if so.Kind != "ScaledObject" || so.APIVersion != "keda.sh/v1alpha1" {
		errs = append(errs, fmt.Errorf("apiVersion %q, kind %q: want keda.sh/v1alpha1, ScaledObject", so.APIVersion, so.Kind))
	}
	if so.Metadata.Namespace == "" {
		so.Metadata.Namespace = "default"
	}
	if so.Spec.ScaleTargetRef.Name == "" {
		errs = append(errs, errors.New("spec.scaleTargetRef.name is required"))
	}
	switch {
	case so.PulseTrigger() == nil:
		errs = append(errs, errors.New("spec.triggers: no trigger of type external-push (pulse's)"))
	case len(so.Spec.Triggers) > 1:
		// The HPA takes the most any trigger's metric asks for: the
		// others were left out without a word.
		errs = append(errs, fmt.Errorf("spec.triggers: %d triggers; pulse-sim simulates one, of type external-push (the HPA would take the most any of them asks for)", len(so.Spec.Triggers)))
	case so.PulseTrigger().UseCachedMetrics:
		errs = append(errs, errors.New("trigger useCachedMetrics: pulse-sim does not simulate KEDA's cached metrics (the HPA reading the value of KEDA's last poll)"))
	}
	if lo, hi := so.MinReplicas(), so.MaxReplicas(); lo < 0 || hi < 1 || lo > hi || hi > maxStatic {
		errs = append(errs, fmt.Errorf("minReplicaCount %d and maxReplicaCount %d: want 0 <= min <= max, 1 <= max <= %d (the most replicas pulse-sim runs)", lo, hi, maxStatic))
	}
	if p := so.Spec.PollingInterval; p != nil && *p < 1 {
		errs = append(errs, fmt.Errorf("pollingInterval %d: want at least 1 (seconds)", *p))
	}
	if v := so.Spec.CooldownPeriod; v != nil && *v < 0 {
		errs = append(errs, fmt.Errorf("cooldownPeriod %d: want 0 or more (seconds)", *v))
	}
	if v := so.Spec.InitialCooldownPeriod; v != nil && *v < 0 {
		errs = append(errs, fmt.Errorf("initialCooldownPeriod %d: want 0 or more (seconds)", *v))
	}
	if t := so.PulseTrigger(); t != nil && t.MetricType != "" && t.MetricType != "AverageValue" && t.MetricType != "Value" {
		errs = append(errs, fmt.Errorf("trigger metricType %q: AverageValue or Value", t.MetricType))
	}
	errs = append(errs, fallbackErrors(so.Spec.Fallback)...)
	if so.Spec.IdleReplicaCount != nil {
		errs = append(errs, errors.New("idleReplicaCount: pulse-sim does not simulate idle replicas"))
	}
	if a := so.Spec.Advanced; a != nil && a.ScalingModifiers != nil {
		errs = append(errs, errors.New("advanced.scalingModifiers: pulse-sim does not simulate scaling modifiers"))
	}
	if b := so.Behavior(); b != nil {
		errs = append(errs, behaviorErrors("scaleUp", b.ScaleUp)...)
		errs = append(errs, behaviorErrors("scaleDown", b.ScaleDown)...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("ScaledObject %s: %w", so.Metadata.Name, errors.Join(errs...))
	}
	return &so, nil
}

// PulseTrigger is the first trigger of type external-push (a parsed
// ScaledObject has one trigger, of that type).
func (so *ScaledObject) PulseTrigger() *Trigger {
	for i := range so.Spec.Triggers {
		if so.Spec.Triggers[i].Type == "external-push" {
			return &so.Spec.Triggers[i]
		}
	}
	return nil
}

// MinReplicas is minReplicaCount (KEDA's default 0).
func (so *ScaledObject) MinReplicas() int32 { return ptr.Deref(so.Spec.MinReplicaCount, 0) }

// MaxReplicas is maxReplicaCount (KEDA's default 100).
func (so *ScaledObject) MaxReplicas() int32 {
	return ptr.Deref(so.Spec.MaxReplicaCount, defaultMaxReplicas)
}

// HPAMinReplicas is the HPA's minReplicas KEDA sets: minReplicaCount, or 1.
func (so *ScaledObject) HPAMinReplicas() int32 { return max(so.MinReplicas(), 1) }

func seconds(p *int32, def time.Duration) time.Duration {
	return time.Duration(ptr.Deref(p, int32(def/time.Second))) * time.Second
}

// PollingInterval is pollingInterval (KEDA's default 30 s).
func (so *ScaledObject) PollingInterval() time.Duration {
	return seconds(so.Spec.PollingInterval, defaultPollingInterval)
}

// Cooldown is cooldownPeriod (KEDA's default 300 s).
func (so *ScaledObject) Cooldown() time.Duration {
	return seconds(so.Spec.CooldownPeriod, defaultCooldown)
}

// InitialCooldown is initialCooldownPeriod (default 0).
func (so *ScaledObject) InitialCooldown() time.Duration {
	return seconds(so.Spec.InitialCooldownPeriod, 0)
}

// Behavior is the HPA behavior of advanced.horizontalPodAutoscalerConfig.
func (so *ScaledObject) Behavior() *autoscalingv2.HorizontalPodAutoscalerBehavior {
	if a := so.Spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil {
		return a.HorizontalPodAutoscalerConfig.Behavior
	}
	return nil
}

// behaviorErrors is what the API server refuses of an HPA's scaling rules
// (autoscaling/v2 validation), which KEDA could not create: such a
// behavior was simulated all the same (a policy of type "pods" proposed 0:
// the HPA never scaled up, and down without limit).
func behaviorErrors(dir string, r *autoscalingv2.HPAScalingRules) []error {
	if r == nil {
		return nil
	}
	var errs []error
	if w := r.StabilizationWindowSeconds; w != nil && (*w < 0 || *w > 3600) {
		errs = append(errs, fmt.Errorf("behavior.%s.stabilizationWindowSeconds %d: want 0 to 3600", dir, *w))
	}
	if sp := r.SelectPolicy; sp != nil {
		switch *sp {
		case autoscalingv2.MaxChangePolicySelect, autoscalingv2.MinChangePolicySelect, autoscalingv2.DisabledPolicySelect:
		default:
			errs = append(errs, fmt.Errorf("behavior.%s.selectPolicy %q: Max, Min or Disabled", dir, *sp))
		}
	}
	for i, p := range r.Policies {
		if p.Type != autoscalingv2.PodsScalingPolicy && p.Type != autoscalingv2.PercentScalingPolicy {
			errs = append(errs, fmt.Errorf("behavior.%s.policies[%d].type %q: Pods or Percent", dir, i, p.Type))
		}
		if p.Value <= 0 {
			errs = append(errs, fmt.Errorf("behavior.%s.policies[%d].value %d: want above 0", dir, i, p.Value))
		}
		if p.PeriodSeconds <= 0 || p.PeriodSeconds > 1800 {
			errs = append(errs, fmt.Errorf("behavior.%s.policies[%d].periodSeconds %d: want 1 to 1800", dir, i, p.PeriodSeconds))
		}
	}
	if tol := r.Tolerance; tol != nil && tol.Sign() < 0 {
		errs = append(errs, fmt.Errorf("behavior.%s.tolerance %s: want 0 or more", dir, tol))
	}
	return errs
}
