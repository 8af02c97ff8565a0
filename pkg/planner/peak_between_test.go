package planner

import (
	"testing"
	"time"
)

// TestAPlanAnsweredBetweenObservationsIsHeld: the hold (rule 7) keeps a
// peak's need for a lead time and more, because capacity released cannot
// come back sooner. A plan answered to the HPA between two observations
// (its syncs fall anywhere; the observations come each 5 s) was acted on,
// but its need was never recorded among the peaks held: one evaluation
// later it was released, and the replicas the HPA added for it removed at
// its next sync. Now it is held (Answered); an evaluation that is not the
// HPA's answer (IsActive, the pushed activity, a standby's learning)
// holds observations only.
func TestAPlanAnsweredBetweenObservationsIsHeld(t *testing.T) {
	cfg := Default(0)
	cfg.Answered = true
	_, st, at := run(t, State{}, cfg, t0, 10*time.Minute, serving("a", 5000, 0.01), serving("b", 5000, 0.01))
	// The same burst at an observation is held: the hold works at the
	// 5 s ticks.
	{
		a := serving("a", 5000, 0.01)
		a.WaitingNow = 300
		burst, st, err := Make(snap(at, a, serving("b", 5000, 0.01)), st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		after, _, _ := Make(snap(at.Add(time.Second), serving("a", 5000, 0.01), serving("b", 5000, 0.01)), st, cfg)
		if after.Replicas != burst.Replicas {
			t.Fatalf("control: a burst at an observation planned %d, then %d: want it held", burst.Replicas, after.Replicas)
		}
	}
	// An observation at `at`: steady load.
	base, st, err := Make(snap(at, serving("a", 5000, 0.01), serving("b", 5000, 0.01)), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// One second later (no observation: within ObserveEvery), a burst
	// queues 300 requests at a: the plan asks for more, and the HPA may
	// act on it.
	a := serving("a", 5000, 0.01)
	a.WaitingNow = 300
	// Not the HPA's answer: between observations nothing is held.
	quiet := cfg
	quiet.Answered = false
	_, qst, err := Make(snap(at.Add(time.Second), a, serving("b", 5000, 0.01)), st, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if q, _, _ := Make(snap(at.Add(2*time.Second), serving("a", 5000, 0.01), serving("b", 5000, 0.01)), qst, quiet); q.Replicas != base.Replicas {
		t.Fatalf("an evaluation not answered to the HPA held %d replicas, want the %d observed", q.Replicas, base.Replicas)
	}
	burst, st, err := Make(snap(at.Add(time.Second), a, serving("b", 5000, 0.01)), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if burst.Replicas <= base.Replicas {
		t.Fatalf("the burst planned %d, no more than the %d before it: no test", burst.Replicas, base.Replicas)
	}
	// One second after that, the queue is gone.
	after, _, err := Make(snap(at.Add(2*time.Second), serving("a", 5000, 0.01), serving("b", 5000, 0.01)), st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if after.Replicas < burst.Replicas {
		t.Fatalf("a plan of %d answered at %s released %s later: planned %d (%s); want it held for the hold", burst.Replicas, at.Add(time.Second).Format(time.TimeOnly), time.Second, after.Replicas, after.Reason)
	}
}
