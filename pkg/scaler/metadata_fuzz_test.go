package scaler

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
)

// FuzzParseTrigger: any metadata either parses into a usable trigger,
// within every bound the docs give its keys, or is refused with a
// MetadataError naming a key; nothing panics.
func FuzzParseTrigger(f *testing.F) {
	f.Add("workspace", "llama", "threshold", "10", "window", "10s")
	f.Add("metricName", "vllm:num_requests_waiting", "workspaceName", "x", "valueType", "average")
	f.Add("deployment", "d", "threshold", "NaN", "missingPods", "ignore")
	f.Add("workspacf", "llama", "threshold", "10", "window", "10s")
	f.Add("workspace", "llama", "threshold", "0.0015", "staleAfter", "11m")
	f.Add("threshold", "10", "window", "10s", "valueType", "average")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		ref := &externalscaler.ScaledObjectRef{Name: "so", Namespace: "ns", ScalerMetadata: map[string]string{k1: v1, k2: v2, k3: v3}}
		tr, err := ParseTrigger(ref, time.Minute, nil)
		if err != nil {
			// A refusal is the metadata's: a key's, or (no workload named,
			// the metadata past its bounds, a key misspelt) the whole
			// metadata's, with no key. Either way it says what, and quotes
			// little of what it was given.
			var me *MetadataError
			if !errors.As(err, &me) || me.Msg == "" {
				t.Fatalf("error %v is not the metadata's", err)
			}
			if len(err.Error()) > 2048 {
				t.Fatalf("error of %d bytes: %.300s…", len(err.Error()), err)
			}
			return
		}
		// Within the bounds docs/scaledobject.md gives: the threshold
		// 0.001 to 1e12 in whole thousandths (what KEDA can give the HPA),
		// the activation threshold 0 to 1e12, the window and staleAfter
		// from a second to the aggregator's --max-window and 10 minutes.
		if tr.Workload.Name == "" || tr.Workload.Namespace == "" || !(tr.Threshold >= MinThreshold && tr.Threshold <= MaxThreshold) ||
			!keptByKEDA(tr.Threshold) ||
			!(tr.ActivationThreshold >= 0 && tr.ActivationThreshold <= MaxThreshold) ||
			tr.Window < MinDuration || tr.Window > time.Minute || tr.StaleAfter < MinDuration || tr.StaleAfter > MaxStaleAfter {
			t.Fatalf("accepted an unusable trigger %+v from %v", tr, ref.ScalerMetadata)
		}
		if MetricName(tr) == "" {
			t.Fatalf("empty metric name for %+v", tr)
		}
	})
}

// keptByKEDA says whether v survives KEDA's rendering for the HPA ("%.3f")
// unchanged.
func keptByKEDA(v float64) bool {
	kept, err := strconv.ParseFloat(fmt.Sprintf("%.3f", v), 64)
	return err == nil && kept == v
}
