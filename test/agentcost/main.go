// Command agentcost measures what pulse's agent costs a node, side by side
// with Debian's Prometheus scraping the same simulated vLLM pods at the same
// interval, in one run: `make agent-cost` (see docs/performance.md).
//
// It starts N vllm-sim servers (each a queueing model at --rate requests/s),
// a pulse aggregator, the agent (static targets, NVML off) and Prometheus,
// waits --warmup, then for --duration reads each process's CPU time
// (/proc/PID/stat utime+stime) and RSS (/proc/PID/status VmRSS, every
// second). With --perf DIR it then records the agent with perf and
// writes where its CPU time goes by component.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pulse-io/pulse/test/procs"
)

type options struct {
	bin, prometheus, perfDir string
	perfFor                  time.Duration
	pods, hostile            int
	rate                     float64
	interval                 time.Duration
	warmup, duration         time.Duration
	agentArgs, agentEnv      string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding pulse-agent, pulse-aggregator and vllm-sim (make build)")
	flag.StringVar(&o.prometheus, "prometheus", "prometheus", "the prometheus binary (Debian's 2.42: apt-get install prometheus); \"\" to measure the agent alone")
	flag.IntVar(&o.pods, "pods", 8, "simulated vLLM servers")
	flag.IntVar(&o.hostile, "hostile", 0, "beside the servers, this many pods of a hostile tenant serving 8 MiB pages, and one router of theirs naming 64 workloads on an 8 MiB page")
	flag.Float64Var(&o.rate, "rate", 12, "requests/s each server's queueing model receives")
	flag.DurationVar(&o.interval, "interval", time.Second, "scrape interval of both the agent and Prometheus")
	flag.DurationVar(&o.warmup, "warmup", 15*time.Second, "time before measuring (connections, caches, Prometheus' first compaction of its head)")
	flag.DurationVar(&o.duration, "duration", 120*time.Second, "time measured")
	flag.StringVar(&o.perfDir, "perf", "", "after measuring, record the agent with perf (4999 Hz) and write the profile and its summary here")
	flag.DurationVar(&o.perfFor, "perf-for", 60*time.Second, "how long --perf records")
	flag.StringVar(&o.agentArgs, "agent-args", "", "extra flags for pulse-agent, space-separated")
	flag.StringVar(&o.agentEnv, "agent-env", "", "extra environment of pulse-agent, NAME=VALUE space-separated (GOMAXPROCS=1, GODEBUG=...)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "agentcost:", err)
		os.Exit(1)
	}
}

// proc is a started process.
type proc struct {
	name string
	cmd  *exec.Cmd
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "agentcost-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	var started []*proc
	defer func() {
		for _, p := range started {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range started {
			_ = p.cmd.Wait()
		}
	}()
	start := func(name string, env []string, args ...string) (*proc, error) {
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if len(env) > 0 {
			cmd.Env = append(os.Environ(), env...)
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		p := &proc{name: name, cmd: cmd}
		started = append(started, p)
		return p, nil
	}

	var targets, urls []string
	for i := range o.pods {
		addr, err := procs.FreeAddr()
		if err != nil {
			return err
		}
		if _, err := start(fmt.Sprintf("vllm-sim-%d", i), nil, filepath.Join(o.bin, "vllm-sim"), "--addr", addr,
			"--arrival-rate", strconv.FormatFloat(o.rate, 'g', -1, 64)); err != nil {
			return err
		}
		targets = append(targets, addr)
		urls = append(urls, "http://"+addr+"/metrics")
	}
	tf, err := targetsYAML(ctx, urls, o.hostile)
	if err != nil {
		return err
	}
	targetsFile := filepath.Join(dir, "targets.yaml")
	if err := os.WriteFile(targetsFile, []byte(tf), 0o600); err != nil {
		return err
	}
	ingest, _ := procs.FreeAddr()
	scalerAddr, _ := procs.FreeAddr()
	aggHTTP, _ := procs.FreeAddr()
	agentHTTP, _ := procs.FreeAddr()
	if _, err := start("aggregator", nil, filepath.Join(o.bin, "pulse-aggregator"), "--ingest-addr", ingest, "--scaler-addr", scalerAddr,
		"--http-addr", aggHTTP, "--log-format", "text"); err != nil {
		return err
	}
	agentCmd := []string{filepath.Join(o.bin, "pulse-agent"), "--static-targets", targetsFile, "--aggregator", ingest,
		"--node-name", "bench", "--nvml", "off", "--scrape-interval", o.interval.String(), "--http-addr", agentHTTP, "--log-format", "text"}
	agentCmd = append(agentCmd, strings.Fields(o.agentArgs)...)
	agent, err := start("agent", strings.Fields(o.agentEnv), agentCmd...)
	if err != nil {
		return err
	}
	measured := []*proc{agent}
	if o.prometheus != "" {
		promBin, err := exec.LookPath(o.prometheus)
		if err != nil {
			return fmt.Errorf("prometheus: %w (apt-get install prometheus, or --prometheus \"\")", err)
		}
		quoted := make([]string, len(targets))
		for i, t := range targets {
			quoted[i] = strconv.Quote(t)
		}
		cfg := fmt.Sprintf("global:\n  scrape_interval: %s\n  scrape_timeout: %s\nscrape_configs:\n- job_name: vllm\n  static_configs:\n  - targets: [%s]\n",
			o.interval, min(o.interval, 10*time.Second), strings.Join(quoted, ", "))
		cfgFile := filepath.Join(dir, "prometheus.yml")
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			return err
		}
		promAddr, _ := procs.FreeAddr()
		prom, err := start("prometheus", nil, promBin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
			"--web.listen-address="+promAddr, "--log.level=warn")
		if err != nil {
			return err
		}
		measured = append(measured, prom)
	}

	size, err := pageSize(urls[0])
	if err != nil {
		return err
	}
	fmt.Printf("%d simulated vLLM servers at %g requests/s each, pages of %.1f KB; interval %s; warm-up %s, measured %s\n",
		o.pods, o.rate, float64(size)/1000, o.interval, o.warmup, o.duration)
	if o.hostile > 0 {
		fmt.Printf("beside them, %d hostile pods with 8 MiB pages and a router naming 64 workloads on an 8 MiB page\n", o.hostile)
	}
	if !procs.Sleep(ctx, o.warmup) {
		return ctx.Err()
	}
	for _, p := range measured {
		if p.cmd.ProcessState != nil {
			return fmt.Errorf("%s exited; its log is gone with %s", p.name, dir)
		}
	}
	results, err := measure(ctx, measured, o.duration)
	if err != nil {
		return err
	}
	fmt.Printf("\n| process | interval | CPU, %% of one core | RSS min / median / max |\n|---|---|---|---|\n")
	for _, r := range results {
		fmt.Printf("| %s | %s | %.2f | %.1f / %.1f / %.1f MB |\n", r.name, o.interval, r.cpuPercent, r.rssMin, r.rssMedian, r.rssMax)
	}
	if o.perfDir != "" {
		return profile(ctx, agent.cmd.Process.Pid, o.perfDir, o.perfFor)
	}
	return nil
}

// targetsYAML is the agent's static targets: the simulated servers at
// urls, and with hostile > 0 that many pods of a hostile tenant and a router
// of theirs naming 64 workloads, all serving 8 MiB pages.
func targetsYAML(ctx context.Context, urls []string, hostile int) (string, error) {
	var tf strings.Builder
	tf.WriteString("targets:\n")
	for i, u := range urls {
		fmt.Fprintf(&tf, "  - {namespace: bench, pod: vllm-%d, workspace: llama, url: %q}\n", i, u)
	}
	if hostile > 0 {
		big, err := serveHostile(ctx)
		if err != nil {
			return "", err
		}
		for i := range hostile {
			fmt.Fprintf(&tf, "  - {namespace: hostile, pod: big-%d, workspace: big, url: %q}\n", i, big)
		}
		names := make([]string, 64)
		for i := range names {
			names[i] = fmt.Sprintf("w%d", i)
		}
		fmt.Fprintf(&tf, "  - {namespace: hostile, pod: router, url: %q, annotations: {pulse.io/demand-source: epp, pulse.io/demand-workloads: %q}}\n",
			big, strings.Join(names, ","))
	}
	return tf.String(), nil
}

// serveHostile serves an 8 MiB page (a valid one: comment lines, then a
// vLLM gauge) on loopback until ctx ends, and returns its URL.
func serveHostile(ctx context.Context) (string, error) {
	addr, err := procs.FreeAddr()
	if err != nil {
		return "", err
	}
	line := "# a hostile tenant's page, padded to 8 MiB\n"
	page := []byte(strings.Repeat(line, (8<<20)/len(line)) + "vllm:num_requests_waiting{model_name=\"m\"} 1\n")
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(page)
	})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return "http://" + addr + "/metrics", nil
}

type result struct {
	name                      string
	cpuPercent                float64
	rssMin, rssMedian, rssMax float64 // MB
}

// measure samples every process's CPU time at both ends of d and its RSS
// every second.
func measure(ctx context.Context, ps []*proc, d time.Duration) ([]result, error) {
	cpu0 := make([]float64, len(ps))
	for i, p := range ps {
		u, err := procs.Read(p.cmd.Process.Pid)
		c := u.CPUSeconds
		if err != nil {
			return nil, err
		}
		cpu0[i] = c
	}
	t0 := time.Now()
	rss := make([][]float64, len(ps))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for time.Since(t0) < d {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		for i, p := range ps {
			u, err := procs.Read(p.cmd.Process.Pid)
			r := float64(u.RSSBytes) / 1e6
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			rss[i] = append(rss[i], r)
		}
	}
	elapsed := time.Since(t0).Seconds()
	out := make([]result, len(ps))
	for i, p := range ps {
		u, err := procs.Read(p.cmd.Process.Pid)
		c := u.CPUSeconds
		if err != nil {
			return nil, err
		}
		slices.Sort(rss[i])
		out[i] = result{name: p.name, cpuPercent: 100 * (c - cpu0[i]) / elapsed,
			rssMin: rss[i][0], rssMedian: rss[i][len(rss[i])/2], rssMax: rss[i][len(rss[i])-1]}
	}
	return out, nil
}

// pageSize is the size of one page as served uncompressed.
func pageSize(url string) (int, error) {
	var last error
	for range 50 {
		resp, err := http.Get(url)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			return len(b), err
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("vllm-sim never answered: %w", last)
}

// profile records the agent with perf for d and writes the report, and the
// share of samples by component, into dir.
func profile(ctx context.Context, pid int, dir string, d time.Duration) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	data := filepath.Join(dir, "perf.data")
	rec := exec.CommandContext(ctx, "perf", "record", "-F", "4999", "-g", "-p", strconv.Itoa(pid), "-o", data, "--", "sleep", strconv.Itoa(int(d.Seconds())))
	if out, err := rec.CombinedOutput(); err != nil {
		return fmt.Errorf("perf record: %w: %s", err, out)
	}
	rep := exec.CommandContext(ctx, "perf", "report", "-i", data, "--no-children", "--sort", "sym", "--stdio", "-g", "none", "--percent-limit", "0")
	out, err := rep.Output()
	if err != nil {
		return fmt.Errorf("perf report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.txt"), out, 0o600); err != nil {
		return err
	}
	shares := summarize(string(out))
	fmt.Printf("\nagent CPU by component (perf, %s; %s):\n", d, filepath.Join(dir, "report.txt"))
	for _, c := range components {
		fmt.Printf("  %-28s %5.1f %%\n", c.name, shares[c.name])
	}
	return nil
}

// components classify perf's symbols; the first match wins.
var components = []struct {
	name     string
	prefixes []string
}{
	{"kernel (syscalls, network)", []string{"[k] "}},
	{"GC and allocation", []string{"runtime.gc", "runtime.mallocgc", "runtime.scanobject", "runtime.greyobject", "runtime.findObject", "runtime.markBits", "runtime.(*mspan)", "runtime.(*mheap)", "runtime.(*mcache)", "runtime.(*gcWork)", "runtime.memclr", "runtime.heapBits", "runtime.sweepone", "runtime.(*sweepLocked)", "runtime.wbBuf", "runtime.bulkBarrier", "runtime.typePointers", "runtime.scanblock", "runtime.nextFreeFast", "runtime.deductAssist"}},
	{"scheduler and timers", []string{"runtime.schedule", "runtime.findRunnable", "runtime.netpoll", "runtime.futex", "runtime.park", "runtime.runqgrab", "runtime.stealWork", "runtime.checkTimers", "runtime.(*timer", "runtime.nanotime", "runtime.usleep", "runtime.notesleep", "runtime.notewakeup", "runtime.mcall", "runtime.gogo", "runtime.goready", "runtime.ready", "runtime.execute", "runtime.casgstatus", "runtime.lock", "runtime.unlock", "runtime.wakep", "runtime.startm", "runtime.stopm", "runtime.resetspinning", "runtime.runqput", "runtime.newproc", "runtime.goexit", "runtime.morestack", "runtime.newstack", "runtime.copystack", "runtime.systemstack", "runtime.(*timers)", "runtime.selectgo", "runtime.chan", "runtime.send", "runtime.recv"}},
	{"other Go runtime", []string{"runtime.", "internal/runtime", "sync.", "sync/atomic."}},
	{"gzip", []string{"compress/"}},
	{"vLLM page extraction", []string{"github.com/pulse-io/pulse/pkg/vllm", "github.com/pulse-io/pulse/pkg/metric"}},
	{"HTTP client", []string{"net/http", "net/textproto", "bufio.", "mime.", "net/url"}},
	{"gRPC and protobuf", []string{"google.golang.org/", "golang.org/x/net/http2", "github.com/pulse-io/pulse/pkg/wire"}},
	{"network (Go)", []string{"net.", "internal/poll", "syscall.", "internal/syscall"}},
	{"pulse agent", []string{"github.com/pulse-io/pulse/"}},
	{"other", []string{""}},
}

// summarize sums perf report's per-symbol percentages by component.
func summarize(report string) map[string]float64 {
	shares := map[string]float64{}
	for _, line := range strings.Split(report, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pct, rest, ok := strings.Cut(line, "%")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(pct), 64)
		if err != nil {
			continue
		}
		sym := strings.TrimSpace(rest)
		sym = strings.TrimPrefix(sym, "[.] ")
		for _, c := range components {
			if slices.ContainsFunc(c.prefixes, func(p string) bool { return strings.HasPrefix(sym, p) }) {
				shares[c.name] += v
				break
			}
		}
	}
	return shares
}
