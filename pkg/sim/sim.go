// Package sim is pulse-sim: a deterministic, virtual-time simulation that
// replays a request trace against simulated vLLM replicas (pkg/sim/replica)
// and scores autoscaling signal pipelines — pulse, a Prometheus setup, the
// keda-kaito-scaler and an oracle — each feeding the same Kubernetes HPA
// (pkg/sim/hpa) through KEDA, side by side, next to the references no
// signal path can argue with: fixed fleets (static:N) and perfect foresight
// (clairvoyant), which set the replica count themselves.
package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/sim/hpa"
	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

// Load balancers.
const (
	// BalanceRoundRobin spreads requests in turn, as a Service (IPVS) does.
	BalanceRoundRobin = "round-robin"
	// BalanceLeastOutstanding picks the replica with the fewest requests in
	// flight, as an inference gateway does.
	BalanceLeastOutstanding = "least-outstanding"
	// BalanceGateway is an endpoint picker with flow control: a request
	// waits at the gateway until some replica has room (fewer than
	// GatewayQueueDepth requests waiting and its KV cache below
	// GatewayKVCache), then goes to the one with the fewest in flight.
	BalanceGateway = "gateway"
)

// The gateway's saturation thresholds: those of the Gateway API Inference
// Extension's saturation detector (queue depth 5, KV cache 0.8).
const (
	GatewayQueueDepth = 5
	GatewayKVCache    = 0.8
)

// What /scale status.replicas counts (the HPA's AverageValue divisor).
const (
	StatusAll   = "all"   // every pod not terminating (a Deployment's status.replicas)
	StatusReady = "ready" // ready pods only
)

// Config is one simulation.
type Config struct {
	Trace        []trace.Request
	TraceName    string
	ScaledObject *ScaledObject
	Profile      *replica.Profile
	// Pipelines to score, by name (Pipelines lists them).
	Pipelines []string
	Seed      uint64
	// TTFTSLO: a request meets its SLO when its time to first token, from
	// its arrival at the gateway, is at most this.
	TTFTSLO         time.Duration
	Balancer        string
	DropOnScaleDown bool
	// TerminationGrace: how long a ready replica removed by a scale-down
	// goes on with the requests it holds (its pod's
	// terminationGracePeriodSeconds: then it is killed); those it has not
	// finished by then are dropped. 0: no bound, it finishes every one
	// (with DropOnScaleDown: none).
	TerminationGrace time.Duration
	StatusReplicas   string
	// InitialReplicas (warm, Ready at 0); 0: the HPA's minimum.
	InitialReplicas int32
	// WarmStart: the signal pipelines and hindsight start with the fleet
	// the clairvoyant's default plan has at 0 (at least what their cold
	// start has: the HPA's minimum, hindsight's minReplicaCount), warm and
	// Ready, as fixed
	// fleets and the clairvoyant do: the fleet of a service that was
	// already serving the trace's first minutes, so that no pipeline's
	// score after the warm-up carries a backlog from a cold start that
	// its references did not have. Not with InitialReplicas.
	WarmStart bool
	// Explain: each sample of a pipeline that runs pulse's planner keeps
	// the planner's last plan (Series.Plans); it changes nothing run.
	Explain bool
	// Drain is how long the simulation runs past the last arrival.
	Drain time.Duration
	// HPA is kube-controller-manager's HPA configuration.
	HPA           hpa.Options
	HPASyncPeriod time.Duration
	// ScrapeInterval is the pulse agent's; PrometheusInterval Prometheus's.
	ScrapeInterval     time.Duration
	PrometheusInterval time.Duration
	// DemandSource: the gateway that holds requests while no replica is
	// ready is an endpoint picker annotated pulse.io/demand-source, scraped
	// by the pulse agent like a replica; its held requests are the
	// workload's pendingRequests (pulse pipeline only).
	DemandSource bool
	// SampleEvery is the resolution of the report's time series.
	SampleEvery time.Duration
	// MaxWindow is the aggregator's --max-window: a trigger asking for a
	// longer window is refused, as the aggregator refuses it (default
	// scaler.DefaultMaxWindow).
	MaxWindow time.Duration
	// Warmup: the *AfterWarmup scores count requests arriving at or after
	// it and replica-hours from it (default 10 minutes, none for a trace
	// whose last request arrives within them; -1: none). One set at or
	// past the last arrival is refused.
	Warmup        time.Duration
	warmupDefault bool // Warmup was 0, and is the default
	// ClientTimeout: a request whose first token has not come this long
	// after its arrival is abandoned by its client (taken off the gateway or
	// its replica) and counted a miss; 0: clients wait for ever.
	ClientTimeout time.Duration

	trigger         scaler.Trigger
	skipped         []string
	horizon         time.Duration
	initialReplicas int32
	hpaPhase        time.Duration
	kedaPhase       time.Duration
}

// DefaultWarmup is the start of a run the *AfterWarmup scores leave out.
const DefaultWarmup = 10 * time.Minute

// Defaults fills what is unset.
func (c *Config) Defaults() {
	if c.TTFTSLO == 0 {
		c.TTFTSLO = 2 * time.Second
	}
	if c.Balancer == "" {
		c.Balancer = BalanceRoundRobin
	}
	if c.StatusReplicas == "" {
		c.StatusReplicas = StatusAll
	}
	if c.Drain == 0 {
		c.Drain = 10 * time.Minute
	}
	if c.HPA == (hpa.Options{}) {
		c.HPA = hpa.DefaultOptions()
		c.HPA.ConfigurableTolerance = true
	}
	if c.HPASyncPeriod == 0 {
		c.HPASyncPeriod = hpa.DefaultSyncPeriod
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = time.Second
	}
	if c.PrometheusInterval == 0 {
		c.PrometheusInterval = 15 * time.Second
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = 10 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup, c.warmupDefault = DefaultWarmup, true
	}
	if c.MaxWindow == 0 {
		c.MaxWindow = scaler.DefaultMaxWindow
	}
}

// prepare checks the configuration and derives what every world shares.
func (c *Config) prepare() error {
	c.Defaults()
	var errs []error
	if len(c.Trace) == 0 {
		errs = append(errs, errors.New("the trace has no request"))
	}
	if c.ScaledObject == nil || c.Profile == nil {
		return errors.New("a ScaledObject and a profile are required")
	}
	if c.Balancer != BalanceRoundRobin && c.Balancer != BalanceLeastOutstanding && c.Balancer != BalanceGateway {
		errs = append(errs, fmt.Errorf("balancer %q: %s, %s or %s", c.Balancer, BalanceRoundRobin, BalanceLeastOutstanding, BalanceGateway))
	}
	if c.ClientTimeout < 0 {
		errs = append(errs, errors.New("the client timeout must not be negative"))
	}
	if c.WarmStart && c.InitialReplicas != 0 {
		errs = append(errs, errors.New("a warm start and initial replicas both set the fleet at 0: give one"))
	}
	if c.TerminationGrace < 0 {
		errs = append(errs, errors.New("the termination grace must not be negative"))
	}
	if c.StatusReplicas != StatusAll && c.StatusReplicas != StatusReady {
		errs = append(errs, fmt.Errorf("status replicas %q: %s or %s", c.StatusReplicas, StatusAll, StatusReady))
	}
	so := c.ScaledObject
	t, err := parseTrigger(so, c.MaxWindow)
	if err != nil {
		errs = append(errs, fmt.Errorf("the pulse trigger: %w", err))
	}
	c.trigger = t
	if err == nil {
		if len(c.Pipelines) == 0 {
			// Every signal pipeline that can express the trigger.
			c.Pipelines, c.skipped, _ = Expressible(so)
		}
		for _, name := range c.Pipelines {
			if _, err := newPipeline(name, c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if c.Trace[len(c.Trace)-1].At <= c.Trace[0].At {
		// Scoring stops at the last arrival: every pipeline and fixed
		// fleet scored 100 % for 0 GPU-hours, the frontiers one point.
		return fmt.Errorf("the trace's %d requests all arrive at %s: no time between its first and last arrival to score", len(c.Trace), c.Trace[0].At)
	}
	c.horizon = c.Trace[len(c.Trace)-1].At + c.Drain
	// Scoring after the warm-up stops at the last arrival (the drain
	// scores nothing): a warm-up past it left every pipeline and fixed
	// fleet at 0 % for 0 GPU-hours, the frontiers at one point.
	switch last := c.Trace[len(c.Trace)-1].At; {
	case c.Warmup < last:
	case !c.warmupDefault:
		return fmt.Errorf("the warm-up (%s) leaves nothing of the trace (its last request arrives at %s) to score: shorten it (--warmup) or use a longer trace", c.Warmup, last)
	default:
		c.Warmup = -1 // a trace shorter than the default warm-up is scored whole
	}
	c.initialReplicas = c.InitialReplicas
	if c.initialReplicas == 0 {
		c.initialReplicas = so.HPAMinReplicas()
	}
	// The HPA's and KEDA's phases relative to the trace: random, the same
	// for every pipeline.
	rng := rand.New(rand.NewPCG(c.Seed, 0x9a5e))
	c.hpaPhase = time.Duration(rng.Int64N(int64(c.HPASyncPeriod)))
	c.kedaPhase = time.Duration(rng.Int64N(int64(so.PollingInterval())))
	return nil
}

func parseTrigger(so *ScaledObject, maxWindow time.Duration) (scaler.Trigger, error) {
	md := so.PulseTrigger().Metadata
	return scaler.ParseTrigger(&externalscaler.ScaledObjectRef{Name: so.Metadata.Name, Namespace: so.Metadata.Namespace, ScalerMetadata: md},
		maxWindow, staticResolver{so})
}

// TriggerMetric is the metric so's pulse trigger asks for (Report's
// Config.Metric: "replicas" for the planner).
func TriggerMetric(so *ScaledObject) (string, error) {
	t, err := parseTrigger(so, 24*time.Hour) // the window is checked by prepare
	if err != nil {
		return "", fmt.Errorf("the pulse trigger: %w", err)
	}
	return t.Metric, nil
}

// Expressible splits the signal pipelines (Pipelines) into those that can
// express so's pulse trigger and, for each other one, why it cannot.
func Expressible(so *ScaledObject) (names, skipped []string, err error) {
	t, err := parseTrigger(so, 24*time.Hour) // the window is checked by prepare
	if err != nil {
		return nil, nil, fmt.Errorf("the pulse trigger: %w", err)
	}
	c := &Config{ScaledObject: so, trigger: t}
	for _, name := range Pipelines() {
		if _, err := newPipeline(name, c); err != nil {
			skipped = append(skipped, err.Error())
		} else {
			names = append(names, name)
		}
	}
	return names, skipped, nil
}

// staticResolver answers the pulse trigger's scaleTargetRef from the file.
type staticResolver struct{ so *ScaledObject }

// A kind left out is KEDA's default, Deployment, as the aggregator reads it.
func (r staticResolver) Resolve(_, _ string) (string, string, error) {
	ref := r.so.Spec.ScaleTargetRef
	if ref.Name == "" {
		return "", "", errors.New("the ScaledObject has no scaleTargetRef name")
	}
	if ref.Kind == "" {
		return "Deployment", ref.Name, nil
	}
	return ref.Kind, ref.Name, nil
}

// Run simulates every pipeline, in parallel, and returns the report.
func Run(cfg Config) (*Report, error) {
	if err := cfg.prepare(); err != nil {
		return nil, err
	}
	results := make([]*PipelineResult, len(cfg.Pipelines))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, name := range cfg.Pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			p, _ := newPipeline(name, &cfg) // checked by prepare
			w := newWorld(&cfg, p)
			results[i] = w.run()
			results[i].Pipeline = name
		}()
	}
	wg.Wait()
	return newReport(&cfg, results), nil
}
