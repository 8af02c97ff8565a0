// Package trace reads request traces and generates synthetic ones.
//
// Two file formats are read: the Azure LLM inference trace's
// (github.com/Azure/AzurePublicDataset), a CSV with the header
// TIMESTAMP,ContextTokens,GeneratedTokens, timestamps like
// "2023-11-16 18:15:46.6805900", optionally with a UTF-8 byte-order mark;
// and the Mooncake trace's (github.com/kvcache-ai/Mooncake), JSON lines with
// timestamp (milliseconds), input_length and output_length (a file whose
// name ends in .jsonl). Generators are written name:key=value,...:
//
//	poisson:rate=20,duration=1h
//	steps:rates=5/20/5,step=10m
//	bursts:base=5,peak=30,on=2m,off=8m,duration=1h
//	ramp:from=1,to=20,duration=1h
//	diurnal:min=2,max=20,duration=1h
//
// each with optional prompt=N,output=N (rates in requests per second; lengths
// in tokens; the defaults are the means of the shipped Azure trace), fixed
// unless lengths=lognormal, which draws each request's lengths from
// lognormals with those means and shape sigma (default 1).
package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Request is one request of a trace, at its offset from the trace's start.
type Request struct {
	At     time.Duration
	Prompt int
	Output int
}

// Defaults of generated requests: the means of the shipped Azure trace.
const (
	DefaultPrompt = 1155
	DefaultOutput = 211
)

// Bounds of a trace, read or generated (and of a rate scale applied to it:
// CheckScale): a run of more is refused before it is made, not left to
// run for days of virtual time or out of memory.
const (
	// MaxTokens: a request's prompt or output, in tokens (past any
	// model's context window).
	MaxTokens = 1 << 24
	// MaxSpan: from a trace's first request to its last.
	MaxSpan = 7 * 24 * time.Hour
	// MaxRequests: the requests of a trace, after its rate scale.
	MaxRequests = 10_000_000
)

// CheckScale says whether n requests at scale times their rate stay
// within MaxRequests, and that scale is a rate scale at all (above 0).
func CheckScale(n int, scale float64) error {
	if !(scale > 0) || math.IsInf(scale, 0) {
		return fmt.Errorf("rate scale %v: want a number above 0", scale)
	}
	if float64(n)*scale > MaxRequests {
		return fmt.Errorf("rate scale %v: %d requests become about %.3g, past the %d a run may have", scale, n, float64(n)*scale, MaxRequests)
	}
	return nil
}

// Name is how reports name a trace: a file's base name, or a generator's
// whole spec.
func Name(spec string) string {
	if name, _, ok := strings.Cut(spec, ":"); ok && isGenerator(name) {
		return spec
	}
	return filepath.Base(spec)
}

// Load reads a trace file, or generates one from a generator spec; seed
// drives the generators.
func Load(spec string, seed uint64) ([]Request, error) {
	if name, args, ok := strings.Cut(spec, ":"); ok && isGenerator(name) {
		return Generate(name, args, seed)
	}
	f, err := os.Open(spec)
	if err != nil {
		return nil, fmt.Errorf("trace %q: neither a file nor a generator (%s): %w", spec, strings.Join(generators, ":, ")+":", err)
	}
	defer func() { _ = f.Close() }() // read only
	read := ReadAzure
	if strings.HasSuffix(spec, ".jsonl") {
		read = ReadMooncake
	}
	reqs, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", spec, err)
	}
	return reqs, nil
}

var generators = []string{"poisson", "steps", "bursts", "ramp", "diurnal"}

func isGenerator(name string) bool { return slices.Contains(generators, name) }

const timeLayout = "2006-01-02 15:04:05.9999999"

// ReadAzure reads the Azure LLM inference trace format. Times become offsets
// from the first request; rows are sorted by time. Every bad row is reported.
func ReadAzure(r io.Reader) ([]Request, error) {
	br := bufio.NewReader(r)
	if b, err := br.Peek(3); err == nil && bytes.Equal(b, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = br.Discard(3)
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = 3
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	if strings.Join(header, ",") != "TIMESTAMP,ContextTokens,GeneratedTokens" {
		return nil, fmt.Errorf("header %q: want TIMESTAMP,ContextTokens,GeneratedTokens", strings.Join(header, ","))
	}
	type row struct {
		t      time.Time
		p, out int
	}
	var rows []row
	var errs []error
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, err) // a csv.ParseError names its line
			continue
		}
		// The record's own line: counting records, blank lines (which
		// the reader skips) put a bad row's number before it.
		line, _ := cr.FieldPos(0)
		t, err1 := time.Parse(timeLayout, rec[0])
		p, err2 := strconv.Atoi(rec[1])
		o, err3 := strconv.Atoi(rec[2])
		if err := errors.Join(err1, err2, err3); err != nil || p < 0 || o < 0 || p > MaxTokens || o > MaxTokens {
			errs = append(errs, fmt.Errorf("line %d: %q: want a timestamp and two token counts (0 to %d)", line, strings.Join(rec, ","), MaxTokens))
		} else {
			rows = append(rows, row{t, p, o})
		}
		if len(errs) > 20 {
			errs = append(errs, errors.New("(the listing stops at 21 bad lines)"))
			break
		}
		if len(rows) > MaxRequests {
			return nil, fmt.Errorf("more than %d requests", MaxRequests)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(rows) == 0 {
		return nil, errors.New("no requests")
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].t.Before(rows[j].t) })
	if first, last := rows[0].t, rows[len(rows)-1].t; last.After(first.Add(MaxSpan)) {
		return nil, fmt.Errorf("the requests span %s to %s, past the %s a trace may span", first.Format(timeLayout), last.Format(timeLayout), MaxSpan)
	}
	out := make([]Request, len(rows))
	for i, rw := range rows {
		out[i] = Request{At: rw.t.Sub(rows[0].t), Prompt: rw.p, Output: max(rw.out, 1)}
	}
	return out, nil
}

// ReadMooncake reads the Mooncake trace format: one JSON object a line with
// timestamp (milliseconds from the start), input_length and output_length
// (other fields, such as hash_ids, are ignored). Times become offsets from
// the first request; rows are sorted by time. Every bad line is reported.
func ReadMooncake(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	type row struct {
		Timestamp    *float64 `json:"timestamp"`
		InputLength  *int     `json:"input_length"`
		OutputLength *int     `json:"output_length"`
	}
	var out []Request
	var errs []error
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			// A byte-order mark, as the Azure reader takes it.
			b = bytes.TrimPrefix(b, []byte{0xEF, 0xBB, 0xBF})
		}
		if len(b) == 0 {
			continue
		}
		var rw row
		if err := json.Unmarshal(b, &rw); err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", line, err))
		} else if rw.Timestamp == nil || rw.InputLength == nil || rw.OutputLength == nil ||
			!(*rw.Timestamp >= 0 && *rw.Timestamp <= float64(MaxSpan.Milliseconds())) ||
			*rw.InputLength < 0 || *rw.OutputLength < 0 || *rw.InputLength > MaxTokens || *rw.OutputLength > MaxTokens {
			errs = append(errs, fmt.Errorf("line %d: want timestamp (0 to %d ms), input_length and output_length (0 to %d)", line, MaxSpan.Milliseconds(), MaxTokens))
		} else {
			out = append(out, Request{At: time.Duration(*rw.Timestamp * float64(time.Millisecond)), Prompt: *rw.InputLength, Output: max(*rw.OutputLength, 1)})
		}
		if len(errs) > 20 {
			errs = append(errs, errors.New("(the listing stops at 21 bad lines)"))
			break
		}
		if len(out) > MaxRequests {
			return nil, fmt.Errorf("more than %d requests", MaxRequests)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(out) == 0 {
		return nil, errors.New("no requests")
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	first := out[0].At
	for i := range out {
		out[i].At -= first
	}
	return out, nil
}

// Generate makes a synthetic trace.
func Generate(name, args string, seed uint64) ([]Request, error) {
	kv := map[string]string{}
	for _, a := range strings.Split(args, ",") {
		if a == "" {
			continue
		}
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not key=value", name, a)
		}
		if _, twice := kv[k]; twice {
			// The last one was taken, without a word.
			return nil, fmt.Errorf("%s: %s given twice", name, k)
		}
		kv[k] = v
	}
	g := gen{kv: kv, rng: rand.New(rand.NewPCG(seed, 0x7ace))}
	prompt, output := g.int("prompt", DefaultPrompt), g.int("output", DefaultOutput)
	lengths := g.str("lengths", "fixed")
	sigma := g.float("sigma", 1)
	if lengths != "fixed" && lengths != "lognormal" {
		g.errs = append(g.errs, fmt.Errorf("lengths %q: fixed or lognormal", lengths))
	}
	if sigma <= 0 || sigma > 4 {
		g.errs = append(g.errs, errors.New("sigma: want a number above 0 and at most 4"))
	}
	rate, dur, ok := g.shape(name)
	if !ok {
		return nil, fmt.Errorf("unknown generator %q: %s", name, strings.Join(generators, ", "))
	}
	if dur > MaxSpan {
		g.errs = append(g.errs, fmt.Errorf("a duration of %s, past the %s a trace may span", dur, MaxSpan))
	}
	for k := range kv {
		if !g.used[k] {
			g.errs = append(g.errs, fmt.Errorf("unknown key %q", k))
		}
	}
	if len(g.errs) > 0 {
		return nil, fmt.Errorf("%s: %w", name, errors.Join(g.errs...))
	}
	// A non-homogeneous Poisson process, by thinning at the peak rate:
	// the most the rate is at a whole second, or a stepped generator's
	// highest level, which a step or burst shorter than a second may hold
	// between two (bursts of 500 ms were generated at the base rate).
	peak := g.ceiling
	for t := time.Duration(0); t < dur; t += time.Second {
		peak = math.Max(peak, rate(t))
	}
	if n := peak * dur.Seconds(); n > MaxRequests {
		return nil, fmt.Errorf("%s: up to %.3g requests (a peak of %g a second for %s), past the %d a trace may have", name, n, peak, dur, MaxRequests)
	}
	var out []Request
	if peak <= 0 {
		return out, nil
	}
	for t := 0.0; ; {
		t += g.rng.ExpFloat64() / peak
		at := time.Duration(t * float64(time.Second))
		if at >= dur {
			break
		}
		if g.rng.Float64() < rate(at)/peak {
			p, o := prompt, output
			if g.mix != nil {
				mp, mo := g.mix(at)
				p, o = cmp.Or(mp, p), cmp.Or(mo, o)
			}
			r := Request{At: at, Prompt: p, Output: o}
			if lengths == "lognormal" {
				r.Prompt, r.Output = lognormal(g.rng, p, sigma), lognormal(g.rng, o, sigma)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// shape reads a generator's keys: its rate over time and its duration;
// false for a generator of another name.
func (g *gen) shape(name string) (rate func(t time.Duration) float64, dur time.Duration, ok bool) {
	switch name {
	case "poisson":
		r := g.float("rate", -1)
		dur = g.dur("duration", time.Hour)
		rate = func(time.Duration) float64 { return r }
	case "steps":
		var levels []float64
		for _, s := range strings.Split(g.str("rates", ""), "/") {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || !(v >= 0) || math.IsInf(v, 0) {
				g.errs = append(g.errs, fmt.Errorf("rates: %q is not a rate", s))
			}
			levels = append(levels, v)
		}
		step := g.dur("step", 10*time.Minute)
		if step > MaxSpan/time.Duration(len(levels)) {
			g.errs = append(g.errs, fmt.Errorf("%d steps of %s, past the %s a trace may span", len(levels), step, MaxSpan))
			step = 0
		}
		dur = step * time.Duration(len(levels))
		at := func(t time.Duration) int { return min(int(t/step), len(levels)-1) }
		rate = func(t time.Duration) float64 { return levels[at(t)] }
		g.ceiling = slices.Max(levels)
		g.stepLengths(len(levels), at)
	case "bursts":
		base, peak := g.float("base", -1), g.float("peak", -1)
		on, off := g.dur("on", 2*time.Minute), g.dur("off", 8*time.Minute)
		dur = g.dur("duration", time.Hour)
		rate = func(t time.Duration) float64 {
			if t%(on+off) >= off {
				return peak
			}
			return base
		}
		g.ceiling = max(base, peak)
	case "ramp":
		from, to := g.float("from", -1), g.float("to", -1)
		dur = g.dur("duration", time.Hour)
		rate = func(t time.Duration) float64 { return from + (to-from)*float64(t)/float64(dur) }
	case "diurnal":
		// One day's swing compressed into duration: the trough at the
		// start and end, the peak in the middle.
		lo, hi := g.float("min", -1), g.float("max", -1)
		dur = g.dur("duration", time.Hour)
		rate = func(t time.Duration) float64 {
			return lo + (hi-lo)*(1-math.Cos(2*math.Pi*float64(t)/float64(dur)))/2
		}
	default:
		return nil, 0, false
	}
	return rate, dur, true
}

// stepLengths reads a steps generator's optional per-step means of the
// prompt and output lengths (prompts=A/B/…, outputs=A/B/…, one a step):
// a mix that changes at a step, as when a new use comes to a model. With
// either, g.mix gives a request's means from its step (at: the step's
// index at a time), 0 for the one not given (the prompt or output key's).
func (g *gen) stepLengths(steps int, at func(time.Duration) int) {
	prompts := g.lengthsEach("prompts", "prompt", steps)
	outputs := g.lengthsEach("outputs", "output", steps)
	if prompts == nil && outputs == nil {
		return
	}
	g.mix = func(t time.Duration) (p, o int) {
		i := at(t)
		if prompts != nil {
			p = prompts[i]
		}
		if outputs != nil {
			o = outputs[i]
		}
		return p, o
	}
}

// lengthsEach reads key's slash-separated means, one for each of steps,
// refused beside the single mean's key (one): nil when key is not given
// or refused.
func (g *gen) lengthsEach(key, one string, steps int) []int {
	v, ok := g.opt(key)
	if !ok {
		return nil
	}
	if _, both := g.kv[one]; both {
		g.errs = append(g.errs, fmt.Errorf("%s and %s: give one", one, key))
	}
	parts := strings.Split(v, "/")
	if len(parts) != steps {
		g.errs = append(g.errs, fmt.Errorf("%s: %d lengths for %d steps", key, len(parts), steps))
		return nil
	}
	out := make([]int, steps)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > MaxTokens {
			g.errs = append(g.errs, fmt.Errorf("%s: %q is not a whole number from 1 to %d", key, p, MaxTokens))
			return nil
		}
		out[i] = n
	}
	return out
}

// lognormal draws a whole number of at least 1 from a lognormal of the
// given mean and shape: exp(N(ln mean - sigma²/2, sigma²)).
func lognormal(rng *rand.Rand, mean int, sigma float64) int {
	mu := math.Log(float64(mean)) - sigma*sigma/2
	return max(1, int(math.Round(math.Exp(mu+sigma*rng.NormFloat64()))))
}

type gen struct {
	kv   map[string]string
	used map[string]bool
	rng  *rand.Rand
	errs []error
	// ceiling: a stepped generator's highest rate (shape's), 0 for others
	ceiling float64
	// mix: a request's prompt and output means at its time, where they
	// change by step (stepLengths); nil: the prompt and output keys'
	mix func(time.Duration) (prompt, output int)
}

func (g *gen) str(k, def string) string {
	if v, ok := g.opt(k); ok {
		return v
	}
	if def == "" {
		g.errs = append(g.errs, fmt.Errorf("%s is required", k))
	}
	return def
}

// opt reads optional key k, known to the generator (never unknown),
// and whether it was given.
func (g *gen) opt(k string) (string, bool) {
	if g.used == nil {
		g.used = map[string]bool{}
	}
	g.used[k] = true
	v, ok := g.kv[k]
	return v, ok
}

func (g *gen) float(k string, def float64) float64 {
	d := ""
	if def >= 0 {
		d = strconv.FormatFloat(def, 'g', -1, 64)
	}
	v, err := strconv.ParseFloat(g.str(k, d), 64)
	if err != nil || !(v >= 0) || math.IsInf(v, 0) {
		g.errs = append(g.errs, fmt.Errorf("%s: want a number of at least 0", k))
		return 0
	}
	return v
}

func (g *gen) int(k string, def int) int {
	v, err := strconv.Atoi(g.str(k, strconv.Itoa(def)))
	if err != nil || v < 1 || v > MaxTokens {
		g.errs = append(g.errs, fmt.Errorf("%s: want a whole number from 1 to %d", k, MaxTokens))
		return 1
	}
	return v
}

func (g *gen) dur(k string, def time.Duration) time.Duration {
	v, err := time.ParseDuration(g.str(k, def.String()))
	if err != nil || v <= 0 {
		g.errs = append(g.errs, fmt.Errorf("%s: want a duration such as 10m", k))
	}
	return v
}

// Copies says how Densify places and sizes the copies of a request.
type Copies struct {
	// Jitter: each copy falls uniformly within ±Jitter/2 of its original
	// (reflected into the trace's span), so copies are not in lockstep.
	Jitter time.Duration
	// Resample: each copy's prompt and output lengths are those of a
	// request drawn at random from the trace (its own joint distribution);
	// false keeps the original's.
	Resample bool
}

// Coherent is pulse-sim's first way of copying: every copy within a second
// after its original, with its lengths (bursts grow in lockstep).
var Coherent = Copies{Jitter: time.Second}

// Densify returns the trace at scale times its rate over the same time span,
// copies placed as Coherent says.
func Densify(reqs []Request, scale float64, seed uint64) []Request {
	return DensifyWith(reqs, scale, seed, Coherent)
}

// reflectInto folds t into [0, end] as a reflection at both ends, as
// often as it takes: clamping piled the copies that fell outside on the
// span's first and last instants, a burst only the clairvoyant saw coming;
// reflected once, then clamped, a jitter longer than the span still piled
// them (a 100-hour jitter on an hour's trace put 34,571 of its 54,027
// requests at its first instant: found in a review, 2026-12-05).
func reflectInto(t, end time.Duration) time.Duration {
	if end <= 0 {
		return 0
	}
	t %= 2 * end
	if t < 0 {
		t += 2 * end
	}
	if t > end {
		t = 2*end - t
	}
	return t
}

// DensifyWith returns the trace at scale times its rate over the same time
// span: each request is kept floor(scale) times, and once more with
// probability frac(scale); the original keeps its time and lengths, the
// copies are placed and sized as c says. Jitter well under the bursts'
// length keeps the per-minute shape. scale < 1 thins it.
func DensifyWith(reqs []Request, scale float64, seed uint64, c Copies) []Request {
	if scale == 1 || len(reqs) == 0 {
		return reqs
	}
	rng := rand.New(rand.NewPCG(seed, 0xde75e))
	whole, frac := math.Floor(scale), scale-math.Floor(scale)
	end := reqs[len(reqs)-1].At
	out := make([]Request, 0, int(float64(len(reqs))*scale)+1)
	for _, r := range reqs {
		n := int(whole)
		if rng.Float64() < frac {
			n++
		}
		for i := range n {
			cp := r
			if i > 0 {
				if c == Coherent {
					cp.At += time.Duration(rng.Float64() * float64(time.Second))
				} else {
					cp.At = reflectInto(cp.At+time.Duration((rng.Float64()-0.5)*float64(c.Jitter)), end)
				}
				if c.Resample {
					o := reqs[rng.IntN(len(reqs))]
					cp.Prompt, cp.Output = o.Prompt, o.Output
				}
			}
			out = append(out, cp)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Rate returns the requests per second of a trace over windows of width w.
func Rate(reqs []Request, w time.Duration) []float64 {
	if len(reqs) == 0 {
		return nil
	}
	out := make([]float64, int(reqs[len(reqs)-1].At/w)+1)
	for _, r := range reqs {
		out[int(r.At/w)]++
	}
	for i := range out {
		out[i] /= w.Seconds()
	}
	return out
}
