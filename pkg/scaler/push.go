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
// and metadata) taken in a pass share one evaluation (takeShare).
const fairShare = 64

type shard struct {
	mu    sync.Mutex
	subs  map[store.Key][]*sub // the open streams by workload
	all   []*sub               // the same, in one slice (sub.at is the index)
	dirty map[store.Key]struct{}
	// queues holds by namespace (sub.tenant) the streams that wait for a
	// pass (sub.pending), in the order they came: new, of a workload
	// changed since, due a recheck, or past their namespace's fair share
	// of a pass. A workload's idle streams wait for nothing
	// (watched[k].idle[u.atI] == u). A stream is in one or the other, so
	// a pass walks no stream it does not evaluate (but those gone, once,
	// and every one at a recheck): with the streams past a fair share kept
	// in one list, and a changed workload's taken whole at every pass, a
	// pass shared with another namespace walked all of one namespace's N
	// streams under the lock the store's writes wait on, to evaluate 64 of
	// them (O(N) a pass, N/64 passes; docs/performance.md).
	// waiters counts the streams in queues, gone ones not yet taken out
	// included.
	queues    map[string]*queue
	waiters   int
	spare     []*queue               // emptied, for the next namespace's (drop)
	spareRoom int                    // their capacity in all
	watched   map[store.Key]*watched // the workloads of the open streams
	wake      chan struct{}          // capacity 1: a pass is due
	// alone is the namespace of the pass under way when it is that
	// namespace's alone ("" otherwise), othersArrived whether a stream of
	// another came new, or a workload of another's changed, since that
	// pass began (othersWaiting).
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
	pass  uint64 // stamps this pass's evaluations and counts (shared)
}

// watched is a workload with open streams: the namespace of its streams
// (sub.tenant), or severalTenants, and those of them that wait for no
// pass.
type watched struct {
	tenant string
	idle   []*sub
}

// queue is a namespace's streams waiting for a pass, first in, first out.
type queue struct {
	subs []*sub
	head int
}

func (q *queue) len() int { return len(q.subs) - q.head }

func (q *queue) pop() *sub {
	u := q.subs[q.head]
	q.subs[q.head] = nil
	q.head++
	if q.head == len(q.subs) || q.head >= 1024 && 2*q.head >= len(q.subs) {
		n := copy(q.subs, q.subs[q.head:])
		clear(q.subs[n:])
		q.subs, q.head = q.subs[:n], 0
	}
	return u
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
	// w is its workload's (shard.watched), looked up once.
	w *watched

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
	// pending: in its namespace's queue; else at atI in its workload's
	// idle streams (shared.w; next to the bools below: a sub fits 112
	// bytes, a size class).
	atI     int
	pending bool

	// Owned by the shard's goroutine.
	sent, last bool      // whether a state was handed over, and which
	evaluated  time.Time // the last evaluation

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
			queues: map[string]*queue{}, watched: map[store.Key]*watched{}, triggers: map[uint64]*shared{}, seed: p.seed})
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
	if w := sh.watched[k]; w != nil {
		if _, again := sh.dirty[k]; !again {
			sh.waiting(w.tenant)
		}
		sh.dirty[k] = struct{}{}
		sh.signal()
	}
	sh.mu.Unlock()
}

// severalTenants is watched.tenant for a workload whose streams are of
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
	k := t.Workload
	if u.shared == nil {
		w := sh.watched[k]
		if w == nil {
			w = &watched{tenant: u.tenant}
			sh.watched[k] = w
		}
		u.shared = &shared{t: t, hash: h, next: first, w: w}
		sh.triggers[h] = u.shared
	}
	u.shared.streams++
	u.at = len(sh.all)
	sh.all = append(sh.all, u)
	u.atW = len(sh.subs[k])
	sh.subs[k] = append(sh.subs[k], u)
	if w := u.shared.w; w.tenant != u.tenant {
		w.tenant = severalTenants // until its streams are all gone
	}
	sh.push(u)
	sh.waiting(u.tenant)
}

// enqueue puts u, open, at the end of its namespace's queue, unless it is
// there already. Called with sh.mu held.
func (sh *shard) enqueue(u *sub) {
	if !u.pending {
		sh.leaveIdle(u)
		sh.push(u)
	}
}

// push puts u, new or out of idle, at the end of its namespace's queue.
// Called with sh.mu held.
func (sh *shard) push(u *sub) {
	u.pending = true
	q := sh.queueOf(u.tenant)
	q.subs = append(q.subs, u)
	sh.waiters++
}

// pushAll pushes us, out of idle, all of namespace tenant's if it is one
// (a workload's, watched.tenant), else each to its own. Called with sh.mu
// held.
func (sh *shard) pushAll(us []*sub, tenant string) {
	if tenant == severalTenants {
		for _, u := range us {
			sh.push(u)
		}
		return
	}
	for _, u := range us {
		u.pending = true
	}
	q := sh.queueOf(tenant)
	q.subs = append(q.subs, us...)
	sh.waiters += len(us)
}

// queueOf is namespace ns's queue, made (or a spare one taken) if it has
// none. Called with sh.mu held.
func (sh *shard) queueOf(ns string) *queue {
	q := sh.queues[ns]
	if q == nil {
		q = &queue{}
		if n := len(sh.spare); n > 0 {
			q, sh.spare[n-1] = sh.spare[n-1], nil
			sh.spare = sh.spare[:n-1]
			sh.spareRoom -= cap(q.subs)
		}
		sh.queues[ns] = q
	}
	return q
}

// leaveIdle takes u, idle, out of its workload's idle streams. Called with
// sh.mu held.
func (sh *shard) leaveIdle(u *sub) {
	w := u.shared.w
	swapRemove(&w.idle, u.atI, func(v *sub, i int) { v.atI = i })
}

// drop takes namespace ns's queue, empty, out of sh.queues, kept for the
// next namespace's (a pass empties a namespace's queue and another fills
// it again, often). Called with sh.mu held.
func (sh *shard) drop(ns string, q *queue) {
	delete(sh.queues, ns)
	clear(q.subs)
	q.subs, q.head = q.subs[:0], 0
	// At most room for twice the shard's streams kept spare (a slice
	// grown by append has up to twice its length), in 16 queues.
	if len(sh.spare) < 16 && sh.spareRoom+cap(q.subs) <= 2*len(sh.all) {
		sh.spare = append(sh.spare, q)
		sh.spareRoom += cap(q.subs)
	}
}

// take takes the first stream of q out of it, idle from now, or nil if it
// is gone. Called with sh.mu held.
func (sh *shard) take(q *queue) *sub {
	u := q.pop()
	sh.waiters--
	u.pending = false
	if u.at < 0 {
		return nil
	}
	w := u.shared.w
	u.atI = len(w.idle)
	w.idle = append(w.idle, u)
	return u
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
// its namespace's queue is dropped by the next pass, signalled here.
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
	if !u.pending {
		sh.leaveIdle(u)
	}
	rest := sh.subs[k]
	swapRemove(&rest, u.atW, func(v *sub, i int) { v.atW = i })
	if len(rest) == 0 {
		delete(sh.subs, k)
		delete(sh.dirty, k)
		delete(sh.watched, k)
	} else {
		sh.subs[k] = rest
	}
	if sh.waiters > 0 {
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

// pass evaluates the streams waiting (left over from the last pass, of
// the workloads changed since it, new); with rechecks (every quarter
// recheck period, not at every pass: a pass comes every few milliseconds
// on a fleet), also those not evaluated for a recheck period. With streams
// of more than one namespace waiting, a namespace's past its fair share
// wait for the next pass, which comes at once.
func (p *pusher) pass(sh *shard, now time.Time, rechecks bool) {
	sh.mu.Lock()
	for k := range sh.dirty {
		// Its idle streams, those evaluated since they last waited: the
		// rest wait already.
		if w := sh.watched[k]; w != nil {
			sh.pushAll(w.idle, w.tenant)
			clear(w.idle)
			w.idle = w.idle[:0]
		}
	}
	clear(sh.dirty)
	if rechecks {
		due := now.Add(-p.s.recheck)
		for _, u := range sh.all {
			if !u.evaluated.After(due) {
				sh.enqueue(u)
			}
		}
	}
	sh.pass++
	// The streams gone at the front of each queue are dropped first: a
	// queue of nothing but gone streams kept the namespace of another
	// from being alone in the pass.
	for ns, q := range sh.queues {
		for q.len() > 0 && q.subs[q.head].at < 0 {
			sh.take(q)
		}
		if q.len() == 0 {
			sh.drop(ns, q)
		}
	}
	// Alone, a namespace takes the pass, until another's stream waits
	// (looked at every yieldEvery evaluations past its fair share: the
	// rest of the pass then waits for the next, as below).
	alone, tenant := len(sh.queues) == 1, ""
	b := sh.batch[:0]
	for ns, q := range sh.queues {
		tenant = ns
		b = sh.takeShare(q, b, alone)
		if q.len() == 0 {
			sh.drop(ns, q)
		}
	}
	if sh.waiters > 0 {
		sh.signal()
	}
	if !alone || len(b) == 0 {
		tenant = ""
	}
	sh.alone, sh.othersArrived = tenant, false
	sh.mu.Unlock()
	for i, u := range b {
		if i > 0 && i%yieldEvery == 0 {
			runtime.Gosched()
			if tenant != "" && i >= fairShare && sh.othersWaiting() {
				sh.postpone(b[i:])
				break
			}
		}
		p.evaluate(u, sh.pass)
		b[i] = nil
		if p.evaluated != nil {
			p.evaluated(i)
		}
	}
	sh.batch = b[:0]
}

// takeShare appends to b, in order, q's streams up to its namespace's fair
// share of distinct triggers in this pass (the streams of a trigger taken
// share its evaluation), or, alone, all of them. A stream of a trigger
// taken that waits behind the share's end waits for the next pass, which
// evaluates its trigger again (the pass walks no further into the queue).
// Called with sh.mu held.
func (sh *shard) takeShare(q *queue, b []*sub, alone bool) []*sub {
	share := 0
	for q.len() > 0 {
		if u := q.subs[q.head]; u.at >= 0 && u.shared.counted != sh.pass {
			if !alone && share == fairShare {
				break
			}
			share++
			u.shared.counted = sh.pass
		}
		if u := sh.take(q); u != nil {
			b = append(b, u)
		}
	}
	return b
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

// postpone hands the rest of a pass, of the one namespace alone in it, to
// the next: first in that namespace's queue, which takes its fair share
// beside the others' at once.
func (sh *shard) postpone(rest []*sub) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var behind []*sub // come since the pass began
	if q := sh.queues[rest[0].tenant]; q != nil {
		behind = q.subs[q.head:]
		sh.waiters -= len(behind)
		delete(sh.queues, rest[0].tenant)
	}
	for i, u := range rest {
		if u.at >= 0 && !u.pending {
			sh.enqueue(u)
		}
		rest[i] = nil
	}
	for _, u := range behind {
		if u.pending = false; u.at >= 0 {
			sh.push(u)
		} // else gone: dropped
	}
	sh.signal()
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
