// Command stepmodel asks whether a replica's capacity can be learned at
// light load from the engine's step times, as a model: each shipped profile
// of pulse-sim's replica is driven alone, at constant Poisson rates, with
// requests of five length mixes, and the rate at which its requests' mean
// queue time passes a quarter of a 2 s TTFT SLO (the planner's break) is
// found by bisection. At that break it prints the marginal utilisation
// rho = beta1 x prefill tokens/s + beta2 x generated tokens/s (the share of
// each second the step model prices by tokens, with the profile's own
// coefficients; what is left is the per-step overhead beta0, which a
// larger batch spreads thinner), the running requests and the KV cache in
// use. Then it fits beta0..beta2 by least squares to what an agent could
// read at 10-40 % of that rate (the mean inter-token latency against
// prompt and generated tokens per engine step: vLLM's
// iteration_tokens_total _count), and prints the capacity a model with a
// fixed target utilisation of 0.8 would predict from a run at 20 %, over
// the break. docs/planner.md gives the table and what it says (the
// paragraph on capacity from the engine's step times, measured and not
// built).
//
//	go run ./test/stepmodel
package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"gonum.org/v1/gonum/mat"

	"github.com/pulse-io/pulse/pkg/sim/replica"
)

// mix is a length mix: lognormal prompts and outputs (sigma lengthSigma)
// with these means.
type mix struct {
	name           string
	prompt, output float64
}

var mixes = []mix{{"chat", 1000, 250}, {"long prompts", 12000, 300}, {"decode-heavy", 300, 1500}, {"short", 200, 100}, {"mid", 3000, 600}}

const (
	lengthSigma = 0.6
	warm        = 5 * time.Minute  // not measured
	measured    = 10 * time.Minute // after warm
	breakQueue  = 0.5              // seconds: a quarter of a 2 s SLO
	target      = 0.8              // the model's utilisation target
)

// window is what one run's measured minutes read, per second.
type window struct {
	prompt, generated, steps float64
	itl, queue               float64 // means, seconds
	running, kv              float64 // means of a sample a second
}

// run drives one replica of p at rate requests a second of m.
func run(p *replica.Profile, m mix, rate float64, seed uint64) window {
	rng := rand.New(rand.NewPCG(seed, 7))
	length := func(mean float64) int {
		mu := math.Log(mean) - lengthSigma*lengthSigma/2
		return max(1, int(math.Exp(mu+lengthSigma*rng.NormFloat64())))
	}
	r := replica.New(p, nil)
	end := warm + measured
	var c0 replica.Counters
	var w window
	samples := 0.0
	sample := warm
	for t, id := time.Duration(0), 0; ; id++ {
		next := t + time.Duration(rng.ExpFloat64()/rate*float64(time.Second))
		for ; sample <= next && sample < end; sample += time.Second {
			r.AdvanceTo(sample)
			if sample == warm {
				c0 = r.Counters()
				continue
			}
			w.running += float64(r.Running())
			w.kv += r.KVUsage()
			samples++
		}
		if next >= end {
			break
		}
		r.AdvanceTo(next)
		t = next
		r.Enqueue(t, replica.NewRequest(id, min(length(m.prompt), p.MaxModelLen/2), length(m.output), t))
	}
	r.AdvanceTo(end)
	c, s := r.Counters(), measured.Seconds()
	w.prompt, w.generated, w.steps = (c.PromptTokens-c0.PromptTokens)/s, (c.GenerationTokens-c0.GenerationTokens)/s, (c.Steps-c0.Steps)/s
	w.itl = (c.ITLSum - c0.ITLSum) / (c.ITLCount - c0.ITLCount)
	w.queue = (c.QueueSum - c0.QueueSum) / (c.QueueCount - c0.QueueCount)
	w.running /= samples
	w.kv /= samples
	return w
}

// breakRate is the highest rate (to 0.1 %) at which the mean queue time
// stays within breakQueue.
func breakRate(p *replica.Profile, m mix) float64 {
	lo, hi := 0.05, 0.1
	for run(p, m, hi, 1).queue < breakQueue {
		lo, hi = hi, 2*hi
	}
	for hi-lo > 0.001*lo {
		if mid := (lo + hi) / 2; run(p, m, mid, 1).queue < breakQueue {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// fit is the least-squares step model over runs at 10-40 % of rate:
// mean ITL = b0 + b1 x prompt tokens a step + b2 x generated tokens a step.
func fit(p *replica.Profile, m mix, rate float64) (b0, b1, b2 float64, err error) {
	var rows, ys []float64
	for _, f := range []float64{0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4} {
		for seed := uint64(2); seed < 5; seed++ {
			w := run(p, m, f*rate, seed)
			rows = append(rows, 1, w.prompt/w.steps, w.generated/w.steps)
			ys = append(ys, w.itl)
		}
	}
	var b mat.VecDense
	if err := b.SolveVec(mat.NewDense(len(ys), 3, rows), mat.NewVecDense(len(ys), ys)); err != nil {
		return 0, 0, 0, err
	}
	return b.AtVec(0), b.AtVec(1), b.AtVec(2), nil
}

func main() {
	fmt.Println("| profile | mix | work at the break (prompt + 4 x generated tokens/s) | rho at the break | running | KV cache | fitted / true beta0, beta1, beta2 | fitted rho at 20 % | predicted at rho 0.8 / the break |")
	fmt.Println("|---|---|---:|---:|---:|---:|---|---:|---:|")
	for _, name := range replica.Shipped() {
		p, err := replica.Load(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, m := range mixes {
			rate := breakRate(p, m)
			brk := run(p, m, rate, 1)
			work := brk.prompt + 4*brk.generated
			rho := p.Beta1Seconds*brk.prompt + p.Beta2Seconds*brk.generated
			b0, b1, b2, err := fit(p, m, rate)
			if err != nil {
				fmt.Fprintln(os.Stderr, name, m.name, err)
				os.Exit(1)
			}
			light := run(p, m, 0.2*rate, 9)
			lightRho := b1*light.prompt + b2*light.generated
			predicted := (light.prompt + 4*light.generated) * target / lightRho
			fmt.Printf("| %s | %s | %.0f | %.2f | %.0f | %.2f | %.2f / %.2f / %.2f | %.2f | %.2f |\n",
				p.Name, m.name, work, rho, brk.running, brk.kv,
				b0/p.Beta0Seconds, b1/p.Beta1Seconds, b2/p.Beta2Seconds, lightRho, predicted/work)
		}
	}
}
