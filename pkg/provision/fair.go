package provision

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
)

// Retries of the provisioner's queue: each workload's own exponential
// backoff (client-go's controller default, 5 ms doubling to 1000 s), and a
// bucket of its namespace's (namespaceRetryQPS, burst namespaceRetryBurst),
// whichever is later. The queue had client-go's one bucket for every
// namespace (10 a second): one tenant's thousands of workloads whose
// ScaledObject the API server refused (a ResourceQuota, KEDA's webhook)
// took it, and another tenant's retry waited minutes behind them. All the
// namespaces' calls together are bounded by the aggregator's client (50 a
// second, burst 100).
const (
	namespaceRetryQPS   = 10
	namespaceRetryBurst = 100
	// maxRetryBuckets bounds the namespaces' buckets kept; past it the full
	// ones (no retry for a while) are dropped.
	maxRetryBuckets = 1024
)

// fairLimiter is the queue's retry limiter (see namespaceRetryQPS).
type fairLimiter struct {
	items workqueue.TypedRateLimiter[key]
	now   func() time.Time
	mu    sync.Mutex
	ns    buckets
}

func newFairLimiter() *fairLimiter {
	return &fairLimiter{items: workqueue.NewTypedItemExponentialFailureRateLimiter[key](5*time.Millisecond, 1000*time.Second),
		now: time.Now, ns: buckets{qps: namespaceRetryQPS, burst: namespaceRetryBurst}}
}

// When is how long k waits before its retry: its own backoff or its
// namespace's bucket, whichever is longer (a token is taken now: a bucket
// taken at future times, out of order, refilled as of the latest and let
// every retry through).
func (l *fairLimiter) When(k key) time.Duration {
	d := l.items.When(k)
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(d, l.ns.of(k.Namespace, now).ReserveN(now, 1).DelayFrom(now))
}

func (l *fairLimiter) Forget(k key)          { l.items.Forget(k) }
func (l *fairLimiter) NumRequeues(k key) int { return l.items.NumRequeues(k) }

// buckets is a rate.Limiter a namespace, of qps and burst. Past
// maxRetryBuckets the full ones (none taken for a while) are dropped, in
// one walk of all; when that leaves most held (each in use), the next walk
// waits until they are twice as many, so that a walk costs O(1) a new
// namespace: with 1,024 held and none full, every new namespace walked
// them all.
type buckets struct {
	ns    map[string]*rate.Limiter
	qps   rate.Limit
	burst int
	// sweepAt: the count held at which the next walk is made
	// (maxRetryBuckets when 0); sweeps counts the walks.
	sweepAt, sweeps int
}

// of is namespace ns's bucket, made when it has none.
func (b *buckets) of(ns string, now time.Time) *rate.Limiter {
	l := b.ns[ns]
	if l != nil {
		return l
	}
	if b.ns == nil {
		b.ns = map[string]*rate.Limiter{}
	}
	if len(b.ns) >= max(b.sweepAt, maxRetryBuckets) {
		b.sweeps++
		for n, o := range b.ns {
			if o.TokensAt(now) >= float64(b.burst) {
				delete(b.ns, n)
			}
		}
		b.sweepAt = 2 * len(b.ns)
	}
	l = rate.NewLimiter(b.qps, b.burst)
	b.ns[ns] = l
	return l
}

// Events of one namespace's workloads (Warning and Normal alike): at most eventBurst at once
// and eventQPS a second after; past it an Event is not sent (the state,
// on /debug/provisioning and in pulse_provisioner_workloads, and the log
// still say it), counted in pulse_provisioner_events_dropped_total. The
// recorder's one queue (1,000, dropped when full) took one tenant's
// thousands of InvalidAnnotation Events at once, and another tenant's
// were dropped.
const (
	eventQPS   = 1
	eventBurst = 25
)

// eventLimiter is a bucket of Events per namespace; its zero value is
// ready.
type eventLimiter struct {
	mu sync.Mutex
	ns buckets
}

// allow takes one of ns's Events, if its bucket has one.
func (l *eventLimiter) allow(ns string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ns.burst == 0 {
		l.ns.qps, l.ns.burst = eventQPS, eventBurst
	}
	return l.ns.of(ns, now).AllowN(now, 1)
}

// fairQueue orders the provisioner's queue: a FIFO a namespace, the
// namespaces taken in turn, so that one tenant's thousands of keys (a
// resync, an edit of every workload's annotations) do not stand before
// another tenant's one, which waited behind them all on the one worker
// (each reconcile that writes costs an API call, at most 50 a second).
// It is client-go's workqueue.Queue, called under the workqueue's lock.
type fairQueue struct {
	byNS  map[string][]key
	order []string // the namespaces with keys, order[0] next
	n     int
}

func (q *fairQueue) Touch(key) {}
func (q *fairQueue) Len() int  { return q.n }

func (q *fairQueue) Push(k key) {
	if q.byNS == nil {
		q.byNS = map[string][]key{}
	}
	l, had := q.byNS[k.Namespace]
	if !had {
		q.order = append(q.order, k.Namespace)
	}
	q.byNS[k.Namespace] = append(l, k)
	q.n++
}

// Pop is the next namespace's oldest key; the workqueue calls it only
// when Len is not 0.
func (q *fairQueue) Pop() key {
	ns := q.order[0]
	q.order[0], q.order = "", q.order[1:]
	l := q.byNS[ns]
	k := l[0]
	l[0] = key{}
	if len(l) == 1 {
		delete(q.byNS, ns)
	} else {
		q.byNS[ns] = l[1:]
		q.order = append(q.order, ns)
	}
	q.n--
	return k
}

// newQueue is the provisioner's queue: its retries by fairLimiter, its
// order by fairQueue.
func newQueue() workqueue.TypedRateLimitingInterface[key] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(newFairLimiter(), workqueue.TypedRateLimitingQueueConfig[key]{
		DelayingQueue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[key]{
			Queue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[key]{Queue: &fairQueue{}}),
		}),
	})
}
