package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/test/procs"
)

// fleet is one run: the aggregator process, the agents, the ScaledObjects
// and what they observe.
type fleet struct {
	o     options
	dir   string
	log   io.Writer
	agg   *aggregatorProc
	proxy *proxy
	// relays: the pulse-relay processes the agents reach it through (--relays).
	relays []*relayProc
	// harnessCPUs: the CPUs the harness runs on (--pin auto); nil: any.
	harnessCPUs []int
	epoch       time.Time // tick 0 of every agent

	agents []*simAgent
	sos    []*scaledObject
	byWL   map[int]*scaledObject
	conns  []*grpc.ClientConn
	wg     sync.WaitGroup
	cancel context.CancelFunc
	runCtx context.Context // the agents' and ScaledObjects' context

	sent        atomic.Int64 // pod-samples sent
	churned     atomic.Int64
	churnPaused atomic.Bool      // during fault scenarios: their victims stay put
	askConn     *grpc.ClientConn // the scenarios' own questions, apart from the ScaledObjects' connection
	echo        *echoProc        // the machine's floor (--echo-every); nil: off
	echoes      echoer
	apart       atomic.Bool // the polls are made by the pollers' process apart, not here

	mu         sync.Mutex
	getMetrics []float64 // seconds, successful calls, since the last reset
	push       []float64
	pushMissed int // rises StreamIsActive never delivered before the next one (30 s later)
	pushRises  int // rises begun
	probes     map[int]*probeState
	errs       map[string]int64 // unexpected, by kind
	ends       map[string]int64 // stream ends, "RPC code"
	faulting   bool
	faultErrs  map[string]int64 // the errors seen during the fault under way
	// starting: until every agent and stream is up; startErrs: what
	// failed meanwhile, by kind (not errors: the warm-up answers
	// Unavailable by design), and startup how long it took.
	starting  bool
	startErrs map[string]int64
	startup   time.Duration
}

// probeState is one probe workload's current rise.
type probeState struct {
	riseAt   time.Time // the first batch sending the high value this half-period
	half     int64
	measured bool
}

// probeHigh reports whether probe workloads are high at t.
func (f *fleet) probeHigh(t time.Time) bool { return (t.Sub(f.epoch)/probeHalf)%2 == 1 }

func (f *fleet) isProbe(w int) bool {
	s := f.byWL[w]
	return s != nil && s.probe
}

// probeRise notes that a batch raising probe workload w, built for the
// tick at tick (which set the value high), is being sent now.
func (f *fleet) probeRise(w int, tick time.Time) {
	now := time.Now()
	half := int64(tick.Sub(f.epoch) / probeHalf)
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.probes[w]
	if p.half != half {
		if !p.riseAt.IsZero() && !p.measured {
			f.pushMissed++
		}
		*p = probeState{riseAt: now, half: half}
		f.pushRises++
	}
}

// unpushed is the rises begun more than probeHalf ago (fallen since) that
// were never pushed: those the next rise has not counted yet. f.mu held.
func (f *fleet) unpushed(now time.Time) int {
	n := 0
	for _, p := range f.probes {
		if !p.riseAt.IsZero() && !p.measured && now.Sub(p.riseAt) > probeHalf {
			n++
		}
	}
	return n
}

// pending is the rises begun within probeHalf of now not pushed yet: in
// neither the latencies nor the missed. f.mu held.
func (f *fleet) pending(now time.Time) int {
	n := 0
	for _, p := range f.probes {
		if !p.riseAt.IsZero() && !p.measured && now.Sub(p.riseAt) <= probeHalf {
			n++
		}
	}
	return n
}

// probeActive notes StreamIsActive delivering true for probe workload w.
func (f *fleet) probeActive(w int, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.probes[w]
	if p.riseAt.IsZero() || p.measured {
		return
	}
	p.measured = true
	f.push = append(f.push, at.Sub(p.riseAt).Seconds())
}

// recordGetMetrics records a poll: the latency of a successful one, the
// error of another.
func (f *fleet) recordGetMetrics(d time.Duration, err error) {
	if err != nil {
		f.rpcError("GetMetrics", err)
		return
	}
	f.mu.Lock()
	f.getMetrics = append(f.getMetrics, d.Seconds())
	f.mu.Unlock()
}

// rpcError counts a failed RPC: expected while a fault is injected,
// an error otherwise.
func (f *fleet) rpcError(rpc string, err error) {
	if err == nil {
		err = errors.New("empty answer")
	}
	f.count(rpc + " " + status.Code(err).String())
	f.logf("%s: %v", rpc, err)
}

// streamEnded counts a stream's end; outside a fault it is an error.
func (f *fleet) streamEnded(name string, err error) {
	kind := name + " "
	switch {
	case errors.Is(err, io.EOF):
		kind += "EOF"
	case status.Code(err) != codes.Unknown:
		kind += status.Code(err).String()
	default:
		kind += "error"
	}
	f.mu.Lock()
	f.ends[kind]++
	f.mu.Unlock()
	f.count(kind)
}

func (f *fleet) errorf(kind, format string, args ...any) {
	f.count(kind)
	fmt.Fprintf(f.log, "fleet: "+format+"\n", args...)
}

// count counts an error of kind: apart while a fault (or the start-up) is
// under way, when errors are expected and each scenario checks its own
// (those of a fault were dropped, though the docs said counted apart:
// faultResult.Errors has them).
func (f *fleet) count(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.starting:
		f.startErrs[kind]++
	case f.faulting:
		if f.faultErrs == nil {
			f.faultErrs = map[string]int64{}
		}
		f.faultErrs[kind]++
	default:
		f.errs[kind]++
	}
}

func (f *fleet) logf(format string, args ...any) {
	if f.o.verbose {
		fmt.Fprintf(f.log, "%s fleet: "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
	}
}

// result is the run's outcome, printed as the last line.
type result struct {
	Agents              int     `json:"agents"`
	PodsPerAgent        int     `json:"podsPerAgent"`
	Pods                int     `json:"pods"` // held by the aggregator at the end of the measurement
	ScaledObjects       int     `json:"scaledObjects"`
	DurationSeconds     float64 `json:"durationSeconds"`
	PodSamplesPerSecond float64 `json:"podSamplesPerSecond"` // received by the aggregator
	// RejectedReports: reports the aggregator refused over the measurement
	// (pulse_aggregator_rejected_reports_total, every reason), counted in
	// podSamplesPerSecond as received; outside --churn each is an error.
	RejectedReports    float64 `json:"rejectedReports"`
	SentPerSecond      float64 `json:"podSamplesSentPerSecond"`
	AggregatorCPUCores float64 `json:"aggregatorCpuCores"`
	AggregatorRSSBytes int64   `json:"aggregatorRssBytes"`
	// AggregatorRSSPeakBytes: its VmHWM at the end, the most it held since
	// it started, start-up included (the RSS goal was judged on the end's
	// reading alone).
	AggregatorRSSPeakBytes int64   `json:"aggregatorRssPeakBytes"`
	HeapInuseBytes         float64 `json:"heapInuseBytes"`
	HeapBytesPerPod        float64 `json:"heapBytesPerPod"` // heap in use: the live heap and what the next GC frees
	// HeapLiveBytes: what the aggregator's last GC found live
	// (go_gc_heap_live_bytes); heap in use runs up to GOGC% over it and
	// the stacks (AggregatorGCPercent).
	HeapLiveBytes float64 `json:"heapLiveBytes"`
	// AggregatorGCPercent: the aggregator's GC percent (go_gc_gogc_percent:
	// its --gc-percent, or GOGC in its environment).
	AggregatorGCPercent float64 `json:"aggregatorGcPercent"`
	// StackInuseBytes and GCGoalBytes: the goroutines' stacks and the heap
	// at which its next GC starts, at the end: Go's GC paces on the live
	// heap and the stacks together, so that the heap in use reaches the
	// live heap and GOGC% of both.
	StackInuseBytes float64 `json:"stackInuseBytes"`
	GCGoalBytes     float64 `json:"gcGoalBytes"`
	// StackScanBytes: what of the stacks the last GC scanned (their used
	// part, go_gc_scan_stack_bytes): the part of the goal that is theirs.
	StackScanBytes      float64 `json:"stackScanBytes"`
	HeapLiveBytesPerPod float64 `json:"heapLiveBytesPerPod"`
	GetMetricsCount     int     `json:"getMetricsCount"`
	// PollsApart: the polls were made and timed by a process apart from
	// the harness's agents (--polls-apart, the default; apart.go), and
	// GetMetrics* and Echo* are its; false: by the harness itself.
	PollsApart bool `json:"pollsApart"`
	// GetMetricsInHarness: the GetMetrics the harness itself timed in the
	// measurement (none with the polls apart).
	GetMetricsInHarness int     `json:"getMetricsInHarness"`
	GetMetricsP50       float64 `json:"getMetricsP50Seconds"`
	GetMetricsP99       float64 `json:"getMetricsP99Seconds"`
	// GetMetricsServerP99: the p99 of the aggregator's GetMetrics handler,
	// from the decoded request to its answer (grpc_server_handling_seconds
	// over the measurement; not the reading, the writing, a wait to run or
	// the network): the upper bound of the bucket that holds it; 0 when
	// none was answered, -1 past the last finite bound.
	GetMetricsServerP99 float64 `json:"getMetricsServerP99Seconds"`
	// Echo*: the machine's floor under the same load (--echo-every): a
	// 32-byte TCP round trip between the harness and an echo process on
	// the aggregator's CPUs, sent on its schedule and timed from its send
	// as a poll is (open loop, pipelined on one connection): an answer's
	// round trip is not expected to beat it; 0 when off.
	EchoCount  int     `json:"echoCount"`
	EchoP50    float64 `json:"echoP50Seconds"`
	EchoP99    float64 `json:"echoP99Seconds"`
	PushCount  int     `json:"pushCount"`  // rises pushed (their latency measured)
	PushRises  int     `json:"pushRises"`  // rises begun within the measurement
	PushMissed int     `json:"pushMissed"` // rises never pushed before the next one, or fallen unpushed by the end
	// PushPending: rises begun in the last probeHalf (15 s) not pushed
	// by the end, in neither the latencies nor the missed: a push slower
	// than the time left shows only here.
	PushPending     int     `json:"pushPending"`
	PushLatencyP50  float64 `json:"pushLatencyP50Seconds"`
	PushLatencyP99  float64 `json:"pushLatencyP99Seconds"`
	AgentStreams    float64 `json:"agentStreams"`
	Goroutines      float64 `json:"goroutines"`
	OpenFDs         int     `json:"openFds"`
	HarnessCPUCores float64 `json:"harnessCpuCores"`
	// AggregatorCPUs and HarnessCPUs: the CPUs each ran on (--pin auto),
	// empty when they shared every CPU.
	AggregatorCPUs string `json:"aggregatorCpus,omitempty"`
	HarnessCPUs    string `json:"harnessCpus,omitempty"`
	// IngestTLS: the ingest port served TLS (--tls).
	IngestTLS bool `json:"ingestTls"`
	// Transport: how the agents reached the aggregator (--transport);
	// IngestConnections: the connections its ingest port served, by the
	// transport they spoke (pulse_aggregator_ingest_connections_total),
	// from its start: auto's agents speak framed to this aggregator.
	Transport         string             `json:"transport"`
	IngestConnections map[string]float64 `json:"ingestConnections"`
	// Relays: the agents reached the aggregator through this many
	// pulse-relay processes (--relays), whose CPU and resident memory,
	// summed, are RelayCPUCores and RelayRSSBytes (the load's, not the
	// aggregator's; on the harness's CPUs).
	Relays        int     `json:"relays"`
	RelayCPUCores float64 `json:"relayCpuCores"`
	RelayRSSBytes int64   `json:"relayRssBytes"`
	// HarnessGOGC: the harness's own GC percent (--harness-gogc).
	HarnessGOGC int `json:"harnessGogc"`
	// AggregatorMemoryLimitBytes: the container limit --memory-limit gave
	// (the aggregator's GOMEMLIMIT 90 % of it); 0: the flag unset (the
	// environment's GOMEMLIMIT, if any).
	AggregatorMemoryLimitBytes int64 `json:"aggregatorMemoryLimitBytes"`
	// AggregatorCPUSecondsPerMillionSamples: the aggregator's CPU time per
	// million pod samples received (everything it did meanwhile included).
	AggregatorCPUSecondsPerMillionSamples float64 `json:"aggregatorCpuSecondsPerMillionSamples"`
	ChurnEvents                           int64   `json:"churnEvents"`
	// StartupSeconds: from the first agent started to every agent and
	// ScaledObject stream up (what an aggregator's restart looks like at
	// this size); StartupFailures: the RPCs that failed meanwhile, by kind
	// (the warm-up's answers are Unavailable; DeadlineExceeded is an
	// answer later than KEDA's 10 s). Neither counts in errors.
	StartupSeconds  float64          `json:"startupSeconds"`
	StartupFailures map[string]int64 `json:"startupFailures,omitempty"`
	Errors          int64            `json:"errors"`
	ErrorKinds      map[string]int64 `json:"errorKinds,omitempty"`
	Soak            *soakResult      `json:"soak,omitempty"`
	Faults          []*faultResult   `json:"faults,omitempty"`
}

// pin, with --pin auto and 2 CPUs or more, puts the harness on its share of
// the CPUs and marks the aggregator's for its start.
func (f *fleet) pin() error {
	agg, harness, ok := cpuSplit()
	if f.o.pin != "auto" {
		return nil
	}
	if !ok {
		f.logf("fewer than 2 CPUs: the aggregator and the harness share them (the summary names no CPUs)")
		return nil
	}
	if err := pinSelf(harness); err != nil {
		return err
	}
	f.agg.cpus, f.harnessCPUs = agg, harness
	f.logf("the aggregator runs on CPUs %s, the harness on %s", cpuList(agg), cpuList(harness))
	return nil
}

// run brings the fleet up, measures for o.duration, runs the faults, and
// tears everything down.
func run(ctx context.Context, o options, log io.Writer) (res *result, err error) {
	raiseFileLimit()
	// The harness's own GC only: the aggregator runs with the environment's.
	defer debug.SetGCPercent(debug.SetGCPercent(o.harnessGOGC))
	dir := o.workdir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "fleet-"); err != nil {
			return nil, err
		}
		defer func() {
			if err == nil {
				_ = os.RemoveAll(dir)
			} else {
				fmt.Fprintln(log, "fleet: logs kept in", dir)
			}
		}()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := start(ctx, o, dir, log)
	if f != nil {
		defer f.stop()
	}
	if err != nil {
		return nil, err
	}
	res, err = f.measure(ctx)
	if err != nil {
		return res, err
	}
	var failed []string
	for _, name := range o.faults {
		fr, err := f.fault(ctx, name)
		if err != nil {
			return res, fmt.Errorf("fault %s: %w", name, err)
		}
		res.Faults = append(res.Faults, fr)
		if !fr.OK {
			failed = append(failed, name)
		}
	}
	f.mu.Lock()
	res.Errors, res.ErrorKinds = 0, cloneCounts(f.errs)
	for _, n := range f.errs {
		res.Errors += n
	}
	f.mu.Unlock()
	switch {
	case len(failed) > 0:
		return res, fmt.Errorf("fault scenarios failed: %v", failed)
	case res.Soak != nil && res.Soak.Leak:
		return res, errors.New("the soak found a leak")
	case res.Errors > 0:
		return res, fmt.Errorf("%d errors outside fault scenarios", res.Errors)
	}
	return res, nil
}

// start brings up the aggregator, the agents and the ScaledObjects, and
// waits until every agent has a stream and every ScaledObject's streams
// have delivered.
func start(ctx context.Context, o options, dir string, log io.Writer) (*fleet, error) {
	f := &fleet{o: o, dir: dir, log: log, byWL: map[int]*scaledObject{}, probes: map[int]*probeState{},
		errs: map[string]int64{}, ends: map[string]int64{}, startErrs: map[string]int64{},
		faulting: true, starting: true} // until every stream is up: warm-up answers are Unavailable
	var err error
	if f.agg, err = newAggregator(o, dir, o.agents); err != nil {
		return nil, err
	}
	if err := f.pin(); err != nil {
		return nil, err
	}
	if err := f.agg.Start(ctx); err != nil {
		return f, err
	}
	partitioned := 0
	if contains(o.faults, "partition") {
		if f.proxy, err = newProxy(f.agg.ingest); err != nil {
			return f, err
		}
		partitioned = o.partitionAgents
	}
	// Workload w's pods: pod slot j of agents a with j*agents+a in
	// [w*podsPerWorkload, (w+1)*podsPerWorkload), so a workload's pods are
	// on consecutive agents, as a Deployment's replicas spread over nodes.
	f.epoch = time.Now().Truncate(o.interval).Add(o.interval)
	if err := f.startRelays(ctx, o.relays); err != nil {
		return f, err
	}
	for a := range o.agents {
		addr := f.agg.ingest
		if a < partitioned {
			addr = f.proxy.Addr()
		}
		sa := newSimAgent(f, a, addr)
		if len(f.relays) > 0 {
			sa.relay = f.relays[a%len(f.relays)].listen
		}
		f.agents = append(f.agents, sa)
	}
	for j := range o.podsPerAgent {
		for a := range o.agents {
			f.agents[a].add((j*o.agents+a)/o.podsPerWorkload, time.Time{})
		}
	}
	if err := f.connectKEDA(); err != nil {
		return f, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	f.cancel, f.runCtx = cancel, runCtx
	started := time.Now()
	for _, a := range f.agents {
		a.start(runCtx)
	}
	for _, s := range f.sos {
		s.run(runCtx)
	}
	f.wg.Add(1)
	go func() { defer f.wg.Done(); f.churn(runCtx, o.churn) }()
	if err := f.measureFloor(runCtx); err != nil {
		return f, err
	}
	f.logf("started %d agents and %d ScaledObjects; waiting for them", o.agents, o.scaledObjects)
	if err := f.waitUp(ctx, 5*time.Minute); err != nil {
		return f, err
	}
	f.mu.Lock()
	f.faulting, f.starting, f.startup = false, false, time.Since(started)
	f.mu.Unlock()
	return f, nil
}

// connectKEDA opens KEDA's connections to the scaler port (and one more
// for the harness's own questions) and makes the ScaledObjects: object k
// watches workload k*stride (spread over the fleet); the last --probes of
// them watch probe workloads.
func (f *fleet) connectKEDA() error {
	o := f.o
	for range o.kedaConns {
		c, err := grpc.NewClient(f.agg.scaler, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		f.conns = append(f.conns, c)
	}
	var err error
	if f.askConn, err = grpc.NewClient(f.agg.scaler, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return err
	}
	f.conns = append(f.conns, f.askConn) // closed with them; not given to ScaledObjects
	stride := max(o.workloads()/max(o.scaledObjects, 1), 1)
	for k := range o.scaledObjects {
		w := k * stride
		s := newScaledObject(f, k, w, k >= o.scaledObjects-o.probes, f.conns[k%o.kedaConns])
		f.sos = append(f.sos, s)
		f.byWL[w] = s
		if s.probe {
			f.probes[w] = &probeState{half: -1}
		}
	}
	return nil
}

// measureFloor starts the echo process and times round trips to it until
// ctx ends (--echo-every; nothing when 0).
func (f *fleet) measureFloor(ctx context.Context) error {
	if f.o.echoEvery <= 0 {
		return nil
	}
	var err error
	if f.echo, err = startEcho(f.agg.cpus, f.logPath("echo")); err != nil {
		return err
	}
	// While the polls are apart, the pollers' process times the floor, as
	// it times the answers.
	f.wg.Add(1)
	go func() { defer f.wg.Done(); f.echoes.run(ctx, f.echo.addr, f.o.echoEvery, f.apart.Load) }()
	return nil
}

// waitUp waits until every live agent has a stream and every ScaledObject's
// StreamMetricSpec and StreamIsActive have delivered since marks.
func (f *fleet) waitUp(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		agents, streams := f.upCounts()
		if agents == f.liveAgents() && streams == len(f.sos) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %d of %d agents up, %d of %d ScaledObjects' streams delivering", limit, agents, f.liveAgents(), streams, len(f.sos))
		}
		if !procs.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

func (f *fleet) upCounts() (agents, streams int) {
	for _, a := range f.agents {
		if a.up.Load() {
			agents++
		}
	}
	for _, s := range f.sos {
		if s.activeOpens.Load() > 0 && s.specOpens.Load() > 0 {
			streams++
		}
	}
	return agents, streams
}

func (f *fleet) liveAgents() int {
	n := 0
	for _, a := range f.agents {
		a.mu.Lock()
		if !a.dead {
			n++
		}
		a.mu.Unlock()
	}
	return n
}

// stop ends every client and the aggregator.
func (f *fleet) stop() {
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
	for _, c := range f.conns {
		_ = c.Close()
	}
	if f.proxy != nil {
		f.proxy.Close()
	}
	f.stopRelays()
	if f.echo != nil {
		f.echo.stop()
	}
	f.agg.Stop()
}

// measure settles, then measures the steady state for o.duration (and
// samples the soak series when asked).
func (f *fleet) measure(ctx context.Context) (*result, error) {
	if err := f.settle(ctx); err != nil {
		return nil, err
	}
	pid := f.agg.PID()
	// The CPU read first and the time with it: the first /metrics read's
	// CPU is in the span, and so is its time.
	t0, h0, s0 := time.Now(), selfCPU(), f.sent.Load()
	p0, r0, _, err := f.usage(pid)
	if err != nil {
		return nil, err
	}
	m0, tm0, err := f.agg.MetricsAt(ctx)
	if err != nil {
		return nil, err
	}
	pollers, err := f.startApart()
	if err != nil {
		return nil, err
	}
	var soak *soakResult
	f.logf("measuring for %s", f.o.duration)
	if f.o.soakEvery > 0 {
		if soak, err = f.soak(ctx, pid, t0.Add(f.o.duration)); err != nil {
			return nil, err
		}
	} else if !procs.Sleep(ctx, f.o.duration) {
		return nil, ctx.Err()
	}
	var apart *pollerResult
	if pollers != nil {
		apart, err = pollers.wait(ctx)
		f.apart.Store(false)
		if err != nil {
			return nil, err
		}
	}
	el := time.Since(t0).Seconds()
	h1, s1 := selfCPU(), f.sent.Load()
	p1, r1, relayRSS, err := f.usage(pid)
	if err != nil {
		return nil, err
	}
	// The aggregator's counters over the time between the two reads that
	// took them (a read tried again starts later).
	m1, tm1, err := f.agg.MetricsAt(ctx)
	if err != nil {
		return nil, err
	}
	gm, push, missed, rises, pending := f.timed()
	echoes, echoErr := f.echoes.take()
	inHarness := len(gm)
	if apart != nil {
		gm, echoes, echoErr = f.fromApart(apart)
		h1 += apart.CPUSeconds
	}
	f.floorMissed(echoErr)
	res := &result{Agents: f.o.agents, PodsPerAgent: f.o.podsPerAgent, Pods: int(m1["pulse_aggregator_pods"]), ScaledObjects: len(f.sos),
		DurationSeconds:     math.Round(el*10) / 10,
		PodSamplesPerSecond: (m1["pulse_aggregator_pod_samples_total"] - m0["pulse_aggregator_pod_samples_total"]) / tm1.Sub(tm0).Seconds(),
		SentPerSecond:       float64(s1-s0) / el,
		AggregatorCPUCores:  (p1.CPUSeconds - p0.CPUSeconds) / el, AggregatorRSSBytes: p1.RSSBytes, AggregatorRSSPeakBytes: p1.RSSPeakBytes,
		HeapInuseBytes: m1["go_memstats_heap_inuse_bytes"], HeapLiveBytes: m1["go_gc_heap_live_bytes"],
		StackInuseBytes: m1["go_memstats_stack_inuse_bytes"], GCGoalBytes: m1["go_memstats_next_gc_bytes"], StackScanBytes: m1["go_gc_scan_stack_bytes"], AggregatorGCPercent: m1["go_gc_gogc_percent"], AgentStreams: m1["pulse_aggregator_agent_streams"],
		Goroutines: m1["go_goroutines"], OpenFDs: p1.FDs, HarnessCPUCores: (h1 - h0) / el, ChurnEvents: f.churned.Load(),
		GetMetricsCount: len(gm), GetMetricsInHarness: inHarness, PollsApart: apart != nil, PushCount: len(push), PushRises: rises, PushMissed: missed, PushPending: pending, Soak: soak, IngestTLS: f.o.tls, Transport: f.o.transport, IngestConnections: byTransport(m1), HarnessGOGC: f.o.harnessGOGC, AggregatorMemoryLimitBytes: f.o.memoryLimit,
		Relays: len(f.relays), RelayCPUCores: (r1 - r0) / el, RelayRSSBytes: relayRSS}
	f.derive(res, m0, m1)
	f.mu.Lock()
	res.StartupSeconds, res.StartupFailures = f.startup.Seconds(), cloneCounts(f.startErrs)
	f.mu.Unlock()
	res.GetMetricsP50, res.GetMetricsP99 = quantile(gm, 0.5), quantile(gm, 0.99)
	res.PushLatencyP50, res.PushLatencyP99 = quantile(push, 0.5), quantile(push, 0.99)
	res.EchoCount, res.EchoP50, res.EchoP99 = len(echoes), quantile(echoes, 0.5), quantile(echoes, 0.99)
	f.logf("measured: %.0f pod-samples/s, aggregator %.2f cores", res.PodSamplesPerSecond, res.AggregatorCPUCores)
	return res, nil
}

// floorMissed counts an echo that failed (the machine's floor not
// measured) as an error; nil is none.
func (f *fleet) floorMissed(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	f.errs["echo"]++
	f.mu.Unlock()
	fmt.Fprintln(f.log, "fleet: the machine's floor was not measured:", err)
}

// timed is what the measurement timed: GetMetrics round trips, push
// latencies, the rises missed (each an error) and the rises begun.
func (f *fleet) timed() (gm, push []float64, missed, rises, pending int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A rise fallen and never pushed is missed though no rise followed it
	// within the measurement (the last of each probe).
	now := time.Now()
	missed, pending = f.pushMissed+f.unpushed(now), f.pending(now)
	if missed > 0 {
		// A rise StreamIsActive never pushed is a failure of the push
		// path, not a latency left out: it was in no error, and the push
		// p99 was of the rises pushed alone.
		f.errs["pushMissed"] += int64(missed)
	}
	return slices.Clone(f.getMetrics), slices.Clone(f.push), missed, f.pushRises, pending
}

// settle waits --settle, then forgets what was timed before it.
func (f *fleet) settle(ctx context.Context) error {
	f.logf("up; settling for %s", f.o.settle)
	if !procs.Sleep(ctx, f.o.settle) {
		return ctx.Err()
	}
	f.mu.Lock()
	f.getMetrics, f.push, f.pushMissed, f.pushRises = nil, nil, 0, 0
	// A rise begun before is none of the measurement's: pushed within it,
	// it was counted a push of no rise counted; missed, a miss of it.
	for _, p := range f.probes {
		*p = probeState{half: p.half}
	}
	f.mu.Unlock()
	_, _ = f.echoes.take()
	return nil
}

// startApart starts the pollers' process for the measurement with
// --polls-apart (nil without it).
func (f *fleet) startApart() (*pollersProc, error) {
	if !f.o.pollsApart {
		return nil, nil
	}
	cfg := pollerConfig{Scaler: f.agg.scaler, Duration: f.o.duration, Objects: f.pollerObjects(), GOGC: f.o.harnessGOGC}
	if f.echo != nil {
		cfg.Echo, cfg.EchoEvery = f.echo.addr, f.o.echoEvery
	}
	f.apart.Store(true)
	return startPollers(f.harnessCPUs, f.logPath("pollers"), cfg)
}

// fromApart is the pollers' process's timed polls and floor, in place of
// the harness's; its failed RPCs are counted as the harness's are.
func (f *fleet) fromApart(apart *pollerResult) (gm, echoes []float64, echoErr error) {
	if apart.EchoError != "" {
		echoErr = errors.New(apart.EchoError)
	}
	for kind, n := range apart.Errors {
		for range n {
			f.count(kind)
		}
	}
	return apart.GetMetrics, apart.Echoes, echoErr
}

// derive fills what res's figures and the aggregator's two /metrics reads
// (m0, m1, bracketing the measurement) give: the reports refused (an error
// outside --churn), the heap a pod, the CPU a million samples, the CPUs,
// and the handler's GetMetrics p99.
func (f *fleet) derive(res *result, m0, m1 map[string]float64) {
	res.RejectedReports = m1["pulse_aggregator_rejected_reports_total"] - m0["pulse_aggregator_rejected_reports_total"]
	if res.RejectedReports > 0 && f.o.churn == 0 {
		f.mu.Lock()
		f.errs["rejected_reports"] += int64(res.RejectedReports)
		f.mu.Unlock()
	}
	if res.Pods > 0 {
		res.HeapBytesPerPod = res.HeapInuseBytes / float64(res.Pods)
		res.HeapLiveBytesPerPod = res.HeapLiveBytes / float64(res.Pods)
	}
	if res.PodSamplesPerSecond > 0 {
		res.AggregatorCPUSecondsPerMillionSamples = res.AggregatorCPUCores / res.PodSamplesPerSecond * 1e6
	}
	if len(f.agg.cpus) > 0 {
		res.AggregatorCPUs, res.HarnessCPUs = cpuList(f.agg.cpus), cpuList(f.harnessCPUs)
	}
	res.GetMetricsServerP99 = getMetricsHandlingQuantile(m0, m1, 0.99)
	if res.GetMetricsServerP99 == 0 && res.GetMetricsCount > 0 {
		fmt.Fprintf(f.log, "fleet: the aggregator timed none of %d GetMetrics answers (no grpc_server_handling_seconds{%s})\n", res.GetMetricsCount, getMetricsSeries)
	}
}

// getMetricsSeries is the labels of GetMetrics' series of
// grpc_server_handling_seconds, as parseMetrics keys them (the page's
// order: by name).
const getMetricsSeries = "grpc_method=GetMetrics,grpc_service=externalscaler.ExternalScaler,grpc_type=unary"

// getMetricsHandlingQuantile is the upper bound of the bucket of the
// aggregator's grpc_server_handling_seconds of GetMetrics that holds its
// q-quantile over what was observed from m0 to m1; 0 when nothing was, -1
// when it lies past the last finite bound.
func getMetricsHandlingQuantile(m0, m1 map[string]float64, q float64) float64 {
	const name, labels = "grpc_server_handling_seconds", getMetricsSeries
	prefix := name + "_bucket{" + labels + ",le="
	var bounds []float64
	for k := range m1 {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			if le, err := strconv.ParseFloat(strings.TrimSuffix(rest, "}"), 64); err == nil && !math.IsInf(le, 1) {
				bounds = append(bounds, le)
			}
		}
	}
	slices.Sort(bounds)
	total := m1[name+"{"+labels+"}"] - m0[name+"{"+labels+"}"]
	if total <= 0 {
		return 0
	}
	for _, le := range bounds {
		key := prefix + strconv.FormatFloat(le, 'g', -1, 64) + "}"
		if m1[key]-m0[key] >= q*total {
			return le
		}
	}
	return -1
}

// quantile is the q-quantile of xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// selfCPU is this process's CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// raiseFileLimit lifts the soft limit on open files to the hard one: the
// harness holds two sockets per agent, and the aggregator (which inherits
// it) one.
func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

func cloneCounts(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// logPath is where a helper process's log goes.
func (f *fleet) logPath(name string) string { return filepath.Join(f.dir, name+".log") }

// byTransport is pulse_aggregator_ingest_connections_total by its
// transport label.
func byTransport(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, t := range []string{"framed", "grpc"} {
		out[t] = m["pulse_aggregator_ingest_connections_total{transport="+t+"}"]
	}
	return out
}
