package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/test/procs"
)

// aggregatorProc is the pulse-aggregator process under test; Start after
// Kill restarts it on the same addresses.
type aggregatorProc struct {
	bin, logPath             string
	args                     []string
	ingest, scaler, httpAddr string
	mu                       sync.Mutex
	cmd                      *exec.Cmd
	exited                   chan struct{}
	log                      *os.File
	starts                   int
	http                     *http.Client
	cpus                     []int // the CPUs it runs on (--pin); nil: any
	env                      []string
	tls                      *ingestTLS // the ingest port's (--tls); nil: plaintext
}

func newAggregator(o options, dir string, expectedAgents int) (*aggregatorProc, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := procs.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	p := &aggregatorProc{bin: filepath.Join(o.bin, "pulse-aggregator"), logPath: filepath.Join(dir, "aggregator.log"),
		ingest: addrs[0], scaler: addrs[1], httpAddr: addrs[2], http: &http.Client{Timeout: 10 * time.Second}}
	p.args = []string{"--ingest-addr", p.ingest, "--scaler-addr", p.scaler, "--http-addr", p.httpAddr,
		"--log-format", "text", "--log-level", "warn",
		// Room for the fleet and its churn; the default caps (10,000 pods)
		// are for one cluster's normal size.
		"--max-pods", strconv.Itoa(o.maxPods()),
		// The fleet's pods are all of one namespace.
		"--max-pods-per-namespace", strconv.Itoa(o.maxPods()),
		"--expected-agents", strconv.Itoa(expectedAgents), "--warmup", "60s",
		"--pod-expiry", o.podExpiry.String()}
	if o.tls {
		var err error
		if p.tls, err = newIngestTLS(dir); err != nil {
			return nil, err
		}
		p.args = append(p.args, "--ingest-tls-cert-file", p.tls.certFile, "--ingest-tls-key-file", p.tls.keyFile)
	}
	if o.relays > 0 {
		// A relay's connection carries many agents' streams, and the
		// relays' connections all come from the loopback's one address.
		p.args = append(p.args, "--max-ingest-streams-per-connection", "1024", "--max-ingest-connections-per-address", "1024")
	}
	p.args = append(p.args, strings.Fields(o.aggregatorArgs)...)
	// The environment's (its GOGC included), and --memory-limit's soft
	// limit: of a name given twice, exec uses the last.
	p.env = os.Environ()
	if o.memoryLimit > 0 {
		// What the aggregator sets in a container of that limit (it reads
		// its cgroup's).
		p.env = append(p.env, "GOMEMLIMIT="+strconv.FormatInt(goMemLimit(o.memoryLimit), 10))
	}
	return p, nil
}

// Start starts the process and waits for /livez.
func (p *aggregatorProc) Start(ctx context.Context) error {
	p.mu.Lock()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.starts++
	fmt.Fprintf(f, "---- start %d at %s\n", p.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	if len(p.cpus) > 0 {
		// taskset execs the aggregator in its own process: every thread
		// it makes stays on these CPUs.
		cmd = exec.Command("taskset", append([]string{"-c", cpuList(p.cpus), p.bin}, p.args...)...)
	}
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, p.env
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		p.mu.Unlock()
		return fmt.Errorf("start pulse-aggregator: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(exited) }()
	p.cmd, p.exited, p.log = cmd, exited, f
	p.mu.Unlock()
	for {
		if resp, err := p.http.Get("http://" + p.httpAddr + "/livez"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("pulse-aggregator exited at start: see %s", p.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *aggregatorProc) Kill() {
	p.signal(syscall.SIGKILL)
}

// Stop ends the process with SIGTERM (SIGKILL after 10 s).
func (p *aggregatorProc) Stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

func (p *aggregatorProc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-exited
}

// PID is the running process's id.
func (p *aggregatorProc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Metrics reads /metrics: each family's value summed over its series
// (histograms and summaries: their count), each series by its labels as
// "name{k=v,...}" in label order, and a histogram's cumulative buckets as
// "name_bucket{k=v,...,le=BOUND}".
func (p *aggregatorProc) Metrics(ctx context.Context) (map[string]float64, error) {
	m, _, err := p.MetricsAt(ctx)
	return m, err
}

// metricsAttempts: a read of /metrics is tried this many times. At 10,000
// agents the aggregator's CPU is busy: one run in five on 2026-11-27 lost
// its summary to a read of the page that ran past the client's 10 s.
const metricsAttempts = 3

// MetricsAt is Metrics, and when the attempt that read the values began
// (the counters are read then, not when the page has arrived): a failed
// attempt (an error, a timeout, an answer other than 200) is tried again,
// up to metricsAttempts in all.
func (p *aggregatorProc) MetricsAt(ctx context.Context) (map[string]float64, time.Time, error) {
	var errs []error
	for range metricsAttempts {
		at := time.Now()
		m, err := p.metricsOnce(ctx)
		if err == nil {
			return m, at, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, time.Time{}, errors.Join(errs...)
}

func (p *aggregatorProc) metricsOnce(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/metrics", nil)
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read aggregator metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read aggregator metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse aggregator metrics: %w", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			v := value(m)
			out[name] += v
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			if len(labels) > 0 {
				out[name+"{"+strings.Join(labels, ",")+"}"] += v
			}
			// A histogram's buckets, cumulative, as NAME_bucket{LABELS,le=BOUND}.
			for _, b := range m.GetHistogram().GetBucket() {
				le := "le=" + strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
				out[name+"_bucket{"+strings.Join(append(labels, le), ",")+"}"] += float64(b.GetCumulativeCount())
			}
		}
	}
	return out, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	}
	return 0
}

// goMemLimit is the soft memory limit the aggregator sets in a container
// whose memory limit is limit.
func goMemLimit(limit int64) int64 {
	return int64(float64(limit) * app.MemoryLimitRatio)
}
