package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// scalerStub answers the polls as a scaler would: one metric, "m", whose
// value is 1; IsActive fails for the ScaledObject "refused".
type scalerStub struct {
	externalscaler.UnimplementedExternalScalerServer
	specs, metrics atomic.Int64
	// slow: GetMetrics for an object named "slow" answers after this long.
	slow time.Duration
}

func (s *scalerStub) GetMetricSpec(context.Context, *externalscaler.ScaledObjectRef) (*externalscaler.GetMetricSpecResponse, error) {
	s.specs.Add(1)
	return &externalscaler.GetMetricSpecResponse{MetricSpecs: []*externalscaler.MetricSpec{{MetricName: "m", TargetSize: 1}}}, nil
}

func (s *scalerStub) GetMetrics(_ context.Context, r *externalscaler.GetMetricsRequest) (*externalscaler.GetMetricsResponse, error) {
	s.metrics.Add(1)
	if r.ScaledObjectRef.GetName() == "slow" {
		time.Sleep(s.slow)
	}
	if r.MetricName != "m" {
		return nil, status.Errorf(codes.InvalidArgument, "metric %q", r.MetricName)
	}
	return &externalscaler.GetMetricsResponse{MetricValues: []*externalscaler.MetricValue{{MetricName: "m", MetricValue: 1}}}, nil
}

func (s *scalerStub) IsActive(_ context.Context, r *externalscaler.ScaledObjectRef) (*externalscaler.IsActiveResponse, error) {
	if r.Name == "refused" {
		return nil, status.Error(codes.Unavailable, "refused")
	}
	return &externalscaler.IsActiveResponse{Result: true}, nil
}

// TestPollersApartTimeEveryPoll: the pollers' process makes each
// object's polls (KEDA's and the HPA's, here at shorter periods), times
// the successful GetMetrics and the echo, counts each failed RPC by its
// code, and counts nothing that the measurement's end cut short.
func TestPollersApartTimeEveryPoll(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	stub := &scalerStub{}
	externalscaler.RegisterExternalScalerServer(srv, stub)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	echoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echoLn.Close()
	go func() { _ = serveEcho(echoLn) }()

	cfg := pollerConfig{Scaler: ln.Addr().String(), Duration: 600 * time.Millisecond, Echo: echoLn.Addr().String(), EchoEvery: 5 * time.Millisecond,
		Every: [2]time.Duration{40 * time.Millisecond, 20 * time.Millisecond},
		Objects: []pollerRef{
			{Idx: 0, Name: "a", Namespace: "fleet", Metadata: map[string]string{"deployment": "w0"}, MetricName: "m"},
			{Idx: 1, Name: "b", Namespace: "fleet", Metadata: map[string]string{"deployment": "w1"}}, // asks for its metric's name
			{Idx: 2, Name: "refused", Namespace: "fleet", Metadata: map[string]string{"deployment": "w2"}, MetricName: "m"},
		}}
	res, err := runPollers(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.GetMetrics) == 0 || int64(len(res.GetMetrics)) > stub.metrics.Load() {
		t.Errorf("%d GetMetrics timed, %d answered: want some, at most those answered", len(res.GetMetrics), stub.metrics.Load())
	}
	for _, d := range res.GetMetrics {
		if d <= 0 {
			t.Fatalf("a GetMetrics of %v s", d)
		}
	}
	if stub.specs.Load() == 0 {
		t.Error("the object without a metric name never asked GetMetricSpec")
	}
	if res.Errors["IsActive Unavailable"] == 0 {
		t.Errorf("errors %v, want the refused IsActive counted", res.Errors)
	}
	for kind := range res.Errors {
		if kind != "IsActive Unavailable" {
			t.Errorf("error %q counted: only the refused IsActive failed", kind)
		}
	}
	if len(res.Echoes) == 0 || res.EchoError != "" {
		t.Errorf("%d echoes, %q: want the floor timed", len(res.Echoes), res.EchoError)
	}
	if res.CPUSeconds <= 0 {
		t.Errorf("CPU %v s, want the process's own", res.CPUSeconds)
	}
}

// TestPollsUnderWayAtTheEndAreTimed: a GetMetrics still under way when
// the measurement ends runs to its answer and is timed; cut there, the
// slowest answers would be the ones left out (or, cut by the deadline
// the server was sent, counted as errors of the aggregator's).
func TestPollsUnderWayAtTheEndAreTimed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const slow = 400 * time.Millisecond
	srv := grpc.NewServer()
	externalscaler.RegisterExternalScalerServer(srv, &scalerStub{slow: slow})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	// The first poll starts within 40 ms; it answers after 400 ms, past
	// the end at 200 ms.
	cfg := pollerConfig{Scaler: ln.Addr().String(), Duration: 200 * time.Millisecond,
		Every:   [2]time.Duration{40 * time.Millisecond, 20 * time.Millisecond},
		Objects: []pollerRef{{Idx: 0, Name: "slow", Namespace: "fleet", Metadata: map[string]string{"deployment": "w0"}, MetricName: "m"}}}
	res, err := runPollers(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) > 0 {
		t.Errorf("errors %v: the slow answer is an answer", res.Errors)
	}
	if len(res.GetMetrics) == 0 {
		t.Fatal("no GetMetrics timed: the one under way at the end was cut")
	}
	for _, d := range res.GetMetrics {
		if d < slow.Seconds() {
			t.Errorf("a GetMetrics of %v s: every answer takes %v", d, slow)
		}
	}
}
