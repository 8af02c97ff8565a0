// Package bench is pulse-sim's benchmark: a suite of traces × profiles ×
// ScaledObjects × seeds run as one command, every pipeline scored next to
// the static-fleet and clairvoyant frontiers, written as a scoreboard.
package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pulse-io/pulse/pkg/sim"
	"github.com/pulse-io/pulse/pkg/sim/replica"
	"github.com/pulse-io/pulse/pkg/sim/trace"
)

// Suite is a benchmark suite (YAML). Paths are relative to the suite file.
type Suite struct {
	// Seeds: each case runs seeds Seed … Seed+Seeds-1 (default 1 and 3).
	Seed  uint64 `json:"seed"`
	Seeds int    `json:"seeds"`
	// Traces, each at its rate multiple (per profile where it differs).
	Traces []TraceCase `json:"traces"`
	// Profiles: shipped names or profile files.
	Profiles []string `json:"profiles"`
	// ScaledObjects: the ScaledObject files whose pipelines are scored.
	ScaledObjects []string `json:"scaledObjects"`
	// Pipelines: the signal pipelines (default: every one that can express
	// each ScaledObject's trigger), and any hindsight reference, scored as
	// they are. static:1 … maxReplicaCount and the clairvoyant sweep are
	// always added.
	Pipelines []string `json:"pipelines"`
	// Clairvoyant: the sweep that traces its frontier.
	Clairvoyant Sweep `json:"clairvoyant"`
	// The run's settings, as pulse-sim run's flags.
	TTFTSLO       replica.Duration `json:"ttftSlo"`
	Warmup        replica.Duration `json:"warmup"`
	warmupDefault bool             // warmup was 0: the default, none for a trace shorter than it
	ClientTimeout replica.Duration `json:"clientTimeout"`
	Balancer      string           `json:"balancer"`
	// TerminationGrace: as pulse-sim run's --termination-grace (0: a
	// replica removed finishes every request it holds).
	TerminationGrace replica.Duration `json:"terminationGrace"`
	// DropOnScaleDown: as pulse-sim run's --drop-on-scale-down: a replica
	// removed drops the requests it holds, as stock vLLM does at SIGTERM
	// (its --shutdown-timeout is 0 by default). Default false: it
	// finishes them (within TerminationGrace).
	DropOnScaleDown bool `json:"dropOnScaleDown"`
	// Copies: how rateScale copies requests (default: 30 s jitter,
	// lengths resampled).
	CopyJitter  replica.Duration `json:"copyJitter"`
	CopyLengths string           `json:"copyLengths"`
	// HPAConfigurableTolerance: the HPA honours a behaviour's per-direction
	// tolerance (Kubernetes' HPAConfigurableTolerance feature gate, alpha
	// and off by default in 1.33); default true, as pulse-sim run's flag.
	// false: the global 10 % applies, as on a default cluster.
	HPAConfigurableTolerance *bool `json:"hpaConfigurableTolerance"`
	// WarmStart: as pulse-sim run's --warm-start; default true: every
	// pipeline starts warm, as its references do. false: the signal
	// pipelines start at the HPA's minimum, as the scoreboards before
	// 2026-12-02 did (which differ too in the startups a warm fleet drew
	// and in which of two replicas created at once a scale-down removed).
	WarmStart *bool `json:"warmStart"`

	// Set by the caller (pulse-sim bench's flags), not the suite file:
	// NoReferences scores the pipelines alone — no fixed fleets, switches
	// or clairvoyant sweep, so no frontier and no distance to one — and
	// Metric, when set, runs only the ScaledObjects whose trigger asks for
	// that metric. The references do not depend on any pipeline, so two
	// builds of the planner are compared by its pipeline alone, in minutes
	// where the whole suite takes hours (docs/simulation/planner-ab.py).
	NoReferences bool   `json:"-"`
	Metric       string `json:"-"`
	// StaticOnly runs the fixed fleets alone of the references (static:1
	// … maxReplicaCount: no switch, no clairvoyant sweep): the static
	// frontier and each pipeline's distance to it, which the goal of the
	// planner is stated against, at a small part of the sweep's cost, and
	// no clairvoyant frontier (ignored with NoReferences).
	StaticOnly bool `json:"-"`

	dir string
}

// TraceCase is one trace of the suite.
type TraceCase struct {
	// Name in the scoreboard (default: the trace's).
	Name string `json:"name"`
	// Trace: a file (Azure CSV or Mooncake JSONL) or a generator spec.
	Trace string `json:"trace"`
	// RateScale: the multiple of its rate (default 1); ByProfile overrides
	// it for a profile.
	RateScale float64            `json:"rateScale"`
	ByProfile map[string]float64 `json:"rateScaleByProfile"`
}

// scale is the trace's rate multiple for a profile, as the suite writes it
// (a shipped name, or a file's path): rateScaleByProfile's keys are
// checked against those.
func (tc TraceCase) scale(profile string) float64 {
	if v, ok := tc.ByProfile[profile]; ok {
		return v
	}
	return tc.RateScale
}

// Sweep is the clairvoyant family's parameter grid: a clairvoyant plan for
// every utilisation × window × hold (0: none), and with Hindsight a
// hindsight plan for each too (0: its default hold), as members of the
// family rather than pipelines scored against it.
type Sweep struct {
	Utilisations []float64          `json:"utilisations"`
	Windows      []replica.Duration `json:"windows"`
	Holds        []replica.Duration `json:"holds"`
	Hindsight    bool               `json:"hindsight"`
	// Switches: the fractions of the scored window at which a switch plan
	// goes from each fleet size to the next, and back (References); none
	// named: DefaultSwitches.
	Switches []float64 `json:"switches"`
}

// Defaults of a suite.
var (
	DefaultUtilisations = []float64{0.25, 0.35, 0.5, 0.7, 0.85, 1, 1.25, 1.5, 2, 3}
	DefaultWindows      = []time.Duration{10 * time.Second, time.Minute}
	DefaultHolds        = []time.Duration{0}
	DefaultSwitches     = []float64{0.25, 0.5, 0.75}
)

// DefaultCopyJitter is how far rateScale copies spread by default.
const DefaultCopyJitter = 30 * time.Second

// Read reads and checks a suite file.
func Read(path string) (*Suite, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read suite: %w", err)
	}
	var s Suite
	if err := yaml.UnmarshalStrict(raw, &s); err != nil {
		return nil, fmt.Errorf("suite %s: %w", path, err)
	}
	s.dir = filepath.Dir(path)
	if err := s.complete(); err != nil {
		return nil, fmt.Errorf("suite %s: %w", path, err)
	}
	return &s, nil
}

func (s *Suite) complete() error {
	var errs []error
	if s.Seed == 0 {
		s.Seed = 1
	}
	if s.Seeds == 0 {
		s.Seeds = 3
	}
	if s.Seeds < 1 || s.Seeds > 100 {
		errs = append(errs, fmt.Errorf("seeds %d: from 1 to 100", s.Seeds))
	}
	if len(s.Traces) == 0 || len(s.Profiles) == 0 || len(s.ScaledObjects) == 0 {
		errs = append(errs, errors.New("traces, profiles and scaledObjects each need at least one entry"))
	}
	errs = append(errs, s.completeTraces()...)
	errs = append(errs, s.Clairvoyant.complete()...)
	if s.TTFTSLO.Duration < 0 || s.Warmup.Duration < 0 {
		errs = append(errs, fmt.Errorf("ttftSlo %s and warmup %s: want 0 (the default) or more", s.TTFTSLO.Duration, s.Warmup.Duration))
	}
	if s.TTFTSLO.Duration == 0 {
		s.TTFTSLO.Duration = 2 * time.Second
	}
	if s.Warmup.Duration == 0 {
		s.Warmup.Duration, s.warmupDefault = sim.DefaultWarmup, true
	}
	if s.CopyJitter.Duration == 0 {
		s.CopyJitter.Duration = DefaultCopyJitter
	}
	if s.CopyLengths == "" {
		s.CopyLengths = "resample"
	}
	if s.CopyLengths != "resample" && s.CopyLengths != "same" {
		errs = append(errs, fmt.Errorf("copyLengths %q: resample or same", s.CopyLengths))
	}
	if s.CopyJitter.Duration < 0 {
		errs = append(errs, fmt.Errorf("copyJitter %s: want 0 (the default) or more, as run's --copy-jitter", s.CopyJitter.Duration))
	}
	switch s.Balancer {
	case "", sim.BalanceRoundRobin, sim.BalanceLeastOutstanding, sim.BalanceGateway:
	default:
		errs = append(errs, fmt.Errorf("balancer %q: %s, %s or %s", s.Balancer, sim.BalanceRoundRobin, sim.BalanceLeastOutstanding, sim.BalanceGateway))
	}
	errs = append(errs, s.checkPipelines()...)
	return errors.Join(errs...)
}

// checkInputs reads every profile, ScaledObject (and its trigger) and
// trace (checkTrace: every seed's) the suite names, before any case runs,
// naming each bad one: a
// bad file was found only when its case came, after the cases before it
// had run, and nothing was written; a bad ScaledObject was named by its
// metadata name, which two files may share.
func (s *Suite) checkInputs() error {
	var errs []error
	for _, prof := range s.Profiles {
		if _, err := replica.Load(s.profilePath(prof)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, path := range s.ScaledObjects {
		so, err := sim.ReadScaledObject(s.path(path))
		if err == nil {
			_, err = sim.TriggerMetric(so) // its trigger's metadata, as pulse parses it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	for _, tc := range s.Traces {
		errs = append(errs, s.checkTrace(tc))
	}
	return errors.Join(errs...)
}

// checkTrace loads tc's trace for every seed, at each rate scale the
// suite's profiles give it, as runCase does, and refuses it when the seeds
// fall either side of the default warm-up (bench.SameWarmup would refuse
// it at its case, after the cases before it had run), or when a warm-up
// given leaves nothing of one to score (run refuses it there): a scale
// thins or copies a trace by its seed, moving its last arrival. (With a
// warm-up given, the first seed's trace alone was loaded: a bad case
// failed after the cases before it had run, hours on a real suite.)
func (s *Suite) checkTrace(tc TraceCase) error {
	var scales []float64 // sorted, so that an error names the same scale each run
	for _, prof := range s.Profiles {
		scales = append(scales, tc.scale(prof))
	}
	slices.Sort(scales)
	scales = slices.Compact(scales)
	within, past := map[float64][]uint64{}, map[float64][]uint64{}
	for i := range s.Seeds {
		seed := s.Seed + uint64(i)
		reqs, err := trace.Load(s.path(tc.Trace), seed)
		if err != nil {
			return fmt.Errorf("%s: %w", tc.Name, err)
		}
		for _, scale := range scales {
			// As runCase: a scale past what a run may hold is refused
			// before the copies are made (made first, a large trace at
			// ×1000 asked for gigabytes here).
			if err := trace.CheckScale(len(reqs), scale); err != nil {
				return fmt.Errorf("%s at ×%g: %w", tc.Name, scale, err)
			}
			scaled := trace.DensifyWith(reqs, scale, seed, trace.Copies{Jitter: s.CopyJitter.Duration, Resample: s.CopyLengths == "resample"})
			if !s.warmupDefault {
				if len(scaled) > 0 && scaled[len(scaled)-1].At <= s.Warmup.Duration {
					return fmt.Errorf("%s at ×%g, seed %d: the warm-up (%s) leaves nothing of the trace (its last request arrives at %s) to score: shorten it or use a longer trace", tc.Name, scale, seed, s.Warmup.Duration, scaled[len(scaled)-1].At)
				}
				continue
			}
			if len(scaled) > 0 && scaled[len(scaled)-1].At <= s.Warmup.Duration {
				within[scale] = append(within[scale], seed)
			} else {
				past[scale] = append(past[scale], seed)
			}
			if w, p := within[scale], past[scale]; len(w) > 0 && len(p) > 0 {
				return fmt.Errorf("%s at ×%g: seed %d's trace ends within the default warm-up (%s), and is scored whole, and seed %d's past it: give a warm-up every seed's trace passes", tc.Name, scale, w[0], s.Warmup.Duration, p[0])
			}
		}
	}
	return nil
}

// SetPipelines replaces the suite's pipelines (pulse-sim bench
// --pipelines), refused as the suite file's are.
func (s *Suite) SetPipelines(ps []string) error {
	if len(ps) == 0 {
		return errors.New("pipelines: none named")
	}
	s.Pipelines = ps
	return errors.Join(s.checkPipelines()...)
}

// checkPipelines refuses the references among the pipelines: the suite
// adds them itself.
func (s *Suite) checkPipelines() []error {
	var errs []error
	sweep := s.Clairvoyant.Names()
	for _, p := range s.Pipelines {
		if k, ref := sim.Reference(p); ref && k != "hindsight" || inSweep(sweep, p) {
			errs = append(errs, fmt.Errorf("pipelines: %s is added by the suite itself (static:1…max, the switches between them, the clairvoyant sweep)", p))
		}
	}
	return errs
}

// completeTraces names each trace and sets its rate scale where the suite
// left them, and checks them.
func (s *Suite) completeTraces() []error {
	var errs []error
	names := map[string]bool{}
	for i := range s.Traces {
		tc := &s.Traces[i]
		if tc.Trace == "" {
			errs = append(errs, fmt.Errorf("traces[%d]: trace is required", i))
			continue
		}
		if tc.Name == "" {
			tc.Name = trace.Name(tc.Trace)
		}
		if names[tc.Name] {
			errs = append(errs, fmt.Errorf("traces[%d]: name %q used twice", i, tc.Name))
		}
		names[tc.Name] = true
		if tc.RateScale == 0 {
			tc.RateScale = 1
		}
		for _, v := range append([]float64{tc.RateScale}, values(tc.ByProfile)...) {
			if v <= 0 || v > 1000 {
				errs = append(errs, fmt.Errorf("traces[%d] (%s): rate scale %g: above 0, at most 1000", i, tc.Name, v))
			}
		}
		for p := range tc.ByProfile {
			if !slices.Contains(s.Profiles, p) {
				errs = append(errs, fmt.Errorf("traces[%d] (%s): rateScaleByProfile names %q, not one of the suite's profiles", i, tc.Name, p))
			}
		}
	}
	return errs
}

// complete fills what the sweep left out with DefaultSweep's, and checks
// its holds.
func (sw *Sweep) complete() []error {
	def := DefaultSweep()
	if len(sw.Utilisations) == 0 {
		sw.Utilisations = def.Utilisations
	}
	if len(sw.Windows) == 0 {
		sw.Windows = def.Windows
	}
	if len(sw.Holds) == 0 {
		sw.Holds = def.Holds
	}
	if len(sw.Switches) == 0 {
		sw.Switches = def.Switches
	}
	var errs []error
	for i, f := range sw.Switches {
		if !(f > 0 && f < 1) {
			errs = append(errs, fmt.Errorf("clairvoyant.switches: %g: want a fraction of the scored window above 0 and below 1", f))
		}
		if slices.Contains(sw.Switches[:i], f) {
			errs = append(errs, fmt.Errorf("clairvoyant.switches: %g is named twice", f))
		}
	}
	for _, h := range sw.Holds {
		if h.Duration != 0 && (h.Duration < time.Second || h.Duration > 24*time.Hour) {
			errs = append(errs, fmt.Errorf("clairvoyant.holds: %s: 0 (none), or from 1s to 24h", h.Duration))
		}
	}
	return errs
}

// Run is one trace × profile of a suite, as pulse-sim run's settings: the
// trace (a file path resolved against the suite, or a generator), the
// profile (a shipped name or a resolved file) and the rate multiple for
// that profile.
type Run struct {
	Name        string // the trace's name in the suite
	Trace       string
	Profile     string
	ProfileName string // the profile's own name (the name: field of a file)
	RateScale   float64
}

// Runs lists the suite's traces × profiles, in the suite's order.
func (s *Suite) Runs() ([]Run, error) {
	names := make([]string, len(s.Profiles)) // each profile's own name, read once
	for i, prof := range s.Profiles {
		p, err := replica.Load(s.profilePath(prof))
		if err != nil {
			return nil, err
		}
		names[i] = p.Name
	}
	var out []Run
	for _, tc := range s.Traces {
		for i, prof := range s.Profiles {
			out = append(out, Run{Name: tc.Name, Trace: s.path(tc.Trace), Profile: s.profilePath(prof), ProfileName: names[i], RateScale: tc.scale(prof)})
		}
	}
	return out, nil
}

// path resolves a file named by the suite (a generator spec is kept).
func (s *Suite) path(p string) string {
	if name, _, ok := strings.Cut(p, ":"); ok && !strings.ContainsAny(name, "/.") {
		return p // a generator
	}
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(s.dir, p)
}

// profilePath: a shipped profile's name, or a file relative to the suite.
func (s *Suite) profilePath(p string) string {
	if slices.Contains(replica.Shipped(), p) {
		return p
	}
	return s.path(p)
}

func values(m map[string]float64) []float64 {
	var out []float64
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
