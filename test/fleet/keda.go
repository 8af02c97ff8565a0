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
	polls    *poller

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
	s := &scaledObject{f: f, idx: idx, workload: workload, probe: probe, client: externalscaler.NewExternalScalerClient(conn),
		ref: &externalscaler.ScaledObjectRef{Name: "so-" + workloadName(workload), Namespace: namespace, ScalerMetadata: md}}
	s.polls = &poller{idx: idx, ref: s.ref, client: s.client, record: f.recordGetMetrics, fail: f.rpcError}
	return s
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

// poll makes the ScaledObject's polls (poller.run) in the harness, except
// while they are made by the pollers' process apart (f.apart): then it
// keeps their schedule and makes none.
func (s *scaledObject) poll(ctx context.Context) {
	s.polls.run(ctx, s.f.apart.Load)
}

// poller makes one ScaledObject's polls as KEDA (GetMetricSpec →
// GetMetrics → IsActive every 30 s) and the HPA (GetMetrics every 15 s)
// do, each at a random offset. The harness's ScaledObjects use it, and so
// does the pollers' process apart (apart.go).
type poller struct {
	idx    int
	ref    *externalscaler.ScaledObjectRef
	client externalscaler.ExternalScalerClient
	record func(time.Duration, error) // a GetMetrics made
	fail   func(rpc string, err error)
	// every: KEDA's and the HPA's periods; zero: theirs (the tests'
	// shorter ones otherwise).
	every [2]time.Duration

	mu         sync.Mutex
	metricName string
}

// KEDA's default pollingInterval and the HPA's sync period.
const (
	kedaPollEvery = 30 * time.Second
	hpaPollEvery  = 15 * time.Second
)

// run polls until ctx ends; at each turn that skip (nil: never) says is
// not the harness's to make, it makes none.
func (p *poller) run(ctx context.Context, skip func() bool) {
	kedaEvery, hpaEvery := kedaPollEvery, hpaPollEvery
	if p.every[0] > 0 {
		kedaEvery, hpaEvery = p.every[0], p.every[1]
	}
	rng := rand.New(rand.NewPCG(uint64(p.idx), 7))
	nextKEDA := time.Now().Add(time.Duration(rng.Int64N(int64(kedaEvery))))
	nextHPA := time.Now().Add(time.Duration(rng.Int64N(int64(hpaEvery))))
	for {
		next := nextHPA
		if nextKEDA.Before(nextHPA) {
			next = nextKEDA
		}
		if !procs.Sleep(ctx, time.Until(next)) {
			return
		}
		kedas := next.Equal(nextKEDA)
		if kedas {
			nextKEDA = nextKEDA.Add(kedaEvery)
		} else {
			nextHPA = nextHPA.Add(hpaEvery)
		}
		switch {
		case skip != nil && skip():
		case kedas:
			p.kedaPoll(ctx)
		default:
			p.getMetrics(ctx)
		}
	}
}

// Each call has KEDA's deadline: without one, a call that hung stalled
// its ScaledObject's polls for ever, unnoticed (no error; it fell out of
// the GetMetrics count, and the slowest out of the percentiles).
//
// A call under way when ctx ends (the measurement's end) runs to its
// answer or its own deadline, as GetMetrics does, and its error counts:
// cut there, one that hung in the last 10 s was never counted.
func (p *poller) kedaPoll(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), getMetricsDeadline)
	spec, err := p.client.GetMetricSpec(cctx, p.ref)
	cancel()
	if err != nil {
		p.fail("GetMetricSpec", err)
		return
	}
	if len(spec.MetricSpecs) > 0 {
		p.mu.Lock()
		p.metricName = spec.MetricSpecs[0].MetricName
		p.mu.Unlock()
	}
	// A call begun after the end would be none of the measurement's.
	if ctx.Err() != nil || !p.getMetrics(ctx) || ctx.Err() != nil {
		return
	}
	cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), getMetricsDeadline)
	defer cancel()
	if _, err := p.client.IsActive(cctx, p.ref); err != nil {
		p.fail("IsActive", err)
	}
}

// name is the metric name learnt from GetMetricSpec; empty before.
func (p *poller) name() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.metricName
}

// getMetrics asks once and records the latency and the outcome; false
// when it failed.
func (p *poller) getMetrics(ctx context.Context) bool {
	name := p.name()
	if name == "" {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), getMetricsDeadline)
		spec, err := p.client.GetMetricSpec(cctx, p.ref)
		cancel()
		if err != nil || len(spec.MetricSpecs) == 0 {
			p.fail("GetMetricSpec", err)
			return false
		}
		name = spec.MetricSpecs[0].MetricName
		p.mu.Lock()
		p.metricName = name
		p.mu.Unlock()
	}
	start := time.Now()
	// A deadline, as KEDA's calls have: an answer later than it is an error,
	// not a latency left out of the percentiles for being still under way
	// when they are read. A call under way when ctx ends (the measurement's
	// end) runs to its answer or its own deadline: cut there, the slowest
	// answers, those still under way, would be the ones left out.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), getMetricsDeadline)
	resp, err := p.client.GetMetrics(cctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: p.ref, MetricName: name})
	cancel()
	if err == nil && len(resp.MetricValues) == 0 {
		err = status.Error(codes.Unknown, "GetMetrics answered no value")
	}
	p.record(time.Since(start), err)
	return err == nil
}
