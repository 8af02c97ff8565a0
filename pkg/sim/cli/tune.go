package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pulse-io/pulse/pkg/sim"
	"github.com/pulse-io/pulse/pkg/sim/bench"
	"github.com/pulse-io/pulse/pkg/sim/plot"
)

// tuneOptions are tune's own flags.
type tuneOptions struct {
	Metrics   string
	ScaleUp   string
	TargetSLO float64
	Seeds     int
}

// Candidate is one configuration of the sweep and its mean scores.
type Candidate struct {
	Metric        string  `json:"metric"`
	Threshold     float64 `json:"threshold"`
	ScaleUpPods   int32   `json:"scaleUpPods"`
	ScaleUpPeriod int32   `json:"scaleUpPeriodSeconds"`
	// SLOAttainment, GPUHours: over the whole run, the warm-up's misses
	// and the drain's GPU-hours with them.
	SLOAttainment float64 `json:"sloAttainment"`
	GPUHours      float64 `json:"gpuHours"`
	// SLOAfterWarmup, GPUHoursAfterWarmup: as the benchmark scores a
	// pipeline (after the warm-up, to the last arrival): what the sweep
	// ranks by and MeetsTarget is of.
	SLOAfterWarmup      float64 `json:"sloAfterWarmup"`
	GPUHoursAfterWarmup float64 `json:"gpuHoursAfterWarmup"`
	// TTFTP90: the seeds' mean; null where any seed's p90 fell on a
	// request with no first token.
	TTFTP90     *float64 `json:"ttftP90"`
	MeetsTarget bool     `json:"meetsTarget"`

	raw []byte // its ScaledObject
}

type scaleUp struct{ pods, period int32 }

func parseGrid(metrics, up string) (map[string][]float64, []string, []scaleUp, error) {
	var errs []error
	grid := map[string][]float64{}
	var order []string
	for _, m := range splitList(metrics) {
		name, vals, ok := strings.Cut(m, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--metrics %q: want metric=threshold/threshold, such as waiting=5/10", m))
			continue
		}
		for _, v := range strings.Split(vals, "/") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) || math.IsInf(f, 0) {
				errs = append(errs, fmt.Errorf("--metrics %s: threshold %q is not a number above 0", name, v))
			}
			grid[name] = append(grid[name], f)
		}
		order = append(order, name)
	}
	var ups []scaleUp
	for _, u := range splitList(up) {
		pods, per, ok := strings.Cut(u, "/")
		n, err1 := strconv.ParseInt(pods, 10, 32)
		d, err2 := time.ParseDuration(per)
		if !ok || err1 != nil || err2 != nil || n < 1 || d < time.Second || d%time.Second != 0 || d > 30*time.Minute {
			errs = append(errs, fmt.Errorf("--scale-up %q: want pods/period such as 1/300s (a period of whole seconds, 1s to 30m: the HPA's periodSeconds)", u))
			continue
		}
		ups = append(ups, scaleUp{int32(n), int32(d.Seconds())})
	}
	return grid, order, ups, errors.Join(errs...)
}

// variant rewrites the ScaledObject YAML with a metric, threshold and
// scale-up policy, keeping everything else.
func variant(raw []byte, metric string, threshold float64, up scaleUp) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	spec, _ := doc["spec"].(map[string]any)
	triggers, _ := spec["triggers"].([]any)
	for _, t := range triggers {
		tm, _ := t.(map[string]any)
		if tm["type"] != "external-push" {
			continue
		}
		md, _ := tm["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			tm["metadata"] = md
		}
		delete(md, "metricName")
		md["metric"] = metric
		md["threshold"] = strconv.FormatFloat(threshold, 'g', -1, 64)
		break
	}
	adv := child(spec, "advanced")
	behavior := child(child(adv, "horizontalPodAutoscalerConfig"), "behavior")
	su := child(behavior, "scaleUp")
	su["policies"] = []any{map[string]any{"type": "Pods", "value": up.pods, "periodSeconds": up.period}}
	su["selectPolicy"] = "Max"
	return yaml.Marshal(doc)
}

func child(m map[string]any, k string) map[string]any {
	c, _ := m[k].(map[string]any)
	if c == nil {
		c = map[string]any{}
		m[k] = c
	}
	return c
}

// tuneFlags are tune's flags: run's, with tune's defaults and meanings
// for --pipelines and --out, and its own; suite is --suite's value.
func tuneFlags(o *Options, t *tuneOptions) (fs *flag.FlagSet, suite *string) {
	o.Pipelines, o.Out = "pulse", "tune"
	*t = tuneOptions{Metrics: "waiting=2/5/10/20,running=32/64/128/256,kvCacheUsage=0.4/0.6/0.8", ScaleUp: "1/300s,1/60s,2/60s,4/15s",
		TargetSLO: 0.95, Seeds: 3}
	fs = flag.NewFlagSet("tune", flag.ContinueOnError)
	o.AddFlags(fs)
	fs.Lookup("pipelines").Usage = "the pipeline each configuration is simulated with (the first named): one of " + strings.Join(sim.Pipelines(), ", ")
	fs.Lookup("out").Usage = "directory for tune.json and tuned-scaledobject.yaml (with --suite, NAME-PROFILE.json for each trace × profile)"
	fs.StringVar(&t.Metrics, "metrics", t.Metrics, "metrics and thresholds to sweep: metric=t1/t2/...,metric=...")
	fs.StringVar(&t.ScaleUp, "scale-up", t.ScaleUp, "scale-up policies to sweep, pods/period, comma-separated")
	fs.Float64Var(&t.TargetSLO, "target-slo", t.TargetSLO, "the SLO attainment (fraction of requests with TTFT ≤ --ttft-slo) a configuration must reach")
	fs.IntVar(&t.Seeds, "seeds", t.Seeds, "seeds each configuration is simulated with; scores are their mean")
	suite = fs.String("suite", "", "sweep each trace × profile of this bench suite (YAML) alone, with the suite's trace, profile, rate scale and run settings: --out gets NAME-PROFILE.json for each")
	return fs, suite
}

func tuneCmd(args []string, stdout, stderr io.Writer) error {
	o := NewOptions()
	var t tuneOptions
	fs, suite := tuneFlags(o, &t)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	o.noteWarmup(fs)
	var errs []error
	if *suite != "" {
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "trace", "profile", "rate-scale", "ttft-slo", "warmup", "copy-jitter", "copy-lengths", "client-timeout", "balancer", "seed", "termination-grace", "drop-on-scale-down", "hpa-configurable-tolerance", "warm-start", "initial-replicas":
				errs = append(errs, fmt.Errorf("--%s: --suite sets it", f.Name))
			}
		})
		o.Trace = *suite // Validate asks for a trace; each of the suite's runs sets its own
	}
	errs = append(errs, o.Validate())
	if !(t.TargetSLO > 0 && t.TargetSLO <= 1) {
		errs = append(errs, errors.New("--target-slo must be in (0, 1]"))
	}
	if t.Seeds < 1 || t.Seeds > 100 {
		errs = append(errs, errors.New("--seeds must be from 1 to 100"))
	}
	grid, order, ups, err := parseGrid(t.Metrics, t.ScaleUp)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	base, err := os.ReadFile(o.ScaledObject)
	if err != nil {
		return fmt.Errorf("read --scaledobject: %w", err)
	}
	g := tuneGrid{metrics: grid, order: order, ups: ups}
	if *suite != "" {
		return tuneSuite(*suite, o, t, g, base, stdout)
	}
	cands, err := g.sweep(o, t, base)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("create --out: %w", err)
	}
	if err := writeJSON(filepath.Join(o.Out, "tune.json"), cands); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "metric\tthreshold\tscale-up\tSLO (≤%s) after the warm-up\tGPU-hours after\tSLO (whole run)\tGPU-hours\tTTFT p90\t\n", o.TTFTSLO)
	for _, c := range cands {
		mark := ""
		if c.MeetsTarget {
			mark = " *"
		}
		fmt.Fprintf(tw, "%s\t%g\t%d pod/%ds\t%.1f%%%s\t%.2f\t%.1f%%\t%.2f\t%s\t\n", c.Metric, c.Threshold, c.ScaleUpPods, c.ScaleUpPeriod,
			100*c.SLOAfterWarmup, mark, c.GPUHoursAfterWarmup, 100*c.SLOAttainment, c.GPUHours, seconds(c.TTFTP90))
	}
	_ = tw.Flush()
	if len(cands) == 0 || !cands[0].MeetsTarget {
		fmt.Fprintf(stdout, "\nno configuration reaches %.1f%% of requests within %s; the closest is first above\n", 100*t.TargetSLO, o.TTFTSLO)
		return nil
	}
	b := cands[0]
	file := filepath.Join(o.Out, "tuned-scaledobject.yaml")
	if err := os.WriteFile(file, b.raw, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	fmt.Fprintf(stdout, "\ncheapest configuration meeting %.1f%% within %s after the warm-up (mean of %d seeds): %s threshold %g, scale up %d pod per %ds: %.2f GPU-hours after it, %.1f%%\n%s\n---\n%s",
		100*t.TargetSLO, o.TTFTSLO, t.Seeds, b.Metric, b.Threshold, b.ScaleUpPods, b.ScaleUpPeriod, b.GPUHoursAfterWarmup, 100*b.SLOAfterWarmup, file, b.raw)
	return nil
}

// tuneGrid is the sweep: metrics × thresholds × scale-up policies.
type tuneGrid struct {
	metrics map[string][]float64
	order   []string
	ups     []scaleUp
}

// sweep simulates every configuration of the grid on o's trace and
// profile, t.Seeds seeds each, and returns them best first: those meeting
// the target by GPU-hours, then the rest by attainment, both after the
// warm-up and to the last arrival, as the benchmark scores a pipeline
// (before 2026-12-02 over the whole run: the warm-up's misses counted and
// the drain's GPU-hours charged, so a trace's best threshold was picked on
// other scores than it was compared on).
func (g tuneGrid) sweep(o *Options, t tuneOptions, base []byte) ([]Candidate, error) {
	var cands []Candidate
	for _, m := range g.order {
		for _, thr := range g.metrics[m] {
			for _, up := range g.ups {
				raw, err := variant(base, m, thr, up)
				if err != nil {
					return nil, err
				}
				c := Candidate{Metric: m, Threshold: thr, ScaleUpPods: up.pods, ScaleUpPeriod: up.period, raw: raw}
				var p90s []*float64
				reports := make([]*sim.Report, 0, t.Seeds)
				for s := range t.Seeds {
					o.soRaw = raw
					cfg, err := o.config(o.Seed + uint64(s))
					if err != nil {
						return nil, fmt.Errorf("%s threshold %g: %w", m, thr, err)
					}
					r, err := sim.Run(cfg)
					if err != nil {
						return nil, fmt.Errorf("%s threshold %g: %w", m, thr, err)
					}
					reports = append(reports, r)
					p90s = append(p90s, r.Pipelines[0].TTFTP90)
				}
				// As run and bench take the seeds: all scored after one
				// warm-up (a trace shorter than the default is scored
				// whole, and seeds either side of it were averaged, the
				// "after the warm-up" ranked by mostly whole runs), and
				// their mean the benchmark's, rounded to 1e-4 (unrounded,
				// six seeds of 100 % made 99.99999999999999 %, short of a
				// target of 100 %).
				if err := bench.SameWarmup(reports); err != nil {
					return nil, err
				}
				sc := bench.Mean(reports, 0)
				c.SLOAttainment, c.GPUHours, c.SLOAfterWarmup, c.GPUHoursAfterWarmup = sc.SLO, sc.GPUHours, sc.SLOAfterWarmup, sc.GPUHoursAfterWarmup
				c.TTFTP90 = meanOrNone(p90s)
				c.MeetsTarget = c.SLOAfterWarmup >= t.TargetSLO
				cands = append(cands, c)
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].MeetsTarget != cands[j].MeetsTarget {
			return cands[i].MeetsTarget
		}
		if cands[i].MeetsTarget {
			return cands[i].GPUHoursAfterWarmup < cands[j].GPUHoursAfterWarmup
		}
		return cands[i].SLOAfterWarmup > cands[j].SLOAfterWarmup
	})
	return cands, nil
}

// tuneSuite sweeps each trace × profile of a suite alone, with the suite's
// settings, writing --out/NAME-PROFILE.json (tune.json's form) for each
// and a line of its best configuration.
func tuneSuite(path string, o *Options, t tuneOptions, g tuneGrid, base []byte, stdout io.Writer) error {
	s, err := bench.Read(path)
	if err != nil {
		return err
	}
	runs, err := s.Runs()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return fmt.Errorf("create --out: %w", err)
	}
	o.Seed, o.TTFTSLO, o.Warmup, o.ClientTimeout = s.Seed, s.TTFTSLO.Duration, s.Warmup.Duration, s.ClientTimeout.Duration
	o.warmupSet = s.WarmupGiven() // as bench takes it (else the default: none for a short trace)
	o.CopyJitter, o.CopyLengths = s.CopyJitter.Duration, s.CopyLengths
	o.TermGrace, o.DropOnScaleDown = s.TerminationGrace.Duration, s.DropOnScaleDown
	o.WarmStart = s.StartsWarm() // as bench runs it
	if s.Balancer != "" {
		o.Balancer = s.Balancer
	}
	if s.HPAConfigurableTolerance != nil {
		o.ConfigTolerance = *s.HPAConfigurableTolerance // (it was left at the flag's)
	}
	for _, r := range runs {
		o.Trace, o.Profile, o.RateScale = r.Trace, r.Profile, r.RateScale
		cands, err := g.sweep(o, t, base)
		if err != nil {
			return fmt.Errorf("%s × %s: %w", r.Name, r.ProfileName, err)
		}
		// A file name of the suite's names, never a path out of --out.
		file := filepath.Join(o.Out, plot.FileName(r.Name+"-"+r.ProfileName)+".json")
		if err := writeJSON(file, cands); err != nil {
			return err
		}
		best := "none"
		if len(cands) > 0 {
			b := cands[0]
			best = fmt.Sprintf("%s %g, scale up %d pod/%ds: %.1f%% at %.2f GPU-hours after the warm-up", b.Metric, b.Threshold, b.ScaleUpPods, b.ScaleUpPeriod, 100*b.SLOAfterWarmup, b.GPUHoursAfterWarmup)
			if !b.MeetsTarget {
				best = fmt.Sprintf("none reaches %.1f%%; closest %s", 100*t.TargetSLO, best)
			}
		}
		fmt.Fprintf(stdout, "%s ×%g · %s: %s (%s)\n", r.Name, r.RateScale, r.ProfileName, best, file)
	}
	return nil
}
