// Package cli is pulse-sim's command line: options, validation and the run
// and tune commands (cmd/pulse-sim only calls Main).
package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/sim"
	"github.com/pulse-io/pulse/pkg/sim/bench"
	"github.com/pulse-io/pulse/pkg/sim/plot"
	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
	"github.com/pulse-io/pulse/pkg/version"
)

// Options are the flags common to run and tune.
type Options struct {
	Trace           string
	ScaledObject    string
	Profile         string
	Pipelines       string
	Out             string
	RateScale       float64
	Seed            uint64
	TTFTSLO         time.Duration
	Balancer        string
	Format          string
	Runs            int
	DropOnScaleDown bool
	TermGrace       time.Duration
	ConfigTolerance bool
	StatusReplicas  string
	ScrapeInterval  time.Duration
	DemandSource    bool
	PromInterval    time.Duration
	InitialReplicas int
	WarmStart       bool
	Explain         bool
	Warmup          time.Duration
	warmupSet       bool // --warmup was given (else a trace shorter than the default is scored whole)
	CopyJitter      time.Duration
	CopyLengths     string
	ClientTimeout   time.Duration
	References      bool
	MaxWindow       time.Duration

	soRaw []byte // the ScaledObject as read (tune rewrites it)
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Profile: "llama-3.1-8b-h100", Out: "report", RateScale: 1,
		Seed: 1, TTFTSLO: 2 * time.Second, Balancer: sim.BalanceRoundRobin, Format: "png", Runs: 1, ConfigTolerance: true,
		StatusReplicas: sim.StatusAll, ScrapeInterval: time.Second, PromInterval: 15 * time.Second,
		Warmup: sim.DefaultWarmup, CopyJitter: bench.DefaultCopyJitter, CopyLengths: "resample", MaxWindow: scaler.DefaultMaxWindow}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Trace, "trace", o.Trace, "request trace: an Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), a Mooncake trace (.jsonl: timestamp in ms, input_length, output_length), or a generator: poisson:rate=R,duration=D | steps:rates=A/B/C,step=D | bursts:base=A,peak=B,on=D,off=D,duration=D | ramp:from=A,to=B,duration=D | diurnal:min=A,max=B,duration=D (each with optional prompt=N,output=N tokens, lengths=fixed|lognormal, sigma=S; steps also prompts=A/B/C,outputs=A/B/C, one mean a step)")
	fs.StringVar(&o.ScaledObject, "scaledobject", o.ScaledObject, "the KEDA ScaledObject YAML to simulate (its one trigger, of type external-push, min/max replicas, pollingInterval, cooldownPeriod, fallback, HPA behavior)")
	fs.StringVar(&o.Profile, "profile", o.Profile, "replica profile: a shipped one ("+strings.Join(replica.Shipped(), ", ")+") or a profile YAML file")
	fs.StringVar(&o.Pipelines, "pipelines", o.Pipelines, "pipelines to score, comma-separated: "+strings.Join(sim.Pipelines(), ", ")+
		", static:N (N warm replicas all run long), switch:from=N,to=M,at=F (N warm replicas, M from a fraction F of the scored window), clairvoyant[:utilisation=U,window=D,horizon=D,hold=D] (perfect foresight), hindsight[:utilisation=U,window=D,hold=D] (perfect measurement, no foresight); default: every one of the first five that can express the trigger")
	fs.StringVar(&o.Out, "out", o.Out, "directory for report.json and the pictures")
	fs.Float64Var(&o.RateScale, "rate-scale", o.RateScale, "replay the trace at this multiple of its rate, over the same time (each request copied; see --copy-jitter and --copy-lengths)")
	fs.DurationVar(&o.CopyJitter, "copy-jitter", o.CopyJitter, "--rate-scale's copies fall uniformly within ± half this of their original (1s with --copy-lengths same: pulse-sim's first, lockstep copies, each within a second after its original)")
	fs.StringVar(&o.CopyLengths, "copy-lengths", o.CopyLengths, "--rate-scale's copies' prompt and output lengths: resample (those of a request drawn from the trace) or same (the original's)")
	fs.IntVar(&o.InitialReplicas, "initial-replicas", o.InitialReplicas, "replicas warm and Ready at 0 (0: the ScaledObject's minimum); static:N starts with N, clairvoyant with its plan")
	fs.BoolVar(&o.WarmStart, "warm-start", o.WarmStart, "the signal pipelines (and hindsight) start with the fleet the default clairvoyant plan has at 0, warm and Ready, as static:N and clairvoyant do (pulse-sim bench's default; not with --initial-replicas)")
	fs.BoolVar(&o.Explain, "explain", o.Explain, "report.json's series of a pipeline whose trigger is the planner's (metric replicas) get plans: the planner's last plan at each sample, every field /debug/triggers shows; null before its first evaluation and after one that answered an error (changes nothing run)")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "the start of the run sloAfterWarmup, gpuHoursAfterWarmup and goodputPerGpuHour leave out")
	fs.DurationVar(&o.MaxWindow, "max-window", o.MaxWindow, "the aggregator's --max-window: a trigger window longer than this is refused, as the aggregator refuses it")
	fs.BoolVar(&o.References, "references", o.References, "also run static:1 … maxReplicaCount, the switches from each to the next and back (at "+
		strings.Trim(fmt.Sprint(bench.DefaultSwitches), "[]")+" of the scored window) and the clairvoyant sweep (utilisations "+
		strings.Trim(fmt.Sprint(bench.DefaultUtilisations), "[]")+", windows 10s and 1m), print each pipeline's distance to the static and clairvoyant frontiers and draw frontier.png")
	fs.DurationVar(&o.ClientTimeout, "client-timeout", o.ClientTimeout, "a request whose first token has not come this long after its arrival is abandoned by its client and counted a miss (0: clients wait for ever; 60s is a realistic chat client)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of everything random: the same seed gives the same report, byte for byte")
	fs.DurationVar(&o.TTFTSLO, "ttft-slo", o.TTFTSLO, "time-to-first-token objective of sloAttainment, from a request's arrival at the gateway")
	fs.StringVar(&o.Balancer, "balancer", o.Balancer, "load balancer: round-robin (a Service), least-outstanding (an inference gateway binding each request at arrival) or gateway (an endpoint picker with flow control: requests wait at the gateway until a replica has room)")
	fs.StringVar(&o.Format, "format", o.Format, "picture format: png or svg")
	fs.BoolVar(&o.DropOnScaleDown, "drop-on-scale-down", o.DropOnScaleDown, "a replica removed by a scale-down drops its in-flight requests (default: it finishes them first)")
	fs.DurationVar(&o.TermGrace, "termination-grace", o.TermGrace, "a replica removed by a scale-down goes on with its requests this long (its pod's terminationGracePeriodSeconds, Kubernetes' default 30s), then is killed: those not finished are dropped, misses (0: no bound, it finishes every one)")
	fs.BoolVar(&o.ConfigTolerance, "hpa-configurable-tolerance", o.ConfigTolerance, "honor the behavior's per-direction tolerance (Kubernetes' HPAConfigurableTolerance feature gate: alpha, off by default, in 1.33); false: the global 0.1 applies")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", o.ScrapeInterval, "the pulse agent's --scrape-interval")
	fs.BoolVar(&o.DemandSource, "demand-source", o.DemandSource, "the gateway holding requests while no replica is ready is a pulse demand source (an endpoint picker annotated pulse.io/demand-source): pulse counts its held requests and activates on them")
	fs.DurationVar(&o.PromInterval, "prometheus-interval", o.PromInterval, "Prometheus' scrape interval (the Kaito proposal's PodMonitor: 15s)")
	fs.StringVar(&o.StatusReplicas, "status-replicas", o.StatusReplicas, "what the target's /scale status.replicas counts: all (not terminating, a Deployment's) or ready")
}

// Validate reports every problem of the options.
func (o *Options) Validate() error {
	var errs []error
	if o.Trace == "" {
		errs = append(errs, errors.New("--trace is required"))
	}
	if o.ScaledObject == "" {
		errs = append(errs, errors.New("--scaledobject is required"))
	}
	if !(o.RateScale > 0) || o.RateScale > 1000 {
		errs = append(errs, errors.New("--rate-scale must be above 0 and at most 1000"))
	}
	if o.TTFTSLO <= 0 {
		errs = append(errs, errors.New("--ttft-slo must be above 0"))
	}
	if o.ScrapeInterval < 100*time.Millisecond || o.PromInterval < time.Second {
		errs = append(errs, errors.New("--scrape-interval must be at least 100ms and --prometheus-interval at least 1s"))
	}
	if o.Runs < 1 {
		errs = append(errs, errors.New("--runs must be at least 1"))
	}
	if o.Format != "png" && o.Format != "svg" {
		errs = append(errs, fmt.Errorf("--format %q: png or svg", o.Format))
	}
	if o.InitialReplicas < 0 || o.InitialReplicas > 10000 {
		errs = append(errs, errors.New("--initial-replicas must be from 0 to 10000"))
	}
	if o.WarmStart && o.InitialReplicas != 0 {
		errs = append(errs, errors.New("--warm-start and --initial-replicas both set the fleet at 0: give one"))
	}
	if o.Warmup < 0 {
		errs = append(errs, errors.New("--warmup must not be negative"))
	}
	if o.CopyJitter < 0 {
		errs = append(errs, errors.New("--copy-jitter must not be negative"))
	}
	if o.CopyLengths != "resample" && o.CopyLengths != "same" {
		errs = append(errs, fmt.Errorf("--copy-lengths %q: resample or same", o.CopyLengths))
	}
	if o.ClientTimeout < 0 {
		errs = append(errs, errors.New("--client-timeout must not be negative"))
	}
	if least := max(scaler.DefaultWindow, scaler.DefaultPlanWindow); o.MaxWindow < least {
		errs = append(errs, fmt.Errorf("--max-window must be at least %s, as the aggregator's: the longest default trigger window", least))
	}
	return errors.Join(errs...)
}

// config builds the simulation's configuration for a seed.
func (o *Options) config(seed uint64) (sim.Config, error) {
	reqs, err := trace.Load(o.Trace, seed)
	if err != nil {
		return sim.Config{}, err
	}
	copies := trace.Copies{Jitter: o.CopyJitter, Resample: o.CopyLengths == "resample"}
	if copies.Jitter == time.Second && !copies.Resample {
		copies = trace.Coherent
	}
	if err := trace.CheckScale(len(reqs), o.RateScale); err != nil {
		return sim.Config{}, fmt.Errorf("--rate-scale: %w", err)
	}
	reqs = trace.DensifyWith(reqs, o.RateScale, seed, copies)
	if o.soRaw == nil {
		if o.soRaw, err = os.ReadFile(o.ScaledObject); err != nil {
			return sim.Config{}, fmt.Errorf("read --scaledobject: %w", err)
		}
	}
	so, err := sim.ParseScaledObject(o.soRaw)
	if err != nil {
		return sim.Config{}, err
	}
	p, err := replica.Load(o.Profile)
	if err != nil {
		return sim.Config{}, err
	}
	name := trace.Name(o.Trace)
	if o.RateScale != 1 {
		name += fmt.Sprintf(" x%g", o.RateScale)
	}
	c := sim.Config{Trace: reqs, TraceName: name, ScaledObject: so, Profile: p, Seed: seed, TTFTSLO: o.TTFTSLO,
		Balancer: o.Balancer, DropOnScaleDown: o.DropOnScaleDown, TerminationGrace: o.TermGrace, StatusReplicas: o.StatusReplicas,
		ScrapeInterval: o.ScrapeInterval, PrometheusInterval: o.PromInterval, DemandSource: o.DemandSource,
		InitialReplicas: int32(o.InitialReplicas), WarmStart: o.WarmStart, Explain: o.Explain, Warmup: o.Warmup, ClientTimeout: o.ClientTimeout, MaxWindow: o.MaxWindow}
	switch {
	case !o.warmupSet:
		c.Warmup = 0 // the default: none for a trace shorter than it
	case o.Warmup == 0:
		c.Warmup = -1 // --warmup 0: none
	}
	c.Defaults()
	c.HPA.ConfigurableTolerance = o.ConfigTolerance
	c.Pipelines = splitPipelines(o.Pipelines)
	if o.References {
		if len(c.Pipelines) == 0 {
			if c.Pipelines, _, err = sim.Expressible(so); err != nil {
				return sim.Config{}, err
			}
		}
		c.Pipelines = append(c.Pipelines, bench.References(so, bench.DefaultSweep())...)
	}
	return c, nil
}

// splitPipelines splits a list of pipelines at its commas, but for those
// within one pipeline's parameters ("clairvoyant:utilisation=1,window=10s"
// is one pipeline): a part of the form key=value with no pipeline's name
// before it goes with the pipeline before it.
func splitPipelines(s string) []string {
	var out []string
	for _, p := range splitList(s) {
		if n := len(out); n > 0 && strings.Contains(out[n-1], ":") && strings.Contains(p, "=") && !strings.Contains(p, ":") {
			out[n-1] += "," + p
			continue
		}
		out = append(out, p)
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Main runs pulse-sim with args (without the program name) and returns the
// exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintf(stdout, "pulse-sim %s\n", version.Version)
		return 0
	}
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = runCmd(args, stdout, stderr)
	case "tune":
		err = tuneCmd(args, stdout, stderr)
	case "bench":
		err = benchCmd(args, stdout, stderr)
	default:
		err = fmt.Errorf("unknown command %q: run (the default), tune or bench", cmd)
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "pulse-sim:", err)
		return 1
	}
	return 0
}

// parse parses args; --help prints every flag, a bad flag only the error
// and where help is.
// noteWarmup records whether --warmup was given.
func (o *Options) noteWarmup(fs *flag.FlagSet) {
	fs.Visit(func(f *flag.Flag) { o.warmupSet = o.warmupSet || f.Name == "warmup" })
}

func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "usage: pulse-sim %s [flags]\n", fs.Name())
			fmt.Fprintln(stderr, "commands: run (the default: simulate and score), tune (sweep trigger thresholds and scale-up policies), bench (run a suite into a scoreboard); pulse-sim COMMAND --help for each")
			fs.PrintDefaults()
			return err
		}
		return fmt.Errorf("%w (see pulse-sim %s --help)", err, fs.Name())
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see pulse-sim %s --help)", fs.Args(), fs.Name())
	}
	return nil
}

func runCmd(args []string, stdout, stderr io.Writer) error {
	o := NewOptions()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	o.AddFlags(fs)
	fs.IntVar(&o.Runs, "runs", o.Runs, "simulate this many seeds (seed, seed+1, ...): runs.json gets every run's scores, the table their mean; report.json and the pictures are the first seed's")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	o.noteWarmup(fs)
	if err := o.Validate(); err != nil {
		return err
	}
	var reports []*sim.Report
	var prof *replica.Profile
	for i := range o.Runs {
		c, err := o.config(o.Seed + uint64(i))
		if err != nil {
			return err
		}
		prof = c.Profile
		r, err := sim.Run(c)
		if err != nil {
			return err
		}
		reports = append(reports, r)
	}
	if err := bench.SameWarmup(reports); err != nil {
		return err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("create --out: %w", err)
	}
	first := reports[0]
	if o.References {
		first = withoutReferenceSeries(first) // they would be most of the file
	}
	if err := writeJSON(filepath.Join(o.Out, "report.json"), first); err != nil {
		return err
	}
	files, err := plot.Write(reports[0], o.Out, o.Format, !o.References)
	if err != nil {
		return err
	}
	var scores []*bench.Score
	for i := range reports[0].Pipelines {
		scores = append(scores, bench.Mean(reports, i))
	}
	signal, _, _, staticFront, clairFront := bench.Split(scores, nil, bench.FrontierSlack(prof))
	if o.References {
		f := filepath.Join(o.Out, "frontier."+o.Format)
		c := reports[0].Config
		if err := bench.WriteFrontier(c.Trace+" · "+c.Profile+" · "+c.ScaledObject, signal, staticFront, clairFront, f, o.Format); err != nil {
			return err
		}
		files = append(files, f)
	}
	if o.Runs > 1 {
		if err := writeJSON(filepath.Join(o.Out, "runs.json"), runsOf(reports)); err != nil {
			return err
		}
	}
	r := reports[0]
	fmt.Fprintf(stdout, "%s, %d requests, %s, ScaledObject %s (%s, threshold %g), seed %d", r.Config.Trace, r.Config.Requests, r.Config.Profile,
		r.Config.ScaledObject, r.Config.Metric, r.Config.Threshold, r.Config.Seed)
	if o.Runs > 1 {
		fmt.Fprintf(stdout, "; mean of %d seeds", o.Runs)
	}
	fmt.Fprintln(stdout)
	for _, sk := range r.Config.Skipped {
		fmt.Fprintf(stdout, "not run: %s\n", sk)
	}
	PrintTable(stdout, meanScores(reports), r.Config.TTFTSLOSeconds, r.Config.WarmupSeconds)
	if len(staticFront) > 0 || len(clairFront) > 0 {
		printFrontiers(stdout, signal, staticFront, clairFront)
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s\n", filepath.Join(o.Out, "report.json"), strings.Join(files, ", "))
	return nil
}

// withoutReferenceSeries is r with the reference pipelines' time series
// left out.
func withoutReferenceSeries(r *sim.Report) *sim.Report {
	out := *r
	out.Pipelines = nil
	for _, p := range r.Pipelines {
		if _, ref := sim.Reference(p.Pipeline); ref {
			q := *p
			q.Series = sim.Series{}
			p = &q
		}
		out.Pipelines = append(out.Pipelines, p)
	}
	return &out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil { //nolint:gosec // G703: a file in --out, named by pulse-sim (fixed names, or plot.FileName of a suite's names)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Run is one seed's scores of one pipeline, for runs.json.
type Run struct {
	Seed uint64 `json:"seed"`
	sim.PipelineResult
}

func runsOf(reports []*sim.Report) []Run {
	var out []Run
	for _, r := range reports {
		for _, p := range r.Pipelines {
			pr := *p
			pr.Series = sim.Series{}
			out = append(out, Run{Seed: r.Config.Seed, PipelineResult: pr})
		}
	}
	return out
}

// printFrontiers prints the frontiers and each signal pipeline's distance
// to them (after the warm-up).
func printFrontiers(w io.Writer, signal []*bench.Score, staticFront, clairFront []bench.Point) {
	text := func(front []bench.Point) string {
		var parts []string
		for _, p := range front {
			parts = append(parts, fmt.Sprintf("%s %.1f%% at %.2f", p.Pipeline, 100*p.SLO, p.GPUHours))
		}
		if len(parts) == 0 {
			return "none run"
		}
		return strings.Join(parts, "; ")
	}
	pts := func(v *float64) string {
		if v == nil {
			return "— (below its first point)"
		}
		return fmt.Sprintf("%+.1f points", 100**v)
	}
	fmt.Fprintf(w, "\nafter the warm-up: static frontier: %s\n", text(staticFront))
	fmt.Fprintf(w, "clairvoyant frontier (its sweep, the switches and the fixed fleets): %s\n", text(clairFront))
	for _, sc := range signal {
		cost := "no fixed fleet attains as much"
		if sc.StaticCost != nil {
			cost = fmt.Sprintf("%.2f× the GPU-hours of the cheapest fixed fleet as good", *sc.StaticCost)
		}
		fmt.Fprintf(w, "%s: %.1f%% at %.2f GPU-hours: %s from the static frontier, %s from the clairvoyant; %s\n", sc.Pipeline,
			100*sc.SLOAfterWarmup, sc.GPUHoursAfterWarmup, pts(sc.ToStatic), pts(sc.ToClairvoyant), cost)
	}
}

// Mean is one pipeline's scores averaged over seeds.
type Mean struct {
	Pipeline string
	Requests float64
	// TTFT percentiles: nil where any seed's fell on a request with no
	// first token (sim.PipelineResult's).
	TTFTP50, TTFTP90, TTFTP99                    *float64
	SLOAttainment, GPUHours                      float64
	SLOAfterWarmup, GPUHoursAfterWarmup, Goodput float64
	MaxReplicas                                  int
	ScaleEvents, Reversals, Dropped, Abandoned   float64
	FirstScaleUpSeconds                          *float64
}

// meanScores averages each pipeline's scores over the reports (one per seed).
func meanScores(reports []*sim.Report) []*Mean {
	out := make([]*Mean, len(reports[0].Pipelines))
	n := float64(len(reports))
	for i := range out {
		m := &Mean{Pipeline: reports[0].Pipelines[i].Pipeline}
		var first float64
		firstN := 0
		var p50, p90, p99 []*float64
		for _, r := range reports {
			p := r.Pipelines[i]
			m.Requests += float64(p.Requests) / n
			p50, p90, p99 = append(p50, p.TTFTP50), append(p90, p.TTFTP90), append(p99, p.TTFTP99)
			m.SLOAttainment += p.SLOAttainment / n
			m.GPUHours += p.GPUHours / n
			m.SLOAfterWarmup += p.SLOAfterWarmup / n
			m.GPUHoursAfterWarmup += p.GPUHoursAfterWarmup / n
			m.Goodput += p.GoodputPerGPUHour / n
			m.MaxReplicas = max(m.MaxReplicas, p.MaxReplicas)
			m.ScaleEvents += float64(p.ScaleEvents) / n
			m.Reversals += float64(p.Reversals) / n
			m.Dropped += float64(p.Dropped) / n
			m.Abandoned += float64(p.Abandoned) / n
			if p.FirstScaleUpSeconds != nil {
				first += *p.FirstScaleUpSeconds
				firstN++
			}
		}
		if firstN > 0 {
			v := first / float64(firstN)
			m.FirstScaleUpSeconds = &v
		}
		m.TTFTP50, m.TTFTP90, m.TTFTP99 = meanOrNone(p50), meanOrNone(p90), meanOrNone(p99)
		out[i] = m
	}
	return out
}

// meanOrNone is the mean of vs; nil when any is (a percentile that fell on
// a request with no first token has no finite value to average).
func meanOrNone(vs []*float64) *float64 {
	var sum float64
	for _, v := range vs {
		if v == nil {
			return nil
		}
		sum += *v
	}
	if len(vs) == 0 {
		return nil
	}
	m := sum / float64(len(vs))
	return &m
}

// seconds prints a TTFT percentile: "none" where it fell on a request
// with no first token.
func seconds(v *float64) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf("%.2fs", *v)
}

// PrintTable prints the comparison table: means with one decimal where a
// mean over seeds need not be whole.
func PrintTable(w io.Writer, rs []*Mean, slo, warmup float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "pipeline\trequests\tTTFT p50\tp90\tp99\tSLO (≤%gs)\tGPU-hours\tSLO after %gm\tGPU-hours after\tgoodput/GPU-h\tmax replicas\tscale events\treversals\tfirst scale-up\tdropped\tabandoned\t\n",
		slo, warmup/60)
	for _, r := range rs {
		first := "-"
		if r.FirstScaleUpSeconds != nil {
			first = fmt.Sprintf("%.0fs", *r.FirstScaleUpSeconds)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%.1f%%\t%.2f\t%.1f%%\t%.2f\t%.0f\t%d\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t\n", r.Pipeline, r.Requests, seconds(r.TTFTP50), seconds(r.TTFTP90), seconds(r.TTFTP99),
			100*r.SLOAttainment, r.GPUHours, 100*r.SLOAfterWarmup, r.GPUHoursAfterWarmup, r.Goodput, r.MaxReplicas, r.ScaleEvents, r.Reversals, first, r.Dropped, r.Abandoned)
	}
	_ = tw.Flush()
}
