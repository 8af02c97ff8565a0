package scaler

import (
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-io/pulse/pkg/store"
)

// pusher evaluates every open StreamIsActive stream on a few goroutines
// (one a CPU, at most maxShards), not on the stream's own: a stream's
// handler wakes only to send a changed state. The store tells the pusher of
// each workload that changes; a shard evaluates the streams of the
// workloads changed since its last pass, then those not evaluated for a
// recheck period (a workload going stale is noticed without a sample).
//
// A stream handler woken at every sample made the scheduler the aggregator's
// largest cost on a fleet: thousands of wake-ups a second, each an
// evaluation on its own goroutine, and a KEDA poll waiting behind them.
type pusher struct {
	s      *Server
	shards []*shard
	seed   maphash.Seed
	once   sync.Once
	wg     sync.WaitGroup

	// evaluated, when set (tests), is called after the i-th evaluation of
	// a pass.
	evaluated func(i int)
	// handed counts the states handed over to streams to send.
	handed atomic.Uint64
}

// maxShards bounds the evaluating goroutines: past a few, the passes spend
// more on waking than on evaluating.
const maxShards = 8

// yieldEvery: a pass yields the CPU after this many evaluations, so that a
// KEDA poll waiting for it is answered between them rather than after a
// whole pass.
const yieldEvery = 16

// fairShare bounds one namespace's evaluations in a pass that has other
// namespaces' too: the rest of its streams wait for the next pass, ahead of
// what comes new. One tenant's
// thousands of ScaledObjects on a busy workload once made every pass of
// their shard evaluate them all before anyone else's; now they take turns
// with the other tenants. Streams of the same trigger (the same workload
// and metadata) are evaluated once a pass.
const fairShare = 64

type shard struct {
	mu    sync.Mutex
	subs  map[store.Key][]*sub // the open streams by workload
	all   []*sub               // the same, in one slice (sub.at is the index)
	dirty map[store.Key]struct{}
	fresh []*sub        // streams still to send their first state
	later []*sub        // streams past their namespace's fair share of a pass
	wake  chan struct{} // capacity 1: a pass is due
	// keyTenant is the namespace of a workload's streams (sub.tenant), or
	// severalTenants. alone is the namespace of the pass under way when
	// it is that namespace's alone ("" otherwise), othersArrived whether
	// a stream of another came new, or a workload of another's changed,
	// since that pass began (othersWaiting).
	keyTenant     map[store.Key]string
	alone         string
	othersArrived bool

	// triggers holds each trigger of the open streams once (mu), by its
	// hash (seed; those of one hash chained by shared.next): the streams
	// of one trigger (the same workload and metadata) share it. Keyed by
	// the Trigger itself, past the 128 bytes a Go map keeps in place, the
	// map held a copy of each on the heap (288 bytes a trigger).
	triggers map[uint64]*shared
	seed     maphash.Seed

	// Owned by the shard's goroutine.
	batch []*sub
	share map[string]int // evaluations a namespace had in this pass
	pass  uint64         // stamps this pass's evaluations and counts (shared)
}

// outcome is one evaluation's answer, for the streams of the same trigger.
type outcome struct {
	active bool
	err    error
}

// shared is what the streams of one trigger in a shard share: the
// trigger's evaluation in a pass, made once for all of them, and whether
// the pass has counted it against its namespace's share. Interned when a
// stream opens, so that a pass keys nothing by the trigger: a Trigger is
// past the 128 bytes a Go map keeps in place, and a map keyed by it copied
// each key it took onto the heap (the pass's memo allocated about 240
// bytes an evaluation, an eighth of all the aggregator allocated at
// 2,000 nodes × 8 pods) and hashed the whole struct at each lookup.
type shared struct {
	// t is the trigger, held here once for its streams (a copy in each
	// stream took 280 bytes a stream); hash is its key in
	// shard.triggers, next the trigger after it there of the same hash.
	t       Trigger
	hash    uint64
	next    *shared
	streams int // open streams holding it (shard.mu)

	// Owned by the shard's goroutine.
	evaluated uint64 // the pass whose evaluation o is (0: none)
	o         outcome
	counted   uint64 // the pass that counted it against a share
}

// sub is one open StreamIsActive stream.
type sub struct {
	shared *shared // its trigger's, in its shard (shared.t)
	// tenant: the ScaledObject's namespace, whose fair share the stream
	// takes (a trigger allowed to read another namespace, with
	// --allow-cross-namespace-triggers, takes its own tenant's, not the
	// namespace it reads).
	tenant string
	at     int // index in shard.all; -1 once removed
	atW    int // index in shard.subs[t.Workload]

	// Owned by the shard's goroutine.
	sent, last bool      // whether a state was handed over, and which
	evaluated  time.Time // the last evaluation
	queued     bool      // in the shard's batch of this pass

	// The hand-over to the stream's handler: the newest state, and a wake
	// signal (capacity 1: its place's wake, which the handler waits on).
	mu    sync.Mutex
	state bool
	ready chan struct{}
	// Owned by the handler (under mu): whether it took a state to send,
	// and which.
	handed, handedState bool
}

func newPusher(s *Server) *pusher {
	p := &pusher{s: s, seed: maphash.MakeSeed()}
	n := min(max(runtime.GOMAXPROCS(0), 1), maxShards)
	for range n {
		p.shards = append(p.shards, &shard{subs: map[store.Key][]*sub{}, dirty: map[store.Key]struct{}{}, wake: make(chan struct{}, 1),
			share: map[string]int{}, triggers: map[uint64]*shared{}, seed: p.seed, keyTenant: map[store.Key]string{}})
	}
	return p
}

// start runs the shards' goroutines (at the first stream: a Server that never
// streams, as pulse-sim's, runs none) and has the store tell of changes.
func (p *pusher) start() {
	p.once.Do(func() {
		p.s.store.OnChange(p.changed)
		for _, sh := range p.shards {
			p.wg.Add(1)
			go p.run(sh)
		}
	})
}

func (p *pusher) shard(k store.Key) *shard {
	if len(p.shards) == 1 {
		return p.shards[0]
	}
	return p.shards[maphash.Comparable(p.seed, k)%uint64(len(p.shards))]
}

// changed marks workload k changed; the store calls it under its write lock.
func (p *pusher) changed(k store.Key) {
	sh := p.shard(k)
	sh.mu.Lock()
	if _, watched := sh.subs[k]; watched {
		if _, again := sh.dirty[k]; !again {
			sh.waiting(sh.keyTenant[k])
		}
		sh.dirty[k] = struct{}{}
		sh.signal()
	}
	sh.mu.Unlock()
}

// severalTenants is keyTenant's value for a workload whose streams are of
// more than one namespace (a namespace's name has no NUL).
const severalTenants = "\x00"

// waiting notes that a stream of tenant waits for a pass (new, or of a
// workload changed). Called with sh.mu held.
func (sh *shard) waiting(tenant string) {
	if sh.alone != "" && tenant != sh.alone {
		sh.othersArrived = true
	}
}

func (sh *shard) signal() {
	select {
	case sh.wake <- struct{}{}:
	default:
	}
}

// add registers a stream, woken by a signal on ready (capacity 1) when a
// state is handed over; its first state is sent at the shard's next pass.
func (p *pusher) add(t Trigger, tenant string, ready chan struct{}) *sub {
	p.start()
	if tenant == "" {
		tenant = t.Workload.Namespace
	}
	u := &sub{tenant: tenant, ready: ready}
	sh := p.shard(t.Workload)
	sh.mu.Lock()
	sh.open(u, t)
	sh.signal()
	sh.mu.Unlock()
	return u
}

// open registers u in the shard, its first state due, sharing its
// trigger's evaluation with the other streams of the trigger. Called with
// sh.mu held.
func (sh *shard) open(u *sub, t Trigger) {
	h := triggerHash(sh.seed, t)
	first := sh.triggers[h]
	u.shared = first
	for u.shared != nil && u.shared.t != t {
		u.shared = u.shared.next
	}
	if u.shared == nil {
		u.shared = &shared{t: t, hash: h, next: first}
		sh.triggers[h] = u.shared
	}
	u.shared.streams++
	u.at = len(sh.all)
	sh.all = append(sh.all, u)
	k := t.Workload
	u.atW = len(sh.subs[k])
	sh.subs[k] = append(sh.subs[k], u)
	switch kt, ok := sh.keyTenant[k]; {
	case !ok:
		sh.keyTenant[k] = u.tenant
	case kt != u.tenant:
		sh.keyTenant[k] = severalTenants // until its streams are all gone
	}
	sh.fresh = append(sh.fresh, u)
	sh.waiting(u.tenant)
}

// triggerHash is t's key in shard.triggers (a variable: a test has every
// trigger collide).
var triggerHash = maphash.Comparable[Trigger]

// forget takes x, which no stream holds now, out of sh.triggers.
func (sh *shard) forget(x *shared) {
	at := sh.triggers[x.hash]
	if at == x {
		if x.next == nil {
			delete(sh.triggers, x.hash)
		} else {
			sh.triggers[x.hash] = x.next
		}
		return
	}
	for at.next != x {
		at = at.next
	}
	at.next = x.next
}

// remove unregisters a stream (its handler has returned or is returning)
// in constant time: KEDA restarting ends every stream at once, and a
// remove that looked for its stream in its workload's list took time in
// the number of streams of the workload, under the shard's lock (20,000
// streams of one workload: about 2·10⁸ comparisons). A stream still among
// the new or postponed ones is dropped by the next pass, signalled here.
func (p *pusher) remove(u *sub) {
	k := u.shared.t.Workload
	sh := p.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	swapRemove(&sh.all, u.at, func(v *sub, i int) { v.at = i })
	u.at = -1
	if u.shared.streams--; u.shared.streams == 0 {
		sh.forget(u.shared)
	}
	rest := sh.subs[k]
	swapRemove(&rest, u.atW, func(v *sub, i int) { v.atW = i })
	if len(rest) == 0 {
		delete(sh.subs, k)
		delete(sh.dirty, k)
		delete(sh.keyTenant, k)
	} else {
		sh.subs[k] = rest
	}
	if len(sh.fresh) > 0 || len(sh.later) > 0 {
		sh.signal()
	}
}

// swapRemove removes (*us)[i], moving the last stream into its place and
// telling it its new index.
func swapRemove(us *[]*sub, i int, moved func(*sub, int)) {
	s := *us
	last := s[len(s)-1]
	s[i] = last
	moved(last, i)
	s[len(s)-1] = nil
	*us = s[:len(s)-1]
}

// run passes over the shard's streams when a workload changed (the first
// change after a quiet minGap at once, later ones at most every minGap: the
// changes between are one evaluation) and every quarter recheck period for
// the streams no change woke.
func (p *pusher) run(sh *shard) {
	defer p.wg.Done()
	scan := time.NewTicker(max(p.s.recheck/4, time.Millisecond))
	defer scan.Stop()
	gap := time.NewTimer(0)
	defer gap.Stop()
	var last time.Time // the last pass
	for {
		rechecks := false
		select {
		case <-p.s.done:
			return
		case <-sh.wake:
			if wait := p.s.minGap - time.Since(last); wait > 0 {
				gap.Reset(wait)
				select {
				case <-p.s.done:
					return
				case <-gap.C:
				}
			}
		case <-scan.C:
			rechecks = true
		}
		last = time.Now()
		p.pass(sh, last, rechecks)
	}
}

// pass evaluates the streams left over from the last pass, then those of
// the workloads changed since it and the new streams; with rechecks (every
// quarter recheck period, not at every pass: a pass comes every few
// milliseconds on a fleet), also those not evaluated for a recheck period.
// With streams of more than one namespace in the pass, past a namespace's
// fair share its streams wait for the next pass, which comes at once.
func (p *pusher) pass(sh *shard, now time.Time, rechecks bool) {
	sh.mu.Lock()
	b := sh.batch[:0]
	take := func(u *sub) {
		if !u.queued && u.at >= 0 { // not removed since it was listed
			u.queued = true
			b = append(b, u)
		}
	}
	for _, u := range sh.later {
		take(u)
	}
	clear(sh.later) // a stream gone since holds its trigger no longer
	sh.later = sh.later[:0]
	for _, u := range sh.fresh {
		take(u)
	}
	clear(sh.fresh)
	sh.fresh = sh.fresh[:0]
	for k := range sh.dirty {
		for _, u := range sh.subs[k] {
			take(u)
		}
	}
	clear(sh.dirty)
	if rechecks {
		due := now.Add(-p.s.recheck)
		for _, u := range sh.all {
			if !u.evaluated.After(due) {
				take(u)
			}
		}
	}
	// Alone, a namespace takes the pass, until another's stream waits
	// (looked at every yieldEvery evaluations past its fair share: the
	// rest of the pass then waits for the next, as below).
	several := severalNamespaces(b)
	if several {
		b = sh.fairShares(b)
	}
	if len(sh.later) > 0 {
		sh.signal()
	}
	alone, tenant := len(b) > 0 && !several, ""
	if alone {
		tenant = b[0].tenant
	}
	sh.alone, sh.othersArrived = tenant, false
	sh.mu.Unlock()
	sh.pass++
	for i, u := range b {
		if i > 0 && i%yieldEvery == 0 {
			runtime.Gosched()
			if alone && i >= fairShare && sh.othersWaiting() {
				sh.postpone(b[i:])
				break
			}
		}
		u.queued = false
		p.evaluate(u, sh.pass)
		b[i] = nil
		if p.evaluated != nil {
			p.evaluated(i)
		}
	}
	sh.batch = b[:0]
}

// othersWaiting is whether another namespace than the one alone in this
// pass has streams waiting for a pass (new, or of a workload changed since
// this pass began): a namespace alone in a pass takes it whole only while
// no one else waits. Noted as they come (waiting), in constant time: it
// walked every stream of every workload changed, under the lock the
// store's writes wait on, every yieldEvery evaluations, and a namespace of
// 10,000 streams on one workload changing made its passes quadratic:
// 22–24 ms a pass, 0.8–1.0 ms now (BenchmarkPushPassAloneWhileItChanges).
// A stream new and gone since is still counted: the rest of the pass then
// waits for the next, which comes at once.
func (sh *shard) othersWaiting() bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.othersArrived
}

// postpone hands the rest of a pass to the next (taken first, with the
// others' turn), which is due at once.
func (sh *shard) postpone(rest []*sub) {
	sh.mu.Lock()
	for i, u := range rest {
		u.queued = false
		sh.later = append(sh.later, u)
		rest[i] = nil
	}
	sh.signal()
	sh.mu.Unlock()
}

// severalNamespaces is whether the streams of b are of more than one
// namespace.
func severalNamespaces(b []*sub) bool {
	for _, u := range b {
		if u.tenant != b[0].tenant {
			return true
		}
	}
	return false
}

// fairShares keeps of b, in order, each namespace's streams up to its fair
// share of distinct triggers (the streams of a trigger kept share its
// evaluation); the rest wait in sh.later, taken first next pass. Called
// with sh.mu held.
func (sh *shard) fairShares(b []*sub) []*sub {
	clear(sh.share)
	sh.pass++
	n := 0
	for _, u := range b {
		if u.shared.counted != sh.pass {
			if sh.share[u.tenant] >= fairShare {
				u.queued = false
				sh.later = append(sh.later, u)
				continue
			}
			sh.share[u.tenant]++
			u.shared.counted = sh.pass
		}
		b[n] = u
		n++
	}
	return b[:n]
}

// evaluate hands a stream's state to its handler when it changed (or was
// never sent). An evaluation that fails (stale, warming up) hands nothing:
// KEDA's polls see the error.
// Streams of one trigger share its evaluation in pass.
func (p *pusher) evaluate(u *sub, pass uint64) {
	u.evaluated = time.Now()
	sh := u.shared
	if sh.evaluated != pass {
		d, err := p.s.Evaluate(sh.t)
		sh.evaluated, sh.o = pass, outcome{active: d.Active, err: err}
	}
	o := sh.o
	if o.err != nil || (u.sent && o.active == u.last) {
		return
	}
	u.sent, u.last = true, o.active
	p.handed.Add(1)
	u.mu.Lock()
	u.state = o.active
	u.mu.Unlock()
	select {
	case u.ready <- struct{}{}:
	default: // the handler has not taken the last one yet: it takes this
	}
}

// next is the newest state handed over, and whether it is other than the
// last the handler sent (states handed over and replaced before it woke,
// false then true again, send nothing: KEDA asks for a scale at each true).
func (u *sub) next() (state, send bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.handed && u.state == u.handedState {
		return u.state, false
	}
	u.handed, u.handedState = true, u.state
	return u.state, true
}
