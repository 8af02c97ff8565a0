// Package scaler serves KEDA's external-push scaler API
// (github.com/kedacore/keda/v2/pkg/scalers/externalscaler) from the store.
// Every RPC answers from memory; nothing blocks on I/O.
package scaler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/store"
)

// Server implements externalscaler.ExternalScalerServer.
type Server struct {
	externalscaler.UnimplementedExternalScalerServer
	store     *store.Store
	maxWindow time.Duration
	resolver  TargetResolver // nil: triggers must name their workload
	// recheck is how often open streams re-evaluate with no new sample, so
	// that a workload going stale is noticed.
	recheck time.Duration
	// minGap spaces a stream's evaluations: changes that come closer are
	// coalesced into one evaluation, at most minGap after the first.
	minGap time.Duration

	done     chan struct{}
	doneOnce sync.Once
	streams  sync.WaitGroup
	open     atomic.Int64
	closeMu  sync.Mutex
	closing  bool // no stream may start once Shutdown has begun
}

// OpenStreams is the number of StreamIsActive and StreamMetricSpec handlers
// running now.
func (s *Server) OpenStreams() int64 { return s.open.Load() }

// enter registers a stream handler; false once Shutdown has begun (the
// handler then returns nil at once: EOF for KEDA).
func (s *Server) enter() bool {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closing {
		return false
	}
	s.streams.Add(1)
	s.open.Add(1)
	return true
}

func (s *Server) leave() { s.open.Add(-1); s.streams.Done() }

var _ externalscaler.ExternalScalerServer = (*Server)(nil)

// New returns a Server reading st; window metadata may ask for at most
// maxWindow. resolver may be nil.
func New(st *store.Store, maxWindow time.Duration, resolver TargetResolver) *Server {
	return &Server{store: st, maxWindow: maxWindow, resolver: resolver, recheck: 500 * time.Millisecond, minGap: 40 * time.Millisecond,
		done: make(chan struct{})}
}

// Shutdown ends every open stream with EOF (the handlers return nil), so
// KEDA reconnects in 2s rather than backing off; call it before GracefulStop.
func (s *Server) Shutdown() {
	s.closeMu.Lock()
	s.closing = true
	s.closeMu.Unlock()
	s.doneOnce.Do(func() { close(s.done) })
	s.streams.Wait()
}

// Result is a trigger's evaluated value.
type Result struct {
	Value  float64 // what GetMetrics returns
	Active bool
}

// Evaluate computes a trigger's value.
func (s *Server) Evaluate(t Trigger) (Result, error) {
	var podBuf [16]store.PodValue
	var valBuf [16]float64
	pods, found := s.store.Query(podBuf[:0], t.Workload, t.Metric, t.Window, t.StaleAfter)
	if !found {
		return Result{}, status.Errorf(codes.NotFound, "%s: no pod of this workload has been reported", describe(t))
	}
	vals := valBuf[:0]
	missing, reporting := 0, 0
	for _, p := range pods {
		if p.Reporting {
			reporting++
		}
		if p.Defined {
			vals = append(vals, p.Value)
		} else {
			missing++
		}
	}
	if reporting == 0 {
		// An error, so that KEDA applies its fallback: never a silent 0.
		return Result{}, status.Errorf(codes.Unavailable, "%s: stale: no pod reported within staleAfter %s", describe(t), t.StaleAfter)
	}
	if len(vals) == 0 {
		return Result{}, status.Errorf(codes.Unavailable, "%s: metric %q is not defined on any reporting pod (absent from the pages, or no requests finished in the window)", describe(t), t.Metric)
	}
	v := aggregate(vals, t.Aggregation)
	if t.MissingPods == "conservative" && missing > 0 {
		// A missing pod never causes a scale-down (it counts as 1.5×
		// threshold when the others are at or below it) and never inflates
		// a scale-up (it counts as 0 when they are above).
		fill := 0.0
		if v <= t.Threshold {
			fill = 1.5 * t.Threshold
		}
		for range missing {
			vals = append(vals, fill)
		}
		v = aggregate(vals, t.Aggregation)
	}
	if t.ValueType == "total" {
		v *= float64(len(vals))
	}
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return Result{}, status.Errorf(codes.Internal, "%s: computed value %v is not a valid metric value", describe(t), v)
	}
	return Result{Value: v, Active: v > t.ActivationThreshold}, nil
}

func aggregate(vals []float64, how string) float64 {
	if how == "max" {
		m := vals[0]
		for _, v := range vals[1:] {
			m = math.Max(m, v)
		}
		return m
	}
	var sum float64
	for _, v := range vals {
		sum += v
	}
	return sum / float64(len(vals))
}

func describe(t Trigger) string {
	return fmt.Sprintf("%s %s/%s", t.Workload.Kind, t.Workload.Namespace, t.Workload.Name)
}

func (s *Server) parse(ref *externalscaler.ScaledObjectRef) (Trigger, error) {
	t, err := ParseTrigger(ref, s.maxWindow, s.resolver)
	switch {
	case errors.Is(err, errNotSynced):
		return t, status.Error(codes.Unavailable, err.Error()) // passes: KEDA retries
	case err != nil:
		return t, status.Error(codes.InvalidArgument, err.Error())
	}
	return t, nil
}

var unsafeName = regexp.MustCompile(`[^a-z0-9-]+`)

// MetricName is the trigger's stable metric name: lower case letters, digits
// and dashes only, so that it is a valid URL path segment and metric name.
func MetricName(t Trigger) string {
	n := strings.ToLower(strings.Join([]string{"pulse", t.Workload.Kind, t.Workload.Namespace, t.Workload.Name, t.Metric}, "-"))
	return strings.Trim(unsafeName.ReplaceAllString(n, "-"), "-")
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

// GetMetrics returns exactly one value (the HPA sums all values returned).
func (s *Server) GetMetrics(_ context.Context, req *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	t, err := s.parse(req.GetScaledObjectRef())
	if err != nil {
		return nil, err
	}
	r, err := s.Evaluate(t)
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
		MetricName: name, MetricValueFloat: r.Value, MetricValue: int64(math.Round(r.Value)),
	}}}, nil
}

// IsActive reports value > activationThreshold, consistently with GetMetrics.
func (s *Server) IsActive(_ context.Context, ref *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	t, err := s.parse(ref)
	if err != nil {
		return nil, err
	}
	r, err := s.Evaluate(t)
	if err != nil {
		return nil, err
	}
	return &externalscaler.IsActiveResponse{Result: r.Active}, nil
}

// StreamIsActive sends the current state at once, then every change, as soon
// as the sample that causes it is stored. It returns nil (EOF for KEDA) when
// the server shuts down, and returns when KEDA cancels.
func (s *Server) StreamIsActive(ref *externalscaler.ScaledObjectRef, stream grpc.ServerStreamingServer[externalscaler.IsActiveResponse]) error {
	t, err := s.parse(ref)
	if err != nil {
		return err
	}
	return s.watch(stream.Context(), t.Workload, func(sent bool, last bool) (bool, bool, error) {
		r, err := s.Evaluate(t)
		if err != nil {
			return last, false, nil // keep the stream; KEDA's polls see the error
		}
		if sent && r.Active == last {
			return last, false, nil
		}
		return r.Active, true, stream.Send(&externalscaler.IsActiveResponse{Result: r.Active})
	})
}

// StreamMetricSpec sends the spec at once. The spec depends only on the
// trigger's metadata, which KEDA sends when it opens the stream, so it never
// changes during a stream; the stream stays open until KEDA cancels it or
// the server shuts down.
func (s *Server) StreamMetricSpec(ref *externalscaler.ScaledObjectRef, stream grpc.ServerStreamingServer[externalscaler.GetMetricSpecResponse]) error {
	t, err := s.parse(ref)
	if err != nil {
		return err
	}
	if !s.enter() {
		return nil
	}
	defer s.leave()
	if err := stream.Send(spec(t)); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
		return stream.Context().Err()
	case <-s.done:
		return nil
	}
}

// watch runs step at once and after every change of workload k (and every recheck
// period) until the client cancels or the server shuts down. step receives
// whether anything was sent and the last state sent, and returns the new
// last state and whether it sent.
func (s *Server) watch(ctx context.Context, k store.Key, step func(sent, last bool) (bool, bool, error)) error {
	if !s.enter() {
		return nil
	}
	defer s.leave()
	tick := time.NewTicker(s.recheck)
	defer tick.Stop()
	var sent, last bool
	var woken time.Time // when a change last woke this stream
	for {
		changed := s.store.Changed(k) // before evaluating, so no change is missed
		next, didSend, err := step(sent, last)
		if err != nil {
			return err
		}
		if didSend {
			sent, last = true, next
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return nil
		case <-changed:
			// Coalesce a burst of changes (every pod of a workload
			// reporting in the same tick) into one evaluation: the first
			// change is evaluated at once, later ones at most every minGap.
			now := time.Now()
			wait := s.minGap - now.Sub(woken)
			woken = now
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-s.done:
					t.Stop()
					return nil
				case <-t.C:
				}
			}
		case <-tick.C:
		}
	}
}
