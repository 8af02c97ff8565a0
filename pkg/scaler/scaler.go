// Package scaler serves KEDA's external-push scaler API
// (github.com/kedacore/keda/v2/pkg/scalers/externalscaler) from the store.
// Every RPC answers from memory; nothing blocks on I/O.
package scaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/slots"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Server implements externalscaler.ExternalScalerServer.
type Server struct {
	crossNS bool // Options.AllowCrossNamespace
	externalscaler.UnimplementedExternalScalerServer
	store     *store.Store
	maxWindow time.Duration
	resolver  TargetResolver // nil: triggers must name their workload
	gate      func() error   // nil, or non-nil error while answers would be partial
	decisions *recorder
	plans     *plans
	// windows: the live triggers' windows, which size the store's
	// retention (nil unless Options.FollowWindows).
	windows *windows
	now     func() time.Time
	log     *slog.Logger
	// recheck: an open stream re-evaluates when this long has passed since
	// its last evaluation with no new sample, so that a workload going stale
	// is noticed; a workload whose samples keep coming is evaluated at them.
	recheck time.Duration
	// minGap spaces the pusher's passes: changes that come closer are
	// coalesced into one evaluation, at most minGap after the first.
	minGap time.Duration
	push   *pusher
	extra  extraNames

	done     chan struct{}
	doneOnce sync.Once
	streams  sync.WaitGroup
	open     atomic.Int64
	closeMu  sync.Mutex
	closing  bool // no stream may start once Shutdown has begun

	// slots bound the open streams (Options.MaxStreams,
	// MaxStreamsPerNamespace) by their ScaledObject's namespace.
	slots                slots.Slots
	maxStreams, maxPerNS int
	maxTriggerSeries     int
	// streamsRefused counts the streams refused past a bound, by the bound
	// (limitAll, limitNamespace); streamsReclaimed those whose place
	// another namespace's took (enter).
	streamsRefused   [2]atomic.Uint64
	streamsReclaimed atomic.Uint64
	// places: the open streams' places, by namespace (closeMu).
	places map[string][]*place
}

// The bounds a stream is refused past, in Server.streamsRefused.
const (
	limitAll = iota
	limitNamespace
)

// Options configure a Server.
type Options struct {
	// MaxWindow bounds the window a trigger may ask for.
	MaxWindow time.Duration
	// Resolver finds a trigger's workload from its ScaledObject when the
	// metadata names none; nil: triggers must name their workload.
	Resolver TargetResolver
	// Gate, when set, is asked before every evaluation: while it returns an
	// error (the aggregator is warming up), every answer is Unavailable
	// with that error, and streams push nothing.
	Gate func() error
	// Now is the clock of the decision records (time.Now when nil).
	Now func() time.Time
	// Logger logs refused triggers (nil: none).
	Logger *slog.Logger
	// FollowWindows keeps the store's retention at the longest window the
	// live triggers ask for (at least DefaultWindow, at most MaxWindow)
	// rather than at MaxWindow; the aggregator sets it.
	FollowWindows bool
	// AllowCrossNamespace lets a trigger's namespace or workspaceNamespace
	// name another namespace than its ScaledObject's; false: a trigger reads
	// only its own namespace (a tenant's ScaledObject must not read
	// another tenant's workload).
	AllowCrossNamespace bool
	// MaxStreams bounds the StreamIsActive and StreamMetricSpec streams
	// open at once (KEDA opens one of each for every external-push
	// trigger), and MaxStreamsPerNamespace those of one namespace (the
	// ScaledObject's), so that one tenant's ScaledObjects cannot take
	// every other tenant's room. A stream past either is refused
	// (ResourceExhausted; KEDA retries, backing off to a minute, and its
	// polls are answered as before). 0: no bound.
	MaxStreams, MaxStreamsPerNamespace int
	// MaxTriggerSeries bounds the triggers whose series /metrics carries
	// (Collector), shared among their namespaces in turn: one tenant's
	// ScaledObjects made a page of hundreds of megabytes, gathered at each
	// scrape. 0: no bound.
	MaxTriggerSeries int
}

// OpenStreams is the number of StreamIsActive and StreamMetricSpec handlers
// running now.
func (s *Server) OpenStreams() int64 { return s.open.Load() }

var _ externalscaler.ExternalScalerServer = (*Server)(nil)

// New returns a Server reading st.
func New(st *store.Store, o Options) *Server {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{store: st, maxWindow: o.MaxWindow, resolver: o.Resolver, gate: o.Gate, crossNS: o.AllowCrossNamespace, decisions: newRecorder(o.Now), plans: newPlans(), log: o.Logger,
		maxStreams: o.MaxStreams, maxPerNS: o.MaxStreamsPerNamespace, maxTriggerSeries: o.MaxTriggerSeries,
		recheck: 500 * time.Millisecond, minGap: 5 * time.Millisecond, done: make(chan struct{}), now: o.Now}
	s.push = newPusher(s)
	if o.FollowWindows {
		floor := DefaultWindow
		if o.MaxWindow > 0 {
			floor = min(floor, o.MaxWindow)
		}
		s.windows = newWindows(floor, o.MaxWindow, st.SetRetention)
	}
	return s
}

// Shutdown ends every open stream with EOF (the handlers return nil), so
// KEDA reconnects in 2s rather than backing off; call it before GracefulStop.
func (s *Server) Shutdown() {
	s.doneOnce.Do(func() { close(s.done) })
	s.closeMu.Lock()
	s.closing = true
	for _, ps := range s.places {
		for _, p := range ps {
			p.signal() // its handler sees done
		}
	}
	s.closeMu.Unlock()
	s.streams.Wait()
	s.push.wg.Wait()
}

func (s *Server) parse(ref *externalscaler.ScaledObjectRef) (Trigger, error) {
	if ref.GetNamespace() == "" {
		// KEDA always names the ScaledObject's namespace. Without one
		// neither the namespace check nor the per-namespace stream bound
		// would apply: a caller could read any namespace and hold streams
		// counted against none.
		return Trigger{}, status.Error(codes.InvalidArgument, "scaledObjectRef: no namespace (KEDA names the ScaledObject's)")
	}
	// KEDA names a ScaledObject as the API server has it: a namespace is
	// a DNS label, a name a DNS subdomain. Another caller's (the scaler
	// port in plaintext) were kept whole in the refusals' records and on
	// /metrics: 1,000 refused calls of 200 KiB names held 204 MB.
	if msgs := validation.IsDNS1123Label(ref.GetNamespace()); len(msgs) > 0 {
		return Trigger{}, status.Errorf(codes.InvalidArgument, "scaledObjectRef: namespace %q is no namespace's name: %s", wire.CleanText(ref.GetNamespace(), 64), strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(ref.GetName()); len(msgs) > 0 {
		return Trigger{}, status.Errorf(codes.InvalidArgument, "scaledObjectRef: name %q is no ScaledObject's name: %s", wire.CleanText(ref.GetName(), 253), strings.Join(msgs, "; "))
	}
	t, err := ParseTrigger(ref, s.maxWindow, s.resolver)
	switch {
	case errors.Is(err, errNotSynced), errors.Is(err, errNotCached), errors.Is(err, errNotCaller):
		return t, status.Error(codes.Unavailable, err.Error()) // passes: KEDA retries
	case err != nil:
		st := status.Error(codes.InvalidArgument, err.Error())
		s.refuse(ref, t, refusalReason(err), st)
		return t, st
	}
	// Another namespace's workload is refused first: refused as a metric
	// not forwarded, the refusal named no flag, and cost a walk of the
	// store.
	if own := ref.GetNamespace(); !s.crossNS && t.Workload.Namespace != own {
		err := status.Error(codes.InvalidArgument, fmt.Sprintf(
			"metadata: namespace %q: ScaledObject %s/%s may read only its own namespace (%s); the aggregator's --allow-cross-namespace-triggers allows others",
			t.Workload.Namespace, own, ref.GetName(), own))
		s.refuse(ref, t, ReasonNamespace, err)
		return t, err
	}
	// A metric the agents do not forward is the same InvalidArgument from
	// every call (GetMetrics once answered it Unavailable). During the
	// warm-up there is no telling (the agents that forward it may not have
	// reported yet): it passes, and the answers are Unavailable until the
	// gate opens (a ScaledObject was refused, and its stream ended, for
	// the agents heard first).
	if warming := s.gate != nil && s.gate() != nil; !warming {
		if err := s.forwarded(t); err != nil {
			s.refuse(ref, t, ReasonUnforwarded, err)
			return t, err
		}
	}
	return t, nil
}

// MetricName is the trigger's stable metric name: lower case letters, digits
// and dashes only, so that it is a valid URL path segment and metric name.
// It is "pulse", the workload's kind, namespace and name and the metric,
// joined by dashes and lower-cased, each run of other characters made one
// dash, and the dashes at either end trimmed. It is made in one pass, into
// one allocation: every poll, push and stream asks for it, and a regular
// expression's replacement over the joined, lower-cased string cost five
// allocations and a scan (TestMetricNameIsTheExpressions holds the two the
// same).
func MetricName(t Trigger) string {
	parts := [...]string{"pulse", t.Workload.Kind, t.Workload.Namespace, t.Workload.Name, t.Metric}
	n := len(parts) - 1
	for _, p := range parts {
		n += len(p)
	}
	// Each character kept is one byte, and a run replaced one dash: the
	// name is never longer than the parts joined.
	var b strings.Builder
	b.Grow(n)
	other := false // within a run of other characters
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('-')
			other = false
		}
		for _, r := range p {
			if r = unicode.ToLower(r); r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
				b.WriteByte(byte(r))
				other = false
			} else if !other {
				b.WriteByte('-')
				other = true
			}
		}
	}
	return strings.Trim(b.String(), "-")
}

func spec(t Trigger) *externalscaler.GetMetricSpecResponse {
	return &externalscaler.GetMetricSpecResponse{MetricSpecs: []*externalscaler.MetricSpec{{
		MetricName:      MetricName(t),
		TargetSizeFloat: t.Threshold,
		TargetSize:      int64(math.Ceil(t.Threshold)), // for KEDA before targetSizeFloat
	}}}
}

// GetMetricSpec returns the trigger's one metric spec.
func (s *Server) GetMetricSpec(_ context.Context, ref *externalscaler.ScaledObjectRef) (*externalscaler.GetMetricSpecResponse, error) {
	t, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	return spec(t), nil
}

// extraNames keeps the names of the gauges the agents forward, read from
// the store (a walk of every pod under its read lock) at most once a
// second: every call of a trigger on an extra gauge walked the whole
// fleet. A name not known is read again after a second; a known one holds
// for extraNamesFor.
type extraNames struct {
	mu    sync.Mutex
	names []string
	pods  int
	at    time.Time
}

const extraNamesFor = 5 * time.Second

func (e *extraNames) get(st *store.Store, want string, now time.Time) ([]string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	age := now.Sub(e.at)
	// With no pod held the walk costs nothing, and the first pods' names
	// are seen at once.
	if e.pods == 0 || age > extraNamesFor || (age >= time.Second && !slices.Contains(e.names, want)) {
		e.names, e.pods = st.ExtraNames()
		e.at = now
	}
	return e.names, e.pods
}

// MetricMeant is, for a metric name no agent forwards while some agent
// is heard, the name pulse knows or the agents forward that it is within
// a typo of ("" for any other: a canonical metric, replicas, a forwarded
// gauge, or a name near none). The provisioner refuses such a name, as
// the trigger's every answer would be refused. During the warm-up there is
// no telling, as for forwarded: the agents heard may be only those that do
// not forward the gauge (a replica started, or one without leader
// election restarted, marked such a workload invalid with a wrong "did you
// mean", where the scaler took its trigger).
func (s *Server) MetricMeant(name string) string {
	if _, ok := metric.Lookup(name); ok || name == MetricReplicas {
		return ""
	}
	if s.gate != nil && s.gate() != nil {
		return ""
	}
	if mapped := vllmNames[name]; mapped != "" {
		return ""
	}
	names, pods := s.extra.get(s.store, name, s.now())
	if pods == 0 || slices.Contains(names, name) {
		return ""
	}
	return meantOf(name, names)
}

// meantOf is the name pulse knows, or else of names (the gauges the
// agents forward), that name is within a typo of; "" for none.
func meantOf(name string, names []string) string {
	if meant := metricNames.Nearest(name); meant != "" && meant != name {
		return meant
	}
	return Nearest(name, names)
}

// forwarded checks that a metric that is not canonical (a raw gauge name) is
// one the agents forward, so that a mistyped metricName is said when KEDA
// first asks, not only later as "not defined on any reporting pod". With no
// pod held at all (an aggregator just started) there is no telling: it
// passes.
func (s *Server) forwarded(t Trigger) error {
	if _, ok := metric.Lookup(t.Metric); ok || t.Metric == MetricReplicas {
		return nil
	}
	names, pods := s.extra.get(s.store, t.Metric, s.now())
	if pods == 0 || slices.Contains(names, t.Metric) {
		return nil
	}
	have := "none"
	if len(names) > 0 {
		have = forwardedList(names)
	}
	// A name within a typo of one pulse knows, or of one the agents
	// forward, is named: a misspelt vLLM name was read as a gauge to
	// forward, and only the list said otherwise.
	hint := ""
	if meant := meantOf(t.Metric, names); meant != "" {
		hint = " (did you mean " + wire.CleanText(meant, 64) + "?)"
	}
	return status.Error(codes.InvalidArgument, (&MetadataError{Key: "metricName", Msg: fmt.Sprintf(
		"%q%s is neither a vLLM metric pulse knows nor a gauge the agents forward (they forward: %s); forward it with the agents' --extra-metric (the daemonset chart's extraMetrics)",
		wire.CleanText(t.Metric, 64), hint, have)}).Error())
}

// maxNamesShown is the most forwarded names a refusal lists: the agents
// of every node forward up to 32 each, and the refusal goes to KEDA's
// events and the HPA's conditions for every trigger that names another.
const maxNamesShown = 8

// forwardedList lists names (metric names: the ingest refuses a hello
// naming another) for a refusal: the first maxNamesShown, each cut to 64
// bytes, and how many more.
func forwardedList(names []string) string {
	var b strings.Builder
	for i, n := range names {
		if i == maxNamesShown {
			fmt.Fprintf(&b, " and %d more", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(wire.CleanText(n, 64))
	}
	return b.String()
}

// GetMetrics returns exactly one value (the HPA sums all values returned).
func (s *Server) GetMetrics(_ context.Context, req *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	ref := req.GetScaledObjectRef()
	t, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	d, err := s.evaluate(t, true)
	s.decisions.record(ref, t, d, err)
	if err != nil {
		return nil, err
	}
	name := req.GetMetricName()
	if name == "" {
		name = MetricName(t)
	}
	// KEDA reads the float when it is > 0 and the integer otherwise, so
	// both say the same (KEDA keeps milli precision).
	return &externalscaler.GetMetricsResponse{MetricValues: []*externalscaler.MetricValue{{
		MetricName: name, MetricValueFloat: d.Value, MetricValue: int64(math.Round(d.Value)),
	}}}, nil
}

// IsActive reports value > activationThreshold, consistently with GetMetrics.
func (s *Server) IsActive(_ context.Context, ref *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	t, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	d, err := s.evaluate(t, true)
	s.decisions.record(ref, t, d, err)
	if err != nil {
		return nil, err
	}
	return &externalscaler.IsActiveResponse{Result: d.Active}, nil
}

// streamRecheck: how often an open stream whose workload came from its
// ScaledObject's scaleTargetRef resolves it again.
var streamRecheck = 15 * time.Second

// StreamIsActive sends the current state at once, then every change, as soon
// as the sample that causes it is stored (the pusher evaluates it). It
// returns nil (EOF for KEDA) when the server shuts down, and returns when
// KEDA cancels. An evaluation that fails (stale, warming up) sends nothing:
// KEDA's polls see the error.
func (s *Server) StreamIsActive(ref *externalscaler.ScaledObjectRef, stream grpc.ServerStreamingServer[externalscaler.IsActiveResponse]) error {
	w, _, err := s.openStream(ref, true)
	if w == nil {
		return err
	}
	defer w.close()
	ctx := stream.Context()
	for {
		why, err := w.wait(ctx)
		switch why {
		case ended:
			return err
		case recheckDue:
			// KEDA reopens a stream when its ScaledObject changes, maybe
			// before the aggregator's cache has the change: a stream
			// resolved from the old scaleTargetRef followed the old
			// workload for its whole life. One whose workload resolves
			// otherwise now ends (EOF): KEDA opens it again. One that no
			// longer resolves at all (its target a kind pulse does not
			// scale, another namespace) ends with the refusal, as KEDA's
			// polls have it; a cache not ready (Unavailable) is waited out.
			if end, err := w.moved(); end {
				return err
			}
			continue
		}
		state, send := w.u.next()
		if !send {
			continue
		}
		if err := stream.Send(&externalscaler.IsActiveResponse{Result: state}); err != nil {
			return err
		}
	}
}

// streamWait is what an open stream holds while it waits, kept on the heap
// so that its goroutine's stack, which every GC scans while it waits,
// holds none of its trigger (280 bytes, and as much again where it is
// resolved anew: the two handlers' frames were 1.4–1.5 KB, their 2,000
// goroutines at 1,000 ScaledObjects 2.6 MB more to scan and so 2.6 MB more
// in the GC's goal).
type streamWait struct {
	s  *Server
	pl *place
	// u: StreamIsActive's subscription to the pusher (nil for
	// StreamMetricSpec's); workload and name: what the trigger resolved to
	// (the workload, and the metric's name the spec sent last).
	u        *sub
	workload store.Key
	name     string
	recheck  <-chan time.Time
	stop     func()
	// ref is the stream's ScaledObjectRef where it is resolved anew
	// (recheck), nil where not: its metadata map (about 650 bytes) went
	// with every open stream, 1.3 MB at 1,000 ScaledObjects, while a
	// trigger named by its metadata never reads it again.
	ref *externalscaler.ScaledObjectRef
}

// openStream resolves ref and takes a place in its namespace; push: it
// subscribes to the pusher, else it gives the spec to send first. nil,
// with the refusal, when either fails.
func (s *Server) openStream(ref *externalscaler.ScaledObjectRef, push bool) (*streamWait, *externalscaler.GetMetricSpecResponse, error) {
	t, err := s.parse(ref)
	if err != nil {
		return nil, nil, err
	}
	pl, err := s.enter(ref.GetNamespace())
	if pl == nil {
		return nil, nil, err
	}
	w := &streamWait{s: s, pl: pl, workload: t.Workload, name: MetricName(t)}
	var first *externalscaler.GetMetricSpecResponse
	if push {
		w.u = s.push.add(t, ref.GetNamespace(), pl.wake)
	} else {
		first = spec(t)
	}
	w.recheck, w.stop = rechecks(t)
	if w.recheck != nil {
		w.ref = kept(ref)
	}
	return w, first, nil
}

// kept is what a stream's rechecks parse of ref again: its names, and its
// metadata's keys of pulse's and KEDA's (their FromEnv forms too). The
// rest was checked at the stream's start (no typo of a key), and is not
// read again. Kept whole, a trigger of 61 unknown keys of 1 KiB and their
// values held about 130 KB more a stream for its life (two a trigger,
// 20,000 a namespace).
func kept(ref *externalscaler.ScaledObjectRef) *externalscaler.ScaledObjectRef {
	md := map[string]string{}
	for k, v := range ref.GetScalerMetadata() {
		if base, _ := strings.CutSuffix(k, "FromEnv"); known[k] || known[base] {
			md[k] = v
		}
	}
	return &externalscaler.ScaledObjectRef{Name: ref.GetName(), Namespace: ref.GetNamespace(), ScalerMetadata: md}
}

// close stops w's rechecks, ends its subscription and gives its place back.
func (w *streamWait) close() {
	w.stop()
	if w.u != nil {
		w.s.push.remove(w.u)
	}
	w.s.leave(w.pl)
}

// moved resolves w.ref again: end is true when the stream should end (with
// err: nil when its workload moved, the refusal when it no longer
// resolves); a cache not ready is waited out. A function apart, never
// inlined, so that the trigger it resolves is in its own frame, gone once
// it returns, not in the waiting loop's.
//
//go:noinline
func (w *streamWait) moved() (end bool, err error) {
	now, err := w.s.parse(w.ref)
	switch {
	case err == nil && now.Workload != w.workload:
		return true, nil
	case status.Code(err) == codes.InvalidArgument:
		return true, err
	}
	return false, nil
}

// respec resolves w.ref again and sends the spec when the metric's name
// changed: end as moved's. Never inlined, as moved.
//
//go:noinline
func (w *streamWait) respec(stream grpc.ServerStreamingServer[externalscaler.GetMetricSpecResponse]) (end bool, err error) {
	now, err := w.s.parse(w.ref)
	var name string
	if err == nil {
		name = MetricName(now)
	}
	switch {
	case err == nil && name != w.name:
		w.name = name
		if err := stream.Send(spec(now)); err != nil {
			return true, err
		}
	case status.Code(err) == codes.InvalidArgument:
		return true, err
	}
	return false, nil
}

// rechecks ticks every streamRecheck for a trigger whose workload comes
// from its ScaledObject's scaleTargetRef (nil for one whose metadata names
// it: that never changes during a stream), and stops the ticker.
func rechecks(t Trigger) (<-chan time.Time, func()) {
	if !t.fromTarget {
		return nil, func() {}
	}
	tick := time.NewTicker(streamRecheck)
	return tick.C, tick.Stop
}

// StreamMetricSpec sends the spec at once, and again when it changes: a
// trigger's metadata, which KEDA sends when it opens the stream, never
// changes during it, but the workload a trigger resolves from its
// ScaledObject's scaleTargetRef does, and the metric's name with it (a
// stream opened before the aggregator's cache had the change kept the old
// name, where GetMetricSpec gave the new). A resolution refused ends the
// stream with the refusal; a cache not ready is waited out. The stream
// stays open until KEDA cancels it or the server shuts down.
func (s *Server) StreamMetricSpec(ref *externalscaler.ScaledObjectRef, stream grpc.ServerStreamingServer[externalscaler.GetMetricSpecResponse]) error {
	w, first, err := s.openStream(ref, false)
	if w == nil {
		return err
	}
	defer w.close()
	if err := stream.Send(first); err != nil {
		return err
	}
	for {
		why, err := w.wait(stream.Context())
		switch why {
		case ended:
			return err
		case recheckDue:
			if end, err := w.respec(stream); end {
				return err
			}
		}
		// handed: none is to a spec's stream, whose place is woken only
		// to end it.
	}
}

// woke is why a stream's wait returned.
type woke uint8

const (
	handed     woke = iota // a state handed over (StreamIsActive's)
	recheckDue             // a recheck is due (streamRecheck)
	ended                  // the stream ends, with wait's error
)

// wait waits on w's context and its place's wake (and, where it is
// resolved anew, its rechecks): ended with the context's error, with
// errReclaimed, or with nil once the server shuts down (EOF for KEDA).
// A function apart, never inlined, so that the select's cases are in its
// own small frame, not in the handler's.
//
//go:noinline
func (w *streamWait) wait(ctx context.Context) (woke, error) {
	select { // a nil recheck is no case: its select parks on two channels
	case <-ctx.Done():
		return ended, ctx.Err()
	case <-w.pl.wake:
	case <-w.recheck:
		return recheckDue, nil
	}
	select {
	case <-w.s.done:
		return ended, nil
	default:
	}
	if w.pl.reclaimed.Load() {
		return ended, errReclaimed
	}
	return handed, nil
}
