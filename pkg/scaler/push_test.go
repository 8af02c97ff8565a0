package scaler

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestStreamsOfManyWorkloadsSeeOnlyTheirOwn: 40 workloads spread over the
// pusher's shards, two streams each. Raising one workload's queue pushes
// true to its two streams and to no other; each stream ends with exactly
// the two states it went through. No recheck comes within the test: every
// push is the store telling of a change.
func TestStreamsOfManyWorkloadsSeeOnlyTheirOwn(t *testing.T) {
	f := newFixture(t)
	f.server.recheck = time.Hour
	const workloads = 40
	key := func(w int) store.Key {
		return store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: fmt.Sprint("w", w)}
	}
	var infos []store.PodInfo
	for w := range workloads {
		infos = append(infos, store.PodInfo{UID: fmt.Sprint("uid-", w), Namespace: "demo", Name: fmt.Sprint("p", w), Ready: true, Workloads: []store.Key{key(w)}})
	}
	f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
	report := func(waiting func(w int) float64) {
		f.ms += 1000
		var rs []store.Report
		for w := range workloads {
			r := store.Report{UID: fmt.Sprint("uid-", w)}
			r.TimeMs = f.ms
			r.Values.Set(metric.Waiting, waiting(w))
			rs = append(rs, r)
		}
		f.store.Add(rs)
	}
	report(func(int) float64 { return 0 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make([][]<-chan bool, workloads)
	for w := range workloads {
		for range 2 {
			ch := f.activeStates(ctx, t, map[string]string{"workspace": fmt.Sprint("w", w), "window": "1s", "activationThreshold": "1"})
			if first := <-ch; first {
				t.Fatalf("w%d: first state true, want false", w)
			}
			got[w] = append(got[w], ch)
		}
	}
	if n := len(f.server.push.shards); n < 1 || n > maxShards {
		t.Fatalf("%d shards", n)
	}
	for raised := range workloads {
		report(func(w int) float64 {
			if w <= raised {
				return 5
			}
			return 0
		})
		for _, ch := range got[raised] {
			if v := <-ch; !v {
				t.Fatalf("w%d raised: pushed false", raised)
			}
		}
	}
	// Every stream went false → true once: nothing else is waiting in any
	// of them (a spurious push of a state already sent would be).
	for w := range workloads {
		for i, ch := range got[w] {
			select {
			case v, ok := <-ch:
				if ok {
					t.Fatalf("w%d stream %d: pushed %v again", w, i, v)
				}
			default:
			}
		}
	}
	if n := f.server.OpenStreams(); n != 2*workloads {
		t.Fatalf("%d streams open, want %d", n, 2*workloads)
	}
}

// TestPushHandsTheNewestStateOver: a handler that has not taken one state
// gets the newest, and the pusher never waits for it (a KEDA that stopped
// reading blocks its own stream, not the others of its shard).
func TestPushHandsTheNewestStateOver(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	md := map[string]string{"workspace": "llama", "window": "1s", "activationThreshold": "1"}
	tr, err := f.server.parse(ref(md))
	if err != nil {
		t.Fatal(err)
	}
	u := &sub{shared: &shared{t: tr}, ready: make(chan struct{}, 1)}
	var pass uint64 // each evaluation a pass of its own
	for i, waiting := range []float64{5, 0, 5, 0} {
		f.report(map[string]float64{"a": waiting})
		pass++
		f.server.push.evaluate(u, pass) // returns although nobody takes
		if u.last != (waiting > 1) {
			t.Fatalf("evaluation %d: last %v after waiting %v", i, u.last, waiting)
		}
	}
	<-u.ready
	if state, send := u.next(); state || !send {
		t.Fatalf("took %v (send %v), want the newest state, false, to send", state, send)
	}
	select {
	case <-u.ready:
		t.Fatal("two wake-ups for one state")
	default:
	}
	// true handed over, then false, before the handler woke: the handler
	// sent false last, and sends nothing (KEDA asks for a scale at each
	// true it gets).
	for _, waiting := range []float64{5, 0} {
		f.report(map[string]float64{"a": waiting})
		pass++
		f.server.push.evaluate(u, pass)
	}
	<-u.ready
	if state, send := u.next(); state || send {
		t.Fatalf("took %v (send %v) after true and false, want false and nothing sent: false was sent last", state, send)
	}
	f.report(map[string]float64{"a": 5})
	pass++
	f.server.push.evaluate(u, pass)
	<-u.ready
	if state, send := u.next(); !state || !send {
		t.Fatalf("took %v (send %v), want true to send", state, send)
	}
}

// TestOneTenantsStreamsTakeTurns: every pass of a shard evaluated all the
// streams of the workloads that changed, one after another, so one
// tenant's hundreds of ScaledObjects on a busy workload delayed every other
// tenant's pushes in that shard by all of theirs. Now, in a pass with other
// namespaces' streams, a namespace has at most fairShare evaluations and
// the rest of its streams wait for the next pass (which comes at once, and
// takes them first); alone, it takes a whole pass. Streams of the same
// trigger are evaluated once. A tenant's streams reading another namespace
// (--allow-cross-namespace-triggers) take the reader's share: they took
// the namespace's they read, and its own streams waited behind them.
func TestOneTenantsStreamsTakeTurns(t *testing.T) {
	f := newFixture(t)
	p := newPusher(f.server)
	sh := p.shards[0]
	trigger := func(ns string, activation float64) Trigger {
		return Trigger{Workload: store.Key{Namespace: ns, Kind: store.KindWorkspace, Name: "llama"}, Metric: "waiting", Threshold: 10,
			ActivationThreshold: activation, ValueType: "total", Aggregation: "avg", MissingPods: MissingHold, Window: time.Second, StaleAfter: time.Minute}
	}
	openAs := func(t Trigger, tenant string) *sub { // as add, without starting the shards' goroutines
		u := &sub{tenant: tenant, ready: make(chan struct{}, 1)}
		sh.open(u, t)
		return u
	}
	open := func(t Trigger) *sub { return openAs(t, t.Workload.Namespace) }
	var noisy, same, cross []*sub
	for i := range 200 {
		noisy = append(noisy, open(trigger("noisy", float64(i))))
	}
	for range 100 {
		same = append(same, open(trigger("same", 1)))
	}
	quiet := open(trigger("quiet", 1))
	// A tenant allowed to read another namespace (--allow-cross-namespace-
	// triggers) takes its own share, not the namespace's it reads.
	for i := range 100 {
		cross = append(cross, openAs(trigger("victim", float64(i+10)), "reader"))
	}
	victim := open(trigger("victim", 1))
	evaluated := func(us []*sub) (n int) {
		for _, u := range us {
			if !u.evaluated.IsZero() {
				n++
			}
		}
		return n
	}
	p.pass(sh, time.Now(), false)
	if quiet.evaluated.IsZero() {
		t.Fatal("the quiet tenant's stream waited behind the noisy tenant's")
	}
	if victim.evaluated.IsZero() || evaluated(cross) != fairShare {
		t.Fatalf("the streams of a tenant reading another namespace: %d evaluated (want %d), that namespace's own evaluated %v",
			evaluated(cross), fairShare, !victim.evaluated.IsZero())
	}
	if n := evaluated(same); n != 100 {
		t.Fatalf("%d of 100 streams of one trigger evaluated: the same trigger counts once against the share", n)
	}
	if n := evaluated(noisy); n != fairShare || sh.waiters != 200+100-2*fairShare {
		t.Fatalf("the noisy tenant: %d evaluated, %d waiting; want %d and %d", n, sh.waiters, fairShare, 200+100-2*fairShare)
	}
	select {
	case <-sh.wake:
	default:
		t.Fatal("no pass is due for the streams that wait")
	}
	// The next passes take the rest, the streams that waited first.
	for range 3 {
		p.pass(sh, time.Now(), false)
	}
	if n := evaluated(noisy); n != 200 || evaluated(cross) != 100 || sh.waiters != 0 {
		t.Fatalf("%d of the noisy tenant's 200 streams and %d of the reader's 100 evaluated, %d waiting, after the passes", n, evaluated(cross), sh.waiters)
	}
}

// TestATenantAloneInAPassLetsAnotherIn: a namespace alone in a pass stops
// at its first look past its fair share once another's stream waits (new,
// or of a workload of the other's that changed during the pass), and takes
// the pass whole while only its own workload changes.
func TestATenantAloneInAPassLetsAnotherIn(t *testing.T) {
	for name, tc := range map[string]struct {
		during func(p *pusher, open func(string, float64) *sub) *sub
		want   int
	}{
		"another's stream opens": {func(_ *pusher, open func(string, float64) *sub) *sub { return open("quiet", 1) }, 112},
		"another's workload changes": {func(p *pusher, _ func(string, float64) *sub) *sub {
			p.changed(store.Key{Namespace: "quiet", Kind: store.KindWorkspace, Name: "llama"})
			return nil
		}, 112},
		"its own workload changes": {func(p *pusher, _ func(string, float64) *sub) *sub {
			p.changed(store.Key{Namespace: "noisy", Kind: store.KindWorkspace, Name: "llama"})
			return nil
		}, 500},
	} {
		t.Run(name, func(t *testing.T) { testAloneInAPass(t, tc.during, tc.want) })
	}
}

// testAloneInAPass: 500 streams of one namespace alone in a pass; during
// it (at its 100th evaluation) during runs, returning a stream that must
// be evaluated by the next pass (or nil); want of the 500 are evaluated.
func testAloneInAPass(t *testing.T, during func(*pusher, func(string, float64) *sub) *sub, want int) {
	f := newFixture(t)
	p := newPusher(f.server)
	p.shards = p.shards[:1]
	sh := p.shards[0]
	open := func(ns string, activation float64) *sub { // as add, without starting the shards' goroutines
		tr := Trigger{Workload: store.Key{Namespace: ns, Kind: store.KindWorkspace, Name: "llama"}, Metric: "waiting", Threshold: 10,
			ActivationThreshold: activation, ValueType: "total", Aggregation: "avg", MissingPods: MissingHold, Window: time.Second, StaleAfter: time.Minute}
		u := &sub{tenant: ns, ready: make(chan struct{}, 1)}
		sh.mu.Lock()
		sh.open(u, tr)
		sh.mu.Unlock()
		return u
	}
	quietBefore := open("quiet", 2) // sent its first state: waits for nothing
	p.pass(sh, time.Now(), false)
	var noisy []*sub
	for i := range 500 {
		noisy = append(noisy, open("noisy", float64(i)))
	}
	// The noisy tenant is alone when the pass begins.
	var quiet *sub
	p.evaluated = func(i int) {
		if i == 99 {
			quiet = during(p, open)
		}
	}
	evaluatedBefore := quietBefore.evaluated
	p.pass(sh, time.Now(), false)
	p.evaluated = nil
	if !quietBefore.evaluated.Equal(evaluatedBefore) {
		t.Fatal("the quiet tenant's stream was in the noisy tenant's pass")
	}
	n := 0
	for _, u := range noisy {
		if !u.evaluated.IsZero() {
			n++
		}
	}
	left := 0
	if q := sh.queues["noisy"]; q != nil {
		left = q.len()
	}
	if n != want || left != 500-want {
		t.Fatalf("the noisy tenant alone: %d of 500 evaluated, %d left for the next pass; want %d (112: the first look past 100), %d left", n, left, want, 500-want)
	}
	if want == 500 {
		return
	}
	select {
	case <-sh.wake:
	default:
		t.Fatal("no pass is due for the streams that wait")
	}
	p.pass(sh, time.Now(), false)
	if quiet != nil && quiet.evaluated.IsZero() || quiet == nil && quietBefore.evaluated.Equal(evaluatedBefore) {
		t.Fatal("the quiet tenant's stream waited past the next pass")
	}
}

// activeStates opens a StreamIsActive stream of md and hands each state it
// pushes to the channel returned, closed when the stream ends.
func (f *fixture) activeStates(ctx context.Context, t *testing.T, md map[string]string) <-chan bool {
	t.Helper()
	s, err := f.client.StreamIsActive(ctx, ref(md))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan bool, 8)
	go func(s grpc.ServerStreamingClient[externalscaler.IsActiveResponse]) {
		for {
			r, err := s.Recv()
			if err != nil {
				close(ch)
				return
			}
			ch <- r.Result
		}
	}(s)
	return ch
}

// BenchmarkPushPass: a pass over 1,000 streams, each its own trigger on a
// workload of 4 pods that reported. The pass's memo was keyed by the
// Trigger, a struct Go's maps keep out of place: each evaluation copied its
// key onto the heap. (docs/performance.md, "Aggregator ingest and KEDA
// RPCs".)
func BenchmarkPushPass(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	st := store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
	p := newPusher(New(st, Options{MaxWindow: time.Minute, Now: func() time.Time { return now }}))
	sh := p.shards[0]
	var infos []store.PodInfo
	var reports []store.Report
	for w := range 1000 {
		k := store.Key{Namespace: "bench", Kind: store.KindWorkspace, Name: fmt.Sprintf("w%d", w)}
		for i := range 4 {
			uid := fmt.Sprintf("w%d-%d", w, i)
			infos = append(infos, store.PodInfo{UID: uid, Namespace: "bench", Name: uid, Ready: true, Workloads: []store.Key{k}})
			r := store.Report{UID: uid}
			r.TimeMs = now.UnixMilli()
			r.Values.Set(metric.Waiting, float64(i))
			reports = append(reports, r)
		}
		sh.open(&sub{tenant: "bench", ready: make(chan struct{}, 1)}, Trigger{Workload: k, Metric: "waiting", Threshold: 10, ActivationThreshold: 1, ValueType: "total", Aggregation: "avg",
			MissingPods: MissingHold, Window: 10 * time.Second, StaleAfter: time.Minute})
	}
	st.Upsert(store.Source{Node: "node-1"}, infos, false)
	st.Add(reports)
	p.pass(sh, now, false) // the first states sent
	b.ReportAllocs()
	for b.Loop() {
		for k := range sh.subs {
			sh.dirty[k] = struct{}{}
		}
		p.pass(sh, now, false)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/evaluation")
}

// benchShard is a pusher of one shard (changed(k) finds the shard the
// streams are in) over a store whose clock stands at now.
func benchShard() (p *pusher, sh *shard, st *store.Store, now time.Time) {
	now = time.Unix(1_700_000_000, 0)
	st = store.New(store.Options{Retention: time.Minute, Now: func() time.Time { return now }})
	p = newPusher(New(st, Options{MaxWindow: time.Minute, Now: func() time.Time { return now }}))
	p.shards = p.shards[:1]
	return p, p.shards[0], st, now
}

// BenchmarkPushPassAloneWhileItChanges: a pass over one namespace's
// 10,000 streams of one workload (half the default per-namespace bound),
// the workload changing while the pass runs (a sample stored: the store
// calls changed). Alone in the pass, the namespace looks every yieldEvery
// evaluations past its fair share for another's streams waiting
// (othersWaiting), which walked every stream of every workload changed,
// its own 10,000 included, under the shard's lock the store's writes wait
// on (docs/performance.md, "Aggregator ingest and KEDA RPCs").
func BenchmarkPushPassAloneWhileItChanges(b *testing.B) {
	p, sh, st, now := benchShard()
	k := store.Key{Namespace: "bench", Kind: store.KindWorkspace, Name: "w"}
	var infos []store.PodInfo
	var reports []store.Report
	for i := range 4 {
		uid := fmt.Sprintf("w-%d", i)
		infos = append(infos, store.PodInfo{UID: uid, Namespace: "bench", Name: uid, Ready: true, Workloads: []store.Key{k}})
		r := store.Report{UID: uid}
		r.TimeMs = now.UnixMilli()
		r.Values.Set(metric.Waiting, float64(i))
		reports = append(reports, r)
	}
	for range 10_000 {
		sh.open(&sub{tenant: "bench", ready: make(chan struct{}, 1)}, Trigger{Workload: k, Metric: "waiting", Threshold: 10, ActivationThreshold: 1, ValueType: "total", Aggregation: "avg",
			MissingPods: MissingHold, Window: 10 * time.Second, StaleAfter: time.Minute})
	}
	st.Upsert(store.Source{Node: "node-1"}, infos, false)
	st.Add(reports)
	p.pass(sh, now, false) // the first states sent
	p.evaluated = func(i int) {
		if i == 0 {
			p.changed(k)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		sh.dirty[k] = struct{}{}
		p.pass(sh, now, false)
	}
}

// BenchmarkPushPassBesideAnother: a pass shared by two namespaces, one
// with N streams, each its own trigger, on one workload that changes at
// every pass, the other with one. Each pass evaluates the first's fair
// share and the other's one; it walked the first's N streams under the
// shard's lock, three times (those left over, the changed workload's, the
// fair shares), which the store's writes of every namespace wait on
// (docs/performance.md, "Aggregator ingest and KEDA RPCs").
func BenchmarkPushPassBesideAnother(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) { benchmarkPassBesideAnother(b, n) })
	}
}

func benchmarkPassBesideAnother(b *testing.B, n int) {
	p, sh, st, now := benchShard()
	noisy := store.Key{Namespace: "noisy", Kind: store.KindWorkspace, Name: "w"}
	quiet := store.Key{Namespace: "quiet", Kind: store.KindWorkspace, Name: "w"}
	var infos []store.PodInfo
	var reports []store.Report
	for _, k := range []store.Key{noisy, quiet} {
		uid := k.Namespace + "-0"
		infos = append(infos, store.PodInfo{UID: uid, Namespace: k.Namespace, Name: uid, Ready: true, Workloads: []store.Key{k}})
		r := store.Report{UID: uid}
		r.TimeMs = now.UnixMilli()
		r.Values.Set(metric.Waiting, 3)
		reports = append(reports, r)
	}
	st.Upsert(store.Source{Node: "node-1"}, infos, false)
	st.Add(reports)
	open := func(k store.Key, activation float64) {
		sh.mu.Lock()
		sh.open(&sub{tenant: k.Namespace, ready: make(chan struct{}, 1)}, Trigger{Workload: k, Metric: "waiting", Threshold: 10, ActivationThreshold: activation,
			ValueType: "total", Aggregation: "avg", MissingPods: MissingHold, Window: 10 * time.Second, StaleAfter: time.Minute})
		sh.mu.Unlock()
	}
	for i := range n {
		open(noisy, float64(i))
	}
	open(quiet, 1)
	evaluations := 0
	p.evaluated = func(int) { evaluations++ }
	b.ReportAllocs()
	for b.Loop() {
		p.changed(noisy)
		p.changed(quiet)
		p.pass(sh, now, false)
	}
	b.ReportMetric(float64(evaluations)/float64(b.N), "evaluations/op")
}

// TestRemoveKeepsTheRestWhole: streams of three workloads, some sharing a
// trigger, removed one by one in a shuffled order. After each remove every
// stream left is where its indices say, in its shard's list and its
// workload's, its trigger held by exactly its streams; the removed one is
// in neither; once all are gone the shard holds nothing. Once more with
// every trigger of one hash: each kept once, in one chain, whatever order
// they go in.
func TestRemoveKeepsTheRestWhole(t *testing.T) {
	t.Run("hashed", testRemoveKeepsTheRestWhole)
	t.Run("one hash", func(t *testing.T) {
		defer func(h func(maphash.Seed, Trigger) uint64) { triggerHash = h }(triggerHash)
		triggerHash = func(maphash.Seed, Trigger) uint64 { return 7 }
		testRemoveKeepsTheRestWhole(t)
	})
}

// TestEveryStreamWaitsOnceOrIsIdle: streams of three namespaces on four
// workloads (one read by two namespaces), opened, removed, their
// workloads changed and passes run, in a random order. After each step
// every open stream is in its namespace's queue exactly once (pending) or
// in its workload's idle streams where its index says, never both; the
// shard's count of streams waiting is its queues'. A workload changed is
// evaluated again, each of its streams, by the passes that follow, and
// no pass evaluates a stream removed before it began.
func TestEveryStreamWaitsOnceOrIsIdle(t *testing.T) {
	f := newFixture(t)
	p := newPusher(f.server)
	p.shards = p.shards[:1]
	sh := p.shards[0]
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []store.Key{
		{Namespace: "a", Kind: store.KindWorkspace, Name: "w"}, {Namespace: "a", Kind: store.KindWorkspace, Name: "v"},
		{Namespace: "b", Kind: store.KindWorkspace, Name: "w"}, {Namespace: "c", Kind: store.KindWorkspace, Name: "w"},
	}
	var open []*sub
	gone := map[*sub]bool{}
	check := func(step int) {
		t.Helper()
		sh.mu.Lock()
		defer sh.mu.Unlock()
		seen, waiting := map[*sub]int{}, 0
		for ns, q := range sh.queues {
			waiting += q.len()
			for _, u := range q.subs[q.head:] {
				if u.at >= 0 && (u.tenant != ns || !u.pending) {
					t.Fatalf("step %d: a stream of %q in %q's queue, pending %v", step, u.tenant, ns, u.pending)
				}
				seen[u]++
			}
		}
		if waiting != sh.waiters {
			t.Fatalf("step %d: %d streams in the queues, the shard counts %d", step, waiting, sh.waiters)
		}
		for _, u := range open {
			idle := !u.pending && u.atI < len(u.shared.w.idle) && u.shared.w.idle[u.atI] == u
			if seen[u] > 1 || u.pending != (seen[u] == 1) || !u.pending && !idle {
				t.Fatalf("step %d: a stream %d times in its queue, pending %v, idle %v", step, seen[u], u.pending, idle)
			}
			if sh.watched[u.shared.t.Workload] != u.shared.w {
				t.Fatalf("step %d: a stream's workload is not the one watched", step)
			}
		}
		for _, w := range sh.watched {
			for _, u := range w.idle {
				if u.at < 0 || u.pending {
					t.Fatalf("step %d: a stream removed or pending among the idle", step)
				}
			}
		}
	}
	// pass runs one, returning the streams it evaluated (their last
	// evaluation's time cleared before it: a pass with rechecks then
	// rechecks every one).
	pass := func(rechecks bool) (evaluated []*sub) {
		for _, u := range open {
			u.evaluated = time.Time{}
		}
		for u := range gone {
			u.evaluated = time.Time{}
		}
		p.pass(sh, time.Now(), rechecks)
		for _, u := range open {
			if !u.evaluated.IsZero() {
				evaluated = append(evaluated, u)
			}
		}
		for u := range gone {
			if !u.evaluated.IsZero() {
				evaluated = append(evaluated, u)
			}
		}
		return evaluated
	}
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 4 || len(open) == 0:
			k := keys[rng.IntN(len(keys))]
			tenant := k.Namespace
			if k.Name == "v" && rng.IntN(2) == 0 {
				tenant = "c" // a reader of another namespace
			}
			u := &sub{tenant: tenant, ready: make(chan struct{}, 1)}
			sh.mu.Lock()
			sh.open(u, Trigger{Workload: k, Metric: "waiting", Threshold: 10, ActivationThreshold: float64(rng.IntN(90)),
				ValueType: "total", Aggregation: "avg", MissingPods: MissingHold, Window: time.Second, StaleAfter: time.Minute})
			sh.mu.Unlock()
			open = append(open, u)
		case r < 6:
			i := rng.IntN(len(open))
			p.remove(open[i])
			gone[open[i]] = true
			open = slices.Delete(open, i, i+1)
		case r < 8:
			p.changed(keys[rng.IntN(len(keys))])
		default:
			for _, u := range pass(rng.IntN(4) == 0) {
				if gone[u] {
					t.Fatalf("step %d: a stream removed before the pass was evaluated", step)
				}
			}
		}
		check(step)
	}
	// Every workload changed: the passes that follow evaluate every open
	// stream.
	for _, k := range keys {
		p.changed(k)
	}
	all := map[*sub]bool{}
	for range 1000 {
		for _, u := range pass(false) {
			all[u] = true
		}
		if sh.waiters == 0 {
			break
		}
	}
	for _, u := range open {
		if !all[u] {
			t.Fatal("an open stream of a workload changed was not evaluated again")
		}
	}
	check(-1)
}

// TestAStreamHoldsNoTriggerOfItsOwn: an open stream's sub reads its
// trigger from its shared, one copy a trigger (a copy in each sub took
// 280 bytes a stream, 384 in all: 1,000 ScaledObjects' streams at 2,000
// nodes × 8 pods held 17 bytes a pod of them).
func TestAStreamHoldsNoTriggerOfItsOwn(t *testing.T) {
	if n := unsafe.Sizeof(sub{}); n > 112 {
		t.Errorf("sub is %d bytes, want at most 112 (a size class)", n)
	}
}

// heldTriggers is every trigger sh holds, down each hash's chain.
func heldTriggers(sh *shard) []*shared {
	var all []*shared
	for _, x := range sh.triggers {
		for ; x != nil; x = x.next {
			all = append(all, x)
		}
	}
	return all
}

func testRemoveKeepsTheRestWhole(t *testing.T) {
	p := newPusher(New(store.New(store.Options{Retention: time.Minute}), Options{MaxWindow: time.Minute}))
	p.shards = p.shards[:1] // every workload's
	sh := p.shards[0]
	var us []*sub
	for i := range 300 {
		k := store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: fmt.Sprint("w", i%3)}
		tr := Trigger{Workload: k, Metric: "waiting", Threshold: float64(1 + i%5), ValueType: "total", Window: 10 * time.Second}
		u := &sub{tenant: "demo", ready: make(chan struct{}, 1)}
		sh.mu.Lock()
		sh.open(u, tr)
		sh.mu.Unlock()
		us = append(us, u)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(us), func(i, j int) { us[i], us[j] = us[j], us[i] })
	for n, gone := range us {
		p.remove(gone)
		left := us[n+1:]
		sh.mu.Lock()
		if gone.at != -1 {
			t.Fatalf("remove %d: the removed stream's index is %d, want -1", n, gone.at)
		}
		if len(sh.all) != len(left) {
			t.Fatalf("remove %d: %d streams in the shard, want %d", n, len(sh.all), len(left))
		}
		listed, held := 0, map[*shared]int{}
		for _, u := range left {
			if sh.all[u.at] != u || sh.subs[u.shared.t.Workload][u.atW] != u {
				t.Fatalf("remove %d: a stream left is not where its indices say", n)
			}
			held[u.shared]++
		}
		for _, l := range sh.subs {
			listed += len(l)
			for _, u := range l {
				if u == gone {
					t.Fatalf("remove %d: the removed stream is still in its workload's list", n)
				}
			}
		}
		if listed != len(left) {
			t.Fatalf("remove %d: %d streams in the workloads' lists, want %d", n, listed, len(left))
		}
		kept := heldTriggers(sh)
		if len(held) != len(kept) {
			t.Fatalf("remove %d: %d triggers held, want %d", n, len(kept), len(held))
		}
		for _, s := range kept {
			if s.streams != held[s] {
				t.Fatalf("remove %d: trigger %+v counts %d streams, %d hold it", n, s.t, s.streams, held[s])
			}
			for _, o := range kept {
				if o != s && o.t == s.t {
					t.Fatalf("remove %d: trigger %+v held twice", n, s.t)
				}
			}
		}
		sh.mu.Unlock()
	}
	if len(sh.subs)+len(sh.dirty)+len(sh.triggers)+len(sh.watched) > 0 {
		t.Fatalf("after every remove: %d workloads, %d changed, %d triggers, %d workloads watched", len(sh.subs), len(sh.dirty), len(sh.triggers), len(sh.watched))
	}
	// The namespaces' queues still name them, removed: the next pass
	// drops them without evaluating any.
	evaluated := 0
	p.evaluated = func(int) { evaluated++ }
	p.pass(sh, time.Now(), true)
	if evaluated != 0 || sh.waiters+len(sh.queues) != 0 {
		t.Fatalf("the pass after every remove evaluated %d and left %d waiting in %d queues", evaluated, sh.waiters, len(sh.queues))
	}
}

// BenchmarkRemoveAll: KEDA restarting ends every stream at once; 20,000
// streams of one workload removed. (docs/performance.md, "Aggregator
// ingest and KEDA RPCs".)
func BenchmarkRemoveAll(b *testing.B) {
	const streams = 20000
	p := newPusher(New(store.New(store.Options{Retention: time.Minute}), Options{MaxWindow: time.Minute}))
	p.shards = p.shards[:1] // every workload's
	sh := p.shards[0]
	k := store.Key{Namespace: "bench", Kind: store.KindWorkspace, Name: "w"}
	us := make([]*sub, streams)
	for b.Loop() {
		b.StopTimer()
		sh.mu.Lock()
		for i := range us {
			us[i] = &sub{tenant: "bench"}
			sh.open(us[i], Trigger{Workload: k, Metric: "waiting", Threshold: 1})
		}
		sh.mu.Unlock()
		p.pass(sh, time.Now(), false) // the first states sent
		b.StartTimer()
		for _, u := range us {
			p.remove(u)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*streams), "ns/remove")
}

// openStream opens a StreamIsActive of a ScaledObject of namespace ns and
// reads its first state: the stream's refusal, if it is refused.
func (f *fixture) openStream(ctx context.Context, ns string, md map[string]string) error {
	s, err := f.client.StreamIsActive(ctx, &externalscaler.ScaledObjectRef{Name: "so", Namespace: ns, ScalerMetadata: md})
	if err == nil {
		_, err = s.Recv()
	}
	return err
}

// TestAWaitingStreamEndsByItsOneWake: a stream's handler waits on its
// context and its place's one wake (place.wake), which the reclaim, the
// shutdown and the pusher's hand-over share. A StreamMetricSpec's and a
// StreamIsActive's place, each taken by another namespace, end their
// streams with the reclaim's refusal (a pending hand-over or none), and
// each left open ends with EOF at the shutdown.
func TestAWaitingStreamEndsByItsOneWake(t *testing.T) {
	md := map[string]string{"workspace": "llama", "window": "1s", "activationThreshold": "1"}
	for _, specFirst := range []bool{true, false} {
		f := newFixture(t)
		f.server.maxStreams = 2
		f.pods("a")
		f.report(map[string]float64{"a": 0})
		// A stream that never ends fails the test at the deadline (Canceled).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var active grpc.ServerStreamingClient[externalscaler.IsActiveResponse]
		var specs grpc.ServerStreamingClient[externalscaler.GetMetricSpecResponse]
		openActive := func() { active = firstRecv(ctx, t, f.client.StreamIsActive, md) }
		openSpecs := func() { specs = firstRecv(ctx, t, f.client.StreamMetricSpec, md) }
		if specFirst {
			openSpecs()
			openActive()
			f.report(map[string]float64{"a": 5}) // a state handed over as the place goes, or just before
		} else {
			openActive()
			openSpecs()
		}
		// Every place taken, demo above its share: other takes demo's newest.
		other := store.Key{Namespace: "other", Kind: store.KindWorkspace, Name: "llama"}
		f.store.Upsert(store.Source{Node: "node-2"}, []store.PodInfo{{UID: "uid-o", Namespace: "other", Name: "o", Ready: true, Workloads: []store.Key{other}}}, false)
		r := store.Report{UID: "uid-o"}
		r.TimeMs = f.ms
		r.Values.Set(metric.Waiting, 0)
		f.store.Add([]store.Report{r})
		if err := f.openStream(ctx, "other", md); err != nil {
			t.Fatalf("other's stream, every place taken: %v", err)
		}
		var reclaimed, kept error
		if specFirst { // the StreamIsActive's place went
			reclaimed = streamEnd(active)
		} else {
			reclaimed = streamEnd(specs)
		}
		if status.Code(reclaimed) != codes.ResourceExhausted || !strings.Contains(reclaimed.Error(), "given to another namespace") {
			t.Fatalf("spec first %v: the newest stream, its place reclaimed, ended with %v; want the reclaim's ResourceExhausted", specFirst, reclaimed)
		}
		go f.server.Shutdown()
		if specFirst {
			kept = streamEnd(specs)
		} else {
			kept = streamEnd(active)
		}
		if !errors.Is(kept, io.EOF) {
			t.Fatalf("spec first %v: the stream left open ended with %v at the shutdown, want EOF", specFirst, kept)
		}
		cancel()
	}
}

// firstRecv opens a stream with open and reads its first message.
func firstRecv[T any](ctx context.Context, t *testing.T, open func(context.Context, *externalscaler.ScaledObjectRef, ...grpc.CallOption) (grpc.ServerStreamingClient[T], error),
	md map[string]string) grpc.ServerStreamingClient[T] {
	t.Helper()
	s, err := open(ctx, ref(md))
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// streamEnd reads s until it ends and returns how.
func streamEnd[T any](s grpc.ServerStreamingClient[T]) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

// TestOneTenantsStreamsCannotTakeAnothersRoom: at most 3 streams of one
// namespace, 4 in all. The fourth of namespace demo is refused
// (ResourceExhausted, naming it), while its three open streams still
// push and its polls are answered; namespace other opens the last one,
// and its next takes the newest of demo's (every place taken, other below
// its share of 4 over 2 namespaces, demo above it: two namespaces held
// every place for as long as they liked); other's third is refused for the
// bound in all (its share held). A namespace third takes one of the
// largest's, then is at its share. A stream ended frees its room, and the
// refusals and the place taken are counted.
func TestOneTenantsStreamsCannotTakeAnothersRoom(t *testing.T) {
	f := newFixture(t)
	f.server.maxStreams, f.server.maxPerNS = 4, 3
	f.pods("a")
	f.report(map[string]float64{"a": 0})
	other := store.Key{Namespace: "other", Kind: store.KindWorkspace, Name: "llama"}
	f.store.Upsert(store.Source{Node: "node-2"}, []store.PodInfo{{UID: "uid-o", Namespace: "other", Name: "o", Ready: true, Workloads: []store.Key{other}}}, false)
	r := store.Report{UID: "uid-o"}
	r.TimeMs = f.ms
	r.Values.Set(metric.Waiting, 0)
	f.store.Add([]store.Report{r})
	third := store.Key{Namespace: "third", Kind: store.KindWorkspace, Name: "llama"}
	f.store.Upsert(store.Source{Node: "node-3"}, []store.PodInfo{{UID: "uid-t", Namespace: "third", Name: "t", Ready: true, Workloads: []store.Key{third}}}, false)
	r.UID = "uid-t"
	f.store.Add([]store.Report{r})
	md := map[string]string{"workspace": "llama", "window": "1s", "activationThreshold": "1"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var demo []<-chan bool
	for range 3 {
		ch := f.activeStates(ctx, t, md)
		if <-ch {
			t.Fatal("first state true, want false")
		}
		demo = append(demo, ch)
	}
	refused := func(ns string) error { return f.openStream(ctx, ns, md) }
	if err := refused("demo"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), `namespace "demo" holds 3 streams open`) {
		t.Fatalf("demo's fourth stream: %v; want ResourceExhausted naming namespace demo", err)
	}
	if _, err := f.metric(t, md); err != nil {
		t.Fatalf("demo's poll beside its refused stream: %v", err)
	}
	f.report(map[string]float64{"a": 5})
	for i, ch := range demo {
		if !<-ch {
			t.Fatalf("demo's stream %d after the refusal: pushed false, want true", i)
		}
	}

	if err := f.openStream(ctx, "other", md); err != nil {
		t.Fatalf("other's stream beside demo's three: %v", err)
	}
	ended := func(ch <-chan bool) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			select {
			case _, ok := <-ch:
				if !ok {
					return true
				}
			case <-time.After(10 * time.Millisecond):
			}
		}
		return false
	}
	if err := f.openStream(ctx, "other", md); err != nil {
		t.Fatalf("other's second stream, every place taken, demo above its share: %v; want demo's newest place", err)
	}
	if !ended(demo[2]) {
		t.Fatal("demo's newest stream still open after other took its place")
	}
	if err := refused("other"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "the aggregator holds 4 streams open") {
		t.Fatalf("other's third stream, at its share: %v; want ResourceExhausted for the bound in all", err)
	}
	if err := f.openStream(ctx, "third", md); err != nil {
		t.Fatalf("a third namespace's first stream: %v; want a place of the largest", err)
	}
	if !ended(demo[1]) {
		t.Fatal("demo's (the largest, first by name) newest stream still open after third took its place")
	}
	if err := refused("third"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third's second stream, at its share: %v; want ResourceExhausted", err)
	}
	want := `
# HELP pulse_aggregator_scaler_streams KEDA's StreamIsActive and StreamMetricSpec streams open now.
# TYPE pulse_aggregator_scaler_streams gauge
pulse_aggregator_scaler_streams 4
# HELP pulse_aggregator_scaler_streams_reclaimed_total Streams ended (ResourceExhausted) to give their place to another namespace's: every place taken, the other namespace below its share of --max-scaler-streams, and this one's the most, above its share.
# TYPE pulse_aggregator_scaler_streams_reclaimed_total counter
pulse_aggregator_scaler_streams_reclaimed_total 2
# HELP pulse_aggregator_scaler_streams_refused_total Streams refused (ResourceExhausted) past a bound, by the bound: all (--max-scaler-streams) or namespace (--max-scaler-streams-per-namespace).
# TYPE pulse_aggregator_scaler_streams_refused_total counter
pulse_aggregator_scaler_streams_refused_total{limit="all"} 2
pulse_aggregator_scaler_streams_refused_total{limit="namespace"} 1
`
	if err := testutil.CollectAndCompare(f.server.Collector(), strings.NewReader(want), "pulse_aggregator_scaler_streams", "pulse_aggregator_scaler_streams_refused_total", "pulse_aggregator_scaler_streams_reclaimed_total"); err != nil {
		t.Fatal(err)
	}

	// The streams end (KEDA cancels them): their room is free again.
	cancel()
	for deadline := time.Now().Add(10 * time.Second); f.server.OpenStreams() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams still open after cancel", f.server.OpenStreams())
		}
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		if v, ok := <-f.activeStates(ctx, t, md); !ok || !v {
			t.Fatalf("demo's stream %d once the others ended: %v, %v; want true", i, v, ok)
		}
	}
}

// TestAStreamsPlaceLeavesInConstantTime: a place is removed by moving its
// namespace's last into it (a scan of a namespace's places at every
// stream's end was one too many); every place left is where its index
// says, and none is lost.
func TestAStreamsPlaceLeavesInConstantTime(t *testing.T) {
	f := newFixture(t)
	var held []*place
	for range 6 {
		p, err := f.server.enter("demo")
		if p == nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	for _, i := range []int{1, 4, 0} {
		f.server.leave(held[i])
	}
	defer func() { // the streams' ends, as their handlers' (Shutdown waits for them)
		for _, i := range []int{2, 3, 5} {
			f.server.leave(held[i])
		}
	}()
	f.server.closeMu.Lock()
	defer f.server.closeMu.Unlock()
	ps := f.server.places["demo"]
	if len(ps) != 3 {
		t.Fatalf("%d places left, want 3", len(ps))
	}
	for i, p := range ps {
		if p.idx != i || !slices.Contains([]*place{held[2], held[3], held[5]}, p) {
			t.Fatalf("place %d: index %d, one of those left %v", i, p.idx, slices.Contains(held, p))
		}
	}
	if _, inNS := f.server.slots.Held("demo"); inNS != 3 {
		t.Fatalf("%d slots held, want 3", inNS)
	}
}

// TestAGoneStreamSharesNoPass: a namespace's 200 streams wait beside
// another namespace's stream opened and closed before any pass. The
// queue of that gone stream alone kept the first namespace from being
// alone in the pass, cut to its fair share (found in a review,
// 2026-12-07).
func TestAGoneStreamSharesNoPass(t *testing.T) {
	f := newFixture(t)
	p := newPusher(f.server)
	p.shards = p.shards[:1]
	sh := p.shards[0]
	open := func(ns string, activation float64) *sub {
		u := &sub{tenant: ns, ready: make(chan struct{}, 1)}
		sh.mu.Lock()
		sh.open(u, Trigger{Workload: store.Key{Namespace: ns, Kind: store.KindWorkspace, Name: "llama"}, Metric: "waiting", Threshold: 10,
			ActivationThreshold: activation, ValueType: "total", Aggregation: "avg", MissingPods: MissingHold, Window: time.Second, StaleAfter: time.Minute})
		sh.mu.Unlock()
		return u
	}
	var noisy []*sub
	for i := range 200 {
		noisy = append(noisy, open("noisy", float64(i)))
	}
	p.remove(open("quiet", 1))
	p.pass(sh, time.Now(), false)
	n := 0
	for _, u := range noisy {
		if !u.evaluated.IsZero() {
			n++
		}
	}
	if n != 200 || len(sh.queues) != 0 || sh.waiters != 0 {
		t.Fatalf("%d of the namespace's 200 streams evaluated, alone in the pass but for a stream gone; %d queues left, %d waiting", n, len(sh.queues), sh.waiters)
	}
}
