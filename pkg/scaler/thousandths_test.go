package scaler

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// kedaMilli is a value as KEDA v2.21 gives it to the HPA: printed to
// thousandths ("%.3f", pkg/scalers/scaler.go) and read as a quantity.
func kedaMilli(v float64) int64 {
	q := resource.MustParse(fmt.Sprintf("%.3f", v))
	return q.MilliValue()
}

// TestAThresholdKEDACannotCarryIsRefused: KEDA gives the HPA its target in
// thousandths, so a threshold of 0.0015 was 0.002 there while pulse filled
// a missing pod against 0.0015: four pods at 0.0018 asked the HPA for 4,
// and with one failing (missingPods hold, filled "upward" with 0 against
// 0.0015) for 3 (found in a review, 2026-12-05). Such a threshold is
// refused, naming what KEDA would make of it.
func TestAThresholdKEDACannotCarryIsRefused(t *testing.T) {
	// Compared with KEDA's own rendering: a tolerance growing with the
	// threshold let 2000.0005 through, which KEDA gives as 2000.001
	// (found in a review of the check, 2026-12-05).
	for v, ok := range map[string]bool{"0.0015": false, "0.0125": false, "2.0005": false, "2000.0005": false, "1000.0004": false, "123456.7894": false,
		"0.001": true, "0.4": true, "0.015": true, "2.5": true, "64": true, "1e12": true, "0.3": true, "0.7": true} {
		_, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "metric": "kvCacheUsage", "threshold": v}), DefaultMaxWindow, nil)
		if ok != (err == nil) || !ok && !strings.Contains(err.Error(), "thousandths") {
			t.Errorf("threshold %s: %v; want accepted %v, a refusal naming the thousandths", v, err, ok)
		}
	}
}

// TestDesiredIsTheHPAs: DesiredReplicas (/debug/triggers, the
// desired-replicas gauge) is the HPA's count before its tolerance, made
// as the HPA makes it, on the thousandths KEDA gives it: three pods at a
// kvCacheUsage threshold of 0.4 summed to 1.2000000000000002 and read 4,
// where the HPA's 1200m over 400m is 3 (found in a review, 2026-12-05).
func TestDesiredIsTheHPAs(t *testing.T) {
	for _, tc := range []struct {
		threshold, per float64
		pods           int
		valueType      string
	}{{0.4, 0.4, 3, "total"}, {0.4, 0.4, 3, "average"}, {0.3, 0.1, 3, "total"}, {0.7, 0.7, 5, "total"}, {0.001, 0.0018, 4, "total"}} {
		f := newFixture(t)
		var names []string
		var rs []store.Report
		f.ms += 1000
		for i := range tc.pods {
			n := fmt.Sprintf("p%d", i)
			names = append(names, n)
			r := store.Report{UID: "uid-" + n}
			r.TimeMs = f.ms
			r.Values.Set(metric.KVCacheUsage, tc.per)
			rs = append(rs, r)
		}
		f.pods(names...)
		f.store.Add(rs)
		tr, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "metric": "kvCacheUsage", "threshold": fmt.Sprint(tc.threshold), "valueType": tc.valueType}), f.server.maxWindow, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := f.server.Evaluate(tr)
		if err != nil {
			t.Fatal(err)
		}
		// The HPA: AverageValue, ceil(value / target); Value, ceil(value /
		// target × ready pods).
		ratio := float64(kedaMilli(d.Value)) / float64(kedaMilli(spec(tr).MetricSpecs[0].TargetSizeFloat))
		if tc.valueType == "average" {
			ratio *= float64(d.Ready)
		}
		if got, hpa := d.DesiredReplicas(tr), int(math.Ceil(ratio)); got != hpa {
			t.Errorf("%d pods at %g, threshold %g, %s: DesiredReplicas %d, the HPA's %d (KEDA gives it %dm over %dm)", tc.pods, tc.per, tc.threshold, tc.valueType, got, hpa, kedaMilli(d.Value), kedaMilli(tr.Threshold))
		}
	} // A value half way between two thousandths goes where KEDA's printing
	// takes it (2.0625 to 2.062), not away from zero (found in a review of
	// the change, 2026-12-05: 2 replicas shown where the HPA asked for 1).
	for _, c := range []struct{ value, threshold float64 }{{2.0625, 2.062}, {1.0005, 1}, {0.0625, 0.062}} {
		d, tr := Decision{Value: c.value}, Trigger{Threshold: c.threshold, ValueType: "total"}
		if got, hpa := d.DesiredReplicas(tr), int(math.Ceil(float64(kedaMilli(c.value))/float64(kedaMilli(c.threshold)))); got != hpa {
			t.Errorf("value %g over %g: DesiredReplicas %d, the HPA's %d", c.value, c.threshold, got, hpa)
		}
	}
}

// TestKEDAMilliIsKEDAs: KEDA hands the HPA a value printed "%.3f" and parsed as
// a quantity, and the simulated KEDA (and, until 2026-12-05, the desired count the
// scaler shows) rounded v×1000 half away from zero
// instead, a thousandth apart from KEDA's wherever the value's decimal
// expansion sits on or near a half (1.0005 is 1.000499… in binary: KEDA's
// 1.000, not 1.001; 2.0625 is a tie KEDA's printing takes to 2.062).
func TestKEDAMilliIsKEDAs(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want int64
	}{
		{2.0625, 2062}, {1.0005, 1000}, {1.2345, 1234}, {0.1235, 123}, {0.0005, 1}, {3.9999, 4000}, {7, 7000},
		{-1, 0}, {math.NaN(), 0}, {math.Inf(1), 0}, {1e300, math.MaxInt64},
	} {
		if got := KEDAMilli(c.v); got != c.want {
			t.Errorf("KEDAMilli(%v) = %d, want %d (KEDA's %q)", c.v, got, c.want, fmt.Sprintf("%.3f", c.v))
		}
	}
}
