package scaler

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
)

// FuzzParseTrigger: any metadata either parses into a usable trigger or is
// refused with a MetadataError naming a key; nothing panics.
func FuzzParseTrigger(f *testing.F) {
	f.Add("workspace", "llama", "threshold", "10", "window", "10s")
	f.Add("metricName", "vllm:num_requests_waiting", "workspaceName", "x", "valueType", "average")
	f.Add("deployment", "d", "threshold", "NaN", "missingPods", "ignore")
	f.Add("workspacf", "llama", "threshold", "10", "window", "10s")
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
		if tr.Workload.Name == "" || tr.Workload.Namespace == "" || !(tr.Threshold > 0) || math.IsInf(tr.Threshold, 0) ||
			tr.ActivationThreshold < 0 || tr.Window <= 0 || tr.Window > time.Minute || tr.StaleAfter <= 0 {
			t.Fatalf("accepted an unusable trigger %+v from %v", tr, ref.ScalerMetadata)
		}
		if MetricName(tr) == "" {
			t.Fatalf("empty metric name for %+v", tr)
		}
	})
}
