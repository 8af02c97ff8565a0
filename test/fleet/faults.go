package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/test/procs"
)

// faultResult is one scenario's outcome: what it measured, and every
// expectation it found broken (OK when none).
type faultResult struct {
	Name     string             `json:"name"`
	OK       bool               `json:"ok"`
	Failures []string           `json:"failures,omitempty"`
	Measured map[string]float64 `json:"measured,omitempty"`
	Notes    []string           `json:"notes,omitempty"`
	// Errors: what the fleet's pollers and streams saw fail meanwhile, by
	// kind (expected of the victims; the scenario checks its own).
	Errors map[string]int64 `json:"errors,omitempty"`
}

func (r *faultResult) failf(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

func (r *faultResult) measure(name string, v float64) { r.Measured[name] = v }

// fault runs one scenario. Errors the fleet sees meanwhile are counted as
// expected, not as errors.
func (f *fleet) fault(ctx context.Context, name string) (*faultResult, error) {
	r := &faultResult{Name: name, Measured: map[string]float64{}}
	f.logf("fault %s", name)
	f.setFaulting(true)
	f.churnPaused.Store(true) // a victim's pods stay where the scenario put them
	defer f.churnPaused.Store(false)
	var err error
	switch name {
	case "malformed-batch":
		err = f.malformedBatch(ctx, r)
	case "pages":
		err = f.pages(ctx, r)
	case "agent-kill":
		err = f.agentKill(ctx, r)
	case "partition":
		err = f.partition(ctx, r)
	case "aggregator-kill":
		err = f.aggregatorKill(ctx, r)
	case "node-silencing":
		err = f.nodeSilencing(ctx, r)
	case "eviction":
		err = f.eviction(ctx, r)
	default:
		err = fmt.Errorf("unknown fault %q", name)
	}
	f.setFaulting(false)
	f.mu.Lock()
	r.Errors, f.faultErrs = f.faultErrs, nil
	f.mu.Unlock()
	r.OK = err == nil && len(r.Failures) == 0
	f.logf("fault %s: ok=%v failures=%v measured=%v errors=%v", name, r.OK, r.Failures, r.Measured, r.Errors)
	return r, err
}

func (f *fleet) setFaulting(on bool) {
	f.mu.Lock()
	f.faulting = on
	f.mu.Unlock()
}

// ask sends one GetMetrics for workload w, as the HPA would, outside the
// measured polls, on the scenarios' own connection.
func (f *fleet) ask(ctx context.Context, w string) answer {
	a, _ := f.askWithMessage(ctx, w)
	return a
}

// askWithMessage is ask with the error's message.
func (f *fleet) askWithMessage(ctx context.Context, w string) (answer, string) {
	client := externalscaler.NewExternalScalerClient(f.askConn)
	ref := &externalscaler.ScaledObjectRef{Name: "so-" + w, Namespace: namespace, ScalerMetadata: map[string]string{
		"deployment": w, "metric": "waiting", "threshold": "10", "activationThreshold": "5"}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	spec, err := client.GetMetricSpec(ctx, ref)
	if err != nil {
		return answer{at: time.Now(), code: status.Code(err)}, status.Convert(err).Message()
	}
	resp, err := client.GetMetrics(ctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: ref, MetricName: spec.MetricSpecs[0].MetricName})
	a := answer{at: time.Now(), code: status.Code(err)}
	if err == nil && len(resp.MetricValues) > 0 {
		a.value = resp.MetricValues[0].MetricValue
	}
	return a, status.Convert(err).Message()
}

// steadyTotal is what workload w answers when every one of its pods
// reports: steadyWaiting per listed Ready pod.
func (f *fleet) steadyTotal(w int) int64 {
	var n int64
	for _, a := range f.agents {
		a.mu.Lock()
		for _, p := range a.pods {
			if p.workload == w && p.ready {
				n += steadyWaiting
			}
		}
		a.mu.Unlock()
	}
	return n
}

// baseline waits until workload w answers its steady total (with --churn:
// any answer), and returns it.
func (f *fleet) baseline(ctx context.Context, w int) (int64, error) {
	var got answer
	if waitFor(ctx, 60*time.Second, func() bool {
		got = f.ask(ctx, workloadName(w))
		return got.code == codes.OK && (f.o.churn > 0 || got.value == f.steadyTotal(w))
	}) < 0 {
		return 0, fmt.Errorf("%s never answered its steady total %d (last: %v %d)", workloadName(w), f.steadyTotal(w), got.code, got.value)
	}
	return got.value, nil
}

// workload reads /debug/workloads for one workload; nil when the
// aggregator holds no pod of it.
func (f *fleet) workload(ctx context.Context, w string) (*debug.Workload, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.agg.httpAddr+"/debug/workloads/"+namespace+"/"+w, nil)
	resp, err := f.agg.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	var doc debug.Document
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode /debug/workloads: %w", err)
	}
	for i := range doc.Workloads {
		if doc.Workloads[i].Kind == "Deployment" || len(doc.Workloads) == 1 {
			return &doc.Workloads[i], nil
		}
	}
	return nil, nil
}

// waitFor polls cond every 100 ms until it holds or limit passes; it
// returns how long it took, or -1.
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) time.Duration {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start)
		}
		if time.Since(start) > limit || !procs.Sleep(ctx, 100*time.Millisecond) {
			return -1
		}
	}
}

// agentsOf returns, for a set of agents, the workloads all of whose pods
// they hold, and one workload none of whose pods they hold.
func (f *fleet) agentsOf(set map[int]bool) (all []int, none int) {
	on, off := map[int]bool{}, map[int]bool{}
	for i, a := range f.agents {
		a.mu.Lock()
		for _, p := range a.pods {
			if set[i] {
				on[p.workload] = true
			} else {
				off[p.workload] = true
			}
		}
		a.mu.Unlock()
	}
	none = -1
	for w := range on {
		if !off[w] && !f.isProbe(w) {
			all = append(all, w)
		}
	}
	for w := range off {
		if !on[w] && !f.isProbe(w) && (none < 0 || w < none) {
			none = w
		}
	}
	return all, none
}

// malformedBatch makes one agent send a batch whose values do not match
// its bitmaps: its stream must end with InvalidArgument, every other
// stream must stay, and the agent must come back on a new stream.
func (f *fleet) malformedBatch(ctx context.Context, r *faultResult) error {
	victim := f.agents[len(f.agents)-1]
	before := make([]int64, len(f.agents))
	for i, a := range f.agents {
		before[i] = a.sessions.Load()
	}
	m0, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	victim.mu.Lock()
	victim.malform = true
	victim.mu.Unlock()
	t0 := time.Now()
	back := waitFor(ctx, 30*time.Second, func() bool { return victim.sessions.Load() > before[len(f.agents)-1] && victim.up.Load() })
	if back < 0 {
		r.failf("the agent that sent the malformed batch has no new stream after 30s")
		return nil
	}
	r.measure("reconnectSeconds", time.Since(t0).Seconds())
	var err2 error
	if b := victim.lastErr.Load(); b != nil {
		err2 = b.err
	}
	if status.Code(err2) != codes.InvalidArgument {
		r.failf("its stream ended with %v, want InvalidArgument", err2)
	}
	m1, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	rejected := m1["pulse_aggregator_rejected_reports_total"] - m0["pulse_aggregator_rejected_reports_total"]
	r.measure("rejectedReports", rejected)
	if rejected < 1 {
		r.failf("pulse_aggregator_rejected_reports_total did not count it")
	}
	for i, a := range f.agents[:len(f.agents)-1] {
		if a.sessions.Load() != before[i] {
			r.failf("agent %s's stream was also ended", a.node)
		}
	}
	return nil
}

// node is a real pulse-agent process with its scraped servers.
type node struct {
	agent *exec.Cmd
	procs []*exec.Cmd
	srv   *http.Server
}

func (n *node) stop() {
	for _, c := range append([]*exec.Cmd{n.agent}, n.procs...) {
		if c != nil && c.Process != nil {
			_ = c.Process.Signal(syscall.SIGTERM)
			_ = c.Wait()
		}
	}
	if n.srv != nil {
		_ = n.srv.Close()
	}
}

// startNode starts vllm-sim servers for the workloads in sims (workload →
// pods), serves the extra pages (workload → handler) itself, and runs a
// real pulse-agent scraping all of them at the fleet's interval; extra are
// more targets, as lines of the static targets file.
func (f *fleet) startNode(name string, sims map[string]int, pages map[string]http.HandlerFunc, extra []string, agentArgs ...string) (*node, error) {
	n := &node{}
	var tf strings.Builder
	tf.WriteString("targets:\n")
	for _, line := range extra {
		tf.WriteString(line + "\n")
	}
	for w, pods := range sims {
		for i := range pods {
			logf, err := os.Create(f.logPath(fmt.Sprintf("%s-%s-%d", name, w, i)))
			if err != nil {
				return n, err
			}
			addr, c, err := f.startSim(logf)
			if c != nil {
				n.procs = append(n.procs, c)
			}
			if err != nil {
				return n, err
			}
			fmt.Fprintf(&tf, "  - {namespace: %s, pod: %s-%d, deployment: %s, url: \"http://%s/metrics\"}\n", namespace, w, i, w, addr)
		}
	}
	if len(pages) > 0 {
		// Bound here and served on that listener: no other process can
		// take the address between its choice and its use.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return n, err
		}
		addr := ln.Addr().String()
		mux := http.NewServeMux()
		for w, h := range pages {
			mux.HandleFunc("/"+w, h)
			fmt.Fprintf(&tf, "  - {namespace: %s, pod: %s-0, deployment: %s, url: \"http://%s/%s\"}\n", namespace, w, w, addr, w)
		}
		n.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = n.srv.Serve(ln) }()
	}
	targets := filepath.Join(f.dir, name+"-targets.yaml")
	if err := os.WriteFile(targets, []byte(tf.String()), 0o600); err != nil {
		return n, err
	}
	httpAddr, err := procs.FreeAddr()
	if err != nil {
		return n, err
	}
	logf, err := os.Create(f.logPath(name + "-agent"))
	if err != nil {
		return n, err
	}
	args := append([]string{"--static-targets", targets, "--aggregator", f.agg.ingest, "--node-name", name, "--nvml", "off",
		"--scrape-interval", f.o.interval.String(), "--http-addr", httpAddr, "--log-format", "text", "--transport", f.o.transport}, agentArgs...)
	if f.agg.tls != nil {
		args = append(args, "--aggregator-ca-file", f.agg.tls.caFile)
	}
	n.agent = exec.Command(filepath.Join(f.o.bin, "pulse-agent"), args...)
	n.agent.Stdout, n.agent.Stderr = logf, logf
	if err := n.agent.Start(); err != nil {
		return n, fmt.Errorf("start pulse-agent: %w", err)
	}
	return n, nil
}

// startSim starts a vllm-sim on a free loopback address and waits for its
// page. An address found free is free only until something binds it (an
// outbound connection's port among them): a server whose page does not
// come is stopped and started again on another, three times at most. c is
// the last one started, running (for the caller to stop) or reaped.
func (f *fleet) startSim(logf *os.File) (addr string, c *exec.Cmd, err error) {
	var errs []error
	for range 3 {
		if addr, err = procs.FreeAddr(); err != nil {
			return "", nil, err
		}
		c = exec.Command(filepath.Join(f.o.bin, "vllm-sim"), "--addr", addr, "--arrival-rate", "4")
		c.Stdout, c.Stderr = logf, logf
		if err := c.Start(); err != nil {
			return "", nil, fmt.Errorf("start vllm-sim: %w", err)
		}
		if servesVLLM(addr, 10*time.Second) {
			return addr, c, nil
		}
		_ = c.Process.Kill()
		_ = c.Wait()
		errs = append(errs, fmt.Errorf("vllm-sim on %s: no vLLM page within 10s (see %s)", addr, logf.Name()))
	}
	return "", c, errors.Join(errs...)
}

// servesVLLM says whether addr serves a vLLM page within d.
func servesVLLM(addr string, d time.Duration) bool {
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(body), "vllm:") {
			return true
		}
	}
	return false
}

// pages runs a real agent scraping two simulated vLLM pods, one page that
// never answers and one over --max-page-bytes: the healthy pods stay fresh
// at every scrape, the other two are reported missing with their reasons,
// and their workloads answer an error, not 0.
func (f *fleet) pages(ctx context.Context, r *faultResult) error {
	const maxPage = 64 << 10
	big := strings.Repeat("# padding line of an oversized page\n", 2*maxPage/36) + "vllm:num_requests_waiting{model_name=\"m\"} 1\n"
	n, err := f.startNode("node-pages", map[string]int{"pages-ok": 2}, map[string]http.HandlerFunc{
		"pages-hung": func(_ http.ResponseWriter, req *http.Request) { <-req.Context().Done() },
		"pages-big":  func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(big)) },
	}, nil, "--max-page-bytes", fmt.Sprint(maxPage))
	defer n.stop()
	if err != nil {
		return err
	}
	f.setFaulting(false) // the fleet must see no error from this
	defer f.setFaulting(true)
	if waitFor(ctx, 30*time.Second, func() bool { return f.ask(ctx, "pages-ok").code == codes.OK }) < 0 {
		r.failf("the healthy pods' workload never answered")
		return nil
	}
	worstAge, err := f.keepFresh(ctx, r, "beside a hung page", "pages-ok")
	if err != nil {
		return err
	}
	r.measure("healthyPodsWorstAgeSeconds", worstAge)
	for w, want := range map[string]string{"pages-hung": "timeout", "pages-big": "too_large"} {
		d, err := f.workload(ctx, w)
		if err != nil {
			return err
		}
		if d == nil || len(d.Pods) != 1 {
			r.failf("%s: pod not held", w)
			continue
		}
		if d.Pods[0].Missing != want {
			r.failf("%s: missing %q, want %q", w, d.Pods[0].Missing, want)
		}
		if a := f.ask(ctx, w); a.code == codes.OK {
			r.failf("%s answered %d, want an error", w, a.value)
		}
	}
	return nil
}

// keepFresh checks, at each of ten scrapes, that each workload of names
// answers and holds its 2 pods, every one fresh (beside what, for the
// failures); it returns the oldest sample age seen.
func (f *fleet) keepFresh(ctx context.Context, r *faultResult, beside string, names ...string) (worstAge float64, err error) {
	for range 10 {
		if !procs.Sleep(ctx, f.o.interval) {
			return 0, ctx.Err()
		}
		for _, name := range names {
			if a := f.ask(ctx, name); a.code != codes.OK {
				r.failf("%s answered %v %s", name, a.code, beside)
			}
			w, err := f.workload(ctx, name)
			if err != nil {
				return 0, err
			}
			if w == nil || len(w.Pods) != 2 {
				r.failf("%s: its 2 pods are not both held %s", name, beside)
				continue
			}
			for _, p := range w.Pods {
				if !p.Fresh || p.AgeSeconds == nil {
					r.failf("pod %s not fresh %s", p.Name, beside)
				} else {
					worstAge = max(worstAge, *p.AgeSeconds)
				}
			}
		}
	}
	return worstAge, nil
}

// agentKill kills agents as SIGKILL would (the simulated ones' connections
// closed at once, and a real pulse-agent process by SIGKILL): their pods
// are held, their workloads answer an error (never a lower total), then
// the pods are dropped at --pod-expiry; other workloads never notice.
func (f *fleet) agentKill(ctx context.Context, r *faultResult) error {
	realNode, err := f.startNode("node-real", map[string]int{"kill-real": 2}, nil, nil)
	defer realNode.stop()
	if err != nil {
		return err
	}
	if waitFor(ctx, 30*time.Second, func() bool { return f.ask(ctx, "kill-real").code == codes.OK }) < 0 {
		r.failf("the real agent's workload never answered")
		return nil
	}
	killed := f.killedAgents()
	victimIdx, ctlIdx, base, ok := f.victimAndControl(ctx, r, killed, "the kill")
	if !ok {
		return nil
	}
	victim, ctl := workloadName(victimIdx), workloadName(ctlIdx)
	// The real pods' queue moves with vllm-sim's model, so for them only
	// the error and the drop are checked, not "never lower".
	if a := f.ask(ctx, "kill-real"); a.code != codes.OK {
		r.failf("kill-real answered %v before the kill", a.code)
		return nil
	}
	t0 := time.Now()
	for a := range killed {
		f.agents[a].kill()
	}
	_ = realNode.agent.Process.Signal(syscall.SIGKILL)
	_ = realNode.agent.Wait()
	realNode.agent = nil
	f.logf("killed agents %v and node-real; %s and kill-real lose every pod; control %s", keys(killed), victim, ctl)

	d := newDeadAgents(victim, "kill-real")
	if err := f.watchDeadAgents(ctx, r, d, t0, ctl, base); err != nil {
		return err
	}
	d.judge(r, f.o.podExpiry)
	r.Notes = append(r.Notes, fmt.Sprintf("%s: pods of simulated agents %v; kill-real: a real pulse-agent process, SIGKILL", victim, keys(killed)))
	// Back: the killed agents start again, with new streams.
	for a := range killed {
		f.agents[a].start(f.runCtx)
	}
	if _, err := f.baseline(ctx, victimIdx); err != nil {
		r.failf("after its agents came back: %v", err)
	}
	return nil
}

// deadAgents is what agent-kill sees of the workloads whose agents died:
// when each first answered an error, whether its pods were then still
// held, and when they were dropped.
type deadAgents struct {
	workloads []string
	held      map[string]bool
	dropped   map[string]time.Duration
	errAt     map[string]time.Duration
}

func newDeadAgents(workloads ...string) *deadAgents {
	return &deadAgents{workloads: workloads, held: map[string]bool{}, dropped: map[string]time.Duration{}, errAt: map[string]time.Duration{}}
}

// watchDeadAgents asks the dead agents' workloads every half second until
// every one is dropped or --pod-expiry and 20 s have passed since t0. A
// workload with a total in base never answers less while held (kill-real's
// queue moves with vllm-sim's model, so it has none); the control workload
// keeps answering its total.
func (f *fleet) watchDeadAgents(ctx context.Context, r *faultResult, d *deadAgents, t0 time.Time, ctl string, base map[string]int64) error {
	for time.Since(t0) < f.o.podExpiry+20*time.Second && len(d.dropped) < len(d.workloads) {
		for _, w := range d.workloads {
			if _, ok := d.dropped[w]; ok {
				continue
			}
			a := f.ask(ctx, w)
			wl, err := f.workload(ctx, w)
			if err != nil {
				return err
			}
			_, exact := base[w]
			switch {
			case wl == nil:
				d.dropped[w] = time.Since(t0)
			case a.code == codes.OK && exact && a.value < base[w]:
				// A failing pod is filled (missingPods: hold), never dropped.
				r.failf("%s answered %d while its agent was dead, less than before (%d)", w, a.value, base[w])
			case a.code != codes.OK:
				if _, ok := d.errAt[w]; !ok {
					d.errAt[w] = time.Since(t0)
				}
				d.held[w] = d.held[w] || len(wl.Pods) > 0
			}
		}
		if a := f.ask(ctx, ctl); a.code != codes.OK || f.o.churn == 0 && a.value != base[ctl] {
			r.failf("control workload %s answered %v %d (before: %d)", ctl, a.code, a.value, base[ctl])
		}
		if !procs.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// judge: each workload answered an error with its pods still held, and
// they were dropped no sooner than --pod-expiry, and not long after.
func (d *deadAgents) judge(r *faultResult, podExpiry time.Duration) {
	for _, w := range d.workloads {
		if !d.held[w] {
			r.failf("%s: its pods were never seen held with an error answered", w)
		}
		dropped, ok := d.dropped[w]
		switch {
		case !ok:
			r.failf("%s: pods not dropped %s after --pod-expiry", w, 20*time.Second)
		case dropped < podExpiry:
			r.failf("%s: pods dropped after %s, before --pod-expiry %s", w, dropped, podExpiry)
		}
		if _, ok := d.errAt[w]; !ok {
			r.failf("%s never answered an error while its agent was dead", w)
		}
		r.measure(w+"/errorAfterSeconds", d.errAt[w].Seconds())
		r.measure(w+"/droppedAfterSeconds", dropped.Seconds())
	}
}

// partition black-holes the proxied agents' connections: the aggregator's
// keepalive must close their streams, their workloads answer an error,
// never another total, and after the heal they are back.
func (f *fleet) partition(ctx context.Context, r *faultResult) error {
	if f.proxy == nil {
		return fmt.Errorf("no proxy: the fleet was not started with the partition fault")
	}
	set := map[int]bool{}
	for a := range f.o.partitionAgents {
		set[a] = true
	}
	// (--partition-agents must be at least --pods-per-workload.)
	victimIdx, ctlIdx, base, ok := f.victimAndControl(ctx, r, set, "the partition")
	if !ok {
		return nil
	}
	victim, ctl := workloadName(victimIdx), workloadName(ctlIdx)
	m0, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	streams0 := m0["pulse_aggregator_agent_streams"]
	sessions0 := make([]int64, f.o.partitionAgents)
	for a := range sessions0 {
		sessions0[a] = f.agents[a].sessions.Load()
	}
	f.proxy.Partition()
	t0 := time.Now()
	var staleAt, detectedAt time.Duration = -1, -1
	for time.Since(t0) < 120*time.Second && detectedAt < 0 {
		a := f.ask(ctx, victim)
		switch {
		case a.code == codes.OK && a.value < base[victim]:
			r.failf("%s answered %d during the partition, less than before (%d)", victim, a.value, base[victim])
		case a.code != codes.OK && staleAt < 0:
			staleAt = time.Since(t0)
		}
		if c := f.ask(ctx, ctl); c.code != codes.OK || f.o.churn == 0 && c.value != base[ctl] {
			r.failf("control workload %s answered %v %d during the partition (before: %d)", ctl, c.code, c.value, base[ctl])
		}
		m, err := f.agg.Metrics(ctx)
		if err != nil {
			return err
		}
		if m["pulse_aggregator_agent_streams"] <= streams0-float64(f.o.partitionAgents) {
			detectedAt = time.Since(t0)
		}
		if !procs.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	r.measure("errorAfterSeconds", staleAt.Seconds())
	r.measure("streamsClosedAfterSeconds", detectedAt.Seconds())
	if staleAt < 0 {
		r.failf("%s never answered an error during the partition", victim)
	}
	if detectedAt < 0 {
		r.failf("the aggregator kept the partitioned streams open for 120s")
	}
	if a := f.ask(ctx, victim); a.code == codes.OK {
		r.failf("%s answered %d after its streams were closed, want an error", victim, a.value)
	}
	f.proxy.Heal()
	t1 := time.Now()
	back := waitFor(ctx, 90*time.Second, func() bool {
		for a := range sessions0 {
			if f.agents[a].sessions.Load() == sessions0[a] || !f.agents[a].up.Load() {
				return false
			}
		}
		a := f.ask(ctx, victim)
		return a.code == codes.OK && (f.o.churn > 0 || a.value == base[victim])
	})
	if back < 0 {
		r.failf("the partitioned agents were not back, with their workload's steady total, 90s after the heal")
	}
	r.measure("recoveredAfterHealSeconds", time.Since(t1).Seconds())
	return nil
}

// aggregatorKill SIGKILLs the aggregator and starts it again: every agent
// and every KEDA stream must come back; after the restart every answer is
// either the warm-up's Unavailable or a full total (never lower than before:
// a pod not heard yet is filled, missingPods: hold), and the warm-up is
// seen to answer.
func (f *fleet) aggregatorKill(ctx context.Context, r *faultResult) error {
	steady, base, ok := f.steadySample(ctx, r)
	if !ok {
		return nil
	}
	exact := f.o.churn == 0
	if !exact {
		r.Notes = append(r.Notes, "with --churn the totals move, so answers after the restart are not compared with those before")
	}
	r.measure("checkedWorkloads", float64(len(steady)))
	m := f.streamMarks()

	t0 := time.Now()
	f.agg.Kill()
	r.measure("killSeconds", time.Since(t0).Seconds())
	if err := f.agg.Start(ctx); err != nil {
		return err
	}
	restarted := time.Now()
	r.measure("restartSeconds", restarted.Sub(t0).Seconds())

	// A checker asks the steady workloads in turn, on its own connection,
	// from the restart on.
	c := &restartChecker{f: f, r: r, steady: steady, base: base, exact: exact, firstOK: map[*scaledObject]time.Time{}}
	checkCtx, stopCheck := context.WithCancel(ctx)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		c.run(checkCtx)
	}()
	agentsBack, fresh, kedaBack := f.waitBack(ctx, t0, m, c)
	stopCheck()
	<-checked
	c.mu.Lock()
	defer c.mu.Unlock()
	if fresh >= 0 {
		var last time.Time
		for _, at := range c.firstOK {
			last = maxTime(last, at)
		}
		fresh = last.Sub(t0) // the last workload's first answer, not when the poll saw it
	}
	r.measure("agentsBackSeconds", agentsBack.Seconds())
	r.measure("freshSeconds", fresh.Seconds())
	r.measure("kedaStreamsBackSeconds", kedaBack.Seconds())
	c.report()
	if agentsBack < 0 {
		r.failf("not every agent was back 5 min after the restart")
	}
	if fresh < 0 {
		r.failf("not every workload answered 5 min after the restart")
	}
	if kedaBack < 0 {
		r.failf("not every KEDA stream was back 5 min after the restart")
	}
	f.judgeStreamEnds(r, m, restarted.Sub(t0))
	return nil
}

// steadySample picks up to 200 steady (non-probe) ScaledObjects, spread
// over the fleet, and their answers before the restart. ok is false when
// one did not answer its total (a failure is recorded).
func (f *fleet) steadySample(ctx context.Context, r *faultResult) (steady []*scaledObject, base map[*scaledObject]int64, ok bool) {
	var all []*scaledObject
	for _, s := range f.sos {
		if !s.probe {
			all = append(all, s)
		}
	}
	base = map[*scaledObject]int64{}
	for i := 0; i < len(all); i += max(1, len(all)/200) {
		s := all[i]
		v, err := f.baseline(ctx, s.workload)
		if err != nil {
			r.failf("before the kill: %v", err)
			return nil, nil, false
		}
		steady = append(steady, s)
		base[s] = v
	}
	return steady, base, true
}

// streamMarks are the agents' sessions and the KEDA streams' opens and
// ends before a restart, by agent and by ScaledObject.
type streamMarks struct {
	sessions                           []int64
	active, spec, activeEnds, specEnds []int64
	ends                               map[string]int64
}

func (f *fleet) streamMarks() streamMarks {
	m := streamMarks{sessions: make([]int64, len(f.agents))}
	for i, a := range f.agents {
		m.sessions[i] = a.sessions.Load()
	}
	n := len(f.sos)
	m.active, m.spec, m.activeEnds, m.specEnds = make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, s := range f.sos {
		m.active[i], m.spec[i] = s.activeOpens.Load(), s.specOpens.Load()
		m.activeEnds[i], m.specEnds[i] = s.activeEnds.Load(), s.specEnds.Load()
	}
	f.mu.Lock()
	m.ends = cloneCounts(f.ends)
	f.mu.Unlock()
	return m
}

// waitBack polls, for at most 5 minutes, for every agent to be back on a new
// session, every steady workload to have answered a total, and every KEDA
// stream to be open again; each is the time from t0 it was first seen, or
// -1.
func (f *fleet) waitBack(ctx context.Context, t0 time.Time, m streamMarks, c *restartChecker) (agentsBack, fresh, kedaBack time.Duration) {
	agentsBack, fresh, kedaBack = -1, -1, -1
	waitFor(ctx, 5*time.Minute, func() bool {
		if agentsBack < 0 && f.allAgentsBack(m.sessions) {
			agentsBack = time.Since(t0)
		}
		if fresh < 0 {
			c.mu.Lock()
			if len(c.firstOK) == len(c.steady) {
				fresh = time.Since(t0)
			}
			c.mu.Unlock()
		}
		if kedaBack < 0 && f.allStreamsBack(m.active, m.spec) {
			kedaBack = time.Since(t0)
		}
		return agentsBack >= 0 && fresh >= 0 && kedaBack >= 0
	})
	return agentsBack, fresh, kedaBack
}

// judgeStreamEnds: every KEDA stream the restart ended, ended with EOF or
// Unavailable (KEDA then retries in 2 s); and with the aggregator back
// within 2 s, which takes every stream's first retry, each of a
// ScaledObject's two streams ended exactly once.
func (f *fleet) judgeStreamEnds(r *faultResult, m streamMarks, restart time.Duration) {
	f.mu.Lock()
	for kind, n := range f.ends {
		if d := n - m.ends[kind]; d > 0 && !strings.HasPrefix(kind, "agent ") {
			r.measure("ended/"+kind, float64(d))
			if !strings.HasSuffix(kind, " EOF") && !strings.HasSuffix(kind, " Unavailable") {
				r.failf("%d KEDA streams ended with %s, want EOF or Unavailable (KEDA then retries in 2s)", d, kind)
			}
		}
	}
	f.mu.Unlock()
	if restart >= 2*time.Second {
		return
	}
	for i, s := range f.sos {
		if a, b := s.activeEnds.Load()-m.activeEnds[i], s.specEnds.Load()-m.specEnds[i]; a != 1 || b != 1 {
			r.failf("%s: StreamIsActive ended %d times, StreamMetricSpec %d, want once each (reconnected at KEDA's first 2s retry)", s.ref.Name, a, b)
			return
		}
	}
}

// restartChecker asks the steady workloads in turn after a restart and
// counts what they answered: the warm-up's Unavailable, another
// Unavailable, a total (partial, filled, or the one before) or another
// error.
type restartChecker struct {
	f      *fleet
	r      *faultResult
	steady []*scaledObject
	base   map[*scaledObject]int64
	exact  bool // no churn: a total must equal the one before, or exceed it (filled)

	mu                                                               sync.Mutex
	warming, otherUnavailable, partial, filled, okAnswers, otherErrs int
	firstOK                                                          map[*scaledObject]time.Time
}

func (c *restartChecker) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil && len(c.steady) > 0; i++ {
		s := c.steady[i%len(c.steady)]
		a, msg := c.f.askWithMessage(ctx, workloadName(s.workload))
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		c.count(s, a, msg)
		c.mu.Unlock()
		if !procs.Sleep(ctx, 5*time.Millisecond) {
			return
		}
	}
}

// count files one answer; c.mu is held.
func (c *restartChecker) count(s *scaledObject, a answer, msg string) {
	switch {
	case a.code == codes.Unavailable && strings.Contains(msg, "warming up"):
		c.warming++
	case a.code == codes.Unavailable:
		// Still reconnecting to the new process, or a workload none of
		// whose pods has sent a sample yet: an error, which KEDA and the
		// HPA hold on, never a number.
		c.otherUnavailable++
	case a.code == codes.OK:
		c.okAnswers++
		switch {
		case c.exact && a.value < c.base[s]:
			c.partial++
			if c.partial <= 3 {
				c.r.failf("%s answered %d after the restart (before: %d): a partial total", workloadName(s.workload), a.value, c.base[s])
			}
		case c.exact && a.value > c.base[s]:
			c.filled++ // a pod not heard yet since the restart, filled (missingPods: hold)
		}
		if _, ok := c.firstOK[s]; !ok {
			c.firstOK[s] = a.at
		}
	default:
		c.otherErrs++
		if c.otherErrs <= 3 {
			c.r.failf("%s answered %v %q after the restart, want the warm-up's Unavailable or a total", workloadName(s.workload), a.code, msg)
		}
	}
}

// report measures the counts; c.mu is held. No warm-up answer means the
// check did not run through the warm-up.
func (c *restartChecker) report() {
	c.r.measure("warmupAnswers", float64(c.warming))
	c.r.measure("otherUnavailableAnswers", float64(c.otherUnavailable))
	c.r.measure("okAnswers", float64(c.okAnswers))
	c.r.measure("partialAnswers", float64(c.partial))
	c.r.measure("filledAnswers", float64(c.filled))
	if c.warming == 0 {
		c.r.failf("no answer said the aggregator was warming up: the check did not run through the warm-up")
	}
}

func (f *fleet) allAgentsBack(sessions0 []int64) bool {
	for i, a := range f.agents {
		if a.sessions.Load() == sessions0[i] || !a.up.Load() {
			return false
		}
	}
	return true
}

func (f *fleet) allStreamsBack(active0, spec0 []int64) bool {
	for i, s := range f.sos {
		if s.activeOpens.Load() == active0[i] || s.specOpens.Load() == spec0[i] {
			return false
		}
	}
	return true
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func keys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// nodeSilencing: one tenant's pod once silenced its whole node. A pod
// whose server answers a status line that is not UTF-8 made proto3 refuse
// every batch of its agent (a real pulse-agent here); a pod of 9 owners
// made the aggregator refuse its agent's whole catalogue and end the
// stream, for ever (a simulated agent sends it, as an agent of before the
// agent's own cap would). The neighbours' pods on both nodes stay fresh at
// every scrape, on streams that never end; only the offending pods are
// missing or refused.
func (f *fleet) nodeSilencing(ctx context.Context, r *faultResult) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer func() { _ = lis.Close() }()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Read(make([]byte, 4096))
				_, _ = c.Write([]byte("HTTP/1.1 503 \xff\xfe\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			}()
		}
	}()
	extra := []string{fmt.Sprintf("  - {namespace: %s, pod: silence-bad-0, deployment: silence-bad, url: \"http://%s/metrics\"}", namespace, lis.Addr())}
	m0, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	n, err := f.startNode("node-silencing", map[string]int{"silence-ok": 2}, nil, extra)
	defer n.stop()
	if err != nil {
		return err
	}
	const hostileWorkload = 90001
	hostile := newSimAgent(f, len(f.agents), f.agg.ingest)
	hostile.node = "node-hostile"
	hostile.add(hostileWorkload, time.Time{})
	hostile.add(hostileWorkload, time.Time{})
	hostile.addOwned(hostileWorkload, 9)
	hostile.start(f.runCtx)
	defer hostile.kill()
	f.setFaulting(false) // the fleet must see no error from this
	defer f.setFaulting(true)
	neighbours := []string{"silence-ok", workloadName(hostileWorkload)}
	if waitFor(ctx, 30*time.Second, func() bool {
		return f.ask(ctx, neighbours[0]).code == codes.OK && f.ask(ctx, neighbours[1]).code == codes.OK
	}) < 0 {
		r.failf("the neighbours' workloads never answered beside the hostile pods")
		return nil
	}
	worstAge, err := f.keepFresh(ctx, r, "beside the hostile pods", neighbours...)
	if err != nil {
		return err
	}
	r.measure("neighbourPodsWorstAgeSeconds", worstAge)
	bad, err := f.workload(ctx, "silence-bad")
	switch {
	case err != nil:
		return err
	case bad == nil || len(bad.Pods) != 1:
		r.failf("the pod with a non-UTF-8 status line is not held")
	case bad.Pods[0].Missing == "" || !utf8.ValidString(bad.Pods[0].Error):
		r.failf("the pod with a non-UTF-8 status line: missing %q, error %q, want missing with a valid text", bad.Pods[0].Missing, bad.Pods[0].Error)
	}
	if s := hostile.sessions.Load(); s != 1 {
		r.failf("the simulated agent beside a pod of 9 owners opened %d streams, want 1 (never ended)", s)
	}
	m1, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	if d := m1["pulse_aggregator_rejected_reports_total{reason=too_many_workloads}"] - m0["pulse_aggregator_rejected_reports_total{reason=too_many_workloads}"]; d < 1 {
		r.failf("the pod of 9 owners was not refused (too_many_workloads %v)", d)
	}
	if d := m1["pulse_aggregator_rejected_reports_total{reason=catalogue}"] - m0["pulse_aggregator_rejected_reports_total{reason=catalogue}"]; d != 0 {
		r.failf("%v catalogues refused whole", d)
	}
	r.Notes = append(r.Notes, "a real pulse-agent beside a page whose status line is not UTF-8; a simulated agent listing a pod of 9 owners beside 2 others")
	return nil
}

// killedAgents are the agents a scenario kills: the first
// --pods-per-workload agents not behind the partition proxy.
func (f *fleet) killedAgents() map[int]bool {
	ppw := f.o.podsPerWorkload
	first := 0
	if f.proxy != nil {
		first = (f.o.partitionAgents + ppw - 1) / ppw * ppw
	}
	killed := map[int]bool{}
	for a := first; a < min(first+ppw, len(f.agents)); a++ {
		killed[a] = true
	}
	return killed
}

// scaleDownMakesRoom: the agents of killed remove the victim workload's
// pods (a scale-down), and the newcomer's waiting pods are held at its next
// batches (held() reaches want); the control workload still answers.
func (f *fleet) scaleDownMakesRoom(ctx context.Context, r *faultResult, killed map[int]bool, victim int, ctl string, held func() int, want int) {
	for a := range killed {
		f.agents[a].removeWorkload(victim)
	}
	t0 := time.Now()
	if waitFor(ctx, 30*time.Second, func() bool { return held() == want }) < 0 {
		r.failf("the newcomer holds %d pods after the scale-down, want %d", held(), want)
	} else {
		r.measure("newcomerHeldAfterSeconds", time.Since(t0).Seconds())
	}
	if a := f.ask(ctx, ctl); a.code != codes.OK {
		r.failf("control workload %s answered %v", ctl, a.code)
	}
}

// victimAndControl picks a workload wholly on the agents of set (the
// victim) and one wholly off them (the control), and waits for both to
// answer their steady totals (before what); base holds them by name. ok is
// false when the fleet has no such pair (a failure is recorded).
func (f *fleet) victimAndControl(ctx context.Context, r *faultResult, set map[int]bool, what string) (victim, control int, base map[string]int64, ok bool) {
	victims, control := f.agentsOf(set)
	if len(victims) == 0 || control < 0 {
		r.failf("no workload lies wholly on agents %v and none wholly off them", keys(set))
		return 0, 0, nil, false
	}
	base = map[string]int64{}
	for _, w := range []int{victims[0], control} {
		v, err := f.baseline(ctx, w)
		if err != nil {
			r.failf("before %s: %v", what, err)
			return 0, 0, nil, false
		}
		base[workloadName(w)] = v
	}
	return victims[0], control, base, true
}

// eviction: at --max-pods, a newcomer's pods once evicted the replicas
// listed least recently though their agents were connected and reporting.
// A simulated agent lists more new pods than there is room for: the pods
// held stay (none evicted, every workload answering), the newcomer's extra
// pods wait (store_full). A victim's agents die and come back: their pods
// were kept, the newcomer still waits. Then they remove the victim's pods
// (a scale-down): the newcomer's waiting pods are held.
func (f *fleet) eviction(ctx context.Context, r *faultResult) error {
	m0, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	ppw := f.o.podsPerWorkload
	killed := f.killedAgents()
	victimIdx, ctlIdx, base, ok := f.victimAndControl(ctx, r, killed, "the newcomer")
	if !ok {
		return nil
	}
	victim, ctl := workloadName(victimIdx), workloadName(ctlIdx)
	room := f.o.maxPods() - int(m0["pulse_aggregator_pods"])
	if room < 0 || room > 2048 {
		return fmt.Errorf("eviction: the aggregator has room for %d more pods; run the fleet with --max-pods near its pod count (the scenario lists that many and %d more)", room, ppw)
	}
	over := ppw // what the victim's scale-down frees
	newcomer, held := f.newcomer(ctx, room+over)
	defer newcomer.kill()
	steady := func(what string) {
		for w, want := range base {
			if a := f.ask(ctx, w); a.code != codes.OK || f.o.churn == 0 && a.value != want {
				r.failf("%s answered %v %d %s (before: %d)", w, a.code, a.value, what, want)
			}
		}
	}
	if waitFor(ctx, 30*time.Second, func() bool { return held() == room }) < 0 {
		r.failf("the newcomer holds %d pods, want the %d there is room for", held(), room)
		return nil
	}
	for range 5 {
		if !procs.Sleep(ctx, f.o.interval) {
			return ctx.Err()
		}
		steady("beside the newcomer")
	}
	if err := f.victimAway(ctx, r, killed, victimIdx, base[victim], held, room); err != nil {
		return err
	}
	steady("with the newcomer waiting")
	if err := f.newcomerWaited(ctx, r, m0, over); err != nil {
		return err
	}
	f.scaleDownMakesRoom(ctx, r, killed, victimIdx, ctl, held, room+over)
	r.Notes = append(r.Notes, fmt.Sprintf("--max-pods %d; a simulated newcomer listing %d pods where there was room for %d; victim %s on agents %v, scaled down at the end", f.o.maxPods(), room+over, room, victim, keys(killed)))
	return nil
}

// newcomer starts a simulated agent on a node of its own that lists n pods
// of a new workload; held counts the pods the aggregator holds of it.
func (f *fleet) newcomer(ctx context.Context, n int) (a *simAgent, held func() int) {
	const newcomerWorkload = 90000
	a = newSimAgent(f, len(f.agents), f.agg.ingest)
	a.node = "node-newcomer"
	for range n {
		a.add(newcomerWorkload, time.Time{})
	}
	a.start(f.runCtx)
	return a, func() int {
		d, err := f.workload(ctx, workloadName(newcomerWorkload))
		if err != nil || d == nil {
			return 0
		}
		return len(d.Pods)
	}
}

// victimAway: the victim's agents die and come back within --pod-expiry.
// Their pods are kept for them, not given to the newcomer (held stays at
// room), the victim never answers less than before meanwhile, and it
// answers its total again once they are back.
func (f *fleet) victimAway(ctx context.Context, r *faultResult, killed map[int]bool, victimIdx int, before int64, held func() int, room int) error {
	victim := workloadName(victimIdx)
	for a := range killed {
		f.agents[a].kill()
	}
	if !procs.Sleep(ctx, 3*f.o.interval) {
		return ctx.Err()
	}
	if n := held(); n != room {
		r.failf("the newcomer holds %d pods while the victim's agents are away, want %d: their pods were given away", n, room)
	}
	if a := f.ask(ctx, victim); a.code == codes.OK && a.value < before {
		r.failf("%s answered %d while its agents were away, less than before (%d)", victim, a.value, before)
	}
	for a := range killed {
		f.agents[a].start(f.runCtx)
	}
	t0 := time.Now()
	if _, err := f.baseline(ctx, victimIdx); err != nil {
		r.failf("after its agents came back: %v", err)
	} else {
		r.measure("victimBackAfterSeconds", time.Since(t0).Seconds())
	}
	return nil
}

// newcomerWaited: since m0, the newcomer's extra pods were refused as
// store_full (at least over of them), and no sample was dropped as
// unknown_pod, which is what an evicted pod's samples would be.
func (f *fleet) newcomerWaited(ctx context.Context, r *faultResult, m0 map[string]float64, over int) error {
	m1, err := f.agg.Metrics(ctx)
	if err != nil {
		return err
	}
	const waitKey, evictKey = "pulse_aggregator_rejected_reports_total{reason=store_full}", "pulse_aggregator_rejected_reports_total{reason=unknown_pod}"
	waited, dropped := m1[waitKey]-m0[waitKey], m1[evictKey]-m0[evictKey]
	if dropped != 0 {
		r.failf("%v samples dropped as unknown_pod: pods held were evicted for the newcomer", dropped)
	}
	if waited < float64(over) {
		r.failf("store_full counted %v, want at least the %d pods that wait", waited, over)
	}
	r.measure("newcomerWaitingReports", waited)
	return nil
}
