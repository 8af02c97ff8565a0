// Package ingest serves the agents' streams (pulse.v1.Ingest) and feeds the
// store. Every stream is independent: a bad message fails only its stream.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/slots"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Strings an agent sends are kept: bound them. A Kubernetes name is at most
// 253 bytes; a demand entry's uid is a pod's uid and a workload's name.
// A scrape error's text is kept up to maxErrorBytes (the agent sends 200).
const (
	maxNameBytes  = 600
	maxErrorBytes = 256
)

// maxWorkloadsPerPod bounds the workloads one pod may belong to (a Kaito
// Workspace, its InferenceSet, a Deployment, an override...), and so, with
// the store's pod cap, the number of workloads.
const maxWorkloadsPerPod = 8

// Limits bound what one stream may send.
type Limits struct {
	MaxPodsPerStream int
	MaxExtraMetrics  int
}

// withDefaults is l with its zero bounds at their defaults: 1,024 pods a
// stream, wire.MaxExtraMetrics extra metrics.
func (l Limits) withDefaults() Limits {
	if l.MaxPodsPerStream <= 0 {
		l.MaxPodsPerStream = 1024
	}
	if l.MaxExtraMetrics <= 0 {
		l.MaxExtraMetrics = wire.MaxExtraMetrics
	}
	return l
}

// Server implements pulsev1.IngestServer.
type Server struct {
	pulsev1.UnimplementedIngestServer
	store   *store.Store
	log     *slog.Logger
	version string
	limits  Limits
	m       metrics
	auth    Authenticator // nil: streams are not authenticated (static/demo mode)
	onHist  func()
	sawHist atomic.Bool
	opened  atomic.Int64 // agent streams open now (the streams gauge's value)

	nodes slots.Slots // open streams by the node their token is bound to
	// helloWait is how long a stream may take to send its hello
	// (helloTimeout; shorter in tests).
	helloWait time.Duration
}

// helloTimeout: how long after its token is reviewed a stream may take
// to send its hello, which an agent sends at once. A stream that sent
// none kept its node's slot (one of maxStreamsPerNode) until its
// connection aged out, an hour.
const helloTimeout = 30 * time.Second

// maxStreamsPerNode: the agent streams one node may hold open at once,
// whatever tokens its agents' pods hold (an agent rolled out shares them
// with the one it replaces). An agent holds one, and one or two more while it reconnects before
// the old one's end is noticed (the server's keepalive ends a dead
// connection within a minute); past it a stream is refused
// (ResourceExhausted, node_streams): a token leaked from a node's agent
// opened streams without bound, each with its decoders' state.
const maxStreamsPerNode = 4

var _ pulsev1.IngestServer = (*Server)(nil)

type metrics struct {
	streams     prometheus.Gauge
	samples     *prometheus.CounterVec
	ok, missing prometheus.Counter // children of samples, looked up once
	rejected    *prometheus.CounterVec
}

// rejectReasons are the reason label values of
// pulse_aggregator_rejected_reports_total.
var rejectReasons = []string{"agent_full", "auth_unavailable", "bad_extra", "bad_time", "catalogue", "duplicate_id", "invalid_entry", "invalid_hello", "malformed_batch", "message", "negative_value", "node_streams", "nonpositive_bound", "other_node", "ratio_above_one", "store_full", "superseded", "too_many_workloads", "unauthenticated", "unknown_pod", "workload_claim"}

// Options configure a Server.
type Options struct {
	Log     *slog.Logger
	Version string // the aggregator's, sent in the welcome
	Limits  Limits
	// Registerer takes the server's metrics.
	Registerer prometheus.Registerer
	// Auth, when set, authenticates every stream and binds it to the node
	// its token is bound to; nil: streams are not authenticated.
	Auth Authenticator
	// OnHistograms, when set, is called once, when the first sample with
	// latency histograms arrives (an agent runs --forward-histograms).
	OnHistograms func()
}

// New returns a Server that writes to st.
func New(st *store.Store, o Options) *Server {
	limits := o.Limits.withDefaults()
	if o.Log == nil {
		o.Log = slog.Default()
	}
	s := &Server{store: st, log: o.Log, version: o.Version, limits: limits, auth: o.Auth, onHist: o.OnHistograms, m: metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_aggregator_agent_streams", Help: "Agent streams open now."}),
		samples: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_aggregator_pod_samples_total", Help: "Pod samples received, by outcome (ok or missing)."},
			[]string{"outcome"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_aggregator_rejected_reports_total", Help: "Reports rejected, by reason."},
			[]string{"reason"}),
	}}
	s.m.ok, s.m.missing = s.m.samples.WithLabelValues("ok"), s.m.samples.WithLabelValues("missing")
	s.helloWait = helloTimeout
	// Every reason exists from the start, at 0, so that rates and alerts on
	// it need no absent() guard.
	for _, r := range rejectReasons {
		s.m.rejected.WithLabelValues(r)
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(s.m.streams, s.m.samples, s.m.rejected)
	}
	return s
}

// Streams is the number of agent streams open now, over either transport.
func (s *Server) Streams() int { return int(s.opened.Load()) }

// SawHistograms says whether a sample with latency histograms has arrived.
func (s *Server) SawHistograms() bool { return s.sawHist.Load() }

var kinds = map[pulsev1.WorkloadKind]string{
	pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE:         store.KindWorkspace,
	pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET:     store.KindInferenceSet,
	pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT:        store.KindDeployment,
	pulsev1.WorkloadKind_WORKLOAD_KIND_STATEFUL_SET:      store.KindStatefulSet,
	pulsev1.WorkloadKind_WORKLOAD_KIND_LEADER_WORKER_SET: store.KindLeaderWorkerSet,
	pulsev1.WorkloadKind_WORKLOAD_KIND_CUSTOM:            store.KindWorkload,
}

// shown is a tenant's string as pulse logs or answers it before it is
// checked: printable, and cut past maxNameBytes (a refused entry's 4 MiB
// name of control characters was logged whole, 24 MiB escaped, at every
// reconnect).
func shown(s string) string { return wire.Printable(wire.CleanText(s, maxNameBytes)) }

// checkHello bounds a hello's strings before any is logged or kept: the
// agent's version is on every line of its stream's log, its instance and
// extra metric names are kept with each of its pods (a hello may be up to
// the 4 MiB of a message), and each extra metric's must be a metric's
// name.
func checkHello(h *pulsev1.Hello) error {
	for _, f := range []struct{ what, v string }{{"node", h.Node}, {"agent version", h.AgentVersion}, {"agent instance", h.AgentInstance}} {
		if len(f.v) > maxNameBytes {
			return status.Errorf(codes.InvalidArgument, "hello's %s is %d bytes; at most %d", f.what, len(f.v), maxNameBytes)
		}
	}
	for i, name := range h.ExtraMetrics {
		if len(name) > maxNameBytes {
			return status.Errorf(codes.InvalidArgument, "hello's extra metric %d is %d bytes; at most %d", i, len(name), maxNameBytes)
		}
		// The agent's --extra-metric takes only a metric's name; the names
		// are shown to every tenant whose trigger names a gauge none
		// forwards (the scaler's refusal), so another's control
		// characters are refused here.
		if !model.LegacyValidation.IsValidMetricName(name) {
			return status.Errorf(codes.InvalidArgument, "hello's extra metric %d, %q, is not a metric name", i, shown(name))
		}
	}
	return nil
}

// hello reads a stream's first message, a hello, and checks it: its
// protocol, its node (the token's, when bound) and its strings.
func (s *Server) hello(stream pulsev1.Ingest_ReportServer, boundNode string) (*pulsev1.Hello, error) {
	first, err := s.firstMessage(stream)
	if errors.Is(err, io.EOF) {
		// gRPC would end it with Unknown, "EOF".
		return nil, status.Error(codes.InvalidArgument, "the stream ended before its hello")
	}
	if err != nil {
		return nil, err
	}
	hello := first.GetHello()
	switch {
	case hello == nil:
		err = status.Error(codes.InvalidArgument, "the first message of a stream must be a hello")
	case hello.ProtocolVersion != pulsev1.ProtocolVersion_PROTOCOL_VERSION_1:
		err = status.Errorf(codes.FailedPrecondition, "protocol version %v is not supported", hello.ProtocolVersion)
	case hello.Node == "":
		err = status.Error(codes.InvalidArgument, "hello names no node")
	case boundNode != "" && hello.Node != boundNode:
		s.m.rejected.WithLabelValues("other_node").Inc()
		return nil, status.Errorf(codes.PermissionDenied, "the agent's token is bound to node %s, not %s", boundNode, shown(hello.Node))
	case len(hello.ExtraMetrics) > s.limits.MaxExtraMetrics:
		err = status.Errorf(codes.InvalidArgument, "hello names %d extra metrics; at most %d", len(hello.ExtraMetrics), s.limits.MaxExtraMetrics)
	default:
		err = checkHello(hello)
	}
	if err != nil {
		s.m.rejected.WithLabelValues("invalid_hello").Inc()
		return nil, err
	}
	// Kept for the stream's life: the fields it does not know (which
	// UnmarshalVT keeps, up to the 4 MiB of a message) are not.
	hello.ProtoReflect().SetUnknown(nil)
	return hello, nil
}

// firstMessage is the stream's first message, or an error once
// helloWait has passed without one. Its Recv ends once Report returns:
// gRPC then cancels the stream.
func (s *Server) firstMessage(stream pulsev1.Ingest_ReportServer) (*pulsev1.AgentMessage, error) {
	type received struct {
		m   *pulsev1.AgentMessage
		err error
	}
	got := make(chan received, 1)
	go func() {
		m, err := stream.Recv()
		got <- received{m, err}
	}()
	timer := time.NewTimer(s.helloWait)
	defer timer.Stop()
	select {
	case r := <-got:
		return r.m, r.err
	case <-timer.C:
		s.m.rejected.WithLabelValues("invalid_hello").Inc()
		return nil, status.Errorf(codes.DeadlineExceeded, "no hello within %s of the stream's start", s.helloWait)
	}
}

// ReviewedHeader is the header Report sends once it has reviewed a
// stream's token, before it reads the stream's hello: a relay reads the
// agent's first message only then (pkg/relay's ReviewedKey, the same).
const ReviewedHeader = "pulse-reviewed"

// Report serves one agent stream.
func (s *Server) Report(stream pulsev1.Ingest_ReportServer) error {
	st, end, err := s.open(stream)
	if st == nil {
		return err
	}
	defer end()
	return st.serve(stream)
}

// open authenticates a stream, reads its hello, welcomes it and opens its
// node's source: the stream's state and what ends it (nil, with the
// refusal, when any of those fails). Apart from serve, so that what it
// needs (a token's review, the hello's checks: 0.9 KB of frame) is not on
// the stack of a stream waiting for its next batch, which every GC scans.
func (s *Server) open(stream pulsev1.Ingest_ReportServer) (_ *streamState, end func(), err error) {
	var ends []func()
	unwind := func() {
		for _, f := range slices.Backward(ends) {
			f()
		}
	}
	defer func() {
		if err != nil {
			unwind()
		}
	}()
	agent, tokenExpires, err := s.authenticate(stream.Context())
	if err != nil {
		return nil, nil, err
	}
	boundNode := agent.Node
	if boundNode != "" {
		if !s.nodes.Take(boundNode, 0, maxStreamsPerNode) {
			s.m.rejected.WithLabelValues("node_streams").Inc()
			return nil, nil, status.Errorf(codes.ResourceExhausted, "node %s's agents hold %d streams open at this aggregator, the most a node may: this one is refused (the agent retries)", boundNode, maxStreamsPerNode)
		}
		ends = append(ends, func() { s.nodes.Give(boundNode) })
	}
	// Said before the hello is read: a relay reads an agent's first
	// message only once its replica has reviewed the stream's token
	// (pkg/relay's ReviewedKey).
	if err := stream.SendHeader(metadata.Pairs(ReviewedHeader, "1")); err != nil {
		return nil, nil, err
	}
	hello, err := s.hello(stream, boundNode)
	if err != nil {
		return nil, nil, err
	}
	// Counted before the welcome: an agent welcomed is a stream open (one
	// counted after it could be welcomed and not yet counted, and
	// Streams read one short).
	s.m.streams.Inc()
	s.opened.Add(1)
	ends = append(ends, s.m.streams.Dec, func() { s.opened.Add(-1) })
	if err := stream.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Welcome{Welcome: &pulsev1.Welcome{
		AggregatorVersion: s.version, ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}); err != nil {
		return nil, nil, err
	}
	st := &streamState{srv: s, hello: hello, ids: map[uint32]string{}, rejected: map[uint32]bool{}, dec: wire.NewDecoder(),
		ctx: stream.Context(), bound: boundNode != "", tokenExpires: tokenExpires, agent: agent}
	if g, ok := s.auth.(agentGoneTeller); ok && agent.PodUID != "" {
		st.agentGone = g
	}
	st.logger().Info("agent stream opened")
	held, release, err := s.openSource(hello.Node)
	if err != nil {
		return nil, nil, err
	}
	ends = append(ends, release)
	st.stream = held
	return st, unwind, nil
}

// serve reads the stream's messages after its hello until it ends.
func (st *streamState) serve(stream pulsev1.Ingest_ReportServer) error {
	var r received // with Codec, the messages after the hello come pooled
	defer r.release()
	for {
		r.release()
		err := stream.RecvMsg(&r)
		if errors.Is(err, io.EOF) {
			st.logger().Info("agent stream closed")
			return nil
		}
		if err != nil {
			st.logger().Info("agent stream ended", logging.KeyErr, err)
			return err
		}
		if err := st.expired(); err != nil {
			return err
		}
		if err := st.revoked(); err != nil {
			return err
		}
		if err := st.take(stream, r.msg); err != nil {
			return err
		}
	}
}

// expired is the error that ends a stream whose token has expired (nil
// while it has not, or says no expiry). The token was reviewed when the
// stream opened: a stream outlives it no longer than the token does (a
// copied token kept a stream open for ever, past its pod's deletion). The
// agent reconnects with the token the kubelet renewed.
func (st *streamState) expired() error {
	if st.tokenExpires.IsZero() || !time.Now().After(st.tokenExpires) {
		return nil
	}
	st.logger().Info("agent stream's token expired: the agent reconnects with its renewed one", logging.KeyUntil, st.tokenExpires)
	return status.Errorf(codes.Unauthenticated, "the stream's token expired at %s: reconnect with the current one", st.tokenExpires.UTC().Format(time.RFC3339))
}

// agentGoneTeller is an Authenticator that remembers the agents' pods the
// API has let go of (TokenReviewer's AgentGone).
type agentGoneTeller interface{ AgentGone(a Agent) bool }

// revoked is the error that ends a stream whose token's pod the API has
// deleted, or that finished, or that has been deleted for longer than the
// API honours its tokens after (AgentGone; nil while none of those, or
// where the review named no pod): a token copied from the agent's pod
// reported its node's pods for the rest of the token's life. An honest
// agent's stream ends with its pod.
func (st *streamState) revoked() error {
	if st.agentGone == nil || !st.agentGone.AgentGone(st.agent) {
		return nil
	}
	st.logger().Info("agent stream's pod is gone: its token is no longer honoured", logging.KeyPod, st.agent.Pod())
	return status.Errorf(codes.Unauthenticated, "the stream's token is bound to pod %s (uid %s), which has been deleted or has finished", st.agent.Pod(), st.agent.PodUID)
}

// take is one message of the stream after its hello: a catalogue, or a
// batch (acknowledged when an ack is due); an error ends the stream.
func (st *streamState) take(stream pulsev1.Ingest_ReportServer, msg *pulsev1.AgentMessage) error {
	switch m := msg.Msg.(type) {
	case *pulsev1.AgentMessage_Catalogue:
		if err := st.catalogue(m.Catalogue); errors.Is(err, errSuperseded) {
			return err
		} else if err != nil {
			st.srv.m.rejected.WithLabelValues("catalogue").Inc()
			return status.Error(codes.InvalidArgument, err.Error())
		}
	case *pulsev1.AgentMessage_Batch:
		if err := st.batch(m.Batch); errors.Is(err, errSuperseded) {
			return err
		} else if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if st.ackDue(time.Now()) {
			return stream.Send(&pulsev1.AggregatorMessage{Msg: &pulsev1.AggregatorMessage_Ack{Ack: &pulsev1.Ack{Seq: m.Batch.Seq}}})
		}
	default:
		st.srv.m.rejected.WithLabelValues("message").Inc()
		return status.Error(codes.InvalidArgument, "unexpected message after hello")
	}
	return nil
}

// openSource opens the stream's source in the store (release closes it),
// or refuses the stream past the node's bound there.
func (s *Server) openSource(node string) (store.Stream, func(), error) {
	held, err := s.store.OpenSource(node)
	if err != nil {
		s.m.rejected.WithLabelValues("node_streams").Inc()
		return 0, nil, status.Errorf(codes.ResourceExhausted, "node %s: %v: this one is refused (the agent retries)", node, err)
	}
	return held, func() { s.store.CloseSource(node, held) }, nil
}

// authenticate returns the node and pod a stream's bearer token is bound
// to (none when streams are not authenticated), and when the token expires
// (zero: it says not).
func (s *Server) authenticate(ctx context.Context) (Agent, time.Time, error) {
	if s.auth == nil {
		return Agent{}, time.Time{}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var token string
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			token = t
		}
	}
	if token == "" {
		s.m.rejected.WithLabelValues("unauthenticated").Inc()
		return Agent{}, time.Time{}, status.Error(codes.Unauthenticated, "no bearer token: agents authenticate with their ServiceAccount token")
	}
	agent, err := s.auth.Authenticate(ctx, token)
	switch {
	case errors.Is(err, ErrUnauthenticated):
		s.m.rejected.WithLabelValues("unauthenticated").Inc()
		return Agent{}, time.Time{}, status.Error(codes.Unauthenticated, err.Error())
	case err != nil:
		// Not an answer: too many reviews in flight, or the API failed.
		// The agent retries.
		s.m.rejected.WithLabelValues("auth_unavailable").Inc()
		return Agent{}, time.Time{}, status.Error(codes.Unavailable, "agent authentication: "+err.Error())
	}
	exp, _ := TokenExpiry(token) // reviewed: its exp is the API server's
	return agent, exp, nil
}

// logger is the stream's log: every line names its node and agent version.
// It is made at each (rare) line, not kept: a logger with attributes holds
// a copy of its handler, about 500 bytes a stream held for its life.
func (st *streamState) logger() *slog.Logger {
	return st.srv.log.With(logging.KeyNode, st.hello.Node, logging.KeyAgent, st.hello.AgentVersion)
}

// streamState is what one stream has established.
type streamState struct {
	srv   *Server
	ctx   context.Context
	bound bool // the stream speaks only for pods of hello.Node
	hello *pulsev1.Hello
	// tokenExpires: when the stream's token expires (zero: it says not).
	tokenExpires time.Time
	// agent: the pod the stream's token is bound to (none where the
	// review names none, or streams are not authenticated), and
	// agentGone what says it is gone (nil: nothing does, or no pod
	// named; revoked).
	agent     Agent
	agentGone agentGoneTeller
	// ids: pod id → uid. (The log's namespace/name of a pod is the
	// store's: a map of them here took 70 bytes a pod.)
	ids map[uint32]string
	// rejected are ids the catalogue named for pods this stream may not
	// report (another node's, a bad entry, one past its limit): their
	// samples are skipped, not malformed.
	rejected map[uint32]bool
	// pending are ids the store refused for room (--max-pods reached, every
	// pod held listed by a connected agent): listed again at each batch
	// until held; their samples are dropped (store_full) meanwhile.
	pending map[uint32]store.PodInfo
	heard   bool      // a batch has arrived on this stream
	acked   time.Time // when a batch was last acked
	// loggedRejects: when each pod's refused values were last logged (once
	// a minute per pod).
	loggedRejects map[uint32]time.Time
	// rejectLogs: the catalogue entries rejected that may be logged.
	rejectLogs *rate.Limiter
	dec        *wire.Decoder
	stream     store.Stream // the store's name for this stream
	// unchecked are entries whose pod could not be looked up (the pod
	// cache not synced, the lookups' rate taken, the API busy): not held
	// (a held pod's entry keeps its last admitted state, in a full
	// catalogue too: heldBefore), their samples
	// skipped, looked up again at a batch at most every uncheckedEvery.
	// One such entry ended the stream, every other pod of the node
	// unreported until its agent reconnected and listed them all again.
	unchecked map[uint32]*pulsev1.Pod
	checked   time.Time // when unchecked entries were last looked up
	// held: the histograms of samples decoded and not stored (the pod
	// refused, waiting for room or not looked up yet, or the sample's time
	// refused), by id, newest of each: the agent sends a histogram only
	// when it changed, so one dropped here was not sent again, and the
	// pod's next stored sample carries it (hold, unhold). Gone with the
	// id's decoder state (forget).
	held map[uint32]*metric.Histograms
}

// hold keeps the histograms of s, a sample decoded and not stored (the
// decoder's, not reused), over those held for its pod before.
func (st *streamState) hold(s *wire.Sample) {
	if s.Hist == nil {
		return
	}
	if st.held == nil {
		st.held = map[uint32]*metric.Histograms{}
	}
	st.held[s.Pod] = metric.Complete(s.Hist, st.held[s.Pod])
}

// unhold completes r, the next sample of pod id stored, with the
// histograms held for it that r lacks (unchanged since, so not resent).
func (st *streamState) unhold(r *store.Report, id uint32) {
	if h, ok := st.held[id]; ok {
		delete(st.held, id)
		r.Hist = metric.Complete(r.Hist, h)
	}
}

// forget drops pod id's decoder state, and the histograms held for it:
// the agent's encoder sends its pod under that id again in full.
func (st *streamState) forget(id uint32) {
	st.dec.Forget(id)
	delete(st.held, id)
}

// ackDue reports whether the batch just stored is acked: every batch, or
// with the hello's ack_every_ms, the first one that long after the last
// ack (it covers the batches before it).
func (st *streamState) ackDue(now time.Time) bool {
	every := time.Duration(st.hello.AckEveryMs) * time.Millisecond
	if every > 0 && !st.acked.IsZero() && now.Sub(st.acked) < every {
		return false
	}
	st.acked = now
	return true
}

// batchBufs are one batch's decoded samples and reports: pooled across
// streams, not held per stream, so that thousands of idle streams hold
// none (only the batches being stored at once do).
type batchBufs struct {
	samples []wire.Sample
	reports []store.Report
}

var batchPool = sync.Pool{New: func() any { return new(batchBufs) }}

// put gives b back to the pool, holding nothing of its batch.
func (b *batchBufs) put() {
	clear(b.samples[:cap(b.samples)])
	clear(b.reports[:cap(b.reports)])
	b.samples, b.reports = b.samples[:0], b.reports[:0]
	batchPool.Put(b)
}

// rejectLogEvery rate-limits the log of one pod's refused values.
const rejectLogEvery = time.Minute

// logRejected logs the values refused from a pod's sample, once a minute
// per pod (the count is in pulse_aggregator_rejected_reports_total).
func (st *streamState) logRejected(id uint32, what string) {
	now := time.Now()
	if last, ok := st.loggedRejects[id]; ok && now.Sub(last) < rejectLogEvery {
		return
	}
	if st.loggedRejects == nil || len(st.loggedRejects) >= len(st.ids)+1 {
		st.loggedRejects = map[uint32]time.Time{}
	}
	st.loggedRejects[id] = now
	pod := st.ids[id]
	if info, ok := st.srv.store.ListedOn(st.hello.Node, pod); ok {
		pod = info.Namespace + "/" + info.Name
	}
	st.logger().Warn("pod values rejected", logging.KeyPod, pod, logging.KeyReason, what)
}

func (st *streamState) catalogue(c *pulsev1.Catalogue) error {
	if c.Full {
		for id := range st.ids {
			st.forget(id)
		}
		for id := range st.rejected {
			st.forget(id)
		}
		clear(st.ids)
		clear(st.rejected)
		clear(st.pending)
		clear(st.unchecked)
		clear(st.held)
	}
	var removed []string
	for _, id := range c.Remove {
		if uid, ok := st.ids[id]; ok {
			removed = append(removed, uid)
			delete(st.ids, id)
		}
		delete(st.rejected, id)
		delete(st.pending, id)
		delete(st.unchecked, id)
		st.forget(id)
	}
	if err := st.checkSize(c); err != nil {
		return err
	}
	return st.admitAll(st.ctx, c.Upsert, c.Full, removed)
}

// admitAll admits entries, looking their pods up within ctx, and stores
// those held (with full, the node's listing is theirs alone). After one
// whose pod cannot be looked up now, the rest are looked up without
// waiting (one waited up to the lookups' bounds: a catalogue of misses
// would have waited that long each).
//
// An id a catalogue lists twice is taken at its first entry, and each
// later entry for it refused alone (duplicate_id): each had moved the id
// to its own uid, past the stream's room (an id held takes none), and
// every uid was stored while the stream kept only the last, so one stream
// held pods it could neither report nor remove, as many as it listed, up
// to --max-pods. The agent lists an id once.
//
// It fails only with errSuperseded: a stream of the node opened after this
// one has listed the node in full, and nothing is stored.
func (st *streamState) admitAll(ctx context.Context, entries []*pulsev1.Pod, full bool, removed []string) error {
	infos := make([]store.PodInfo, 0, len(entries))
	ids := make([]uint32, 0, len(entries))
	listed := make(map[uint32]bool, len(entries))
	// spent: the node's share of the lookups ran out in this catalogue.
	// Its agent spent it (entries of pods the API does not have), so an
	// entry not looked up after it is not kept as last admitted: a
	// compromised node listed made-up pods first, and kept a pod the API
	// had deleted (another tenant's) held, with its samples, unchecked.
	spent := false
	for _, p := range entries {
		if listed[p.Id] {
			st.refuseRepeat(p)
			continue
		}
		listed[p.Id] = true
		info, ok, err := st.admit(ctx, p, &removed)
		if errors.Is(err, ErrLookupUnavailable) {
			spent = spent || errors.Is(err, errNodeLookups)
			if held, ok := st.heldBefore(p, full); ok && !spent {
				// Kept as last admitted, as a held pod's entry is in a
				// catalogue of changes: a full one (at every reconnect)
				// unlisted it, its series dropped and its workload a
				// replica short, until a lookup worked.
				st.ids[p.Id] = p.Uid
				infos, ids = append(infos, held), append(ids, p.Id)
			}
			st.uncheck(p, err)
			if ctx.Err() == nil {
				done, cancel := context.WithCancel(ctx)
				cancel()
				ctx = done
			}
			continue
		}
		delete(st.unchecked, p.Id) // admitted, or refused for good
		if !ok {
			continue
		}
		infos = append(infos, info)
		ids = append(ids, p.Id)
	}
	// A pod removed under one id and listed under another in the same
	// catalogue (the agent's ids are reused: it left and came back
	// between two sends) stays listed: removed first, its series was
	// dropped, and at --max-pods a new pod took its place.
	removed = slices.DeleteFunc(removed, func(uid string) bool {
		return slices.ContainsFunc(infos, func(i store.PodInfo) bool { return i.UID == uid })
	})
	if len(removed) > 0 {
		if err := st.srv.store.RemoveStream(st.hello.Node, st.stream, removed...); err != nil {
			return st.superseded()
		}
	}
	infos, ids = st.withoutGone(infos, ids)
	refused, err := st.srv.store.UpsertStream(st.source(), infos, full)
	if err != nil {
		return st.superseded()
	}
	st.dropGone(infos)
	st.wait(infos, ids, refused)
	if full && !st.heard && len(st.unchecked) == 0 && !slices.ContainsFunc(infos, scraped) {
		// Its agent scrapes none of its pods (none ready: an idle GPU
		// node, or its pods loading their model), so no batch comes: its
		// state is whole with its catalogue. The warm-up counted agents a
		// batch came from, and one such node held every restarted replica
		// unready for the whole --warmup.
		st.heard = true
		st.srv.store.MarkHeard(st.hello.Node)
	}
	return nil
}

// heldBefore is what the store holds of p's pod, in a full catalogue
// (whose stream's admitted entries were cleared), when its node's agent
// listed it under p's name before.
func (st *streamState) heldBefore(p *pulsev1.Pod, full bool) (store.PodInfo, bool) {
	if !full {
		return store.PodInfo{}, false
	}
	info, ok := st.srv.store.ListedOn(st.hello.Node, p.Uid)
	return info, ok && info.Namespace == p.Namespace && info.Name == p.Name && info.Demand == p.Demand
}

// refuseRepeat refuses p, an entry whose id its catalogue listed before:
// counted and logged (bounded), and nothing else changed (what the first
// entry for the id did stands).
func (st *streamState) refuseRepeat(p *pulsev1.Pod) {
	st.srv.m.rejected.WithLabelValues("duplicate_id").Inc()
	if st.logAllowed() {
		st.logger().Warn("catalogue entry rejected (logged at most ten a minute a stream; counted in pulse_aggregator_rejected_reports_total)",
			logging.KeyPod, shown(p.Namespace)+"/"+shown(p.Name), logging.KeyReason, "duplicate_id",
			logging.KeyErr, fmt.Errorf("the catalogue lists pod id %d more than once: its first entry is taken, this one refused", p.Id))
	}
}

// scraped is whether the agent scrapes the pod info lists: one ready and
// not being deleted.
func scraped(info store.PodInfo) bool { return info.Ready && !info.Terminating }

// checkSize: past the stream's limit a new entry is refused alone
// (agent_full, in admit), before it costs an API lookup, and the pods held
// keep their places. The refused are remembered (their samples are
// skipped, not malformed), up to as many again: a catalogue past that ends
// the stream, checked here before any lookup (a refused catalogue of 2,000
// pods once cost 2,000 GETs first).
func (st *streamState) checkSize(c *pulsev1.Catalogue) error {
	limit := st.srv.limits.MaxPodsPerStream
	// Entries, whatever they name: one held pod listed 60,000 times
	// counted as none new, and each copy was looked up and upserted under
	// the store's lock (61 ms a catalogue, every reader waiting).
	if len(c.Upsert) > 2*limit {
		return fmt.Errorf("catalogue has %d entries; at most %d per agent, and as many again refused", len(c.Upsert), limit)
	}
	n := len(st.ids) + len(st.rejected)
	for _, p := range c.Upsert {
		if _, ok := st.ids[p.Id]; !ok && !st.rejected[p.Id] {
			n++
		}
	}
	if n > 2*limit {
		return fmt.Errorf("catalogue lists %d pods; at most %d per agent, and as many again refused", n, limit)
	}
	return nil
}

// admit takes one entry into the stream's pods, or refuses it alone (the
// pod its id named before added to removed); ok is false when refused. An
// error (ErrLookupUnavailable) is an entry whose pod could not be looked
// up now (uncheck).
func (st *streamState) admit(ctx context.Context, p *pulsev1.Pod, removed *[]string) (info store.PodInfo, ok bool, err error) {
	// The room is what is held now: an entry held before and refused in
	// this catalogue gives its place back.
	limit := st.srv.limits.MaxPodsPerStream
	if _, held := st.ids[p.Id]; !held && len(st.ids) >= limit {
		*removed = st.reject(p, "agent_full", "", fmt.Errorf("the agent's stream holds --max-pods-per-agent (%d) pods already", limit), *removed)
		return info, false, nil
	}
	info, podUID, reason, err := entryInfo(p, time.Now().UnixMilli())
	if err != nil {
		*removed = st.reject(p, reason, "", err, *removed)
		return info, false, nil
	}
	if st.bound {
		// An agent speaks only for the pods of its own node.
		// It names only workloads its pod belongs to.
		node, err := st.srv.auth.PodNode(ctx, entryOf(p, podUID, st.hello.Node))
		if errors.Is(err, ErrLookupUnavailable) {
			return info, false, err
		}
		if err != nil || node != st.hello.Node {
			reason := "other_node"
			switch {
			case errors.Is(err, ErrClaim) && node == st.hello.Node:
				reason = "workload_claim"
			case err != nil && !errors.Is(err, ErrClaim):
				reason = "unknown_pod"
			}
			*removed = st.reject(p, reason, node, err, *removed)
			return info, false, nil
		}
	}
	delete(st.rejected, p.Id)
	if old, ok := st.ids[p.Id]; ok && old != p.Uid {
		st.forget(p.Id)
		*removed = append(*removed, old)
	}
	st.ids[p.Id] = p.Uid
	delete(st.pending, p.Id)
	return info, true, nil
}

// uncheck keeps entry p, whose pod could not be looked up now, to be
// looked up again at a batch: a pod held keeps what was admitted of it;
// one not held is not, its samples skipped (counted once, as
// auth_unavailable).
func (st *streamState) uncheck(p *pulsev1.Pod, err error) {
	if _, again := st.unchecked[p.Id]; !again {
		st.srv.m.rejected.WithLabelValues("auth_unavailable").Inc()
		if st.logAllowed() {
			st.logger().Info("catalogue entry not looked up now: looked up again at a batch", logging.KeyPod, shown(p.Namespace)+"/"+shown(p.Name), logging.KeyErr, err)
		}
	}
	if len(st.unchecked) == 0 {
		st.checked = time.Now() // looked up again uncheckedEvery from now
	}
	if st.unchecked == nil {
		st.unchecked = map[uint32]*pulsev1.Pod{}
	}
	st.unchecked[p.Id] = known(p) // the message goes back to its pool
	if _, held := st.ids[p.Id]; !held {
		delete(st.pending, p.Id)
		st.rejected[p.Id] = true
	}
}

// known is a copy of p without the fields its message did not know (a
// clone kept them, up to the 4 MiB of a message an entry, for as long as
// the entry was not looked up).
func known(p *pulsev1.Pod) *pulsev1.Pod {
	c := proto.Clone(p).(*pulsev1.Pod)
	c.ProtoReflect().SetUnknown(nil)
	for _, w := range c.Workloads {
		w.ProtoReflect().SetUnknown(nil)
	}
	return c
}

// uncheckedEvery: how often a stream's unchecked entries are looked up
// again, each time within uncheckedWait.
const (
	uncheckedEvery = time.Second
	uncheckedWait  = time.Second
)

// recheck looks the unchecked entries up again, when due.
func (st *streamState) recheck(now time.Time) error {
	if now.Sub(st.checked) < uncheckedEvery {
		return nil
	}
	st.checked = now
	ids := slices.Sorted(maps.Keys(st.unchecked))
	entries := make([]*pulsev1.Pod, len(ids))
	for i, id := range ids {
		entries[i] = st.unchecked[id]
	}
	ctx, cancel := context.WithTimeout(st.ctx, uncheckedWait)
	defer cancel()
	return st.admitAll(ctx, entries, false, nil)
}

// wait keeps the entries the store refused for room (infos[i] listed as
// ids[i]) pending, counted and warned of, to be listed again at each batch.
func (st *streamState) wait(infos []store.PodInfo, ids []uint32, refused []string) {
	if len(refused) == 0 {
		return
	}
	held := make(map[string]bool, len(refused))
	for _, uid := range refused {
		held[uid] = true
	}
	if st.pending == nil {
		st.pending = map[uint32]store.PodInfo{}
	}
	for i, info := range infos {
		if held[info.UID] {
			st.pending[ids[i]] = info
			st.srv.m.rejected.WithLabelValues("store_full").Inc()
			if !st.logAllowed() { // listed again at each batch: bounded as every refusal
				continue
			}
			st.logger().Warn("pod not held: the aggregator holds --max-pods pods, or its namespace --max-pods-per-namespace, each listed by a connected agent, or its namespace holds a share of the room and room freed goes first to a namespace holding less that waits; it is listed again until there is room (raise the cap)",
				logging.KeyPod, info.Namespace+"/"+info.Name)
		}
	}
}

// errSuperseded ends a stream older than one of its node's that has
// listed the node in full (store.ErrSuperseded): what it carries is older
// than what the aggregator holds. Its agent, if it still runs, reconnects
// and lists the node again.
var errSuperseded = status.Error(codes.Aborted, "a newer stream of this node has listed its pods in full: this older one ends (reconnect to list them again)")

// superseded counts and logs the stream's end for a newer stream of its
// node (errSuperseded).
func (st *streamState) superseded() error {
	st.srv.m.rejected.WithLabelValues("superseded").Inc()
	st.logger().Info("agent stream superseded: a newer stream of its node has listed the node's pods in full, so this one's catalogue and samples are older than what is held; it ends")
	return errSuperseded
}

// source is the stream's agent as the store knows it.
func (st *streamState) source() store.Source {
	return store.Source{Node: st.hello.Node, Instance: st.hello.AgentInstance, ExtraNames: st.hello.ExtraMetrics, Stream: st.stream}
}

// relist lists the pods the store refused for room again; those it holds
// now leave pending.
func (st *streamState) relist() error {
	infos := make([]store.PodInfo, 0, len(st.pending))
	for id, info := range st.pending {
		if st.gone(info) {
			delete(st.pending, id) // its pod let go while it waited: never held
			continue
		}
		infos = append(infos, info)
	}
	refused, err := st.srv.store.UpsertStream(st.source(), infos, false)
	if err != nil {
		return st.superseded()
	}
	dropped := st.dropGone(infos)
	if len(refused) == len(infos) {
		return nil
	}
	still := make(map[string]bool, len(refused))
	for _, uid := range refused {
		still[uid] = true
	}
	for id, info := range st.pending {
		if !still[info.UID] {
			delete(st.pending, id)
			if dropped[info.UID] {
				continue // let go as it was stored: never held
			}
			st.logger().Info("pod held now: the aggregator had room", logging.KeyPod, info.Namespace+"/"+info.Name)
		}
	}
	return nil
}

// goneTeller is an Authenticator that remembers the pods the API has let
// go of (TokenReviewer's Gone).
type goneTeller interface{ Gone(podUID string) bool }

// gone says that info's pod (a router's, for a demand entry) is one the API
// has let go of since its entry was looked up: the store dropped it
// (store.Gone), and an entry still waiting for room, or in a catalogue
// still being looked up then, was held after it, with whatever the stream
// sent for it.
func (st *streamState) gone(info store.PodInfo) bool {
	g, ok := st.srv.auth.(goneTeller)
	if !ok {
		return false
	}
	return g.Gone(podUID(info))
}

// podUID is the uid of the pod info stands for: its own, or a demand
// entry's router's.
func podUID(info store.PodInfo) string {
	if info.Demand {
		uid, _ := store.DemandPodUID(info.UID)
		return uid
	}
	return info.UID
}

// dropGone lets go what the store holds of infos, just stored, whose pod
// the API has deleted meanwhile. The pod cache marks a pod gone and then
// tells the store (TokenReviewer.tellGone), which held nothing of it if
// that came between withoutGone's check and the upsert: nothing told the
// store again, and the pod was held with what its node's stream sent for
// it until the stream ended. Checked after the upsert, a pod not yet
// marked gone is one the store will be told of. It returns the entries
// let go, by their uid (nil for none).
func (st *streamState) dropGone(infos []store.PodInfo) map[string]bool {
	var dropped map[string]bool
	for _, info := range infos {
		if !st.gone(info) {
			continue
		}
		st.srv.store.Gone(st.hello.Node, podUID(info))
		if dropped == nil {
			dropped = map[string]bool{}
		}
		dropped[info.UID] = true
	}
	return dropped
}

// withoutGone is infos (and their ids, in step) less those gone.
func (st *streamState) withoutGone(infos []store.PodInfo, ids []uint32) ([]store.PodInfo, []uint32) {
	n := 0
	for i := range infos {
		if !st.gone(infos[i]) {
			infos[n], ids[n] = infos[i], ids[i]
			n++
		}
	}
	return infos[:n], ids[:n]
}

// logAllowed: a rejection is logged at most ten a minute a stream (an
// agent listing thousands of made-up pods at each catalogue wrote a line
// each).
func (st *streamState) logAllowed() bool {
	if st.rejectLogs == nil {
		st.rejectLogs = rate.NewLimiter(rate.Every(6*time.Second), 10)
	}
	return st.rejectLogs.Allow()
}

// reject refuses one catalogue entry (counted, logged, the pod its id named
// before added to removed); the rest of the catalogue and the stream go on:
// one pod's bad labels or annotations must not silence its node's others.
func (st *streamState) reject(p *pulsev1.Pod, reason, node string, err error, removed []string) []string {
	st.srv.m.rejected.WithLabelValues(reason).Inc()
	if st.logAllowed() {
		st.logger().Warn("catalogue entry rejected (logged at most ten a minute a stream; counted in pulse_aggregator_rejected_reports_total)",
			logging.KeyPod, shown(p.Namespace)+"/"+shown(p.Name), logging.KeyReason, reason, logging.KeyPodNode, node, logging.KeyErr, err)
	}
	if old, ok := st.ids[p.Id]; ok {
		removed = append(removed, old)
		delete(st.ids, p.Id)
		// The agent's encoder forgets a pod only removed or replaced (a
		// new uid): the decoder does the same, or the next batch with
		// this id does not decode and ends the stream. Its samples are
		// decoded and dropped while it is refused.
		if old != p.Uid {
			st.forget(p.Id)
		}
	}
	delete(st.pending, p.Id)
	st.rejected[p.Id] = true
	return removed
}

// entryInfo checks one catalogue entry against the limits (its times no
// more than maxClockAhead past nowMs) and returns what the store keeps of
// it and the uid of the pod that vouches for it (a demand entry's router),
// or the rejection's reason and error.
func entryInfo(p *pulsev1.Pod, nowMs int64) (info store.PodInfo, podUID, reason string, err error) {
	if p.Uid == "" || p.Namespace == "" || p.Name == "" {
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %d: uid, namespace and name are required", p.Id)
	}
	if len(p.Uid) > maxNameBytes || len(p.Namespace) > maxNameBytes || len(p.Name) > maxNameBytes {
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %d: a uid, namespace or name over %d bytes", p.Id, maxNameBytes)
	}
	if !wire.IsName(p.Uid) || !wire.IsName(p.Namespace) || !wire.IsName(p.Name) {
		// A newline in a name forged a row of the debug tables under
		// another namespace's name; a bidi override reordered the rest.
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %d: a uid, namespace or name with a control or format character", p.Id)
	}
	podUID = p.Uid
	if p.Demand {
		// A router's entry for one workload: the router pod's uid and the
		// workload's name.
		var ok bool
		if podUID, ok = store.DemandPodUID(p.Uid); !ok {
			return info, "", "invalid_entry", fmt.Errorf("catalogue entry %d: a demand entry's uid %q is not POD_UID/demand/WORKLOAD", p.Id, p.Uid)
		}
	}
	if len(p.Workloads) > maxWorkloadsPerPod {
		return info, "", "too_many_workloads", fmt.Errorf("catalogue entry %s/%s: %d workloads; at most %d", p.Namespace, p.Name, len(p.Workloads), maxWorkloadsPerPod)
	}
	if ahead := nowMs + maxClockAhead.Milliseconds(); p.CreatedUnixMs > ahead || p.ReadySinceUnixMs > ahead || p.UnreadySinceUnixMs > ahead {
		// As a sample's time: a time past 2262 wrapped when the store
		// took it in nanoseconds, and the pod's startup and age read as
		// garbage.
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %s/%s: created %d ms, ready since %d ms, unready since %d ms: one is more than an hour ahead of the aggregator's clock (is the node's clock set?)", p.Namespace, p.Name, p.CreatedUnixMs, p.ReadySinceUnixMs, p.UnreadySinceUnixMs)
	}
	if p.CreatedUnixMs < 0 || p.ReadySinceUnixMs < 0 || p.ReadySinceUnixMs > 0 && p.ReadySinceUnixMs < p.CreatedUnixMs {
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %s/%s: created %d ms and ready since %d ms: want neither negative, nor ready before created", p.Namespace, p.Name, p.CreatedUnixMs, p.ReadySinceUnixMs)
	}
	if p.UnreadySinceUnixMs < 0 || p.UnreadySinceUnixMs > 0 && (p.Ready || p.UnreadySinceUnixMs < p.CreatedUnixMs) {
		return info, "", "invalid_entry", fmt.Errorf("catalogue entry %s/%s: unready since %d ms (created %d ms, ready %v): want it not negative, not before created, and none while ready", p.Namespace, p.Name, p.UnreadySinceUnixMs, p.CreatedUnixMs, p.Ready)
	}
	info = store.PodInfo{UID: p.Uid, Namespace: p.Namespace, Name: p.Name, Ready: p.Ready, Terminating: p.Terminating, Demand: p.Demand,
		CreatedMs: p.CreatedUnixMs, ReadySinceMs: p.ReadySinceUnixMs, UnreadySinceMs: p.UnreadySinceUnixMs}
	for _, w := range p.Workloads {
		kind, ok := kinds[w.Kind]
		if !ok || w.Name == "" || len(w.Name) > maxNameBytes || !wire.IsName(w.Name) {
			return info, "", "invalid_entry", fmt.Errorf("catalogue entry %s/%s: workload kind %v name %q is not valid", p.Namespace, p.Name, w.Kind, shown(w.Name))
		}
		info.Workloads = append(info.Workloads, store.Key{Namespace: p.Namespace, Kind: kind, Name: w.Name})
	}
	return info, podUID, "", nil
}

// entryOf is what the entry p claims of the pod podUID.
func entryOf(p *pulsev1.Pod, podUID, node string) Entry {
	e := Entry{Namespace: p.Namespace, Name: p.Name, PodUID: podUID, UID: p.Uid, Node: node}
	for _, w := range p.Workloads {
		e.Workloads = append(e.Workloads, discovery.Workload{Kind: w.Kind, Name: w.Name})
	}
	return e
}

// maxClockAhead bounds how far ahead of the aggregator's clock a sample's
// time may be (its node's clock is NTP's too, or the cluster's TLS would
// fail): past it the sample is refused alone (bad_time).
const maxClockAhead = time.Hour

// warnBadTime logs a sample refused for its time, at most ten a minute a
// stream (with the entries' rejections).
func (st *streamState) warnBadTime(timeMs, nowMs int64) {
	if st.logAllowed() {
		what := "more than an hour ahead of the aggregator's clock"
		if timeMs < 0 {
			what = "before 1970"
		}
		st.logger().Warn("sample refused: its time is "+what+" (is the node's clock set?); counted in pulse_aggregator_rejected_reports_total{reason=\"bad_time\"}",
			logging.KeyNode, st.hello.Node, logging.KeySampleTime, time.UnixMilli(timeMs).UTC().Format(time.RFC3339), logging.KeyNow, time.UnixMilli(nowMs).UTC().Format(time.RFC3339))
	}
}

// checkIDs returns an error naming the first pod id in b that the stream's
// catalogue has not listed: checked before decoding, so that a batch of
// unknown ids allocates no decoder state.
func (st *streamState) checkIDs(b *pulsev1.SampleBatch) error {
	known := func(id uint32) bool {
		_, ok := st.ids[id]
		return ok || st.rejected[id]
	}
	for _, id := range b.Pods {
		if !known(id) {
			return fmt.Errorf("batch %d names pod id %d, which the catalogue has not listed", b.Seq, id)
		}
	}
	for _, m := range b.Missing {
		if !known(m.Pod) {
			return fmt.Errorf("batch %d names pod id %d, which the catalogue has not listed", b.Seq, m.Pod)
		}
	}
	for _, x := range b.Extra {
		if !known(x.Pod) {
			return fmt.Errorf("batch %d names pod id %d, which the catalogue has not listed", b.Seq, x.Pod)
		}
	}
	return nil
}

// values fills r with a scraped sample's values, extra gauges and
// histograms. Every pulse value is a count, a ratio, a rate or a duration:
// a negative one is bad input. It is dropped (absent), the rest kept, and
// the pod shows it (/debug/workloads) and is logged. Extra values that do
// not match the hello's names are dropped the same way (bad_extra), that
// sample's alone: the batch decoded, so the two ends still agree.
func (st *streamState) values(r *store.Report, s *wire.Sample) {
	var rejected []string
	switch {
	case s.Extra == nil:
	case len(s.Extra) != len(st.hello.ExtraMetrics):
		st.srv.m.rejected.WithLabelValues("bad_extra").Inc()
		rejected = append(rejected, fmt.Sprintf("%d extra values for %d extra metrics", len(s.Extra), len(st.hello.ExtraMetrics)))
	default:
		r.Extra = make([]float64, len(s.Extra))
		for i, x := range s.Extra {
			if math.IsInf(x, 0) {
				x = math.NaN()
			}
			r.Extra[i] = x
		}
	}
	r.Values, r.Hist = s.Values, s.Hist
	st.unhold(r, s.Pod)
	if s.Hist != nil && !st.srv.sawHist.Load() && !st.srv.sawHist.Swap(true) && st.srv.onHist != nil {
		st.srv.onHist()
	}
	for id := metric.ID(1); id < metric.NumIDs; id++ {
		v, ok := r.Values.Get(id)
		switch {
		case !ok:
		case v < 0:
			r.Values.Present &^= 1 << id
			st.srv.m.rejected.WithLabelValues("negative_value").Inc()
			rejected = append(rejected, "negative "+id.Name())
		case v > 1 && id.Ratio():
			// A fraction past 1: one pod's KV cache "50000 full" made its
			// workload's mean 12,500 against a threshold of 0.4.
			r.Values.Present &^= 1 << id
			st.srv.m.rejected.WithLabelValues("ratio_above_one").Inc()
			rejected = append(rejected, fmt.Sprintf("%s %g above 1", id.Name(), v))
		}
	}
	rejected = st.latencyBounds(r, rejected)
	if rejected != nil {
		r.Rejected = strings.Join(rejected, ", ")
		st.logRejected(s.Pod, r.Rejected)
	}
}

// latencyBounds drops a sample's histogram with a bound at or below 0, and
// adds why to rejected: every histogram pulse reads is of latencies (TTFT,
// ITL), and no bucket of them holds a duration of 0 or less. Merged with
// its workload's other pods on the bounds they share, one pod's bucket at
// -100 left only the +Inf bucket, and the workload's quantile Unavailable.
// The sample's other values are kept, and its pod's last histogram stands
// (metric.Complete).
func (st *streamState) latencyBounds(r *store.Report, rejected []string) []string {
	if r.Hist == nil {
		return rejected
	}
	var kept *metric.Histograms
	for i := range r.Hist {
		b := &r.Hist[i]
		if !b.Present() || b.Bounds[0] > 0 {
			continue
		}
		if kept == nil {
			c := *r.Hist // the sample's own, never the decoder's
			kept = &c
		}
		kept[i] = metric.Buckets{}
		st.srv.m.rejected.WithLabelValues("nonpositive_bound").Inc()
		rejected = append(rejected, fmt.Sprintf("%s's bound %g at or below 0", metric.Hist(i).Name(), b.Bounds[0]))
	}
	if kept != nil {
		r.Hist = kept
	}
	return rejected
}

// batch stores a batch. A batch that does not decode ends the stream: the
// two ends' encoding state no longer agree, and a new stream resets both.
func (st *streamState) batch(b *pulsev1.SampleBatch) error {
	if err := st.checkIDs(b); err != nil {
		st.srv.m.rejected.WithLabelValues("malformed_batch").Inc()
		return err
	}
	bufs := batchPool.Get().(*batchBufs)
	defer bufs.put()
	samples, err := st.dec.Decode(bufs.samples[:0], b)
	bufs.samples = samples
	if err != nil {
		st.srv.m.rejected.WithLabelValues("malformed_batch").Inc()
		return err
	}
	if len(st.pending) > 0 {
		if err := st.relist(); err != nil {
			return err
		}
	}
	if len(st.unchecked) > 0 {
		if err := st.recheck(time.Now()); err != nil {
			return err
		}
	}
	reports := bufs.reports[:0]
	nowMs := time.Now().UnixMilli()
	for i := range samples {
		if r, ok := st.report(&samples[i], b.TimeUnixMs, nowMs); ok {
			reports = append(reports, r)
		}
	}
	bufs.reports = reports
	dropped, err := st.srv.store.AddStream(st.hello.Node, st.stream, reports)
	if err != nil {
		return st.superseded()
	}
	if dropped > 0 {
		st.srv.m.rejected.WithLabelValues("unknown_pod").Add(float64(dropped))
	}
	if !st.heard && len(st.unchecked) == 0 {
		// Its state is whole: the warm-up may count it (one whose
		// entries are not looked up yet holds it).
		st.heard = true
		st.srv.store.MarkHeard(st.hello.Node)
	}
	return nil
}

// report is what the store is given of s, a sample of the batch sent at
// batchMs; false when it is refused (counted; its histograms held, hold).
func (st *streamState) report(s *wire.Sample, batchMs, nowMs int64) (store.Report, bool) {
	uid, ok := st.ids[s.Pod]
	switch {
	case !ok && st.rejected[s.Pod]:
		st.hold(s)
		return store.Report{}, false // its entry's refusal was counted, and logged, once
	case !ok:
		st.srv.m.rejected.WithLabelValues("unknown_pod").Inc()
		return store.Report{}, false
	}
	if _, waits := st.pending[s.Pod]; waits {
		st.srv.m.rejected.WithLabelValues("store_full").Inc()
		st.hold(s)
		return store.Report{}, false
	}
	r := store.Report{UID: uid}
	r.TimeMs = batchMs + int64(s.OffsetMs)
	if r.TimeMs < 0 || r.TimeMs-nowMs > maxClockAhead.Milliseconds() {
		// A time no clock of the cluster gives (the agent's, or a
		// lie): the store keeps each pod's series in time order, and
		// one sample years ahead held every later one out; one before
		// 1970 (or past an int64) overflowed the series' time deltas.
		// (A time behind is a clock stepped back: the store starts the
		// pod's series again.)
		st.srv.m.rejected.WithLabelValues("bad_time").Inc()
		st.warnBadTime(r.TimeMs, nowMs)
		st.hold(s)
		return store.Report{}, false
	}
	if s.Missing != pulsev1.MissingReason_MISSING_REASON_UNSPECIFIED {
		r.Missing, r.Error = wire.ReasonName(s.Missing), wire.CleanText(s.Error, maxErrorBytes)
		st.srv.m.missing.Inc()
		return r, true
	}
	st.values(&r, s)
	st.srv.m.ok.Inc()
	return r, true
}
