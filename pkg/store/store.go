// Package store holds the aggregator's state: per pod, a short series of raw
// samples (counters made monotonic across resets); per workload, the set of
// its pods. Canonical values are derived on read, over any window up to the
// retention, so every reader (debug endpoint, every KEDA trigger with its own
// window) sees one consistent state.
package store

import (
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/pulse-io/pulse/pkg/signal"
)

// Workload kinds as they appear in keys, the debug endpoint and metadata.
const (
	KindWorkspace       = "Workspace"
	KindInferenceSet    = "InferenceSet"
	KindDeployment      = "Deployment"
	KindStatefulSet     = "StatefulSet"
	KindLeaderWorkerSet = "LeaderWorkerSet"
	KindWorkload        = "Workload" // a pulse.io/workload override or a static target's workload
)

// Key names a workload.
type Key struct{ Namespace, Kind, Name string }

// PodInfo is a catalogue entry as the aggregator keeps it.
type PodInfo struct {
	UID, Namespace, Name string
	Workloads            []Key
	Ready                bool
}

// Sample is one report of a pod: its values, or why it has none.
type Sample struct {
	TimeMs  int64
	Values  signal.Values
	Extra   []float64 // aligned with the reporting stream's extra names; NaN absent
	Missing string    // empty when the scrape succeeded; else the reason
	Error   string
}

// Options bound the store.
type Options struct {
	// Retention is the longest window a reader may ask for.
	Retention time.Duration
	// MaxSamples caps the samples kept per pod.
	MaxSamples int
	// MaxPods caps the pods held; past it the pod listed (by a catalogue)
	// least recently is evicted, and counted. Workloads exist only through
	// their pods.
	MaxPods int
	// Expiry: pods of an agent whose streams have all been closed this long
	// are dropped. Pods of a connected agent stay until it removes them.
	Expiry time.Duration
	// Now is the clock (time.Now when nil); tests set it.
	Now func() time.Time
}

// Store is safe for concurrent use.
type Store struct {
	opts Options

	mu        sync.RWMutex
	pods      *simplelru.LRU[string, *pod] // by uid, most recently listed first
	workloads map[Key]map[string]*pod
	sources   map[string]*source // by node
	lastSweep time.Time
	evicted   int
	now       func() time.Time

	// watchMu guards watches; it is taken after mu (never before), so that
	// watchers do not contend for mu.
	watchMu sync.Mutex
	watches map[Key]chan struct{} // closed at the workload's next change
}

// source is one node's agent as the store knows it.
type source struct {
	streams  int       // open streams
	closedAt time.Time // when the last one closed
}

type pod struct {
	PodInfo
	source     string // the stream that reports it (node/instance)
	extraNames []string

	series   []signal.Sample // oldest first; counters monotonic
	extras   [][]float64     // parallel to series
	mono     signal.Monotonic
	lastSeen time.Time // aggregator clock of the last successful sample
	missing  string
	errText  string
}

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Retention <= 0 {
		opts.Retention = time.Minute
	}
	if opts.MaxSamples <= 0 {
		opts.MaxSamples = 128
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxPods <= 0 {
		opts.MaxPods = 10000
	}
	if opts.Expiry <= 0 {
		opts.Expiry = 10 * time.Minute
	}
	s := &Store{
		opts:      opts,
		workloads: make(map[Key]map[string]*pod),
		sources:   make(map[string]*source),
		watches:   make(map[Key]chan struct{}),
		now:       opts.Now,
	}
	// The eviction callback runs with mu held, inside Add, Upsert or
	// Remove: it unlinks the pod from its workloads and wakes their watchers.
	s.pods, _ = simplelru.NewLRU(opts.MaxPods, func(_ string, p *pod) {
		s.notify(p)
		s.unlink(p)
	})
	return s
}

// OpenSource records an agent stream of node opening.
func (s *Store) OpenSource(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src := s.sources[node]
	if src == nil {
		src = &source{}
		s.sources[node] = src
	}
	src.streams++
}

// CloseSource records an agent stream of node closing. Its pods stay (and
// go stale) until the node reconnects or Expiry passes.
func (s *Store) CloseSource(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src := s.sources[node]; src != nil && src.streams > 0 {
		src.streams--
		if src.streams == 0 {
			src.closedAt = s.now()
		}
	}
}

// sweep drops the pods of nodes disconnected for longer than Expiry; it
// runs at most every few seconds, with mu held for writing.
func (s *Store) sweep(now time.Time) {
	if now.Sub(s.lastSweep) < 5*time.Second {
		return
	}
	s.lastSweep = now
	var gone []string
	for node, src := range s.sources {
		if src.streams == 0 && now.Sub(src.closedAt) > s.opts.Expiry {
			delete(s.sources, node)
			for _, uid := range s.pods.Keys() {
				if p, ok := s.pods.Peek(uid); ok && p.source == node {
					gone = append(gone, uid)
				}
			}
		}
	}
	for _, uid := range gone {
		s.pods.Remove(uid) // the eviction callback unlinks it
	}
}

// Evicted is the number of pods evicted because MaxPods was reached.
func (s *Store) Evicted() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.evicted
}

// Changed returns a channel that is closed at the next change of workload k:
// a sample of one of its pods, or a pod joining, leaving or changing.
func (s *Store) Changed(k Key) <-chan struct{} {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	ch := s.watches[k]
	if ch == nil {
		ch = make(chan struct{})
		s.watches[k] = ch
	}
	return ch
}

// notify wakes the watchers of p's workloads; mu must be held for writing.
func (s *Store) notify(p *pod) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	s.notifyLocked(p)
}

// notifyLocked is notify with watchMu held.
func (s *Store) notifyLocked(p *pod) {
	if len(s.watches) == 0 {
		return
	}
	for _, k := range p.Workloads {
		if ch := s.watches[k]; ch != nil {
			close(ch)
			delete(s.watches, k)
		}
	}
}

// Upsert adds or updates pods reported by source. With full set, pods of the
// same source that are not listed are removed.
func (s *Store) Upsert(source string, extraNames []string, pods []PodInfo, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	listed := make(map[string]bool, len(pods))
	for _, info := range pods {
		listed[info.UID] = true
		p, ok := s.pods.Get(info.UID)
		if !ok {
			p = &pod{}
			if s.pods.Add(info.UID, p) {
				s.evicted++
			}
		} else {
			s.notify(p)
			s.unlink(p)
		}
		p.PodInfo = info
		p.source = source
		p.extraNames = extraNames
		s.link(p)
		s.notify(p)
	}
	if full {
		for _, uid := range s.pods.Keys() {
			if p, _ := s.pods.Peek(uid); p.source == source && !listed[uid] {
				s.pods.Remove(uid)
			}
		}
	}
	s.sweep(s.now())
}

// Remove deletes pods by uid.
func (s *Store) Remove(uids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, uid := range uids {
		s.pods.Remove(uid) // the eviction callback unlinks it
	}
}

func (s *Store) link(p *pod) {
	for _, k := range p.Workloads {
		m := s.workloads[k]
		if m == nil {
			m = make(map[string]*pod)
			s.workloads[k] = m
		}
		m[p.UID] = p
	}
}

func (s *Store) unlink(p *pod) {
	for _, k := range p.Workloads {
		if m := s.workloads[k]; m != nil {
			delete(m, p.UID)
			if len(m) == 0 {
				delete(s.workloads, k)
			}
		}
	}
}

// Report is one pod's sample, by uid.
type Report struct {
	UID string
	Sample
}

// Add records samples; samples of pods not in the catalogue are dropped and
// counted in the return value.
func (s *Store) Add(reports []Report) (dropped int) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	for i := range reports {
		r := &reports[i]
		p, ok := s.pods.Peek(r.UID) // samples do not reorder the LRU: that costs too much per sample
		if !ok {
			dropped++
			continue
		}
		if r.Missing != "" {
			p.missing, p.errText = r.Missing, r.Error
			s.notifyLocked(p)
			continue
		}
		if n := len(p.series); n > 0 && r.TimeMs <= p.series[n-1].TimeMs {
			continue // out of order or repeated: keep the series monotonic in time
		}
		if p.series == nil {
			p.series = make([]signal.Sample, 0, min(s.opts.MaxSamples, 64))
		}
		p.series = append(p.series, signal.Sample{TimeMs: r.TimeMs, Values: r.Values})
		p.mono.Adjust(&p.series[len(p.series)-1].Values)
		if r.Extra != nil || p.extras != nil {
			// extras stays nil until a pod forwards any; then it runs
			// parallel to series.
			for len(p.extras) < len(p.series)-1 {
				p.extras = append(p.extras, nil)
			}
			p.extras = append(p.extras, r.Extra)
		}
		p.trim(s.opts)
		p.lastSeen, p.missing, p.errText = now, "", ""
		s.notifyLocked(p)
	}
	return dropped
}

// trim drops samples older than the retention (keeping one before it, so a
// rate over the full retention has its start) and beyond MaxSamples. It
// drops lazily, in one copy once half the series has expired, so that an
// append costs O(1) amortized; readers pick their window from the end.
func (p *pod) trim(o Options) {
	n := len(p.series)
	from := p.series[n-1].TimeMs - o.Retention.Milliseconds()
	if n <= o.MaxSamples && p.series[n/2].TimeMs > from {
		return // less than half has expired: nothing to do yet
	}
	cut := sort.Search(n, func(i int) bool { return p.series[i].TimeMs > from })
	if cut > 0 {
		cut-- // keep the sample just before the retention
	}
	if over := n - o.MaxSamples; over > cut {
		cut = over
	}
	if cut == 0 {
		return
	}
	p.series = append(p.series[:0], p.series[cut:]...)
	if len(p.extras) >= cut {
		p.extras = append(p.extras[:0], p.extras[cut:]...)
	}
}

// window returns the samples of the last d on the pod's own clock (d == 0:
// all). For rates and ratios it includes the sample just before the window,
// so that the increase covers the whole window.
func (p *pod) window(d time.Duration, rule signal.Rule) []signal.Sample {
	if d <= 0 || len(p.series) == 0 {
		return p.series
	}
	from := p.series[len(p.series)-1].TimeMs - d.Milliseconds()
	i := sort.Search(len(p.series), func(i int) bool { return p.series[i].TimeMs > from })
	if i > 0 && rule != signal.RuleGauge {
		i--
	}
	return p.series[i:]
}

// Pods returns the number of pods held.
func (s *Store) Pods() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pods.Len()
}
