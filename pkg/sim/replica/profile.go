package replica

import (
	"embed"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Profile describes a model served by vLLM on some GPUs: its step-time
// coefficients, its KV cache and scheduler limits, and how long a new replica
// takes to become Ready. Profiles are YAML files; those under profiles/ ship
// with pulse-sim, each citing where its numbers come from.
type Profile struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// GPUs per replica (for GPU-hours).
	GPUs int `json:"gpus"`
	// KVCacheTokens is the KV cache capacity in tokens (vLLM's "GPU KV
	// cache size" at its gpu_memory_utilization).
	KVCacheTokens int `json:"kvCacheTokens"`
	// MaxNumSeqs and MaxNumBatchedTokens are vLLM's scheduler limits.
	MaxNumSeqs          int `json:"maxNumSeqs"`
	MaxNumBatchedTokens int `json:"maxNumBatchedTokens"`
	// MaxModelLen: a request whose prompt and output exceed it is refused.
	MaxModelLen int `json:"maxModelLen"`
	// Step time = Beta0 + Beta1·prefill tokens + Beta2·decoding sequences.
	Beta0Seconds float64 `json:"beta0Seconds"`
	Beta1Seconds float64 `json:"beta1SecondsPerPrefillToken"`
	Beta2Seconds float64 `json:"beta2SecondsPerDecodeSequence"`
	// The memory-bandwidth floor of a step: every step reads the weights
	// and the KV cache of every running sequence, so it lasts at least
	// (WeightBytesPerGPU + KV tokens in use × KVBytesPerTokenPerGPU) /
	// MemoryBandwidthBytesPerSecond, however few tokens it computes. The
	// linear model above is fitted at short contexts and holds a decoding
	// sequence's cost constant; at long ones (thousands of tokens a
	// sequence) decode is bound by reading the KV cache, and the floor
	// binds. All three 0: no floor.
	WeightBytesPerGPU             float64 `json:"weightBytesPerGPU"`
	KVBytesPerTokenPerGPU         float64 `json:"kvBytesPerTokenPerGPU"`
	MemoryBandwidthBytesPerSecond float64 `json:"memoryBandwidthBytesPerSecond"`
	// PrefillAttentionPerContextToken is what a prefill token costs more,
	// as a share of Beta1, for every token it attends to, those before it
	// and itself (4 × layers × hidden size FLOPs each, against the 2 × its
	// matrices' parameters that Beta1 prices), so the p-th token of a
	// prompt (the first is 1) costs Beta1·(1 + this·p). Beta1 is fitted at
	// short prompts, where this is a few percent; a 15,000-token prompt's
	// attention is a fifth of its prefill on an 8B model (28 % on top of
	// Beta1 alone). 0: none.
	PrefillAttentionPerContextToken float64 `json:"prefillAttentionPerContextToken"`
	// Startup is the mean time from a replica's creation to Ready
	// (scheduling, image pull, model load); each replica's is drawn from a
	// normal distribution with StartupStddev, cut at ±3 standard deviations.
	Startup       Duration `json:"startup"`
	StartupStddev Duration `json:"startupStddev"`
	// Sources cite the measurements each number comes from.
	Sources []string `json:"sources"`
}

// Duration is a time.Duration written as "240s" in YAML.
type Duration struct{ time.Duration }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w", s, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// StartupTime draws one replica's startup time from normal, a standard
// normal variate.
func (p *Profile) StartupTime(normal float64) time.Duration {
	z := math.Max(-3, math.Min(3, normal))
	return p.Startup.Duration + time.Duration(z*float64(p.StartupStddev.Duration))
}

// stepTime is a step's length: the linear model of its prefill (in
// PrefillUnits) and decoding sequences, and at least the time to read the
// weights and the kvTokens in use (the bandwidth floor).
func (p *Profile) stepTime(prefill float64, decode, kvTokens int) time.Duration {
	s := p.Beta0Seconds + p.Beta1Seconds*prefill + p.Beta2Seconds*float64(decode)
	s = max(s, p.ReadSeconds(float64(kvTokens)))
	return time.Duration(math.Round(s * 1e9))
}

// PrefillUnits is what prefilling tokens after before tokens of context
// costs, in prefill tokens at no context (Beta1's unit): each token also
// attends to every token before it, and to itself.
func (p *Profile) PrefillUnits(tokens, before int) float64 {
	n, k := float64(tokens), float64(before)
	return n + p.PrefillAttentionPerContextToken*(n*k+n*(n+1)/2)
}

// ReadSeconds is the time a step takes to read the weights and kvTokens of
// KV cache at the profile's memory bandwidth (0 with no bandwidth given).
func (p *Profile) ReadSeconds(kvTokens float64) float64 {
	if p.MemoryBandwidthBytesPerSecond <= 0 {
		return 0
	}
	return (p.WeightBytesPerGPU + kvTokens*p.KVBytesPerTokenPerGPU) / p.MemoryBandwidthBytesPerSecond
}

// maxStepSeconds bounds a profile's longest step: a minute, thousands of
// times a real engine's (tens of milliseconds).
const maxStepSeconds = 60

// longestStep is, in seconds, the step at the profile's limits.
func (p *Profile) longestStep() float64 {
	s := p.Beta0Seconds + p.Beta1Seconds*p.PrefillUnits(p.MaxNumBatchedTokens, p.MaxModelLen) + p.Beta2Seconds*float64(p.MaxNumSeqs)
	return max(s, p.ReadSeconds(float64(p.KVCacheTokens)))
}

// Validate reports every problem of the profile.
func (p *Profile) Validate() error {
	var errs []error
	bad := func(f string, a ...any) {
		errs = append(errs, fmt.Errorf("profile %s: "+f, append([]any{p.Name}, a...)...))
	}
	if p.Name == "" {
		bad("name is required")
	}
	if p.GPUs < 1 {
		bad("gpus must be at least 1")
	}
	if p.MaxNumSeqs < 1 || p.MaxNumBatchedTokens < 1 {
		bad("maxNumSeqs and maxNumBatchedTokens must be at least 1")
	}
	if p.MaxModelLen < 1 || p.KVCacheTokens < p.MaxModelLen {
		bad("kvCacheTokens (%d) must hold at least one request of maxModelLen (%d)", p.KVCacheTokens, p.MaxModelLen)
	}
	if p.Beta0Seconds <= 0 || p.Beta1Seconds < 0 || p.Beta2Seconds < 0 || !(p.PrefillAttentionPerContextToken >= 0) {
		bad("beta0Seconds must be above 0, beta1, beta2 and prefillAttentionPerContextToken not negative")
	}
	if p.WeightBytesPerGPU < 0 || p.KVBytesPerTokenPerGPU < 0 || p.MemoryBandwidthBytesPerSecond < 0 ||
		(p.MemoryBandwidthBytesPerSecond == 0) != (p.WeightBytesPerGPU == 0 && p.KVBytesPerTokenPerGPU == 0) {
		bad("weightBytesPerGPU and kvBytesPerTokenPerGPU must not be negative, and memoryBandwidthBytesPerSecond above 0 when either is given (all three 0: no bandwidth floor)")
	}
	// The longest step the profile can take: a full batch's prefill at the
	// longest context, every sequence decoding, the whole KV cache read.
	// Past maxStepSeconds (or not a number) a step's nanoseconds
	// overflowed, and every TTFT came out below 0: attained.
	if s := p.longestStep(); !(s <= maxStepSeconds) {
		bad("its longest step (%d prefill tokens after %d of context, %d sequences decoding, %d KV tokens read) takes %g s: at most %g", p.MaxNumBatchedTokens, p.MaxModelLen, p.MaxNumSeqs, p.KVCacheTokens, s, float64(maxStepSeconds))
	}
	if p.Startup.Duration < 0 || p.StartupStddev.Duration < 0 || 3*p.StartupStddev.Duration > p.Startup.Duration {
		bad("startup and startupStddev must not be negative, and three standard deviations at most the startup")
	}
	if len(p.Sources) == 0 {
		bad("sources: cite where the numbers come from")
	}
	return errors.Join(errs...)
}

//go:embed profiles/*.yaml
var shipped embed.FS

// Shipped lists the names of the profiles that ship with pulse-sim.
func Shipped() []string {
	ents, _ := shipped.ReadDir("profiles")
	var out []string
	for _, e := range ents {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Load reads a shipped profile by name, or a profile file by path.
func Load(nameOrPath string) (*Profile, error) {
	raw, err := shipped.ReadFile("profiles/" + nameOrPath + ".yaml")
	if err != nil {
		if raw, err = os.ReadFile(nameOrPath); err != nil {
			return nil, fmt.Errorf("profile %q is neither a shipped profile (%s) nor a readable file: %w",
				nameOrPath, strings.Join(Shipped(), ", "), err)
		}
	}
	var p Profile
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		return nil, fmt.Errorf("parse profile %s: %w", nameOrPath, err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}
