package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// The pollers apart: through the measurement, the ScaledObjects' polls
// (KEDA's every 30 s, the HPA's GetMetrics every 15 s) are made and timed
// by a process of their own, the harness's own binary, rather than by the
// harness, which drives the agents too. KEDA's operator and its metrics
// adapter are processes apart from the nodes' agents; in the harness's one
// process a GetMetrics answer waited, after it arrived, behind the agents'
// own batches and the harness's GC before its time was taken, and that
// wait was counted as the aggregator's (docs/performance.md, "The ingest
// port's read buffers pooled, and the polls timed apart"). The machine's floor (the echo) is timed there too, as the
// answers are. The streams (StreamIsActive, StreamMetricSpec) stay in the
// harness: a push's latency is timed from the batch the harness sends.

// pollerEnv marks a harness binary started as the pollers' process: it
// reads its pollerConfig on stdin, polls, and writes its pollerResult on
// stdout.
const pollerEnv = "PULSE_FLEET_POLLERS"

// pollerConfig is what the pollers' process is given.
type pollerConfig struct {
	Scaler    string        `json:"scaler"`
	Duration  time.Duration `json:"duration"`
	Echo      string        `json:"echo,omitempty"` // the echo process's address; empty: no floor
	EchoEvery time.Duration `json:"echoEvery,omitempty"`
	Objects   []pollerRef   `json:"objects"`
	// Every: KEDA's and the HPA's periods; zero: theirs (30 s, 15 s).
	Every [2]time.Duration `json:"every,omitempty"`
	// GOGC: --harness-gogc, the process's GC percent as the harness's (it
	// ran Go's 100 while the summary said 400); 0: Go's default.
	GOGC int `json:"gogc,omitempty"`
}

// pollerRef is one ScaledObject to poll.
type pollerRef struct {
	Idx       int               `json:"idx"` // its offsets' seed, as in the harness
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Metadata  map[string]string `json:"metadata"`
	// MetricName: what the harness's GetMetricSpec learnt (as KEDA keeps
	// it); empty: the process asks first.
	MetricName string `json:"metricName,omitempty"`
}

// pollerResult is what the pollers' process timed.
type pollerResult struct {
	GetMetrics []float64        `json:"getMetrics"` // seconds, successful calls
	Errors     map[string]int64 `json:"errors"`     // failed RPCs, "RPC code"
	Echoes     []float64        `json:"echoes"`
	EchoError  string           `json:"echoError,omitempty"`
	CPUSeconds float64          `json:"cpuSeconds"` // the process's own
}

// runPollersIfAsked runs the pollers' process when this binary was started
// as one; false otherwise.
func runPollersIfAsked() bool {
	if os.Getenv(pollerEnv) == "" {
		return false
	}
	var cfg pollerConfig
	if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fleet pollers: read the configuration:", err)
		os.Exit(1)
	}
	if cfg.GOGC != 0 {
		debug.SetGCPercent(cfg.GOGC)
	}
	res, err := runPollers(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet pollers:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "fleet pollers: write the result:", err)
		os.Exit(1)
	}
	return true
}

// runPollers polls every object of cfg, and times the echo, for
// cfg.Duration.
func runPollers(ctx context.Context, cfg pollerConfig) (*pollerResult, error) {
	conn, err := grpc.NewClient(cfg.Scaler, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	client := externalscaler.NewExternalScalerClient(conn)
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var (
		mu  sync.Mutex
		res = &pollerResult{Errors: map[string]int64{}}
		wg  sync.WaitGroup
		ech echoer
	)
	// An error's time and text go to stderr (the work directory's
	// pollers.log): when in the run it came says more than its count.
	logError := func(rpc string, err error) {
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", time.Now().Format("15:04:05.000"), rpc, err)
	}
	record := func(d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.Errors["GetMetrics "+status.Code(err).String()]++
			logError("GetMetrics", err)
			return
		}
		res.GetMetrics = append(res.GetMetrics, d.Seconds())
	}
	// Every call's failure counts: one under way when the measurement ends
	// runs to its answer or its own deadline (poller.kedaPoll), and the
	// pollers end once each has (wg below). Cut at the end and dropped
	// then, a GetMetricSpec or IsActive that hung in the last 10 s was
	// never counted.
	fail := func(rpc string, err error) {
		if err == nil {
			err = errors.New("empty answer")
		}
		mu.Lock()
		res.Errors[rpc+" "+status.Code(err).String()]++
		mu.Unlock()
		logError(rpc, err)
	}
	for _, o := range cfg.Objects {
		// Every GetMetrics is recorded: one under way at the end runs to its
		// answer (poller.getMetrics).
		p := &poller{idx: o.Idx, client: client, metricName: o.MetricName, every: cfg.Every, fail: fail, record: record, ref: &externalscaler.ScaledObjectRef{Name: o.Name, Namespace: o.Namespace, ScalerMetadata: o.Metadata}}
		wg.Add(1)
		go func() { defer wg.Done(); p.run(ctx, nil) }()
	}
	if cfg.Echo != "" {
		wg.Add(1)
		go func() { defer wg.Done(); ech.run(ctx, cfg.Echo, cfg.EchoEvery, nil) }()
	}
	wg.Wait()
	echoes, echoErr := ech.take()
	res.Echoes = echoes
	if echoErr != nil {
		res.EchoError = echoErr.Error()
	}
	res.CPUSeconds = selfCPU()
	return res, nil
}

// pollersProc is the pollers' process, started for one measurement.
type pollersProc struct {
	cmd  *exec.Cmd
	out  chan pollersOut
	stop context.CancelFunc
}

type pollersOut struct {
	res *pollerResult
	err error
}

// startPollers starts the pollers' process on cpus (nil: any) for cfg.
func startPollers(cpus []int, logPath string, cfg pollerConfig) (*pollersProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	in, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	// It ends by itself after cfg.Duration; a minute more and it is killed.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+time.Minute)
	cmd := exec.CommandContext(ctx, self)
	if len(cpus) > 0 {
		cmd = exec.CommandContext(ctx, "taskset", "-c", cpuList(cpus), self)
	}
	cmd.Env = append(os.Environ(), pollerEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the harness
	log, err := os.Create(logPath)
	if err != nil {
		cancel()
		return nil, err
	}
	cmd.Stdin, cmd.Stderr = bytes.NewReader(in), log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		_ = log.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		_ = log.Close()
		return nil, fmt.Errorf("start the pollers' process: %w", err)
	}
	p := &pollersProc{cmd: cmd, out: make(chan pollersOut, 1), stop: cancel}
	go func() {
		var res pollerResult
		derr := json.NewDecoder(stdout).Decode(&res)
		_, _ = io.Copy(io.Discard, stdout)
		werr := cmd.Wait()
		_ = log.Close()
		switch {
		case werr != nil:
			p.out <- pollersOut{err: fmt.Errorf("the pollers' process (its log: %s): %w", logPath, werr)}
		case derr != nil:
			p.out <- pollersOut{err: fmt.Errorf("read the pollers' result: %w", derr)}
		default:
			p.out <- pollersOut{res: &res}
		}
	}()
	return p, nil
}

// wait returns what the process timed once it has ended, or ctx's error
// (the process killed).
func (p *pollersProc) wait(ctx context.Context) (*pollerResult, error) {
	defer p.stop()
	select {
	case o := <-p.out:
		return o.res, o.err
	case <-ctx.Done():
		p.stop()
		<-p.out
		return nil, ctx.Err()
	}
}

// pollerObjects lists the ScaledObjects for the pollers' process.
func (f *fleet) pollerObjects() []pollerRef {
	refs := make([]pollerRef, len(f.sos))
	for i, s := range f.sos {
		refs[i] = pollerRef{Idx: s.idx, Name: s.ref.Name, Namespace: s.ref.Namespace, Metadata: s.ref.ScalerMetadata, MetricName: s.polls.name()}
	}
	return refs
}
