package hpa

import (
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/utils/ptr"
)

// TestTheLegacyStabilizationWindowIs300s: no behavior, 4 replicas wanted
// at t=0, 1 from then on. Kubernetes (horizontal.go stabilizeRecommendation:
// rec.timestamp.Before(cutoff) drops it, a sync being 15 s plus the
// reconcile's time) scales down at the sync 300 s later; pulse-sim kept
// the t=0 recommendation, exactly on the cutoff on its 15 s grid, and
// scaled down a sync later (tiedOut).
func TestTheLegacyStabilizationWindowIs300s(t *testing.T) {
	c := New(Spec{MinReplicas: 1, MaxReplicas: 10}, DefaultOptions())
	target := Target{AverageValue: true, Milli: 1000}
	spec := int32(4)
	downAt := time.Duration(-1)
	for k := 0; k <= 30 && downAt < 0; k++ {
		now := time.Duration(k) * 15 * time.Second
		usage := int64(4000)
		if k > 0 {
			usage = 1000
		}
		r := c.Sync(now, State{SpecReplicas: spec, StatusReplicas: spec, ReadyPods: spec}, []Reading{{Target: target, Milli: usage}})
		if r.Desired < spec {
			downAt = now
		}
		spec = r.Desired
	}
	if downAt != 300*time.Second {
		t.Fatalf("scaled down at %s; Kubernetes drops a recommendation 20 syncs (300 s + the reconciles' time) old and scales down at the sync 300 s later", downAt)
	}
}

// TestAScaleEventOnePeriodOldIsOutdated: the baseline ScaledObject's
// policies (up 1 pod per 300 s, down 1 pod per 600 s, no stabilization).
// Scale-ups 300 s apart: in Kubernetes the earlier event is then older than
// the longest scale-up period (markScaleEventsOutdated, Before(cutoff)) and
// storeScaleEvent overwrites it, so a scale-down 100 s after the last one
// counts one added pod in its 600 s period: 4 -> 2. pulse-sim kept both
// (the earlier exactly 300 s old on its grid, not Before), counted two:
// 4 -> 1 (tiedOut). A port of v1.33.13's code run beside the sim, its
// syncs 1 ms late each, agreed on 600,000 random syncs once ties were out.
func TestAScaleEventOnePeriodOldIsOutdated(t *testing.T) {
	beh := &autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleUp: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(int32(0)),
			Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 1, PeriodSeconds: 300}}},
		ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(int32(0)),
			Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PodsScalingPolicy, Value: 1, PeriodSeconds: 600}}},
	}
	c := New(Spec{MinReplicas: 1, MaxReplicas: 10, Behavior: beh}, DefaultOptions())
	target := Target{AverageValue: true, Milli: 1000}
	spec := int32(1)
	var path []int32
	for k := 0; k <= 50; k++ {
		now := time.Duration(k) * 15 * time.Second
		usage := int64(10_000) // wants 10 until 700 s
		if now >= 700*time.Second {
			usage = 1000 // then 1
		}
		r := c.Sync(now, State{SpecReplicas: spec, StatusReplicas: spec, ReadyPods: spec}, []Reading{{Target: target, Milli: usage}})
		if r.Desired != spec {
			path = append(path, r.Desired)
			t.Logf("t=%4.0fs %d -> %d", now.Seconds(), spec, r.Desired)
		}
		spec = r.Desired
		if now >= 700*time.Second && len(path) > 0 && path[len(path)-1] < 4 {
			break
		}
	}
	if got := path[len(path)-1]; got != 2 {
		t.Fatalf("first scale-down from 4 went to %d; Kubernetes (one scale-up remembered in the 600 s period) goes to 2", got)
	}
}
