//go:build fleet

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// bin holds pulse-aggregator, pulse-agent and vllm-sim: $PULSE_FLEET_BIN
// (make fleet-test), else built here.
var bin string

func TestMain(m *testing.M) {
	if serveEchoIfAsked() || runPollersIfAsked() { // the harness's echo and pollers' processes, started from this binary
		return
	}
	bin = os.Getenv("PULSE_FLEET_BIN")
	if bin == "" {
		dir, err := os.MkdirTemp("", "fleet-bin-")
		if err != nil {
			panic(err)
		}
		defer func() { _ = os.RemoveAll(dir) }()
		for name, pkg := range map[string]string{"pulse-aggregator": "./cmd/aggregator", "pulse-agent": "./cmd/agent", "vllm-sim": "./test/vllmsim/cmd/vllm-sim"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				panic(string(out))
			}
		}
		bin = dir
	}
	os.Exit(m.Run())
}

// small is a fleet of 12 agents × 4 pods (12 workloads of 4 pods) and 6
// ScaledObjects, 2 of them probes.
func small(t *testing.T, faults ...string) *fleet {
	t.Helper()
	return smallWith(t, func(o *options) { o.faults = faults })
}

// smallWith is small with its options changed by mutate.
func smallWith(t *testing.T, mutate func(*options)) *fleet {
	t.Helper()
	o := defaultOptions()
	o.bin, o.agents, o.podsPerAgent, o.scaledObjects, o.probes = bin, 12, 4, 6, 2
	o.podExpiry, o.verbose = 15*time.Second, testing.Verbose()
	o.pin = "off" // the tests assert behaviour, not cost: both share the CPUs, as before
	mutate(&o)
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	f, err := start(t.Context(), o, t.TempDir(), os.Stderr)
	if f != nil {
		t.Cleanup(f.stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// runFault runs one scenario and fails the test with every expectation it
// found broken.
func runFault(t *testing.T, f *fleet, name string) *faultResult {
	t.Helper()
	r, err := f.fault(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range r.Failures {
		t.Error(msg)
	}
	t.Logf("%s: measured %v", name, r.Measured)
	return r
}

// noErrors checks that the fleet saw no error outside the scenario.
func noErrors(t *testing.T, f *fleet) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		t.Errorf("errors outside the fault: %v", f.errs)
	}
}

func TestSteadyFleetAnswersAndPushes(t *testing.T) {
	f := small(t)
	f.o.settle, f.o.duration = time.Second, 35*time.Second // two probe rises
	res, err := f.measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Pods != 48 || res.AgentStreams != 12 {
		t.Errorf("aggregator holds %d pods on %v streams, want 48 on 12", res.Pods, res.AgentStreams)
	}
	// The agents' default transport (auto) reached this aggregator framed.
	if res.Transport != "auto" || res.IngestConnections["framed"] < 12 || res.IngestConnections["grpc"] != 0 {
		t.Errorf("transport %s, connections by transport %v: want auto, every agent's framed", res.Transport, res.IngestConnections)
	}
	// Samples arrived and none was refused. Twelve agents of four pods at
	// 1 s offer 48 a second: a harness skipping its ticks when late
	// offered fewer, unnoticed (asserted loosely: the machine's pace is
	// not the code's).
	if res.StartupSeconds <= 0 {
		t.Errorf("start-up %v s: want the time to every stream up", res.StartupSeconds)
	}
	if nominal := float64(f.o.agents*f.o.podsPerAgent) / f.o.interval.Seconds(); res.PodSamplesPerSecond < 0.8*nominal || res.RejectedReports != 0 {
		t.Errorf("%.1f pod-samples/s received, %v refused: want about %.0f, none refused", res.PodSamplesPerSecond, res.RejectedReports, nominal)
	}
	// Every rise of the measurement pushed (a miss is an error, below),
	// and no push of a rise it did not count.
	if res.PushCount == 0 || res.PushMissed != 0 || res.PushCount > res.PushRises {
		t.Errorf("%d of %d rises pushed, %d missed: want every one", res.PushCount, res.PushRises, res.PushMissed)
	}
	if res.GetMetricsCount == 0 {
		t.Error("no GetMetrics was measured")
	}
	if res.EchoCount == 0 || res.EchoP99 <= 0 {
		t.Errorf("the machine's floor was not measured: %d echoes, p99 %v s", res.EchoCount, res.EchoP99)
	}
	if res.AggregatorRSSBytes <= 0 || res.AggregatorRSSPeakBytes < res.AggregatorRSSBytes {
		t.Errorf("the aggregator's RSS %d bytes, its peak %d: want both read, the peak at least the end's", res.AggregatorRSSBytes, res.AggregatorRSSPeakBytes)
	}
	if !res.PollsApart || res.GetMetricsInHarness > len(f.sos) {
		t.Errorf("polls apart %v, %d GetMetrics timed in the harness: want them timed apart (at most one a ScaledObject under way as they moved)", res.PollsApart, res.GetMetricsInHarness)
	}
	noErrors(t, f)
	// The same fleet with the polls made and timed in the harness, as
	// before the pollers' process.
	f.o.pollsApart, f.o.duration = false, 20*time.Second
	if res, err = f.measure(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res.PollsApart || res.GetMetricsCount == 0 || res.GetMetricsInHarness != res.GetMetricsCount || res.EchoCount == 0 {
		t.Errorf("polls in the harness: apart %v, %d GetMetrics (%d in the harness), %d echoes; want all of them timed here",
			res.PollsApart, res.GetMetricsCount, res.GetMetricsInHarness, res.EchoCount)
	}
	noErrors(t, f)
}

// TestSteadyFleetOverTLS: the ingest port with TLS, as the chart serves it
// by default (--tls): every agent streams, pushes and answers come, no
// error; and a real agent trusting the fleet's CA streams beside them.
func TestSteadyFleetOverTLS(t *testing.T) {
	f := smallWith(t, func(o *options) { o.tls = true })
	f.o.settle, f.o.duration = time.Second, 35*time.Second // two probe rises
	res, err := f.measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !res.IngestTLS || res.Pods != 48 || res.AgentStreams != 12 || res.RejectedReports != 0 {
		t.Errorf("TLS %v: %d pods on %v streams, %v refused; want 48 on 12, none refused", res.IngestTLS, res.Pods, res.AgentStreams, res.RejectedReports)
	}
	if res.PushCount == 0 || res.GetMetricsCount == 0 {
		t.Errorf("%d rises pushed, %d GetMetrics: want some of each", res.PushCount, res.GetMetricsCount)
	}
	noErrors(t, f)
	runFault(t, f, "node-silencing") // its real pulse-agent dials with --aggregator-ca-file
	noErrors(t, f)
}

// TestSteadyFleetOverTheFramedTransport: the agents' streams as framed
// connections (--transport framed) to the TLS ingest port: every agent
// streams, pushes and answers come, no error; and a real agent with
// --transport=framed streams beside them.
func TestSteadyFleetOverTheFramedTransport(t *testing.T) {
	f := smallWith(t, func(o *options) { o.transport, o.tls = "framed", true })
	f.o.settle, f.o.duration = time.Second, 20*time.Second
	res, err := f.measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Transport != "framed" || res.Pods != 48 || res.AgentStreams != 12 || res.RejectedReports != 0 {
		t.Errorf("transport %s: %d pods on %v streams, %v refused; want framed, 48 on 12, none refused", res.Transport, res.Pods, res.AgentStreams, res.RejectedReports)
	}
	if res.PushCount == 0 || res.GetMetricsCount == 0 {
		t.Errorf("%d rises pushed, %d GetMetrics: want some of each", res.PushCount, res.GetMetricsCount)
	}
	noErrors(t, f)
	runFault(t, f, "node-silencing") // its real pulse-agent dials with --transport framed
	noErrors(t, f)
}

// TestSteadyFleetThroughRelays: the agents reach the TLS ingest port
// through two pulse-relay processes (--relays): every agent's stream
// arrives on the relays' few connections, pushes and answers come, no
// error, and the relays' cost is reported apart.
func TestSteadyFleetThroughRelays(t *testing.T) {
	f := smallWith(t, func(o *options) { o.relays, o.tls = 2, true })
	f.o.settle, f.o.duration = time.Second, 20*time.Second
	res, err := f.measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Relays != 2 || res.Pods != 48 || res.AgentStreams != 12 || res.RejectedReports != 0 {
		t.Errorf("%d relays: %d pods on %v streams, %v refused; want 2 relays, 48 pods on 12 streams, none refused", res.Relays, res.Pods, res.AgentStreams, res.RejectedReports)
	}
	// auto, the default, is gRPC through a relay: the relays' connections.
	if res.IngestConnections["framed"] != 0 || res.IngestConnections["grpc"] < 2 {
		t.Errorf("connections by transport %v: want the relays' gRPC alone", res.IngestConnections)
	}
	if res.RelayCPUCores <= 0 || res.RelayRSSBytes <= 0 {
		t.Errorf("the relays' cost: %v cores, %d bytes: want it measured", res.RelayCPUCores, res.RelayRSSBytes)
	}
	if res.PushCount == 0 || res.GetMetricsCount == 0 {
		t.Errorf("%d rises pushed, %d GetMetrics: want some of each", res.PushCount, res.GetMetricsCount)
	}
	noErrors(t, f)
}

func TestMalformedBatchEndsOnlyItsStream(t *testing.T) {
	f := small(t)
	runFault(t, f, "malformed-batch")
	noErrors(t, f)
}

func TestHungAndOversizedPagesAffectNoOtherPod(t *testing.T) {
	f := small(t)
	runFault(t, f, "pages")
	noErrors(t, f)
}

func TestDeadAgentsPodsAreHeldThenDropped(t *testing.T) {
	f := small(t)
	runFault(t, f, "agent-kill")
	noErrors(t, f)
}

func TestPartitionedAgentGoesStaleNeverZero(t *testing.T) {
	f := small(t, "partition")
	runFault(t, f, "partition")
	noErrors(t, f)
}

func TestAggregatorKillNeverAnswersAPartialTotal(t *testing.T) {
	f := small(t)
	runFault(t, f, "aggregator-kill")
	noErrors(t, f)
}

func TestOnePodCannotSilenceItsNode(t *testing.T) {
	f := small(t)
	runFault(t, f, "node-silencing")
	noErrors(t, f)
}

func TestFullStoreNeverEvictsALiveAgentsPods(t *testing.T) {
	f := small(t, "eviction")
	runFault(t, f, "eviction")
	noErrors(t, f)
}
