package discovery

import (
	"fmt"
	"strings"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Annotations of a demand source: a router pod whose page says how many
// requests it holds (or has received) for the workloads behind it
// (docs/scaledobject.md, "Demand before the first pod").
const (
	// AnnotationDemandSource names the router: a preset (epp,
	// production-stack) or custom.
	AnnotationDemandSource = "pulse.io/demand-source"
	// AnnotationDemandWorkloads lists the workloads it fronts: NAME, or
	// NAME=VALUE where the label's value is not the workload's name.
	AnnotationDemandWorkloads = "pulse.io/demand-workloads"
	// AnnotationDemandKind is their kind (default Workspace).
	AnnotationDemandKind = "pulse.io/demand-kind"
	// AnnotationDemandMetric, AnnotationDemandLabel and AnnotationDemandType
	// (held or arrivals) set or override the preset's.
	AnnotationDemandMetric = "pulse.io/demand-metric"
	AnnotationDemandLabel  = "pulse.io/demand-label"
	AnnotationDemandType   = "pulse.io/demand-type"
)

// demandKinds are the kinds pulse.io/demand-kind accepts.
var demandKinds = map[string]pulsev1.WorkloadKind{
	"Workspace":       pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE,
	"InferenceSet":    pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET,
	"Deployment":      pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT,
	"StatefulSet":     pulsev1.WorkloadKind_WORKLOAD_KIND_STATEFUL_SET,
	"LeaderWorkerSet": pulsev1.WorkloadKind_WORKLOAD_KIND_LEADER_WORKER_SET,
	"Workload":        pulsev1.WorkloadKind_WORKLOAD_KIND_CUSTOM,
}

// IsDemandSource reports whether annotations mark a demand source: set
// and not empty (empty is unset, as for every annotation pulse reads: a
// Helm template rendering nothing).
func IsDemandSource(annotations map[string]string) bool {
	return annotations[AnnotationDemandSource] != ""
}

// DemandTargets expands a demand source into one target per workload it
// fronts, each reading that workload's series of the router's page: base is
// the router pod's target (its uid, name, URL, readiness).
func DemandTargets(base Target, annotations map[string]string) ([]Target, error) {
	src := annotations[AnnotationDemandSource]
	d, ok := vllm.DemandPresets[src]
	switch {
	case ok:
	case src == "custom":
	default:
		return nil, fmt.Errorf("annotation %s=%q: want epp, production-stack or custom", AnnotationDemandSource, wire.CleanText(src, 64))
	}
	if m := annotations[AnnotationDemandMetric]; m != "" {
		// Counted before it is split: 250 KiB of commas was split into
		// 256,000 names at every listing of the node's targets, then
		// refused.
		if n := strings.Count(m, ",") + 1; n > vllm.MaxDemandMetrics {
			return nil, fmt.Errorf("demand source %q (annotation %s): %d metrics; at most %d", wire.CleanText(src, 64), AnnotationDemandMetric, n, vllm.MaxDemandMetrics)
		}
		d.Metrics = strings.Split(m, ",")
		for i := range d.Metrics {
			d.Metrics[i] = strings.TrimSpace(d.Metrics[i])
		}
	}
	if l := annotations[AnnotationDemandLabel]; l != "" {
		d.Label = l
	}
	switch annotations[AnnotationDemandType] {
	case "":
	case "held":
		d.Arrivals = false
	case "arrivals":
		d.Arrivals = true
	default:
		return nil, fmt.Errorf("annotation %s=%q: want held or arrivals", AnnotationDemandType, wire.CleanText(annotations[AnnotationDemandType], 64))
	}
	if err := vllm.ValidateDemand(&d); err != nil {
		return nil, fmt.Errorf("demand source %q (annotations %s, %s): %w", wire.CleanText(src, 64), AnnotationDemandMetric, AnnotationDemandLabel, err)
	}
	kind, err := demandKind(annotations)
	if err != nil {
		return nil, err
	}
	items, err := demandItems(annotations[AnnotationDemandWorkloads])
	if err != nil {
		return nil, err
	}
	var out []Target
	for _, it := range items {
		dd := d
		dd.Match = it.value
		t := base
		t.UID = store.DemandUID(base.UID, it.name)
		t.Workloads = []Workload{{Kind: kind, Name: it.name}}
		t.Demand = &dd
		out = append(out, t)
	}
	return out, nil
}

// demandKind is the kind pulse.io/demand-kind names (default Workspace).
func demandKind(annotations map[string]string) (pulsev1.WorkloadKind, error) {
	name := annotations[AnnotationDemandKind]
	if name == "" {
		name = "Workspace"
	}
	kind, ok := demandKinds[name]
	if !ok {
		return 0, fmt.Errorf("annotation %s=%q: want Workspace, InferenceSet, Deployment, StatefulSet, LeaderWorkerSet or Workload", AnnotationDemandKind, wire.CleanText(name, 64))
	}
	return kind, nil
}
