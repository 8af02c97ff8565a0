package hpa

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// The cases below carry over the facts of Kubernetes v1.33's
// pkg/controller/podautoscaler tests (horizontal_test.go); the test names in
// comments are theirs.

const now = time.Hour // the virtual "now" of a case

func value(milli int64) Target   { return Target{Milli: milli} }
func average(milli int64) Target { return Target{AverageValue: true, Milli: milli} }

func TestExternalMetrics(t *testing.T) {
	tests := map[string]struct {
		min, max, spec, status int32
		target                 Target
		level                  int64 // reported usage, milli
		want                   int32
	}{
		// TestScaleUpCMExternal: Value 6.666, usage 8.6, 3 ready pods.
		"scale up, Value": {min: 2, max: 6, spec: 3, status: 3, target: value(6666), level: 8600, want: 4},
		// TestScaleUpPerPodCMExternal: AverageValue 2.222.
		"scale up, AverageValue": {min: 2, max: 6, spec: 3, status: 3, target: average(2222), level: 8600, want: 4},
		// TestScaleDownCMExternal: Value 14.4, 5 ready pods.
		"scale down, Value": {min: 2, max: 6, spec: 5, status: 5, target: value(14400), level: 8600, want: 3},
		// TestScaleDownPerPodCMExternal: AverageValue 3.
		"scale down, AverageValue": {min: 2, max: 6, spec: 5, status: 5, target: average(3000), level: 8600, want: 3},
		// TestScaleDownToZeroCMExternal: minReplicas 0, usage 0.
		"scale down to zero, Value": {min: 0, max: 6, spec: 5, status: 5, target: value(14400), level: 0, want: 0},
		// TestToleranceCMExternal: ratio 8.6/8.666 is within 10 %.
		"within tolerance, Value": {min: 2, max: 6, spec: 4, status: 4, target: value(8666), level: 8600, want: 4},
		// TestTolerancePerPodCMExternal: 8.6 / (2.2 × 4) is within 10 %.
		"within tolerance, AverageValue": {min: 2, max: 6, spec: 4, status: 4, target: average(2200), level: 8600, want: 4},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := New(Spec{MinReplicas: tc.min, MaxReplicas: tc.max}, DefaultOptions())
			c.recs = []recommendation{} // the cases start with no recommendation
			r := c.Sync(now, State{SpecReplicas: tc.spec, StatusReplicas: tc.status, ReadyPods: tc.status},
				[]Reading{{Target: tc.target, Milli: tc.level}})
			if r.Desired != tc.want {
				t.Fatalf("desired %d, want %d (%+v)", r.Desired, tc.want, r)
			}
		})
	}
}

// TestConfigurableTolerance: a behavior's per-direction tolerance applies
// only with the HPAConfigurableTolerance gate (alpha, off in 1.33).
func TestConfigurableTolerance(t *testing.T) {
	one, ninety := resource.MustParse("0.01"), resource.MustParse("0.9")
	tests := map[string]struct {
		gate     bool
		behavior *autoscalingv2.HorizontalPodAutoscalerBehavior
		level    int64
		want     int32
	}{
		// 3 replicas, usage 3.06 of a 3 total (AverageValue 1): 2 % over.
		"scale up because of a 1% tolerance": {gate: true, level: 3060, want: 4,
			behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: &autoscalingv2.HPAScalingRules{Tolerance: &one}}},
		"no scale-down because of a 90% tolerance": {gate: true, level: 900, want: 3,
			behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{Tolerance: &ninety}}},
		"no scaling because of the default tolerance": {gate: true, level: 3060, want: 3},
		"tolerance ignored with the gate off": {gate: false, level: 3060, want: 3,
			behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: &autoscalingv2.HPAScalingRules{Tolerance: &one}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := DefaultOptions()
			o.ConfigurableTolerance = tc.gate
			c := New(Spec{MinReplicas: 1, MaxReplicas: 5, Behavior: tc.behavior}, o)
			r := c.Sync(now, State{SpecReplicas: 3, StatusReplicas: 3, ReadyPods: 3}, []Reading{{Target: average(1000), Milli: tc.level}})
			if r.Desired != tc.want {
				t.Fatalf("desired %d, want %d", r.Desired, tc.want)
			}
		})
	}
}

// TestConvertDesiredReplicasWithRules.
func TestConvertDesiredReplicasWithRules(t *testing.T) {
	tests := []struct{ current, desired, min, max, want int32 }{
		{5, 7, 3, 8, 7},       // within range
		{3, 1, 2, 8, 2},       // below minReplicas
		{1, 0, 0, 10, 0},      // zero within range
		{20, 1000, 1, 10, 10}, // maxReplicas < scale-up limit
		{3, 1000, 1, 2000, 6}, // scale-up limit max(2 × 3, 4) < maxReplicas
		{1, 1000, 1, 2000, 4}, // the limit's minimum is 4
	}
	for _, tc := range tests {
		if got := convertWithRules(tc.current, tc.desired, tc.min, tc.max); got != tc.want {
			t.Errorf("convert(%d → %d, min %d, max %d) = %d, want %d", tc.current, tc.desired, tc.min, tc.max, got, tc.want)
		}
	}
}

func rules(pods, podsPeriod, percent, percentPeriod, window int32) *autoscalingv2.HPAScalingRules {
	r := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(window), SelectPolicy: ptr.To(autoscalingv2.MaxChangePolicySelect)}
	if pods != 0 {
		r.Policies = append(r.Policies, autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PodsScalingPolicy, Value: pods, PeriodSeconds: podsPeriod})
	}
	if percent != 0 {
		r.Policies = append(r.Policies, autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PercentScalingPolicy, Value: percent, PeriodSeconds: percentPeriod})
	}
	return r
}

// uniform spreads events over the last 120 seconds, each at the middle of
// its segment (generateEventsUniformDistribution).
func uniform(changes []int32) []scaleEvent {
	const period = 120
	seg := float64(period) / float64(len(changes))
	out := make([]scaleEvent, len(changes))
	for i, c := range changes {
		ago := float64(period) - seg*float64(i+1) + seg/2
		out[i] = scaleEvent{change: c, at: now - time.Duration(ago*float64(time.Second))}
	}
	return out
}

// TestCalculateScaleLimits: TestCalculateScaleUpLimitWithScalingRules and
// TestCalculateScaleDownLimitWithBehaviors (selectPolicy Min).
func TestCalculateScaleLimits(t *testing.T) {
	r := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(int32(300)), SelectPolicy: ptr.To(autoscalingv2.MinChangePolicySelect),
		Policies: []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PodsScalingPolicy, Value: 2, PeriodSeconds: 60},
			{Type: autoscalingv2.PercentScalingPolicy, Value: 50, PeriodSeconds: 60}}}
	if got := scaleUpLimit(now, 1, nil, nil, r); got != 2 {
		t.Errorf("scale-up limit = %d, want 2", got)
	}
	if got := scaleDownLimit(now, 5, nil, nil, r); got != 3 {
		t.Errorf("scale-down limit = %d, want 3", got)
	}
}

// TestScalingWithRules: the rate limits of behaviors, with earlier events.
func TestScalingWithRules(t *testing.T) {
	tests := map[string]struct {
		ups, downs        []scaleEvent
		min, max          int32
		up, down          *autoscalingv2.HPAScalingRules
		current, proposal int32
		want              int32
	}{
		"within range":                  {current: 5, proposal: 7, min: 3, max: 8, want: 7},
		"below minReplicas":             {current: 3, proposal: 1, min: 2, max: 8, want: 2},
		"zero within range, min 0":      {current: 1, proposal: 0, min: 0, max: 10, want: 0},
		"maxReplicas < limit":           {current: 20, proposal: 1000, min: 1, max: 10, want: 10},
		"above the maximum":             {current: 100, proposal: 1000, min: 100, max: 150, want: 150},
		"1% per minute lets one in":     {current: 3, proposal: 1000, min: 1, max: 2000, up: rules(0, 0, 1, 60, 0), want: 4},
		"scale-down limit above min":    {current: 1000, proposal: 3, min: 3, max: 2000, down: rules(20, 60, 0, 0, 0), want: 980},
		"scale-up, default behavior":    {current: 10, proposal: 50, min: 1, max: 1000, want: 20},
		"pods policy larger":            {current: 10, proposal: 500, min: 1, max: 1000, up: rules(100, 60, 100, 60, 0), want: 110},
		"percent policy larger":         {current: 10, proposal: 500, min: 1, max: 1000, up: rules(2, 60, 100, 60, 0), want: 20},
		"large pods policy, max":        {current: 10, proposal: 50, min: 1, max: 1000, up: rules(100, 60, 0, 0, 0), want: 50},
		"pod policy limitation":         {current: 10, proposal: 50, min: 1, max: 1000, up: rules(30, 60, 0, 0, 0), want: 40},
		"percent policy limitation":     {current: 10, proposal: 50, min: 1, max: 1000, up: rules(0, 0, 200, 60, 0), want: 30},
		"scale-down percent > pods":     {current: 100, proposal: 2, min: 1, max: 1000, down: rules(20, 60, 1, 60, 300), want: 80},
		"scale-down pods > percent":     {current: 100, proposal: 2, min: 1, max: 1000, down: rules(2, 60, 1, 60, 300), want: 98},
		"scale-down to min, large pods": {current: 10, proposal: 0, min: 1, max: 1000, down: rules(100, 60, 0, 0, 300), want: 1},
		"scale-down pod limitation":     {current: 10, proposal: 2, min: 1, max: 1000, down: rules(5, 60, 0, 0, 300), want: 5},
		"scale-down percent, in range":  {current: 10, proposal: 5, min: 1, max: 1000, down: rules(0, 0, 50, 60, 300), want: 5},
		"scale-up, max with events": {ups: uniform([]int32{1, 5, 9}), current: 100, proposal: 500, min: 1, max: 200,
			up: rules(300, 60, 0, 0, 0), want: 200},
		// 120 s ago there were 100 - 15 replicas; Pods 5 per 120 s allows none.
		"no scale-up after many events": {ups: uniform([]int32{1, 5, 9}), current: 100, proposal: 500, min: 1, max: 1000,
			up: rules(5, 120, 0, 0, 0), want: 100},
		"pods policy after events":    {ups: uniform([]int32{1, 5, 9}), current: 100, proposal: 500, min: 1, max: 1000, up: rules(150, 120, 0, 0, 0), want: 235},
		"percent policy after events": {ups: uniform([]int32{1, 5, 9}), current: 100, proposal: 500, min: 1, max: 1000, up: rules(0, 0, 200, 120, 0), want: 255},
		"percent after up and down": {ups: uniform([]int32{4}), downs: uniform([]int32{2}), current: 6, proposal: 24,
			min: 1, max: 1000, up: rules(0, 0, 300, 300, 0), want: 16},
		"scale-down pods after events": {downs: uniform([]int32{1, 5, 9}), current: 100, proposal: 2, min: 1, max: 1000,
			down: rules(5, 120, 0, 0, 300), want: 100},
		"scale-down percent after events": {downs: uniform([]int32{2, 4, 6}), current: 100, proposal: 0, min: 1, max: 1000,
			down: rules(0, 0, 50, 120, 300), want: 56},
		"scale-down after up and down": {ups: uniform([]int32{2}), downs: uniform([]int32{4}), current: 10, proposal: 1,
			min: 1, max: 1000, down: rules(0, 0, 50, 180, 0), want: 6},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := New(Spec{MinReplicas: tc.min, MaxReplicas: tc.max,
				Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: tc.up, ScaleDown: tc.down}}, DefaultOptions())
			c.ups, c.down = tc.ups, tc.downs
			if got := c.withBehaviorRate(now, tc.current, tc.proposal, tc.min); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

// TestNormalizeDesiredReplicasWithBehavior: stabilization windows over the
// recommendation history, and which old recommendation is replaced.
func TestNormalizeDesiredReplicasWithBehavior(t *testing.T) {
	rec := func(r int32, ago time.Duration) recommendation { return recommendation{r, now - ago} }
	tests := map[string]struct {
		recs              []recommendation
		current, proposal int32
		up, down          int32 // stabilization windows, seconds
		want              int32
		wantRecs          []int32
	}{
		"empty, scaling down":         {recs: []recommendation{}, current: 100, proposal: 5, down: 300, want: 5, wantRecs: []int32{5}},
		"scale-down stabilization":    {recs: []recommendation{rec(4, 2*time.Minute), rec(5, time.Minute)}, current: 100, proposal: 3, down: 180, want: 5, wantRecs: []int32{4, 5, 3}},
		"scale-up stabilization":      {recs: []recommendation{rec(4, 2*time.Minute), rec(5, time.Minute)}, current: 1, proposal: 7, up: 300, down: 300, want: 4, wantRecs: []int32{4, 5, 7}},
		"no scale-down stabilization": {recs: []recommendation{rec(1, 2*time.Minute), rec(2, time.Minute)}, current: 100, proposal: 3, up: 300, down: 300, want: 3, wantRecs: []int32{1, 2, 3}},
		"reuse an old element": {recs: []recommendation{rec(10, 10*time.Minute), rec(9, 9*time.Minute)}, current: 100, proposal: 3, down: 300,
			want: 3, wantRecs: []int32{10, 3}},
		"reuse an obsolete one, scale down": {recs: []recommendation{rec(10, 10*time.Minute), rec(4, time.Minute), rec(5, 2*time.Minute), rec(9, 9*time.Minute)},
			current: 100, proposal: 3, down: 180, want: 5, wantRecs: []int32{10, 4, 5, 3}},
		"reuse the only obsolete one, scale up": {recs: []recommendation{rec(10, 100*time.Minute), rec(6, time.Minute), rec(5, 2*time.Minute), rec(9, 3*time.Minute)},
			current: 1, proposal: 100, up: 300, down: 300, want: 5, wantRecs: []int32{100, 6, 5, 9}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			up := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(tc.up), Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 10000, PeriodSeconds: 15}}}
			down := &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(tc.down), Policies: []autoscalingv2.HPAScalingPolicy{{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15}}}
			c := New(Spec{MinReplicas: 1, MaxReplicas: 1000, Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: up, ScaleDown: down}}, DefaultOptions())
			c.recs = tc.recs
			if got := c.normalizeWithBehavior(now, tc.current, tc.proposal, 1); got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
			var got []int32
			for _, r := range c.recs {
				got = append(got, r.replicas)
			}
			if len(got) != len(tc.wantRecs) {
				t.Fatalf("recommendations %v, want %v", got, tc.wantRecs)
			}
			for i := range got {
				if got[i] != tc.wantRecs[i] {
					t.Fatalf("recommendations %v, want %v", got, tc.wantRecs)
				}
			}
		})
	}
}

// TestStabilizeDownscale: without a behavior, the highest recommendation of
// the last 5 minutes wins.
func TestStabilizeDownscale(t *testing.T) {
	c := New(Spec{MinReplicas: 1, MaxReplicas: 10}, DefaultOptions())
	c.recs = []recommendation{{10, now - 10*time.Minute}, {4, now - time.Minute}, {5, now - 2*time.Minute}}
	if got := c.normalize(now, 5, 2, 1); got != 5 {
		t.Fatalf("got %d, want 5 (the highest of the last 5 minutes)", got)
	}
}

// TestDefaultsFillAPartialBehavior: the API server's defaults.
func TestDefaultsFillAPartialBehavior(t *testing.T) {
	c := New(Spec{MinReplicas: 1, MaxReplicas: 10, Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
		ScaleUp: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(int32(30))}}}, DefaultOptions())
	b := c.Spec().Behavior
	if *b.ScaleUp.StabilizationWindowSeconds != 30 || len(b.ScaleUp.Policies) != 2 || *b.ScaleUp.SelectPolicy != autoscalingv2.MaxChangePolicySelect {
		t.Errorf("scaleUp %+v", b.ScaleUp)
	}
	if *b.ScaleDown.StabilizationWindowSeconds != 300 || b.ScaleDown.Policies[0].Value != 100 || b.ScaleDown.Policies[0].PeriodSeconds != 15 {
		t.Errorf("scaleDown %+v", b.ScaleDown)
	}
}

// TestSyncSpecialCases: zero replicas with minReplicas > 0 disables
// scaling; above max goes to max; failing metrics change nothing.
func TestSyncSpecialCases(t *testing.T) {
	c := New(Spec{MinReplicas: 1, MaxReplicas: 4}, DefaultOptions())
	ok := []Reading{{Target: average(1000), Milli: 9000}}
	if r := c.Sync(now, State{SpecReplicas: 0}, ok); r.Rescale || r.Desired != 0 {
		t.Errorf("at 0 with min 1: %+v, want scaling disabled", r)
	}
	if r := c.Sync(now, State{SpecReplicas: 6, StatusReplicas: 6}, ok); r.Desired != 4 {
		t.Errorf("above max: %+v", r)
	}
	bad := []Reading{{Target: average(1000), Err: errors.New("Unavailable")}}
	if r := c.Sync(now, State{SpecReplicas: 3, StatusReplicas: 3}, bad); r.Rescale || r.Desired != 3 || r.Err == nil {
		t.Errorf("failing metric: %+v, want no change and the error", r)
	}
	// One of two metrics fails: the other may scale up, not down.
	two := []Reading{{Target: average(1000), Milli: 9000}, {Target: average(1000), Err: errors.New("x")}}
	if r := c.Sync(now, State{SpecReplicas: 3, StatusReplicas: 3}, two); r.Desired != 4 {
		t.Errorf("one failing of two, scaling up: %+v", r)
	}
	low := []Reading{{Target: average(1000), Milli: 1000}, {Target: average(1000), Err: errors.New("x")}}
	if r := c.Sync(now+time.Hour, State{SpecReplicas: 3, StatusReplicas: 3}, low); r.Rescale {
		t.Errorf("one failing of two, scaling down: %+v, want no change", r)
	}
}

// TestAnEmptyPolicyListIsTheDefaults: a behavior's "policies: []" never
// reaches the API server (HPAScalingRules.Policies is omitempty: KEDA's
// HPA carries no policies), which fills in the defaults as for a list left
// out (copyHPAScalingRules). Taken as a list of no policy, the HPA could
// never scale in that direction (scaleUpLimit's Max of nothing is MinInt32,
// held at the current count).
func TestAnEmptyPolicyListIsTheDefaults(t *testing.T) {
	rules := &autoscalingv2.HPAScalingRules{Policies: []autoscalingv2.HPAScalingPolicy{}}
	sent, err := json.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	var got autoscalingv2.HPAScalingRules
	if err := json.Unmarshal(sent, &got); err != nil || got.Policies != nil {
		t.Fatalf("the API server gets %s (policies %v): want none", sent, got.Policies)
	}
	for dir, b := range map[string]*autoscalingv2.HorizontalPodAutoscalerBehavior{
		"up":   {ScaleUp: rules.DeepCopy()},
		"down": {ScaleDown: rules.DeepCopy()},
	} {
		c := New(Spec{MinReplicas: 1, MaxReplicas: 20, Behavior: b}, DefaultOptions())
		current, usage, want := int32(2), int64(6000), int32(6) // up: 2 + 4 Pods (the default's Max)
		if dir == "down" {
			c.spec.Behavior.ScaleDown.StabilizationWindowSeconds = new(int32)
			current, usage, want = 6, 2000, 2 // down: 100 % per 15 s
		}
		res := c.Sync(0, State{SpecReplicas: current, StatusReplicas: current, ReadyPods: current},
			[]Reading{{Target: Target{AverageValue: true, Milli: 1000}, Milli: usage}})
		if res.Desired != want {
			t.Errorf("scale%s with policies: []: %d → %d, want %d (the default policies)", dir, current, res.Desired, want)
		}
	}
}
