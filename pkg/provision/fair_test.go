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

// TestManyBusyNamespacesWalkTheBucketsRarely: past maxRetryBuckets, a new
// namespace's bucket walked every bucket for the full ones to drop; with
// none full (thousands of namespaces retrying at once) each new one walked
// them all, 10,000 namespaces about ten million steps under the lock. The
// walks now wait for the buckets to double; the idle ones still go.
func TestManyBusyNamespacesWalkTheBucketsRarely(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := buckets{qps: namespaceRetryQPS, burst: namespaceRetryBurst}
	const n = 10 * maxRetryBuckets
	for i := range n {
		b.of(fmt.Sprintf("team-%d", i), now).ReserveN(now, 1) // none full
	}
	if len(b.ns) != n {
		t.Fatalf("%d buckets held of %d namespaces retrying", len(b.ns), n)
	}
	if b.sweeps > 5 {
		t.Fatalf("%d walks of the buckets for %d busy namespaces; want one each time they double (at most 5)", b.sweeps, n)
	}
	// An hour on every bucket is full again: the next walk, made as new
	// namespaces come, drops them all.
	later := now.Add(time.Hour)
	for i := 0; len(b.ns) >= n; i++ {
		if i > 2*n {
			t.Fatalf("%d buckets held an hour later, after %d new namespaces: the full ones were not dropped", len(b.ns), i)
		}
		b.of(fmt.Sprintf("later-%d", i), later)
	}
	if len(b.ns) > 1 {
		t.Fatalf("%d buckets held after the walk of an hour later; want only the newest namespace's", len(b.ns))
	}
}

// TestOneTenantsKeysLeaveAnothersTurn: the queue was one FIFO for every
// namespace, worked by one worker: after one tenant's 3,000 workloads were
// queued (a resync, an edit of every annotation), another tenant's one
// waited behind them all, a minute at the client's 50 calls a second. The
// namespaces now take turns, each its own keys in order.
func TestOneTenantsKeysLeaveAnothersTurn(t *testing.T) {
	q := newQueue()
	defer q.ShutDown()
	for i := range 3000 {
		q.Add(key{"Deployment", "team-a", fmt.Sprintf("w-%d", i)})
	}
	q.Add(key{"Deployment", "team-b", "w"})
	q.Add(key{"Deployment", "team-b", "v"})
	want := []key{
		{"Deployment", "team-a", "w-0"}, {"Deployment", "team-b", "w"},
		{"Deployment", "team-a", "w-1"}, {"Deployment", "team-b", "v"},
		{"Deployment", "team-a", "w-2"}, {"Deployment", "team-a", "w-3"},
	}
	for i, w := range want {
		k, quit := q.Get()
		if quit || k != w {
			t.Fatalf("key %d worked: %v (quit %v); want %v: team-b's keys in turn with team-a's, each namespace's in order", i, k, quit, w)
		}
		q.Done(k)
	}
	// A key added again while worked is worked again once done, in its
	// namespace's turn (the workqueue's own rule, kept).
	k, _ := q.Get()
	q.Add(k)
	q.Add(key{"Deployment", "team-c", "w"})
	q.Done(k)
	if n := q.Len(); n != 2997 {
		t.Fatalf("%d keys queued; want 2,997 (team-a's 2,995 left, the one re-added, and team-c's)", n)
	}
	if next, _ := q.Get(); next != (key{"Deployment", "team-a", "w-5"}) {
		t.Fatalf("next worked: %v; want team-a's w-5, its turn", next)
	}
	if next, _ := q.Get(); next != (key{"Deployment", "team-c", "w"}) {
		t.Fatalf("next worked: %v; want team-c's, its turn", next)
	}
}
