// Package trace reads request traces and generates synthetic ones.
//
// The trace format is the Azure LLM inference trace's
// (github.com/Azure/AzurePublicDataset): a CSV with the header
// TIMESTAMP,ContextTokens,GeneratedTokens, timestamps like
// "2023-11-16 18:15:46.6805900", optionally with a UTF-8 byte-order mark.
// Generators are written name:key=value,...:
//
//	poisson:rate=20,duration=1h[,prompt=1155,output=211]
//	steps:rates=5/20/5,step=10m[,prompt=...,output=...]
//	bursts:base=5,peak=30,on=2m,off=8m,duration=1h[,prompt=...,output=...]
//
// (rates in requests per second; lengths in tokens, fixed; the defaults are
// the means of the shipped Azure trace).
package trace

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
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
		return nil, fmt.Errorf("trace %q: neither a file nor a generator (poisson:, steps:, bursts:): %w", spec, err)
	}
	defer func() { _ = f.Close() }() // read only
	reqs, err := ReadAzure(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", spec, err)
	}
	return reqs, nil
}

func isGenerator(name string) bool { return name == "poisson" || name == "steps" || name == "bursts" }

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
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", line, err))
			continue
		}
		t, err1 := time.Parse(timeLayout, rec[0])
		p, err2 := strconv.Atoi(rec[1])
		o, err3 := strconv.Atoi(rec[2])
		if err := errors.Join(err1, err2, err3); err != nil || p < 0 || o < 0 {
			errs = append(errs, fmt.Errorf("line %d: %q: want a timestamp and two token counts", line, strings.Join(rec, ",")))
			continue
		}
		rows = append(rows, row{t, p, o})
		if len(errs) > 20 {
			break
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(rows) == 0 {
		return nil, errors.New("no requests")
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].t.Before(rows[j].t) })
	out := make([]Request, len(rows))
	for i, rw := range rows {
		out[i] = Request{At: rw.t.Sub(rows[0].t), Prompt: rw.p, Output: max(rw.out, 1)}
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
		kv[k] = v
	}
	g := gen{kv: kv, rng: rand.New(rand.NewPCG(seed, 0x7ace))}
	prompt, output := g.int("prompt", DefaultPrompt), g.int("output", DefaultOutput)
	var rate func(t time.Duration) float64
	var dur time.Duration
	switch name {
	case "poisson":
		r := g.float("rate", -1)
		dur = g.dur("duration", time.Hour)
		rate = func(time.Duration) float64 { return r }
	case "steps":
		var levels []float64
		for _, s := range strings.Split(g.str("rates", ""), "/") {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v < 0 {
				g.errs = append(g.errs, fmt.Errorf("rates: %q is not a rate", s))
			}
			levels = append(levels, v)
		}
		step := g.dur("step", 10*time.Minute)
		dur = step * time.Duration(len(levels))
		rate = func(t time.Duration) float64 { return levels[min(int(t/step), len(levels)-1)] }
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
	default:
		return nil, fmt.Errorf("unknown generator %q: poisson, steps or bursts", name)
	}
	for k := range kv {
		if !g.used[k] {
			g.errs = append(g.errs, fmt.Errorf("unknown key %q", k))
		}
	}
	if len(g.errs) > 0 {
		return nil, fmt.Errorf("%s: %w", name, errors.Join(g.errs...))
	}
	// A non-homogeneous Poisson process, by thinning at the peak rate.
	peak := 0.0
	for t := time.Duration(0); t < dur; t += time.Second {
		peak = math.Max(peak, rate(t))
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
			out = append(out, Request{At: at, Prompt: prompt, Output: output})
		}
	}
	return out, nil
}

type gen struct {
	kv   map[string]string
	used map[string]bool
	rng  *rand.Rand
	errs []error
}

func (g *gen) str(k, def string) string {
	if g.used == nil {
		g.used = map[string]bool{}
	}
	g.used[k] = true
	if v, ok := g.kv[k]; ok {
		return v
	}
	if def == "" {
		g.errs = append(g.errs, fmt.Errorf("%s is required", k))
	}
	return def
}

func (g *gen) float(k string, def float64) float64 {
	d := ""
	if def >= 0 {
		d = strconv.FormatFloat(def, 'g', -1, 64)
	}
	v, err := strconv.ParseFloat(g.str(k, d), 64)
	if err != nil || v < 0 {
		g.errs = append(g.errs, fmt.Errorf("%s: want a number of at least 0", k))
	}
	return v
}

func (g *gen) int(k string, def int) int {
	v, err := strconv.Atoi(g.str(k, strconv.Itoa(def)))
	if err != nil || v < 1 {
		g.errs = append(g.errs, fmt.Errorf("%s: want a whole number of at least 1", k))
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

// Densify returns the trace at scale times its rate over the same time span:
// each request is kept floor(scale) times, and once more with probability
// frac(scale); the copies fall uniformly within a second after the original,
// so the per-minute shape (bursts) is kept. scale < 1 thins it.
func Densify(reqs []Request, scale float64, seed uint64) []Request {
	if scale == 1 {
		return reqs
	}
	rng := rand.New(rand.NewPCG(seed, 0xde75e))
	whole, frac := math.Floor(scale), scale-math.Floor(scale)
	out := make([]Request, 0, int(float64(len(reqs))*scale)+1)
	for _, r := range reqs {
		n := int(whole)
		if rng.Float64() < frac {
			n++
		}
		for i := range n {
			c := r
			if i > 0 {
				c.At += time.Duration(rng.Float64() * float64(time.Second))
			}
			out = append(out, c)
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
