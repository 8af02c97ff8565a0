package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/framed"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/procs"
)

// namespace holds every simulated workload.
const namespace = "fleet"

// Queue lengths the simulated pods report: steady workloads hold
// steadyWaiting requests per pod; a probe's pods hold 0, then probeHigh for
// probeHalf, then 0 for probeHalf, and so on. probeHalf is longer than the
// trigger's default 10 s window, so that a probe really falls to inactive
// before it rises again.
const (
	steadyWaiting = 3
	probeHigh     = 20
	probeHalf     = 15 * time.Second
)

// pod is one simulated vLLM pod as an agent lists it.
type pod struct {
	id          uint32
	uid, name   string
	workload    int
	ready       bool
	terminating bool
	readyAt     time.Time // not Ready until then (model load)
	owners      int       // more owners listed beside its workload (a hostile pod)
	removeAt    time.Time // terminating: removed from the catalogue then
}

// simAgent is one node's agent: one gRPC connection and one Ingest stream,
// as pkg/agent holds it.
type simAgent struct {
	f    *fleet
	idx  int
	node string
	addr string // what it dials: the aggregator, or the partition proxy

	mu       sync.Mutex
	pods     map[uint32]*pod
	nextID   uint32
	dirty    bool                        // the catalogue changed since it was last sent
	sent     map[uint32]discovery.Target // the catalogue last sent; nil: send it whole
	malform  bool                        // send one malformed batch at the next tick
	dead     bool                        // killed: no connection until revived
	cancel   context.CancelFunc
	sessions atomic.Int64 // sessions opened (a welcome received)
	up       atomic.Bool
	lastErr  atomic.Pointer[errBox] // why the last session ended
	relay    string                 // the pulse-relay it reaches the aggregator through (--relays); empty: directly
}

// errBox holds an error of any concrete type in an atomic.Pointer.
type errBox struct{ err error }

func newSimAgent(f *fleet, idx int, addr string) *simAgent {
	return &simAgent{f: f, idx: idx, node: fmt.Sprintf("node-%05d", idx), addr: addr, pods: map[uint32]*pod{}}
}

// add lists a new pod of workload w (not Ready until readyAt).
func (a *simAgent) add(w int, readyAt time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextID++
	uid := fmt.Sprintf("%s-%d", a.node, a.nextID)
	a.pods[a.nextID] = &pod{id: a.nextID, uid: uid, name: fmt.Sprintf("w%d-%s", w, uid), workload: w,
		ready: !readyAt.After(time.Now()), readyAt: readyAt}
	a.dirty = true
}

// addOwned lists a new pod of workload w with extra more owners (each a
// workload of its own), as a hostile pod's owner references would make it.
func (a *simAgent) addOwned(w, extra int) {
	a.add(w, time.Time{})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[a.nextID].owners = extra
}

// removeWorkload removes the agent's pods of workload w (a scale-down).
func (a *simAgent) removeWorkload(w int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, p := range a.pods {
		if p.workload == w {
			delete(a.pods, id)
			a.dirty = true
		}
	}
}

// start runs the agent until ctx ends or it is killed.
func (a *simAgent) start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	a.dead, a.cancel = false, cancel
	a.mu.Unlock()
	a.f.wg.Add(1)
	go func() {
		defer a.f.wg.Done()
		a.run(ctx)
	}()
}

// kill cuts the agent off as a SIGKILL of its process would: its
// connection closes at once, nothing more is sent.
func (a *simAgent) kill() {
	a.mu.Lock()
	a.dead = true
	cancel := a.cancel
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// run dials once (gRPC reconnects the connection underneath) and runs
// sessions with the agent's backoff until ctx ends.
func (a *simAgent) run(ctx context.Context) {
	creds := insecure.NewCredentials()
	if t := a.f.agg.tls; t != nil {
		creds = credentials.NewTLS(t.client.Clone())
	}
	// Each agent from an address of its own, as each node's agent is (the
	// ingest port holds at most --max-ingest-connections-per-address from
	// one): 127.1.X.Y on the loopback.
	from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 1, byte(a.idx/250), byte(a.idx%250+1))}}
	target := a.addr
	if a.relay != "" {
		// The relays serve the agents plaintext (and reach a TLS ingest
		// port with its CA).
		target, creds = a.relay, insecure.NewCredentials()
	}
	var client pulsev1.IngestClient
	if a.f.o.transport != agent.TransportFramed || a.relay != "" {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return from.DialContext(ctx, "tcp", addr) }),
			grpc.WithKeepaliveParams(agent.ClientKeepalive),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
				BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
				MinConnectTimeout: 2 * time.Second}))
		if err != nil {
			a.f.errorf("agent-dial", "agent %s: %v", a.node, err)
			return
		}
		defer func() { _ = conn.Close() }()
		client = pulsev1.NewIngestClient(conn)
	}
	if a.f.o.transport == agent.TransportFramed || a.f.o.transport == agent.TransportAuto && a.relay == "" {
		// As the agent's framed transport: a connection each stream (auto:
		// gRPC's, made at its first stream, for an aggregator that does not
		// speak it).
		o := framed.ClientOptions{Fallback: client, Dial: from.DialContext}
		if t := a.f.agg.tls; t != nil {
			o.TLS = t.client.Clone()
		}
		c, err := framed.NewClient(target, o)
		if err != nil {
			a.f.errorf("agent-dial", "agent %s: %v", a.node, err)
			return
		}
		client = c
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := a.session(ctx, client)
		a.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		a.lastErr.Store(&errBox{err})
		a.f.streamEnded("agent", err)
		if time.Since(start) > 10*time.Second {
			delay = 100 * time.Millisecond
		}
		if !procs.Sleep(ctx, time.Duration(rand.Int64N(int64(delay))+1)) {
			return
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// open opens a stream and makes its hello and welcome.
func (a *simAgent) open(ctx context.Context, client pulsev1.IngestClient) (grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage], error) {
	stream, err := client.Report(ctx)
	if err != nil {
		return nil, fmt.Errorf("open stream: %w", err)
	}
	if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{
		Node: a.node, AgentVersion: "fleet", AgentInstance: fmt.Sprintf("%s-%d", a.node, time.Now().UnixNano()),
		ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1, AckEveryMs: uint32(agent.AckEvery.Milliseconds())}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	// io.EOF: the aggregator ended the stream, and its status is Recv's.
	welcome, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("receive welcome: %w", err)
	}
	if welcome.GetWelcome() == nil {
		return nil, errors.New("no welcome")
	}
	return stream, nil
}

// session is one stream: hello, welcome, the full catalogue, then a batch
// of every listed pod at each tick, at the agent's own phase in the
// interval (agents are not synchronised).
func (a *simAgent) session(ctx context.Context, client pulsev1.IngestClient) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if a.relay != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, relay.UpstreamKey, a.addr)
	}
	stream, err := a.open(ctx, client)
	if err != nil {
		return err
	}
	a.sessions.Add(1)
	a.up.Store(true)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				cancel(fmt.Errorf("receive: %w", err))
				return
			}
		}
	}()
	enc := wire.NewEncoder()
	a.mu.Lock()
	a.sent = nil
	a.mu.Unlock()
	var seq uint64
	lastSent := time.Now() // when a batch was last sent
	phase := time.Duration(int64(a.f.o.interval) * int64(a.idx) / int64(a.f.o.agents))
	next := a.f.epoch.Add(phase)
	for {
		now := time.Now()
		for !next.After(now) {
			next = next.Add(a.f.o.interval)
		}
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		cat, batch, rise := a.tick(enc, next)
		if cat != nil {
			if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: cat}}); err != nil {
				return agent.SendFailed(ctx, fmt.Errorf("send catalogue: %w", err))
			}
		}
		if batch == nil {
			if time.Since(lastSent) < agent.HeartbeatEvery {
				continue
			}
			// As the agent: an empty batch when no ready pod has sent one
			// for its heartbeat's interval. Churn leaves some agents with
			// none for minutes, whose framed connections the aggregator
			// ended after a minute of silence (gRPC's keepalive held them).
			batch = &pulsev1.SampleBatch{TimeUnixMs: next.UnixMilli()}
		}
		lastSent = time.Now()
		seq++
		batch.Seq = seq
		for _, w := range rise {
			a.f.probeRise(w, next)
		}
		if err := stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: batch}}); err != nil {
			return agent.SendFailed(ctx, fmt.Errorf("send batch: %w", err))
		}
		a.f.sent.Add(int64(len(batch.Pods) + len(batch.Missing)))
	}
}

// tick advances the pods' states to now and returns the catalogue change
// to send (nil: none), the batch, and the probe workloads this batch
// raises.
func (a *simAgent) tick(enc *wire.Encoder, now time.Time) (*pulsev1.Catalogue, *pulsev1.SampleBatch, []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, p := range a.pods {
		if p.terminating && !now.Before(p.removeAt) {
			delete(a.pods, id)
			a.dirty = true
		} else if !p.ready && !p.terminating && !now.Before(p.readyAt) {
			p.ready = true
			a.dirty = true
		}
	}
	var cat *pulsev1.Catalogue
	if a.sent == nil || a.dirty {
		current := make(map[uint32]discovery.Target, len(a.pods))
		for id, p := range a.pods {
			t := discovery.Target{UID: p.uid, Namespace: namespace, Pod: p.name, Ready: p.ready, Terminating: p.terminating,
				Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, Name: workloadName(p.workload)}}}
			for i := range p.owners {
				t.Workloads = append(t.Workloads, discovery.Workload{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, Name: fmt.Sprintf("%s-owner-%d", p.name, i)})
			}
			current[id] = t
		}
		cat = agent.DiffCatalogue(a.sent, current, a.sent == nil)
		for _, id := range cat.Remove {
			enc.Forget(id) // ids are never reused, so a removal is the only reset
		}
		a.sent, a.dirty = current, false
	}
	b := &pulsev1.SampleBatch{TimeUnixMs: now.UnixMilli()}
	if a.malform {
		// A batch whose values do not match its present bitmaps: the
		// aggregator must end this stream and nothing else.
		a.malform = false
		for id := range a.pods {
			b.Pods = append(b.Pods, id)
			b.OffsetsMs = append(b.OffsetsMs, 0)
			b.PresentXor = append(b.PresentXor, 0b110)
		}
		return cat, b, nil
	}
	tick := now.Sub(a.f.epoch) / a.f.o.interval
	var rise []int
	high := a.f.probeHigh(now)
	for id, p := range a.pods {
		if !p.ready {
			continue // listed, not scraped: the agent sends nothing for it
		}
		s := wire.Sample{Pod: id}
		waiting := float64(steadyWaiting)
		if a.f.isProbe(p.workload) {
			waiting = 0
			if high {
				waiting = probeHigh
				rise = append(rise, p.workload)
			}
		}
		a.f.values(&s.Values, int64(tick), int64(p.id), waiting)
		enc.Append(b, &s)
	}
	if len(b.Pods) == 0 {
		return cat, nil, nil
	}
	return cat, b, rise
}

// values fills the standard vLLM set, as the agent extracts it: the queue
// (held at waiting: the fault scenarios check the answers against it), the
// running requests and KV cache moving at every tick, and counters growing
// by a different increase at every tick (half to one and a half times their
// rate). A page whose values did not move, or whose counters grew by the
// same amount each tick, cost the wire one byte a value (its predictions,
// the last value and the last increase, exact) and the store its cheapest
// deltas: the cost measured would be the least there is.
func (f *fleet) values(v *metric.Values, tick, salt int64, waiting float64) {
	v.Set(metric.Waiting, waiting)
	v.Set(metric.Running, math.Floor(4+8*wobble(tick, salt, 1)))
	v.Set(metric.KVCacheUsage, math.Round((0.3+0.4*wobble(tick, salt, 2))*1e4)/1e4)
	c := func(k uint64, rate float64) float64 { // cumulative, never falling
		return math.Floor(rate*float64(tick) + rate/2*wobble(tick, salt, k))
	}
	ms := func(k uint64, rate float64) float64 { // a latency sum, in ms
		return c(k, 1000*rate) / 1000
	}
	v.Set(metric.PrefixHits, c(3, 700)+float64(salt))
	v.Set(metric.PrefixQueries, c(4, 1000)+float64(salt))
	v.Set(metric.PromptTokens, c(5, 1200))
	v.Set(metric.GenerationTokens, c(6, 300))
	v.Set(metric.RequestSuccess, c(7, 4))
	v.Set(metric.Preemptions, float64(tick/600))
	v.Set(metric.TTFTSum, ms(8, 0.8))
	v.Set(metric.TTFTCount, c(9, 4))
	v.Set(metric.QueueTimeSum, ms(10, 0.1))
	v.Set(metric.QueueTimeCount, c(11, 4))
	v.Set(metric.E2ELatencySum, ms(12, 20))
	v.Set(metric.E2ELatencyCount, c(13, 4))
	v.Set(metric.ITLSum, ms(14, 15))
	v.Set(metric.ITLCount, c(15, 300))
}

// wobble is a value in [0, 1) of (tick, salt, k), the same at every call
// (a run is reproducible) and unlike its neighbours.
func wobble(tick, salt int64, k uint64) float64 {
	x := uint64(tick)*0x9E3779B97F4A7C15 ^ uint64(salt)*0xBF58476D1CE4E5B9 ^ k*0x94D049BB133111EB
	x ^= x >> 31
	x *= 0xD6E8FEB86659FD93
	x ^= x >> 32
	return float64(x>>11) / (1 << 53)
}

func workloadName(w int) string { return fmt.Sprintf("w%d", w) }

// churn applies pod events at rate per second across the fleet until ctx
// ends: a pod restarts (a new uid on the same agent), moves (terminates
// here, a new pod of its workload appears on another agent), or goes
// not-Ready for loadTime. New pods load for loadTime before they are Ready.
func (f *fleet) churn(ctx context.Context, rate float64) {
	if rate <= 0 {
		return
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for {
		d := time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if !procs.Sleep(ctx, d) {
			return
		}
		if f.churnPaused.Load() {
			continue
		}
		a := f.agents[rng.IntN(len(f.agents))]
		now := time.Now()
		a.mu.Lock()
		var victim *pod
		for _, p := range a.pods { // map order: random enough
			if !p.terminating {
				victim = p
				break
			}
		}
		if victim == nil {
			a.mu.Unlock()
			continue
		}
		kind := rng.IntN(3)
		switch kind {
		case 0, 1: // restart, move: this pod terminates
			victim.terminating, victim.ready, victim.removeAt = true, false, now.Add(f.o.interval)
		case 2: // not Ready for a while
			victim.ready, victim.readyAt = false, now.Add(f.o.loadTime)
		}
		a.dirty = true
		w := victim.workload
		a.mu.Unlock()
		switch kind {
		case 0:
			a.add(w, now.Add(f.o.loadTime))
		case 1:
			f.agents[rng.IntN(len(f.agents))].add(w, now.Add(f.o.loadTime))
		}
		f.churned.Add(1)
	}
}
