// Command demo is `make run`: on loopback, an aggregator, a static-mode agent
// and five simulated vLLM pods in two workloads (demo/llama: 3 serving pods
// and one starting, demo/phi: 1 pod) whose load changes over time, and a
// poller that asks the scaler what the HPA would ask every 15 s, so that
// /debug/triggers shows each decision. Ctrl-C stops everything.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// config is the demo's flags.
type config struct {
	bin                                         string
	httpAddr, scalerAddr, ingestAddr, agentAddr string
	// out gets the demo's own lines (addresses, instructions); logs gets
	// the aggregator's and the agent's.
	out, logs io.Writer
}

func main() {
	c := config{out: os.Stdout, logs: os.Stdout}
	flag.StringVar(&c.bin, "bin", "bin", "directory holding pulse-agent and pulse-aggregator")
	flag.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:8080", "the aggregator's HTTP address (debug endpoints, /metrics)")
	flag.StringVar(&c.scalerAddr, "scaler-addr", "127.0.0.1:9090", "the aggregator's KEDA scaler address")
	flag.StringVar(&c.ingestAddr, "ingest-addr", "127.0.0.1:9091", "the aggregator's ingest address")
	flag.StringVar(&c.agentAddr, "agent-http-addr", "127.0.0.1:8081", "the agent's HTTP address (/metrics)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("pulse-demo", version.Version)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type pod struct {
	workload, name string
	// starting: listed as not ready (loading its model): not scraped, and
	// no demand of its own.
	starting bool
	// The arrival rate swings around base with this amplitude and period.
	base, amp float64
	period    time.Duration
}

// portsFree checks, before anything starts, that the demo's addresses can
// be listened on, naming the make variable of each that cannot (a taken port
// once failed only after "pulse demo is running").
func portsFree(c config) error {
	var errs []error
	for _, a := range []struct{ addr, flag, variable string }{
		{c.httpAddr, "--http-addr", "DEMO_HTTP"}, {c.scalerAddr, "--scaler-addr", "DEMO_SCALER"},
		{c.ingestAddr, "--ingest-addr", "DEMO_INGEST"}, {c.agentAddr, "--agent-http-addr", "DEMO_AGENT"},
	} {
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s cannot be listened on (%w): choose another with make run %s=127.0.0.1:PORT", a.flag, a.addr, err, a.variable))
			continue
		}
		_ = ln.Close()
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, c config) error {
	if err := portsFree(c); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The pods' and the poller's goroutines end with ctx.
	defer func() { stop(); wg.Wait() }()
	dir, err := os.MkdirTemp("", "pulse-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "targets.yaml")
	if err := startPods(ctx, c.out, file, &wg); err != nil {
		return err
	}

	// Each child says where it listens once it does (an address with port
	// 0 is the kernel's choice); the instructions name those addresses.
	exits := make(chan error, 2)
	running := 0
	// fail stops the demo and waits for the children that still run; a
	// demo stopped while it started has not failed.
	fail := func(err error) error {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			err = nil
		}
		stop()
		for ; running > 0; running-- {
			if e := <-exits; e != nil {
				fmt.Fprintln(c.logs, "stopped after the failure:", e)
			}
		}
		return err
	}
	// launch starts a child and waits until it says where it listens.
	launch := func(want *regexp.Regexp, name string, args ...string) ([]string, error) {
		out, err := startChild(ctx, c.logs, exits, want, filepath.Join(c.bin, name), append([]string{"--log-format=text"}, args...)...)
		if err != nil {
			return nil, err
		}
		running++
		return listening(ctx, out, exits, &running)
	}
	agg, err := launch(aggListening, "pulse-aggregator", "--expected-agents=1",
		"--ingest-addr="+c.ingestAddr, "--scaler-addr="+c.scalerAddr, "--http-addr="+c.httpAddr)
	if err != nil {
		return fail(err)
	}
	ingestAddr, scalerAddr, httpAddr := agg[1], agg[2], agg[3]
	agent, err := launch(agentListening, "pulse-agent", "--node-name=demo-node", "--static-targets="+file,
		"--aggregator="+ingestAddr, "--http-addr="+c.agentAddr)
	if err != nil {
		return fail(err)
	}
	instruct(c.out, httpAddr, scalerAddr, agent[1])
	wg.Add(1)
	go func() { defer wg.Done(); poll(ctx, scalerAddr) }()
	select {
	case <-ctx.Done():
	case err := <-exits:
		running--
		// A child stopped by the demo's end may be waited on before the
		// select sees that end: only an exit before it is a failure.
		if ctx.Err() == nil {
			return fail(fmt.Errorf("a pulse process exited: %w", err))
		}
	}
	for ; running > 0; running-- {
		// Those stopped by the demo's end exit with the signal, which says
		// nothing.
		if err := <-exits; err != nil && ctx.Err() == nil {
			fmt.Fprintln(c.logs, err)
		}
	}
	fmt.Fprintln(c.out, "demo stopped")
	return nil
}

// instruct says on out where the demo is and how to steer it.
func instruct(out io.Writer, httpAddr, scalerAddr, agentAddr string) {
	fmt.Fprintf(out, `
pulse demo is running. Look at:
  curl -s 'http://%[1]s/debug/workloads?format=table'
  curl -s http://%[1]s/debug/workloads/demo/llama
  curl -s 'http://%[1]s/debug/triggers?format=table'   (what the HPA was told, every 15 s, and why)
  KEDA scaler (external-push) on %[2]s, agent metrics on http://%[3]s/metrics
Steer a simulated pod (its address is above):
  curl -X POST -d '{"waiting":40}' http://POD/load     hold a value (DELETE /load releases it)
  curl -X POST -d '{"arrivalRate":60,"batchCapacity":16,"serviceRate":1}' http://POD/model
                                                      hold a load model (DELETE /model: back to the demo's swing)
  curl -X POST -d '{"seconds":10}' http://POD/hang     its page hangs for 10 s (the agent reports it missing: timeout)
  curl http://POD/load                                 what it serves now
Ctrl-C stops everything.

`, httpAddr, scalerAddr, agentAddr)
}

// startPods starts the demo's simulated vLLM pods, each until ctx ends
// (wg counts their goroutines), says where each is on out, and writes the
// agent's static targets to file.
func startPods(ctx context.Context, out io.Writer, file string, wg *sync.WaitGroup) error {
	pods := []pod{
		{"llama", "llama-0", false, 14, 12, 90 * time.Second},
		{"llama", "llama-1", false, 14, 12, 90 * time.Second},
		{"llama", "llama-2", false, 14, 12, 90 * time.Second},
		{"llama", "llama-3", true, 14, 12, 90 * time.Second},
		{"phi", "phi-0", false, 6, 5, 40 * time.Second},
	}
	targets := "targets:\n"
	for _, p := range pods {
		sim := vllmsim.New(vllmsim.Options{Seed: uint64(len(p.name)) + uint64(time.Now().UnixNano())})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 5 * time.Second}
		wg.Add(3)
		go func() { defer wg.Done(); _ = srv.Serve(ln) }()
		go func() { defer wg.Done(); <-ctx.Done(); _ = srv.Close() }()
		go func() { defer wg.Done(); drive(ctx, sim, p) }()
		targets += fmt.Sprintf("- namespace: demo\n  pod: %s\n  workspace: %s\n  url: http://%s/metrics\n  ready: %v\n", p.name, p.workload, ln.Addr(), !p.starting)
		note := "(steer it: POST /load, /model, /hang)"
		if p.starting {
			note = "(listed as starting: not scraped, no demand)"
		}
		fmt.Fprintf(out, "simulated vLLM %-8s http://%s/metrics  %s\n", p.name, ln.Addr(), note)
	}
	return os.WriteFile(file, []byte(targets), 0o600)
}

// The lines (--log-format=text) in which the aggregator and the agent say
// where they listen.
var (
	aggListening   = regexp.MustCompile(`msg="aggregator listening" ingest=(\S+) scaler=(\S+) http=(\S+)`)
	agentListening = regexp.MustCompile(`msg="agent http listening" addr=(\S+)`)
)

// startChild starts a pulse binary whose exit, with its last words, is sent
// on exits; its output's first line that want matches is kept.
func startChild(ctx context.Context, logs io.Writer, exits chan<- error, want *regexp.Regexp, path string, args ...string) (*tail, error) {
	out := &tail{w: logs, want: want, found: make(chan []string, 1)}
	cmd := command(ctx, out, path, args...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%s: %w; its last words: %s", filepath.Base(path), err, out.String())
		}
		exits <- err
	}()
	return out, nil
}

// listening waits for a child's line that says where it listens; a child
// that exits first (running counts it gone) or the demo's end is an error.
func listening(ctx context.Context, out *tail, exits <-chan error, running *int) ([]string, error) {
	select {
	case m := <-out.found:
		return m, nil
	case err := <-exits:
		*running--
		if err == nil {
			err = errors.New("exited with status 0")
		}
		return nil, fmt.Errorf("a pulse process exited before it listened: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// command runs a child that gets SIGTERM when ctx ends and is killed if the
// demo itself dies, so nothing is left behind.
func command(ctx context.Context, out io.Writer, path string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, path, args...)
	c.Stdout, c.Stderr = out, out
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = 5 * time.Second
	return c
}

// drive runs the queueing model with an arrival rate that swings over time;
// a model posted to the pod (POST /model) holds instead until released.
func drive(ctx context.Context, sim *vllmsim.Server, p pod) {
	start := time.Now()
	go sim.RunModel(ctx, 100*time.Millisecond)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		phase := 2 * math.Pi * time.Since(start).Seconds() / p.period.Seconds()
		sim.Drive(vllmsim.QueueModel{ArrivalRate: p.base + p.amp*math.Sin(phase), BatchCapacity: 16, ServiceRate: 1})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll asks the scaler for each workload's value every 15 s, as KEDA's HPA
// does, so that /debug/triggers shows the decisions.
func poll(ctx context.Context, addr string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	keda := externalscaler.NewExternalScalerClient(conn)
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	if !sleepCtx(ctx, 3*time.Second) {
		return
	}
	for {
		for _, w := range []string{"llama", "phi"} {
			_, _ = keda.GetMetrics(ctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: &externalscaler.ScaledObjectRef{
				Name: w, Namespace: "demo", ScalerMetadata: map[string]string{"workspace": w, "threshold": "10"}}})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// tail passes a child's output on to w and keeps its last bytes, so that a
// child that exits is reported with why; the first line want matches is
// sent on found.
type tail struct {
	w     io.Writer
	want  *regexp.Regexp
	found chan []string
	mu    sync.Mutex
	last  []byte
	line  []byte // the line being written
	sent  bool
}

const (
	tailBytes = 1024
	maxLine   = 64 << 10
)

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.last = append(t.last, p...)
	if len(t.last) > tailBytes {
		t.last = t.last[len(t.last)-tailBytes:]
	}
	for rest := p; !t.sent && len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			t.line = append(t.line, rest...)
			if len(t.line) > maxLine {
				t.line = t.line[:0] // no log line of the two is this long
			}
			break
		}
		t.line = append(t.line, rest[:i]...)
		if m := t.want.FindStringSubmatch(string(t.line)); m != nil {
			t.found <- m
			t.sent = true
		}
		t.line, rest = t.line[:0], rest[i+1:]
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.last))
}
