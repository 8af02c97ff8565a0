package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/netbound"
	"github.com/pulse-io/pulse/pkg/slots"
	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// result is one scrape's outcome.
type result struct {
	uid     string
	timeMs  int64
	page    vllm.Page
	missing pulsev1.MissingReason
	err     string
}

// Resolver resolves aggregator names; net.DefaultResolver is one.
type Resolver = netbound.Resolver

// Deps are the agent's clients, built once at wiring time. New builds the
// ones left nil from the options.
type Deps struct {
	// Pods lists and watches the node's pods (discovery.NodePods); unused
	// in static mode.
	Pods cache.ListerWatcher
	// NVML is the GPU library; unused with --nvml=off.
	NVML nvml.Interface
	// Resolver resolves --aggregator names.
	Resolver Resolver
}

// Agent scrapes targets and streams results to aggregators.
type Agent struct {
	opts      *Options
	log       *slog.Logger
	deps      Deps
	scraper   Scraper
	extractor *vllm.Extractor
	cat       *catalogue
	static    []discovery.Target // --static-targets, read by New
	leftOut   int                // entries SetTargets left out last (past --max-pods)
	m         *agentMetrics
	reg       *prometheus.Registry

	streamersMu sync.RWMutex
	streamers   map[string]*streamer // by address

	nvml *gpu.NVML // nil when NVML is off or unavailable
	// nvmlLostTry: when NVML was last initialized again after the driver
	// went away, and how long until the next try (the GPU loop's alone).
	nvmlLostTry    time.Time
	nvmlReopenWait time.Duration
	// nvmlMismatch: since when (monotonic ns since monoStart; 0: not)
	// NVML has been initialized again only to find the driver at another
	// version than the library loaded: /livez fails past
	// nvmlMismatchRestart, so that the kubelet restarts the agent with
	// the driver's library.
	nvmlMismatch atomic.Int64
	podRes       *gpu.PodResources
	gpuPods      atomic.Pointer[gpuRead]
	// kube: the node's pod discovery (nil with --static-targets).
	kube *discovery.Kube
	// listedAt: when each pod listed (by uid) was first listed, on this
	// agent's clock (listedBefore).
	listedAt atomic.Pointer[map[string]time.Time]

	inflightMu sync.Mutex
	inflight   map[string]bool
	counters   map[string]*vllm.Counters // by uid, for the pods listed now
	// series bounds the counter series every pod's counters follow;
	// released are the counters of pods no longer listed whose scrape is
	// in flight: their room is given back when it ends.
	series   *vllm.Budget
	released map[string]*vllm.Counters
	// arrivals: each router's demand entry's arrival state (by uid, for
	// those listed now), with the demand it is of.
	arrivals map[string]demandArrivals
	lastTick atomic.Int64 // the last scrape tick, nanoseconds on the monotonic clock since monoStart (0: none yet)
	httpAddr atomic.Value // string: the bound HTTP address, once listening
	// healthAddr: the bound health address (--health-addr), once listening.
	healthAddr atomic.Value
}

// HealthAddr is the bound address of --health-addr; empty until Run is
// listening, or without it.
func (a *Agent) HealthAddr() string {
	s, _ := a.healthAddr.Load().(string)
	return s
}

// HTTPAddr is the bound address of /metrics, /livez and /readyz; empty until
// Run is listening.
func (a *Agent) HTTPAddr() string {
	s, _ := a.httpAddr.Load().(string)
	return s
}

// monoStart is the process's start on the monotonic clock: durations since
// it are not moved by a wall clock stepped.
var monoStart = time.Now()

// New wires an agent from validated options, building its clients.
func New(opts *Options, log *slog.Logger) (*Agent, error) {
	return NewWithDeps(opts, log, Deps{})
}

// NewWithDeps wires an agent with the given clients (tests pass fakes).
func NewWithDeps(opts *Options, log *slog.Logger, deps Deps) (*Agent, error) {
	var extras []vllm.ExtraMetric
	for _, s := range opts.ExtraMetrics {
		x, err := vllm.ParseExtraMetric(s)
		if err != nil {
			return nil, err
		}
		extras = append(extras, x)
	}
	var exOpts []vllm.Option
	if opts.ForwardHistograms {
		exOpts = append(exOpts, vllm.WithHistograms())
	}
	ex, err := vllm.NewExtractor(extras, exOpts...)
	if err != nil {
		return nil, err
	}
	// The static targets are read first: a bad file is reported before
	// anything else is opened or logged.
	var static []discovery.Target
	if opts.StaticTargets != "" {
		if static, err = discovery.LoadStaticTargets(opts.StaticTargets); err != nil {
			return nil, err
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a := &Agent{
		opts: opts, log: log, extractor: ex, cat: newCatalogue(), reg: reg, static: static,
		scraper:   newHTTPScraper(ex, opts.MaxPageBytes, opts.MaxListed, opts.InsecureSkipVerify),
		m:         newAgentMetrics(reg),
		inflight:  map[string]bool{},
		counters:  map[string]*vllm.Counters{},
		arrivals:  map[string]demandArrivals{},
		series:    vllm.NewBudget(maxSeries, maxSeries/2),
		released:  map[string]*vllm.Counters{},
		streamers: map[string]*streamer{},
	}
	if deps.Resolver == nil {
		deps.Resolver = net.DefaultResolver
	}
	if opts.StaticTargets == "" && deps.Pods == nil {
		cfg, err := clientcmd.BuildConfigFromFlags("", opts.KubeConfig) // in-cluster when empty
		if err != nil {
			return nil, fmt.Errorf("kubernetes client config (set --kubeconfig, or --static-targets to run without Kubernetes): %w", err)
		}
		cfg.UserAgent = "pulse-agent/" + version.Version
		if deps.Pods, err = discovery.NodePods(cfg, opts.NodeName); err != nil {
			return nil, err
		}
	}
	if opts.NVML != gpu.ModeOff && deps.NVML == nil {
		deps.NVML = nvml.New()
	}
	a.deps = deps
	if opts.NVML != gpu.ModeOff {
		if a.nvml, err = gpu.OpenNVML(deps.NVML, opts.NVML, opts.ScrapeInterval, log); err != nil {
			return nil, err
		}
	}
	if a.nvml != nil {
		if a.nvml.Lost() { // its driver not loaded yet: initialized again an interval on, backing off
			a.nvmlLostTry, a.nvmlReopenWait = time.Now(), opts.ScrapeInterval
		} else {
			a.m.nvml.Set(1)
		}
		if a.podRes, err = gpu.DialPodResources(opts.PodResourcesSocket); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// SetTargets replaces the pods to scrape.
func (a *Agent) SetTargets(ts []discovery.Target) {
	ts, left := fairList(ts, a.opts.MaxListed)
	a.m.leftOut.Set(float64(left))
	if left > 0 && left != a.leftOut {
		a.log.Warn("catalogue entries left out: the node lists more than --max-pods, shared fairly among namespaces (the aggregator would refuse the whole catalogue past twice its --max-pods-per-agent)",
			logging.KeyLeftOut, left, logging.KeyMaxPods, a.opts.MaxListed)
	}
	a.leftOut = left
	a.cat.Set(ts)
	a.m.targets.Set(float64(len(ts)))
	listed := make(map[string]bool, len(ts))
	namespaces := map[string]bool{}
	now, before := time.Now(), a.listedAt.Load()
	listedAt := make(map[string]time.Time, len(ts))
	for _, t := range ts {
		listed[t.UID] = true
		namespaces[t.Namespace] = true
		listedAt[t.UID] = now
		if before != nil {
			if at, ok := (*before)[t.UID]; ok {
				listedAt[t.UID] = at
			}
		}
	}
	a.listedAt.Store(&listedAt)
	// The counter series' budget is shared among the namespaces listed:
	// a fixed half for each let two namespaces' pages take it all, and
	// every other namespace's counters were summed as their pages had
	// them (an engine's restart read as the pod's). A namespace past its
	// share, set lower since it took its room, gives its pods' room back
	// when the budget is full (vllm.Budget.Over); they take it again, up
	// to the share, at their next scrapes.
	a.series.SetShare(maxSeries / max(2, len(namespaces)))
	a.dropCounters(listed)
	a.streamersMu.RLock()
	for _, s := range a.streamers {
		s.prune(listed)
	}
	a.streamersMu.RUnlock()
}

// Run runs the agent until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	if a.opts.StaticTargets != "" {
		a.SetTargets(a.static)
		a.log.Info("static targets loaded", logging.KeyTargets, len(a.static), logging.KeyFile, a.opts.StaticTargets)
	} else {
		sel, err := discovery.ParseSelector(a.opts.PodSelector)
		if err != nil {
			return err
		}
		k := discovery.NewKube(discovery.KubeOptions{Pods: a.deps.Pods, Node: a.opts.NodeName, Selector: sel,
			OnChange: a.SetTargets, Log: a.log})
		a.kube = k // before the HTTP servers start: /readyz reads it
		g.Go(func() error { return k.Run(ctx) })
	}
	g.Go(func() error { return a.serveHTTP(ctx) })
	if a.opts.HealthAddr != "" {
		g.Go(func() error { return a.serveHealth(ctx) })
	}
	g.Go(func() error { a.scrapeLoop(ctx); return nil })
	// The GPU loop is not one of the group: an NVML call that hangs (a GPU
	// fallen off the bus, a wedged driver) must not hold the agent's stop,
	// which waited for it until the kubelet killed the pod.
	gpuDone := make(chan struct{})
	go func() { defer close(gpuDone); a.gpuLoop(ctx) }()
	g.Go(func() error { a.fanOut(ctx); return nil })
	err := g.Wait()
	select {
	case <-gpuDone:
		a.nvml.Close()
	case <-time.After(gpuStopWait):
		a.log.Warn("an NVML call has not returned: stopping without it (NVML not shut down)", logging.KeyElapsed, gpuStopWait)
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// scrapeLoop starts each ready pod's scrape at the node's phase of the
// interval (see phaser) unless its previous one is still in flight. Each
// scrape runs on its own with its own timeout, so a slow pod delays no other
// pod's sample; at most --max-concurrent-scrapes run at once. A router's
// demand entries (one per workload it names) share one scrape of its page:
// a router is one pod, and takes one slot, however many workloads it names.
func (a *Agent) scrapeLoop(ctx context.Context) {
	slots := newTenantSlots(a.opts.MaxConcurrent, a.opts.MaxConcurrent) // shared among the namespaces below
	var wg sync.WaitGroup
	defer wg.Wait()
	ph := newPhaser(a.opts.ScrapeInterval, phaseOf(a.opts.NodeName, a.opts.ScrapeInterval))
	timer := time.NewTimer(0)
	defer timer.Stop()
	var units map[string][]discovery.Target
	var changed <-chan struct{}
	for {
		now := time.Now()
		a.lastTick.Store(int64(time.Since(monoStart)) + 1) // monotonic: a wall clock stepped is no stall
		if changed == nil {
			var byID map[uint32]discovery.Target
			_, byID, changed = a.cat.snapshot()
			units = scrapeUnits(byID)
			slots.share(namespaces(units))
			ph.sync(slices.Collect(maps.Keys(units)), now)
		}
		ph.due(now, func(key string) {
			tgs := units[key]
			counters := a.startScrape(key, tgs[0].Namespace)
			if counters == nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer a.endScrape(key)
				// The wait for a slot is within the scrape's timeout: one
				// tenant's stalling pages held every slot, and the other
				// tenants' scrapes started late and ran late.
				sctx, cancel := context.WithDeadline(withTenant(ctx, tgs[0].Namespace), now.Add(a.opts.timeout())) // from the tick
				defer cancel()
				start := time.Now()
				release, ok := slots.take(sctx)
				if !ok {
					if ctx.Err() == nil {
						all, per := slots.bounds()
						err := &ScrapeError{Reason: pulsev1.MissingReason_MISSING_REASON_TIMEOUT, Err: fmt.Errorf(
							"no scrape slot within the scrape timeout (at most %d scrapes at once, %d of one namespace)", all, per)}
						for _, tg := range tgs {
							a.publish(a.result(tg, start, vllm.Page{}, err))
						}
					}
					return
				}
				defer release()
				if tgs[0].Demand == nil {
					a.publish(a.scrapeOne(sctx, tgs[0], counters))
					return
				}
				for _, r := range a.scrapeDemand(sctx, tgs) {
					a.publish(r)
				}
			}()
		})
		// Wake for the next scrape, and at least every interval: /livez
		// reads the loop's last pass.
		wait := a.opts.ScrapeInterval
		if at, ok := ph.next(); ok {
			wait = min(wait, time.Until(at))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-changed:
			changed = nil // Reset (Go 1.23 timers) discards a pending fire
		case <-timer.C:
		}
	}
}

// fairList is at most n of ts, shared fairly among their namespaces (in
// turn, each namespace's by uid), and how many were left out: one
// tenant's routers naming 64 workloads each, or its many pods, made a
// catalogue the aggregator refused whole (past twice its limit, or 4 MiB),
// silencing every tenant of the node at each reconnect.
func fairList(ts []discovery.Target, n int) ([]discovery.Target, int) {
	out := slots.Share(ts, n, func(t discovery.Target) string { return t.Namespace },
		func(x, y discovery.Target) int { return strings.Compare(x.UID, y.UID) })
	return out, len(ts) - len(out)
}

// namespaces is how many namespaces the units' pods are of: the scrape
// slots are shared equally among them, so that one tenant's pages that
// accept and stall hold at most its share of the node's slots (with
// --max-concurrent-scrapes of 64: all of them for one namespace, 32 each
// for two, 21 each for three; until 2026-11-30 half for any one
// namespace, so that two tenants could hold every slot, and a lone one
// never more than half).
func namespaces(units map[string][]discovery.Target) int {
	seen := map[string]struct{}{}
	for _, tgs := range units {
		seen[tgs[0].Namespace] = struct{}{}
	}
	return len(seen)
}

// scrapeUnits groups the ready targets into what one scrape reads: a
// model server's page (keyed by its pod's uid), or a router's page for all
// its demand entries (keyed by the router pod's uid: two routers of two
// namespaces briefly at one address, the IP reused before a pod's status
// caught up, were one unit, one page attributed to both; and not by its
// URL too: a router's pulse.io/port edited while its scrape ran started a
// second scrape of the same entries, both writing their arrivals' state,
// a concurrent map write that ends the agent), each sorted by uid.
func scrapeUnits(byID map[uint32]discovery.Target) map[string][]discovery.Target {
	units := make(map[string][]discovery.Target, len(byID))
	for _, tg := range byID {
		switch {
		case !tg.Ready || tg.Terminating:
		case tg.Demand == nil:
			units[tg.UID] = []discovery.Target{tg}
		default:
			k := demandUnit + tg.PodUID()
			units[k] = append(units[k], tg)
		}
	}
	for _, tgs := range units {
		slices.SortFunc(tgs, func(x, y discovery.Target) int { return strings.Compare(x.UID, y.UID) })
	}
	return units
}

// demandUnit prefixes the key of a router's scrape (never a uid).
const demandUnit = "demand "

// maxSeries bounds the counter series the agent follows for all its pods
// (vllm.Budget: 65,536 take about 6 MiB), shared among the namespaces
// listed (at most half of them for one namespace's pods, SetTargets); a
// vLLM page of 8 engines has a few hundred.
const maxSeries = 1 << 16

// dropCounters gives back the counter state of the pods not listed (all
// listed when listed is nil) and, while the series' budget is full, of
// every pod of a namespace past its share (vllm.Budget.Over).
func (a *Agent) dropCounters(listed map[string]bool) {
	over := a.series.Over()
	if listed == nil && over == nil {
		return
	}
	a.inflightMu.Lock()
	defer a.inflightMu.Unlock()
	for uid := range a.arrivals {
		if listed != nil && !listed[uid] {
			delete(a.arrivals, uid)
		}
	}
	for uid, c := range a.counters {
		if (listed == nil || listed[uid]) && !over[c.Namespace()] {
			continue
		}
		delete(a.counters, uid)
		if a.inflight[uid] {
			a.released[uid] = c
		} else {
			c.Release()
		}
	}
}

// startScrape marks uid, of namespace ns, in flight and returns its counter
// state; nil when the previous scrape of uid is still in flight. A
// namespace under its share refused a series since the last scrape began
// (the budget full) has the namespaces past their share give their room
// back first: their pods take it again, up to the share, at their next
// scrapes.
func (a *Agent) startScrape(uid, ns string) *vllm.Counters {
	if a.series.Starved() {
		a.dropCounters(nil)
	}
	a.inflightMu.Lock()
	defer a.inflightMu.Unlock()
	if a.inflight[uid] {
		a.m.skipped.Inc()
		return nil
	}
	a.inflight[uid] = true
	c := a.counters[uid]
	if c == nil {
		c = vllm.NewCountersIn(a.series, ns)
		a.counters[uid] = c
	}
	return c
}

func (a *Agent) endScrape(uid string) {
	a.inflightMu.Lock()
	delete(a.inflight, uid)
	if c := a.released[uid]; c != nil {
		c.Release()
		delete(a.released, uid)
	}
	a.inflightMu.Unlock()
}

// maxErrorBytes bounds a scrape error's text on the wire.
const maxErrorBytes = 200

// demandArrivals is one demand entry's arrival state, and the demand it
// follows.
type demandArrivals struct {
	demand vllm.Demand
	arr    *vllm.Arrivals
}

// arrivalsOf is the arrival state of each of tgs (a router's demand
// entries) that counts arrivals, nil for the others: kept from scrape to
// scrape while the entry is listed with the same demand.
func (a *Agent) arrivalsOf(tgs []discovery.Target) []*vllm.Arrivals {
	arrs := make([]*vllm.Arrivals, len(tgs))
	a.inflightMu.Lock()
	defer a.inflightMu.Unlock()
	for i, tg := range tgs {
		if tg.Demand == nil || !tg.Demand.Arrivals {
			continue
		}
		da, ok := a.arrivals[tg.UID]
		if !ok || !da.demand.Equal(tg.Demand) {
			da = demandArrivals{demand: *tg.Demand, arr: vllm.NewArrivals()}
			a.arrivals[tg.UID] = da
		}
		arrs[i] = da.arr
	}
	return arrs
}

// scrapeDemand reads a router's page once and returns one result for each
// of its demand entries (tgs, all of one URL).
func (a *Agent) scrapeDemand(ctx context.Context, tgs []discovery.Target) []result {
	start := time.Now()
	sctx, cancel := context.WithTimeout(withTenant(ctx, tgs[0].Namespace), a.opts.timeout())
	defer cancel()
	demands := make([]*vllm.Demand, len(tgs))
	for i, tg := range tgs {
		demands[i] = tg.Demand
	}
	pages, errs := a.scraper.ScrapeDemand(sctx, tgs[0].URL, demands, a.arrivalsOf(tgs))
	a.m.duration.Observe(time.Since(start).Seconds())
	out := make([]result, len(tgs))
	for i, tg := range tgs {
		out[i] = a.result(tg, start, pages[i], errs[i])
	}
	return out
}

func (a *Agent) scrapeOne(ctx context.Context, tg discovery.Target, counters *vllm.Counters) result {
	start := time.Now()
	sctx, cancel := context.WithTimeout(withTenant(ctx, tg.Namespace), a.opts.timeout())
	defer cancel()
	page, err := a.scraper.Scrape(sctx, tg.URL, tg.Demand, counters)
	a.m.duration.Observe(time.Since(start).Seconds())
	if err == nil && tg.Demand == nil {
		a.addGPU(tg, &page)
	}
	return a.result(tg, start, page, err)
}

// result is one target's scrape, started at start, as the streams send it:
// its page, or why it is missing.
func (a *Agent) result(tg discovery.Target, start time.Time, page vllm.Page, err error) result {
	r := result{uid: tg.UID, timeMs: start.UnixMilli(), page: page}
	if err != nil {
		var se *ScrapeError
		r.missing = pulsev1.MissingReason_MISSING_REASON_PARSE
		if errors.As(err, &se) {
			r.missing = se.Reason
		}
		r.err = wire.CleanText(err.Error(), maxErrorBytes)
		reason := wire.ReasonName(r.missing)
		a.m.errors.WithLabelValues(reason).Inc()
		a.log.Debug("scrape failed", logging.KeyPod, tg.Namespace+"/"+tg.Pod, logging.KeyReason, reason, logging.KeyErr, err)
	}
	return r
}

// publish hands a result to every stream; a newer result of the same pod
// replaces one not yet sent (its values are cumulative, so none is lost).
func (a *Agent) publish(r result) {
	a.streamersMu.RLock()
	defer a.streamersMu.RUnlock()
	for _, s := range a.streamers {
		s.offer(r)
	}
}

// gpuRead is one GPU read attributed to pods (by namespace/name): when
// what it read began (the read before it began: at long intervals NVML's
// values are means since it), and when it ended.
type gpuRead struct {
	from, at time.Time
	pods     map[string]gpu.PodGPU
}

// listedBefore reports whether the agent listed pod uid before a GPU read
// whose values are from from on. The pod-resources API names a pod, not
// its uid: a read from before a pod recreated under its name (a
// StatefulSet's) was of the one it replaced, whose GPUs the values are,
// and the new pod carried them for up to gpuStale intervals. Both times
// are this agent's clock (a pod's creationTimestamp is the API server's:
// a node's clock ahead of it passed the predecessor's reads).
func (a *Agent) listedBefore(uid string, from time.Time) bool {
	listed := a.listedAt.Load()
	if listed == nil {
		return false
	}
	at, ok := (*listed)[uid]
	return ok && at.Before(from)
}

// gpuStale: a GPU read older than this many scrape intervals is not sent
// (an NVML call that hangs, on a GPU fallen off the bus, stopped the reads
// and left the last one sent as fresh, for ever).
const gpuStale = 3

// addGPU adds the pod's GPU values, from the last GPU read, to its page.
func (a *Agent) addGPU(tg discovery.Target, page *vllm.Page) {
	r := a.gpuPods.Load()
	if r == nil || time.Since(r.at) > gpuStale*a.opts.ScrapeInterval {
		return
	}
	g, ok := r.pods[tg.Namespace+"/"+tg.Pod]
	if !ok || !a.listedBefore(tg.UID, r.from) {
		return
	}
	if g.HasUtilization {
		page.Set(metric.GPUUtilization, g.Utilization)
	}
	if g.HasMemory {
		page.Set(metric.GPUMemoryUsage, g.Memory)
	}
}

// nvmlMismatchRestart is how long NVML may find the driver at another
// version before /livez fails (a driver's upgrade may pass through it).
var nvmlMismatchRestart = 2 * time.Minute

// readNVML reads the GPUs; a read that fails, whole or for one GPU, is
// counted, and warned of when it starts failing (failing holds whether the
// last one did).
func (a *Agent) readNVML(failing *bool) gpu.Devices {
	if a.nvml.Lost() && time.Since(a.nvmlLostTry) >= a.nvmlReopenWait {
		a.nvmlLostTry = time.Now()
		err := a.nvml.Reopen()
		switch {
		case errors.Is(err, gpu.ErrVersionMismatch):
			if a.nvmlMismatch.CompareAndSwap(0, int64(time.Since(monoStart))) {
				a.log.Warn("the NVIDIA driver was upgraded while the agent runs: its NVML library is the old one, and the GPUs are not read until the agent restarts; /livez fails in "+
					nvmlMismatchRestart.String()+" so that the kubelet restarts it", logging.KeyErr, err)
			}
		default:
			a.nvmlMismatch.Store(0)
		}
		if err != nil {
			a.nvmlReopenWait = min(2*a.nvmlReopenWait, nvmlReopenMax)
			a.log.Debug("NVML not initialized again yet", logging.KeyErr, err)
		} else {
			a.m.nvml.Set(1)
			a.log.Info("NVML initialized again: GPU utilization is read")
		}
	}
	wasLost := a.nvml.Lost()
	devs, err := a.nvml.Read()
	if !wasLost && a.nvml.Lost() { // this read found the driver gone
		a.m.nvml.Set(0)
		a.log.Warn("the NVIDIA driver went away: NVML shut down, GPUs have no values; initialized again (every interval, backing off to 30s) until it comes back",
			logging.KeyErr, err)
		a.nvmlLostTry, a.nvmlReopenWait = time.Now(), a.opts.ScrapeInterval
	}
	switch {
	case err != nil:
		a.m.nvmlErrors.Inc()
		if !*failing {
			a.log.Warn("NVML read failed; the GPUs it could not read have no values", logging.KeyErr, err)
		}
		*failing = true
	case *failing:
		a.log.Info("NVML reads every GPU again")
		*failing = false
	}
	return devs
}

// gpuStopWait: how long a stop waits for the GPU loop's NVML call.
const gpuStopWait = 2 * time.Second

// nvmlReopenMax: after the driver went away NVML is initialized again at
// the next interval, then ever less often, at most this far apart.
const nvmlReopenMax = 30 * time.Second

// gpuLoop reads NVML and the kubelet's pod resources every interval. With
// no NVML it does nothing; with no kubelet socket it says so once and goes
// on trying (a kubelet that comes back is picked up).
func (a *Agent) gpuLoop(ctx context.Context) {
	if a.nvml == nil {
		return
	}
	defer func() { _ = a.podRes.Close() }()
	t := time.NewTicker(a.opts.ScrapeInterval)
	defer t.Stop()
	failing, nvmlFailing := false, false
	var last time.Time // when the last read began
	for {
		began := time.Now()
		from := last
		if from.IsZero() {
			from = began
		}
		last = began
		devs := a.readNVML(&nvmlFailing)
		lctx, cancel := context.WithTimeout(ctx, a.opts.timeout())
		pods, ambiguous, err := a.podRes.List(lctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			a.m.podResErrors.Inc()
			if !failing {
				a.log.Warn("kubelet pod-resources unavailable; GPU values are not attributed to pods", logging.KeySocket, a.opts.PodResourcesSocket, logging.KeyErr, err)
			}
			failing = true
			a.gpuPods.Store(nil)
		case err == nil:
			if failing {
				a.log.Info("kubelet pod-resources available again", logging.KeySocket, a.opts.PodResourcesSocket)
			}
			failing = false
			if len(ambiguous) > 0 {
				a.log.Debug("pods the kubelet lists twice under one name (one replacing the other): no GPU value until one is gone", logging.KeyPod, slices.Sorted(maps.Keys(ambiguous)))
			}
			byPod, unknown := gpu.Attribute(devs, pods, ambiguous)
			// A device NVML did not read this time (its read failed, or
			// NVML is down) is unread, not unknown: counted so, every
			// GPU of the node was counted each interval the driver was
			// away, as if its IDs were not NVML's.
			if len(unknown) > 0 && !nvmlFailing {
				a.m.unknownDevices.Add(float64(len(unknown)))
				a.log.Debug("device IDs that NVML does not know", logging.KeyIDs, unknown)
			}
			a.gpuPods.Store(&gpuRead{from: from, at: time.Now(), pods: byPod})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// aggregatorConnected reports whether a stream to some aggregator is open,
// and the addresses tried.
func (a *Agent) aggregatorConnected() (addrs []string, ok bool) {
	a.streamersMu.RLock()
	defer a.streamersMu.RUnlock()
	for addr, s := range a.streamers {
		addrs = append(addrs, addr)
		if s.connected.Load() {
			ok = true
		}
	}
	sort.Strings(addrs)
	if len(addrs) == 0 {
		addrs = []string{"none"}
	}
	return addrs, ok
}

// The agent's HTTP port (/metrics, /livez, /readyz) is reachable from any
// pod of the cluster (the chart has no NetworkPolicy for it). Each
// connection held costs a goroutine and its buffers, about 19 KiB, for up to
// the server's IdleTimeout: one pod opening thousands took the agent past
// its 128Mi limit, and every tenant of the node lost its scraping with it.
// The port holds at most maxHTTPConns connections (netbound), and at most
// maxHTTPConnsPerIP from one address, so that one client cannot take
// every other's room (Prometheus's); sixteen clients can, so the probes
// have a port of their own (maxHealthConns).
const (
	maxHTTPConns      = 256
	maxHTTPConnsPerIP = 16
)

func (a *Agent) serveHTTP(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", app.MetricsHandler(a.reg, promhttp.HandlerOpts{}))
	a.healthHandlers(mux)
	return a.listenAndServe(ctx, a.opts.HTTPAddr, maxHTTPConns, maxHTTPConnsPerIP, &a.httpAddr, "http", mux)
}

// The health port (--health-addr, the chart's on the pod's loopback: no
// other pod reaches it) serves /livez and /readyz alone, for the
// kubelet's exec probes (pulse-agent probe). The HTTP port is reachable
// from any pod: 16 pods of any tenant, each holding its 16 connections,
// filled its 256 and the kubelet's probes were closed at once, the agent
// restarted for ever and every tenant of the node lost its samples.
const maxHealthConns = 8

// serveHealth serves /livez and /readyz on --health-addr.
func (a *Agent) serveHealth(ctx context.Context) error {
	mux := http.NewServeMux()
	a.healthHandlers(mux)
	return a.listenAndServe(ctx, a.opts.HealthAddr, maxHealthConns, maxHealthConns, &a.healthAddr, "health", mux)
}

// listenAndServe serves h on addr, at most all connections and perIP
// from one address, until ctx ends; the bound address is stored in bound.
func (a *Agent) listenAndServe(ctx context.Context, addr string, all, perIP int, bound *atomic.Value, what string, h http.Handler) error {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	ln := netbound.New(raw, all, perIP)
	bound.Store(ln.Addr().String())
	a.log.Info("agent "+what+" listening", logging.KeyAddr, ln.Addr().String())
	// Bounded as the aggregator's: a slow or idle client holds nothing
	// for long.
	srv := app.NewHTTPServer(h, a.log)
	go func() { //nolint:gosec // G118: ctx has ended when the shutdown starts; it needs a live context of its own
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", what, err)
	}
	return nil
}

// healthHandlers registers /livez and /readyz on mux.
func (a *Agent) healthHandlers(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		// The scrape loop ticks every interval; 1.5 intervals without a
		// tick means it is stuck.
		if age := time.Since(monoStart) - time.Duration(a.lastTick.Load()); age > a.opts.ScrapeInterval*3/2+time.Second {
			http.Error(w, fmt.Sprintf("scrape loop stalled for %s", age), http.StatusInternalServerError)
			return
		}
		if since := a.nvmlMismatch.Load(); since != 0 && time.Since(monoStart)-time.Duration(since) > nvmlMismatchRestart {
			http.Error(w, "the NVIDIA driver was upgraded while the agent runs, and its NVML library is the old one: a restart mounts the driver's", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if a.lastTick.Load() == 0 {
			http.Error(w, "scrape loop not started", http.StatusServiceUnavailable)
			return
		}
		// No stream opens before the node's pods are listed once: that
		// is what is wrong, not the aggregator.
		if a.kube != nil {
			if ok, why := a.kube.Listed(); !ok {
				if why == "" {
					why = "waiting for the first list"
				}
				http.Error(w, fmt.Sprintf("the pods of node %s not listed yet (no stream opens before): %s", a.opts.NodeName, why), http.StatusServiceUnavailable)
				return
			}
		}
		// An agent that delivers to no aggregator does nothing useful.
		if addrs, ok := a.aggregatorConnected(); !ok {
			http.Error(w, fmt.Sprintf("no aggregator connected (--aggregator %s; resolved: %s)",
				strings.Join(a.opts.Aggregators, ","), strings.Join(addrs, ", ")), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type agentMetrics struct {
	nvml           prometheus.Gauge
	unknownDevices prometheus.Counter
	podResErrors   prometheus.Counter
	nvmlErrors     prometheus.Counter
	duration       prometheus.Histogram
	errors         *prometheus.CounterVec
	targets        prometheus.Gauge
	leftOut        prometheus.Gauge
	skipped        prometheus.Counter
	connected      *prometheus.GaugeVec
	batches        *prometheus.CounterVec
	bytes          *prometheus.CounterVec
	acked          *prometheus.GaugeVec
}

func newAgentMetrics(reg prometheus.Registerer) *agentMetrics {
	m := &agentMetrics{
		nvml: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_agent_nvml_available", Help: "1 when NVML is initialized and GPU utilization is read."}),
		unknownDevices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_agent_gpu_unknown_devices_total", Help: "GPU device IDs from the kubelet that NVML does not know."}),
		podResErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_agent_pod_resources_errors_total", Help: "Failed calls to the kubelet's pod-resources API."}),
		nvmlErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_agent_nvml_errors_total", Help: "NVML reads that failed, whole or for one GPU (its pods then have no GPU values)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pulse_agent_scrape_duration_seconds", Help: "Duration of one pod scrape, successful or not.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_agent_scrape_errors_total", Help: "Failed scrapes by reason."}, []string{"reason"}),
		targets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_agent_targets", Help: "Pods this agent knows of."}),
		leftOut: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pulse_agent_targets_left_out", Help: "Catalogue entries left out past --max-pods (shared fairly among namespaces)."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_agent_scrapes_skipped_total", Help: "Scrapes not started because the previous one of the pod was still in flight."}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pulse_agent_aggregator_connected", Help: "1 while a stream to the aggregator is open."}, []string{"aggregator"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_agent_batches_sent_total", Help: "Sample batches sent."}, []string{"aggregator"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_agent_batch_bytes_sent_total", Help: "Encoded bytes of the sample batches sent."}, []string{"aggregator"}),
		acked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pulse_agent_acked_batch_seq", Help: "Sequence number of the last batch the aggregator acknowledged on the current stream (it acks at most every 10 s)."}, []string{"aggregator"}),
	}
	for _, r := range []pulsev1.MissingReason{1, 2, 3, 4, 5, 6} {
		m.errors.WithLabelValues(wire.ReasonName(r))
	}
	reg.MustRegister(m.nvml, m.unknownDevices, m.podResErrors, m.nvmlErrors, m.duration, m.errors, m.targets, m.leftOut, m.skipped, m.connected, m.batches, m.bytes, m.acked)
	return m
}
