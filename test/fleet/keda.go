package main

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/test/procs"
)

// getMetricsDeadline bounds one GetMetrics call (the HPA's sync is 15 s).
const getMetricsDeadline = 10 * time.Second

// scaledObject is one ScaledObject's external-push trigger, as KEDA and the
// HPA drive it.
type scaledObject struct {
	f        *fleet
	idx      int
	workload int
	probe    bool
	ref      *externalscaler.ScaledObjectRef
	client   externalscaler.ExternalScalerClient

	mu         sync.Mutex
	metricName string

	activeOpens atomic.Int64 // StreamIsActive streams that delivered a first value
	specOpens   atomic.Int64 // StreamMetricSpec streams that delivered the spec
	activeEnds  atomic.Int64 // StreamIsActive streams that ended
	specEnds    atomic.Int64
}

// answer is one GetMetrics outcome.
type answer struct {
	at    time.Time
	value int64
	code  codes.Code
}

func newScaledObject(f *fleet, idx, workload int, probe bool, conn *grpc.ClientConn) *scaledObject {
	md := map[string]string{"deployment": workloadName(workload), "metric": "waiting", "threshold": "10", "activationThreshold": "5"}
	if probe {
		// The window's maximum: the first raised sample of any of the
		// workload's pods flips the decision, so that the latency measured
		// is the path's (agent stream, store, StreamIsActive), not how many
		// samples a window average needs.
		md["aggregation"] = "max"
	}
	return &scaledObject{f: f, idx: idx, workload: workload, probe: probe, client: externalscaler.NewExternalScalerClient(conn),
		ref: &externalscaler.ScaledObjectRef{Name: "so-" + workloadName(workload), Namespace: namespace, ScalerMetadata: md}}
}

// run holds the two streams and polls until ctx ends.
func (s *scaledObject) run(ctx context.Context) {
	s.f.wg.Add(3)
	go func() { defer s.f.wg.Done(); s.retry(ctx, "StreamIsActive", &s.activeEnds, s.streamIsActive) }()
	go func() { defer s.f.wg.Done(); s.retry(ctx, "StreamMetricSpec", &s.specEnds, s.streamMetricSpec) }()
	go func() { defer s.f.wg.Done(); s.poll(ctx) }()
}

// retry runs a stream as KEDA's externalPushScaler does: at once, then
// after 2 s, doubling to a minute; an EOF resets the wait to 2 s.
func (s *scaledObject) retry(ctx context.Context, name string, ends *atomic.Int64, once func(context.Context) error) {
	wait := 2 * time.Second
	for {
		err := once(ctx)
		if ctx.Err() != nil {
			return
		}
		ends.Add(1)
		s.f.streamEnded(name, err)
		if errors.Is(err, io.EOF) {
			wait = 2 * time.Second
		}
		if !procs.Sleep(ctx, wait) {
			return
		}
		wait = min(wait*2, time.Minute)
	}
}

func (s *scaledObject) streamIsActive(ctx context.Context) error {
	stream, err := s.client.StreamIsActive(ctx, s.ref)
	if err != nil {
		return err
	}
	first := true
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		if first {
			s.activeOpens.Add(1)
			first = false
		}
		if s.probe && resp.Result {
			s.f.probeActive(s.workload, now)
		}
	}
}

func (s *scaledObject) streamMetricSpec(ctx context.Context) error {
	stream, err := s.client.StreamMetricSpec(ctx, s.ref)
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		s.specOpens.Add(1)
	}
}

// poll asks as KEDA (GetMetricSpec → GetMetrics → IsActive every 30 s)
// and the HPA (GetMetrics every 15 s) do, each at a random offset.
func (s *scaledObject) poll(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(s.idx), 7))
	nextKEDA := time.Now().Add(time.Duration(rng.Int64N(int64(30 * time.Second))))
	nextHPA := time.Now().Add(time.Duration(rng.Int64N(int64(15 * time.Second))))
	for {
		next := nextHPA
		if nextKEDA.Before(nextHPA) {
			next = nextKEDA
		}
		if !procs.Sleep(ctx, time.Until(next)) {
			return
		}
		if next.Equal(nextKEDA) {
			nextKEDA = nextKEDA.Add(30 * time.Second)
			s.kedaPoll(ctx)
		} else {
			nextHPA = nextHPA.Add(15 * time.Second)
			s.getMetrics(ctx)
		}
	}
}

func (s *scaledObject) kedaPoll(ctx context.Context) {
	spec, err := s.client.GetMetricSpec(ctx, s.ref)
	if err != nil {
		s.f.rpcError("GetMetricSpec", err)
		return
	}
	if len(spec.MetricSpecs) > 0 {
		s.mu.Lock()
		s.metricName = spec.MetricSpecs[0].MetricName
		s.mu.Unlock()
	}
	if !s.getMetrics(ctx) {
		return
	}
	if _, err := s.client.IsActive(ctx, s.ref); err != nil {
		s.f.rpcError("IsActive", err)
	}
}

// getMetrics asks once and records the latency and the outcome; false
// when it failed.
func (s *scaledObject) getMetrics(ctx context.Context) bool {
	s.mu.Lock()
	name := s.metricName
	s.mu.Unlock()
	if name == "" {
		spec, err := s.client.GetMetricSpec(ctx, s.ref)
		if err != nil || len(spec.MetricSpecs) == 0 {
			s.f.rpcError("GetMetricSpec", err)
			return false
		}
		name = spec.MetricSpecs[0].MetricName
		s.mu.Lock()
		s.metricName = name
		s.mu.Unlock()
	}
	start := time.Now()
	// A deadline, as KEDA's calls have: an answer later than it is an error,
	// not a latency left out of the percentiles for being still under way
	// when they are read.
	cctx, cancel := context.WithTimeout(ctx, getMetricsDeadline)
	resp, err := s.client.GetMetrics(cctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: s.ref, MetricName: name})
	cancel()
	if err == nil && len(resp.MetricValues) == 0 {
		err = status.Error(codes.Unknown, "GetMetrics answered no value")
	}
	s.f.recordGetMetrics(time.Since(start), err)
	return err == nil
}
