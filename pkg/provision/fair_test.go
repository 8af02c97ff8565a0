package provision

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// TestOneTenantsRetriesLeaveAnothersAlone: the queue had client-go's one
// bucket of retries (10 a second) for every namespace: after one tenant's
// 3,000 workloads failed at once (a ResourceQuota refusing their
// ScaledObjects), another tenant's first retry waited five minutes. Each
// namespace has a bucket of its own.
func TestOneTenantsRetriesLeaveAnothersAlone(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	l := newFairLimiter()
	l.now = func() time.Time { return at }
	var last time.Duration
	for i := range 3000 {
		last = l.When(key{"Deployment", "team-a", fmt.Sprintf("w-%d", i)})
	}
	if last < 250*time.Second {
		t.Fatalf("team-a's 3,000th first retry in %s; want its namespace's bucket (10 a second) to spread them", last)
	}
	// A workload of team-a's failing again and again (its own backoff
	// hours long) refills no bucket: team-a's next retry still waits its
	// turn. (A bucket taken at future times refilled as of the latest,
	// and let every retry through.)
	long := key{"Deployment", "team-a", "again"}
	for range 20 {
		l.When(long)
	}
	if next := l.When(key{"Deployment", "team-a", "w-next"}); next < last {
		t.Fatalf("team-a's next retry after a long backoff's: in %s; want its turn, after %s", next, last)
	}
	b := l.When(key{"Deployment", "team-b", "w"})
	if b > time.Second {
		t.Fatalf("team-b's first retry, after team-a's 3,000: in %s; want its own backoff alone (5 ms)", b)
	}
	// client-go's default, for the record: the one bucket.
	d := workqueue.DefaultTypedControllerRateLimiter[key]()
	for i := range 3000 {
		d.When(key{"Deployment", "team-a", fmt.Sprintf("w-%d", i)})
	}
	if old := d.When(key{"Deployment", "team-b", "w"}); old < time.Minute {
		t.Fatalf("the default limiter gave team-b's retry %s: the test no longer shows what it fixed", old)
	}
	// Per workload, still its own backoff: doubling at each failure.
	k := key{"Deployment", "team-c", "w"}
	first, second := l.When(k), l.When(k)
	if first != 5*time.Millisecond || second != 10*time.Millisecond || l.NumRequeues(k) != 2 {
		t.Fatalf("one workload's retries in %s then %s (%d requeues); want 5 ms then 10 ms", first, second, l.NumRequeues(k))
	}
	l.Forget(k)
	if l.NumRequeues(k) != 0 {
		t.Fatal("forgotten, still counted")
	}
}

// TestOneTenantsEventsLeaveAnothers: one tenant editing 5,000 workloads'
// annotations into invalid ones made 5,000 warning Events at once, past
// the recorder's one queue (1,000, dropped when full), and another
// tenant's Events were dropped. Each namespace's Events have a bucket.
func TestOneTenantsEventsLeaveAnothers(t *testing.T) {
	var l eventLimiter
	now := time.Unix(1_700_000_000, 0)
	sent := 0
	for range 5000 {
		if l.allow("team-a", now) {
			sent++
		}
	}
	if sent != eventBurst {
		t.Fatalf("team-a's 5,000 Events at once: %d sent; want its burst, %d", sent, eventBurst)
	}
	if !l.allow("team-b", now) {
		t.Fatal("team-b's Event, after team-a's 5,000: not sent")
	}
	if !l.allow("team-a", now.Add(time.Second)) {
		t.Fatal("team-a's Event a second later: not sent")
	}
}
