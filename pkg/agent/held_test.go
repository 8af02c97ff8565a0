package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// TestHeldResultsAreBounded: while an aggregator was unreachable every pod
// ever scraped kept a held result, deleted pods' included (autoscaling's
// churn grew them for the outage's length, per replica); and a result held
// from before a clock step was sent with an offset past the wire's int32
// milliseconds. Pods no longer listed lose their held results, and results
// older than maxHeldMs before a batch's newest are not sent.
func TestHeldResultsAreBounded(t *testing.T) {
	s := newStreamer(nil, "127.0.0.1:1", "", nil)
	for _, uid := range []string{"a", "b", "gone"} {
		s.offer(result{uid: uid, timeMs: 1_000_000})
	}
	s.prune(map[string]bool{"a": true, "b": true})
	if _, held := s.pending["gone"]; held || len(s.pending) != 2 {
		t.Fatalf("held after the pod went: %v", s.pending)
	}
	// a: held from 30 days before (a clock stepped forward since); b: now.
	now := int64(1_800_000_000_000)
	s.offer(result{uid: "a", timeMs: now - 30*24*3600*1000})
	s.offer(result{uid: "b", timeMs: now})
	b := s.batch(map[string]uint32{"a": 1, "b": 2}, wire.NewEncoder())
	if b == nil || b.TimeUnixMs != now {
		t.Fatalf("batch %+v: want b's result alone, at its time", b)
	}
	if n := len(b.Pods); n != 1 || b.Pods[0] != 2 {
		t.Fatalf("batch of pods %v: want pod 2 alone", b.Pods)
	}
}

// silentAggregator answers a stream's hello with a welcome, or not, and
// acknowledges nothing.
type silentAggregator struct {
	pulsev1.UnimplementedIngestServer
	welcome bool
}

func (f *silentAggregator) Report(stream pulsev1.Ingest_ReportServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if f.welcome {
		if err := stream.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{}}}); err != nil {
			return err
		}
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
}

// TestAStuckAggregatorEndsTheStream: a replica whose handler is stuck
// before its welcome, or that takes batches and acknowledges none, held
// the agent's stream for ever (gRPC's transport still answers the
// keepalives), in silence. Past welcomeWait without a welcome, or
// ackDeadline without an ack of batches sent, the session ends with the
// reason, and the agent reconnects.
func TestAStuckAggregatorEndsTheStream(t *testing.T) {
	defer func(w, d time.Duration) { welcomeWait, ackDeadline = w, d }(welcomeWait, ackDeadline)
	welcomeWait, ackDeadline = 200*time.Millisecond, 300*time.Millisecond
	for _, c := range []struct {
		welcome bool
		says    string
	}{{false, "no welcome within"}, {true, "no batch acknowledged"}} {
		// A replica that welcomes is given time to (the dial, the
		// handshake, the hello and the welcome, within 200 ms, was a
		// race on a loaded machine): only the acks' deadline is tested.
		welcomeWait = 200 * time.Millisecond
		if c.welcome {
			welcomeWait = 30 * time.Second
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		pulsev1.RegisterIngestServer(g, &silentAggregator{welcome: c.welcome})
		go func() { _ = g.Serve(ln) }()
		a := newIdleAgent(t)
		a.SetTargets([]discovery.Target{{UID: "u1", Namespace: "ns", Pod: "p", Ready: true,
			Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}})
		s := newStreamer(a, ln.Addr().String(), "", nil)
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { // a result every 20 ms, as scrapes bring them
			for ctx.Err() == nil {
				s.offer(result{uid: "u1", timeMs: time.Now().UnixMilli()})
				time.Sleep(20 * time.Millisecond)
			}
		}()
		done := make(chan error, 1)
		go func() { done <- s.session(ctx, pulsev1.NewIngestClient(conn)) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("welcome %v: the session ended with %v, want %q", c.welcome, err, c.says)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("welcome %v: the session never ended", c.welcome)
		}
		cancel()
		_ = conn.Close()
		g.Stop()
	}
}

// TestTheCatalogueIsBoundedFairly: one tenant's routers naming 64
// workloads each (the taint toleration is the tenant's) made a catalogue
// of thousands of entries, which the aggregator refused whole at every
// reconnect, silencing every tenant of the node. The agent lists at most
// --max-pods entries, shared fairly among namespaces; the rest are left
// out, said and counted.
func TestTheCatalogueIsBoundedFairly(t *testing.T) {
	var ts []discovery.Target
	for i := range 3000 {
		ts = append(ts, discovery.Target{UID: fmt.Sprintf("router-%d/demand/w", i), Namespace: "big", Pod: fmt.Sprint("r", i)})
	}
	for i := range 5 {
		ts = append(ts, discovery.Target{UID: fmt.Sprint("small-", i), Namespace: "small", Pod: fmt.Sprint("s", i)})
	}
	a := newIdleAgent(t)
	a.SetTargets(ts)
	_, listed, _ := a.cat.snapshot()
	small := 0
	for _, tg := range listed {
		if tg.Namespace == "small" {
			small++
		}
	}
	if len(listed) != a.opts.MaxListed || small != 5 {
		t.Fatalf("%d listed, %d of the small tenant's 5; want %d and all 5", len(listed), small, a.opts.MaxListed)
	}
	if v := testutil.ToFloat64(a.m.leftOut); v != 3005-float64(a.opts.MaxListed) {
		t.Fatalf("pulse_agent_targets_left_out %v", v)
	}
	// Within the bound, all are listed.
	a.SetTargets(ts[2990:])
	if _, listed, _ := a.cat.snapshot(); len(listed) != 15 || testutil.ToFloat64(a.m.leftOut) != 0 {
		t.Fatalf("%d listed of 15", len(listed))
	}
}

// TestTheScrapeSlotsAreSharedAmongTheNamespaces: one global bound on
// scrapes at once, waited for outside the scrape's timeout, let one
// tenant's pages that accept and stall hold every slot of the node: the
// other tenants' scrapes started late and ran late. Then one namespace held
// at most half the slots, so two tenants could still hold them all, and a
// tenant alone on its node never more than half. The slots are now shared
// equally among the namespaces of the node's pods, and the wait is within
// the scrape's timeout.
func TestTheScrapeSlotsAreSharedAmongTheNamespaces(t *testing.T) {
	s := newTenantSlots(6, 6)
	take := func(ns string, wait time.Duration) (func(), bool) {
		ctx, cancel := context.WithTimeout(withTenant(context.Background(), ns), wait)
		defer cancel()
		return s.take(ctx)
	}
	// Alone on the node, a namespace takes every slot.
	s.share(1)
	var a []func()
	for i := range 6 {
		release, ok := take("a", time.Second)
		if !ok {
			t.Fatalf("namespace a alone: its slot %d of 6 refused", i+1)
		}
		a = append(a, release)
	}
	// Pods of two more namespaces come: a third each. a keeps what it
	// holds, and each slot it gives back goes to another namespace.
	s.share(3)
	if all, per := s.bounds(); all != 6 || per != 2 {
		t.Fatalf("shared among 3: %d in all, %d a namespace; want 6 and 2", all, per)
	}
	var others []func()
	for _, ns := range []string{"b", "c", "b", "c"} {
		got := make(chan func(), 1)
		go func() {
			release, _ := take(ns, 5*time.Second)
			got <- release
		}()
		if release, ok := take(ns, 20*time.Millisecond); ok {
			release()
			t.Fatalf("namespace %s took a slot while a held every one", ns)
		}
		a[len(a)-1]()
		a = a[:len(a)-1]
		release := <-got
		if release == nil {
			t.Fatalf("namespace %s: refused the slot a gave back", ns)
		}
		others = append(others, release)
		if release, ok := take("a", 20*time.Millisecond); ok {
			release()
			t.Fatalf("namespace a, holding %d of its share of 2, took another", len(a))
		}
	}
	for _, release := range append(a, others...) {
		release()
	}
	// Two stalling namespaces hold a third each; the third namespace's
	// share is free.
	var held []func()
	for _, ns := range []string{"a", "a", "b", "b"} {
		release, ok := take(ns, time.Second)
		if !ok {
			t.Fatalf("namespace %s: its share refused", ns)
		}
		held = append(held, release)
	}
	if _, ok := take("a", 20*time.Millisecond); ok {
		t.Fatal("namespace a took past its share")
	}
	for range 2 {
		release, ok := take("c", time.Second)
		if !ok {
			t.Fatal("namespace c's share refused beside a's and b's held slots")
		}
		held = append(held, release)
	}
	for _, release := range held {
		release()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.by) != 0 || len(s.all) != 0 || s.waiting != 0 {
		t.Fatalf("after every release: %d namespaces, %d slots held, %d waiting", len(s.by), len(s.all), s.waiting)
	}
}

// deafAggregator welcomes a stream and then reads nothing more: the
// stream's flow-control window fills, and the agent's Send blocks.
type deafAggregator struct {
	pulsev1.UnimplementedIngestServer
}

func (deafAggregator) Report(stream pulsev1.Ingest_ReportServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{}}}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// TestADeafAggregatorEndsTheStream: the ack deadline was checked after each
// Send returned, and a replica that stops reading (its handler stuck in a
// lookup) fills the stream's window within seconds: Send blocked until
// the stream ended, which nothing did, and the agent stayed on that
// replica for ever. The deadline now runs beside the sends.
func TestADeafAggregatorEndsTheStream(t *testing.T) {
	defer func(d time.Duration) { ackDeadline = d }(ackDeadline)
	ackDeadline = 300 * time.Millisecond
	var targets []discovery.Target
	for i := range 200 {
		targets = append(targets, discovery.Target{UID: fmt.Sprint("u", i), Namespace: "ns", Pod: fmt.Sprint("p", i), Ready: true,
			Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}})
	}
	s, client := streamTo(t, deafAggregator{}, targets)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // 200 pods' errors every 20 ms: tens of KB a batch
		for ctx.Err() == nil {
			for i := range 200 {
				s.offer(result{uid: fmt.Sprint("u", i), timeMs: time.Now().UnixMilli(), missing: pulsev1.MissingReason_MISSING_REASON_CONNECT,
					err: fmt.Sprintf("dial tcp 10.0.0.%d:8000: connect: connection refused %d %s", i, time.Now().UnixNano(), strings.Repeat("x", 150))})
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- s.session(ctx, client) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no batch acknowledged") {
			t.Fatalf("the session ended with %v, want no batch acknowledged", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session never ended: a Send blocked on a replica that reads nothing")
	}
}

// TestAnIdleStreamIsNoStuckOne: the aggregator acknowledges at a batch, at
// most every AckEvery, so the last batches before a node's last ready pod
// goes wait for the next one. The ack deadline ended such a stream 30 s
// later on every aggregator replica (a warning, a flap of /readyz, the
// catalogue sent again). A stream with nothing to send waits for no ack;
// once it sends again, an aggregator that acknowledges none still ends it.
func TestAnIdleStreamIsNoStuckOne(t *testing.T) {
	defer func(d time.Duration) { ackDeadline = d }(ackDeadline)
	ackDeadline = 300 * time.Millisecond
	s, client := streamTo(t, &silentAggregator{welcome: true}, []discovery.Target{{UID: "u1", Namespace: "ns", Pod: "p", Ready: true,
		Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scrapes := func(d time.Duration) { // a result every 20 ms, as scrapes bring them
		for end := time.Now().Add(d); ctx.Err() == nil && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			s.offer(result{uid: "u1", timeMs: time.Now().UnixMilli()})
		}
	}
	scrapes(60 * time.Millisecond) // batches no ack answers, then none
	done := make(chan error, 1)
	go func() { done <- s.session(ctx, client) }()
	select {
	case err := <-done:
		t.Fatalf("an idle stream ended after its last batches: %v", err)
	case <-time.After(10 * ackDeadline):
	}
	go scrapes(time.Hour)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no batch acknowledged") {
			t.Fatalf("the session ended with %v, want no batch acknowledged", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sending again to an aggregator that acknowledges none, the session never ended")
	}
}

// streamTo serves srv as an aggregator on loopback, and returns an idle
// agent's streamer to it, listing targets, and a client of it.
func streamTo(t *testing.T, srv pulsev1.IngestServer, targets []discovery.Target, opts ...grpc.ServerOption) (*streamer, pulsev1.IngestClient) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	pulsev1.RegisterIngestServer(g, srv)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	a := newIdleAgent(t)
	a.SetTargets(targets)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return newStreamer(a, ln.Addr().String(), "", nil), pulsev1.NewIngestClient(conn)
}

// TestACatalogueNotTakenEndsTheStream: a catalogue is acknowledged by no
// ack, and the watch of acks covered batches only: an aggregator that
// stops reading after its welcome, sent catalogues past its flow-control
// window before any batch (a first of 1,000 entries, then a change),
// held the stream for ever, connected, with no batch going out. Such a
// catalogue blocked past the ack deadline now ends the session.
func TestACatalogueNotTakenEndsTheStream(t *testing.T) {
	defer func(d time.Duration) { ackDeadline = d }(ackDeadline)
	ackDeadline = 300 * time.Millisecond
	var targets []discovery.Target
	for i := range 1000 {
		targets = append(targets, discovery.Target{UID: fmt.Sprintf("%036d", i), Namespace: "ns", Pod: fmt.Sprintf("pod-%0100d", i), Ready: true,
			URL: fmt.Sprintf("http://10.0.%d.%d:8000/metrics", i/256, i%256), Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}})
	}
	// The aggregator's fixed 64 KiB windows (no bandwidth estimate to grow them).
	s, client := streamTo(t, deafAggregator{}, targets, grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.session(ctx, client) }()
	go func() { // the catalogue changes: more are sent, past the window the first filled
		for i := 1; ctx.Err() == nil; i++ {
			s.agent.SetTargets(targets[i%2:])
			time.Sleep(50 * time.Millisecond)
		}
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "a catalogue not taken") {
			t.Fatalf("the session ended with %v, want a catalogue not taken", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session never ended: its catalogue's Send blocked on a replica that reads nothing")
	}
}

// TestACatalogueBlockedBehindBatchesEndsTheStream: the catalogue watch
// ("a catalogue not taken") held only while no batch waited for an ack,
// and the batch watch resets once the last batch Send returned
// ackDeadline/3 ago. The aggregator acks at most every 10 s, so batches
// almost always wait: a replica that stopped reading, its window filled by
// batches, and then a catalogue change (whose Send blocks, and with it the
// session's loop: no batch Send follows) held the stream for ever,
// connected, no batch going out.
func TestACatalogueBlockedBehindBatchesEndsTheStream(t *testing.T) {
	defer func(d time.Duration) { ackDeadline = d }(ackDeadline)
	ackDeadline = 300 * time.Millisecond
	var acked, sent atomic.Uint64
	var sentAt, cataloguing atomic.Int64
	sent.Store(4) // four batches wait for an ack
	now := time.Now()
	sentAt.Store(now.Add(-ackDeadline).UnixNano())          // the last batch's Send returned long ago: idle
	cataloguing.Store(now.Add(-2 * ackDeadline).UnixNano()) // a catalogue's Send blocked since
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go watchAcks(ctx, cancel, &sent, &acked, &sentAt, &cataloguing)
	select {
	case <-ctx.Done():
		if err := context.Cause(ctx); !strings.Contains(err.Error(), "not taken") {
			t.Fatalf("the session ended with %v, want a catalogue not taken", err)
		}
	case <-time.After(10 * ackDeadline):
		t.Fatal("a catalogue blocked behind unacknowledged batches did not end the session")
	}
}

// TestAnIdleStreamSendsHeartbeats: a stream whose node has no ready pod
// sent nothing after its catalogue, and the aggregator ends a stream whose
// token expired, and looks up entries it could not look up, only at a
// message: an idle agent's entries were never held, its expired token
// never seen. It sends an empty batch every heartbeatEvery without one.
func TestAnIdleStreamSendsHeartbeats(t *testing.T) {
	defer func(d time.Duration) { heartbeatEvery = d }(heartbeatEvery)
	heartbeatEvery = 50 * time.Millisecond
	loading := discovery.Target{UID: "u1", Namespace: "ns", Pod: "p1", Ready: false,
		Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	s, client := streamTo(t, ingest.New(store.New(store.Options{}), ingest.Options{}), []discovery.Target{loading})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.session(ctx, client) }()
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(s.agent.m.batches.WithLabelValues(s.addr)) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("an idle stream sent %v batches, want heartbeats", testutil.ToFloat64(s.agent.m.batches.WithLabelValues(s.addr)))
		}
	}
}

// A stream the aggregator ended fails the next Send with io.EOF on either
// transport, and its status (a token expired, a bound) comes at Recv,
// which readAcks makes the session's cause: the session waits for it, so
// that the log says why, not EOF. Another failure is returned as it is.
func TestASendsFailureWaitsForTheStreamsStatus(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	want := status.Error(codes.Unauthenticated, "the token expired")
	go cancel(want) // readAcks, as its Recv returns the status
	if err := SendFailed(ctx, fmt.Errorf("send batch: %w", io.EOF)); !errors.Is(err, want) {
		t.Fatalf("SendFailed: %v; want the stream's status %v", err, want)
	}
	other := errors.New("encode: too large")
	if err := SendFailed(context.Background(), other); !errors.Is(err, other) {
		t.Fatalf("SendFailed: %v; want %v", err, other)
	}
}

// TestAStreamThatNeverOpensEndsToo: through a relay every replica's stream
// shares the agent's one connection, which carries at most
// relay.MaxStreamsPerConnection; gRPC waits for room with no bound, and
// the welcome's wait began only once the stream was open: a replica past
// the bound got nothing from the node, in silence, for ever. The welcome's
// wait covers the stream's opening, and says why.
func TestAStreamThatNeverOpensEndsToo(t *testing.T) {
	defer func(w time.Duration) { welcomeWait = w }(welcomeWait)
	welcomeWait = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.MaxConcurrentStreams(1)) // as a relay's connection, full
	pulsev1.RegisterIngestServer(g, &silentAggregator{welcome: true})
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The one stream the connection carries, held open.
	held, err := pulsev1.NewIngestClient(conn).Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{Node: "n"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Recv(); err != nil {
		t.Fatal(err)
	}
	a := newIdleAgent(t)
	a.opts.Relay = "relay:9091"
	s := newStreamer(a, ln.Addr().String(), "", nil)
	done := make(chan error, 1)
	go func() { done <- s.session(ctx, pulsev1.NewIngestClient(conn)) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no welcome within") || !strings.Contains(err.Error(), fmt.Sprintf("at most %d streams", relay.MaxStreamsPerConnection)) {
			t.Errorf("the session ended with %v; want no welcome, naming the relay's bound", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("a stream that never opened held the session for ever")
	}
}

// lateAcks is an ingest client whose stream, once its context ends, still
// delivers one ack (one in flight when the session ended) a moment later,
// and records that it did.
type lateAcks struct {
	pulsev1.IngestClient
	delivered atomic.Bool
}

type lateAckStream struct {
	pulsev1.Ingest_ReportClient
	ctx  context.Context
	c    *lateAcks
	once sync.Once
}

func (c *lateAcks) Report(ctx context.Context, opts ...grpc.CallOption) (pulsev1.Ingest_ReportClient, error) {
	s, err := c.IngestClient.Report(ctx, opts...)
	return &lateAckStream{Ingest_ReportClient: s, ctx: ctx, c: c}, err
}

func (s *lateAckStream) Recv() (*pulsev1.AggregatorMessage, error) {
	m, err := s.Ingest_ReportClient.Recv()
	if err != nil && s.ctx.Err() != nil {
		late := false
		s.once.Do(func() { late = true })
		if late {
			time.Sleep(50 * time.Millisecond) // the ack arrives as the session ends
			defer s.c.delivered.Store(true)
			return &pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: 99}}}, nil
		}
	}
	return m, err
}

// TestASessionEndsWithItsAckReader: the session returned while its ack
// reader ran on, so an ack read as it ended set the address's acked gauge
// after fanOut had deleted the address's series (the address gone from
// DNS): a stale series for ever. The session now returns once its reader
// has.
func TestASessionEndsWithItsAckReader(t *testing.T) {
	st := store.New(store.Options{})
	s, client := streamTo(t, ingest.New(st, ingest.Options{}), nil)
	c := &lateAcks{IngestClient: client}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.session(ctx, c) }()
	for deadline := time.Now().Add(10 * time.Second); !s.connected.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session never connected")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the session ended with %v, want its context's end", err)
	}
	if !c.delivered.Load() {
		t.Fatal("the session returned before its ack reader had taken the last ack")
	}
	s.agent.m.acked.DeleteLabelValues(s.addr) // as fanOut does, the address gone
	if n := testutil.CollectAndCount(s.agent.m.acked); n != 0 {
		t.Fatalf("%d acked series after the address's were deleted, want 0", n)
	}
}
