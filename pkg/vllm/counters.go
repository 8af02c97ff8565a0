package vllm

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"

	"github.com/pulse-io/pulse/pkg/metric"
)

// retireAfter is how many scrapes a counter series may be absent before it
// is forgotten (its last value stays in the sum).
const retireAfter = 10

// maxSeries bounds the series one pod's Counters follows (a vLLM page of 8
// engines has a few hundred counter and bucket series pulse reads): a page
// of new series at every scrape once grew the agent's memory without bound.
// Past it a new series is summed as the page has it, not made monotonic.
// maxRetiredBuckets bounds the retired bucket offsets kept; past it those
// of bounds the page no longer has are dropped.
const (
	maxSeries         = 4096
	maxRetiredBuckets = 2 * int(metric.NumHists) * metric.MaxBuckets
)

// Counters makes a pod's counters monotonic per series before they are
// summed. A counter pulse reads is the sum of several series (engines of a
// data-parallel server, finished reasons, models); when one engine restarts,
// its series starts again from 0 and the sum drops by what that engine had
// counted. Seen only as a sum, that is indistinguishable from a restart of
// the whole server, whose reset handling (everything before counted as new)
// turns it into a spike of the other engines' whole history. Per series, the
// drop is a reset of that series alone, and the sum stays exact.
//
// A series that disappears keeps its last value in the sum (a page that
// briefly lacks it changes nothing); after retireAfter scrapes it is
// forgotten and its value kept as an offset. A series that appears counts
// from zero; one retired that comes back (up to maxAsleep of them a pod)
// continues from its last value, its part of the offset taken back (it
// counted from zero too: its whole value again, a spike of the rate).
//
// A restart is seen as a series' value falling, or, on a page that gives
// it (vLLM's), as the server's process_start_time_seconds moving by more
// than startSlack (started): every series then counts again from zero.
// Without it, a series the server makes at its first use (vLLM V0's
// request_success_total by finished reason) that is absent after a
// restart and comes back above its last value, or a small one back past
// its last value within a scrape, is taken as having gone on: what it had
// counted before is missed once (a series at 2, back at 3, adds 1, not
// 3), as Prometheus' rate() misses it. Nothing spikes, but a ratio of two
// counters, one of them so missed, is wrong over the interval (a mean
// TTFT of 1.6 s where 0.6 s was true).
//
// One Counters belongs to one pod and is used by one scrape at a time.
type Counters struct {
	// budget, when set, is the agent's, shared by every pod's Counters;
	// ns is this pod's namespace, whose share a new series takes.
	budget      *Budget
	ns          string
	series      map[uint64]*counterSeries
	retired     [metric.NumIDs]float64
	retiredHist map[bucketKey]float64
	scrape      uint64
	unseen      []uint64 // finish's, kept between scrapes
	// asleep: the series retired into retired or retiredHist, by key, as
	// they were (at most maxAsleep; nil until one is).
	asleep map[uint64]counterSeries
	// raw: the series summed as the page has them this scrape (no room to
	// follow them), so that one given twice is taken once (nil until one
	// is; cleared at each scrape).
	raw map[uint64]struct{}
	// won and wonHist: 1 + the rank of the name that last made each
	// counter's and each histogram's value (0: none yet), by which a page
	// without it judges its series (wins).
	won     [metric.NumIDs]uint8
	wonHist [metric.NumHists]uint8
	// start is the server's process_start_time_seconds last seen (0:
	// none).
	start float64
}

// maxAsleep bounds the retired series a pod's Counters remembers to
// continue should they come back; past it one comes back counted from
// zero, as a new one.
const maxAsleep = 64

type counterSeries struct {
	id           metric.ID
	bucket       bucketKey // for a histogram bucket's series: hist is not 0
	rank         uint8     // its name's (source.rank): of two names, the lower on the page wins
	last, offset float64
	seen         uint64 // the scrape that last saw it
}

// bucketKey is a histogram's bucket: 1 + the histogram, and its bound.
type bucketKey struct {
	hist uint8
	le   float64
}

// NewCounters returns the state of a pod not scraped before.
func NewCounters() *Counters { return &Counters{series: map[uint64]*counterSeries{}} }

// NewCountersIn returns the state of a pod of namespace ns not scraped
// before, whose series take room in b (Release gives it back).
func NewCountersIn(b *Budget, ns string) *Counters {
	c := NewCounters()
	c.budget, c.ns = b, ns
	return c
}

// Namespace is the namespace whose share c's series take.
func (c *Counters) Namespace() string { return c.ns }

// Release gives the room c's series hold in its budget back; c is not
// used after it.
func (c *Counters) Release() {
	if c.budget != nil {
		c.budget.give(c.ns, len(c.series))
		c.budget = nil
	}
}

// Budget bounds the counter series all of an agent's pods follow, and
// those of one namespace's pods: each pod follows at most maxSeries, but
// a node's pods each holding their most took 37 MiB of an agent limited
// to 128 Mi at the kubelet's 110 pods a node (350 MiB at 1,024), every
// tenant of the node losing its signal with the agent. Past its room a
// new series is summed as the page has it, as past maxSeries.
type Budget struct {
	mu       sync.Mutex
	max, per int
	total    int
	ns       map[string]int
	// starved: a namespace under its share was refused a series because
	// the budget was full (Starved).
	starved atomic.Bool
}

// NewBudget returns a budget of all series in all, per of one namespace.
func NewBudget(all, per int) *Budget {
	return &Budget{max: all, per: min(per, all), ns: map[string]int{}}
}

// SetShare sets the most one namespace's series may hold (at most all).
func (b *Budget) SetShare(per int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.per = min(max(per, 0), b.max)
}

// Over is the namespaces holding more than one namespace's share (set
// lower since they took their room) while the budget is full; nil when it
// is not: with room left, the others take that, and a namespace past its
// share takes none of it. (Its pods' state given back, a pod whose engine
// restarted before reads a lower sum once, a reset of its counters: so
// only when it must.)
func (b *Budget) Over() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.total < b.max {
		return nil
	}
	var over map[string]bool
	for ns, n := range b.ns {
		if n > b.per {
			if over == nil {
				over = map[string]bool{}
			}
			over[ns] = true
		}
	}
	return over
}

// take takes one series' room for namespace ns; false when there is none.
func (b *Budget) take(ns string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ns[ns] >= b.per {
		return false
	}
	if b.total >= b.max {
		b.starved.Store(true)
		return false
	}
	b.total++
	b.ns[ns]++
	return true
}

// Starved reports, once, that a namespace under its share was refused a
// series because the budget was full since Starved last said so: the
// namespaces past their share (Over) should give their room back. The
// share is set at pod events (SetShare), and a budget that filled after
// the last one held a namespace under its share summed until the next.
func (b *Budget) Starved() bool { return b.starved.Swap(false) }

// give gives n series' room of namespace ns back.
func (b *Budget) give(ns string, n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if b.ns[ns] -= n; b.ns[ns] <= 0 {
		delete(b.ns, ns)
	}
}

// Held is the series the budget holds room for, in all and of namespace ns.
func (b *Budget) Held(ns string) (all, of int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.ns[ns]
}

// begin starts a scrape.
func (c *Counters) begin() {
	c.scrape++
	// A map cleared keeps its room: one of a page's thousands of series
	// past the budget (some 580 KB for 16,000) was held for the pod's
	// life, outside the budget. A few are cleared in place.
	if len(c.raw) > rawKept {
		c.raw = nil
	} else {
		clear(c.raw)
	}
}

// started takes the server's start time on this page (its
// process_start_time_seconds): one more than startSlack from the last one
// seen is a restart, and every series, followed or asleep, counts again
// from zero, whatever its next value. A page without one (NaN) forgets the
// last, so that a restart while the pages lacked it is seen by its falls
// alone (remembered, such a restart was counted a second time when the
// start time came back). Called after begin, before the page's counters.
func (c *Counters) started(at float64) {
	if math.IsNaN(at) || math.IsInf(at, 0) || at <= 0 {
		c.start = 0 // unknown: a restart meanwhile is seen by its falls alone
		return
	}
	if c.start != 0 && math.Abs(at-c.start) > startSlack {
		for _, s := range c.series {
			s.offset, s.last = s.offset+s.last, 0
		}
		for k, s := range c.asleep {
			s.offset, s.last = s.offset+s.last, 0
			c.asleep[k] = s
		}
	}
	c.start = at
}

// startSlack: a start time that moves by no more is the same process's (a
// client that derives it at each scrape from the boot time, as Go's does
// from /proc/stat's btime, moves it by a second now and then). A server
// restarts in more.
const startSlack = 2.0

// rawKept: the most series past the budget whose map a scrape keeps for
// the next.
const rawKept = 64

// observe returns the series' value made monotonic; ok is false for a
// line to skip: a series the page already gave this scrape (the first line
// holds, as Prometheus keeps it: read as a reset of the series at every
// scrape, a second line made a page that never changed count up by the
// first line's value each second), or a negative count (no counter is
// below zero: read as a reset, one sample of -1 counted the whole counter
// again; the series is held at its last value, as one the page lacks).
func (c *Counters) observe(id metric.ID, rank uint8, name string, labels []*dto.LabelPair, v float64) (float64, bool) {
	return c.observeSeries(seriesKey(name, labels), counterSeries{id: id, rank: rank}, v)
}

// observeBucket is observe for a histogram bucket's series.
func (c *Counters) observeBucket(hist, rank uint8, le float64, name string, labels []*dto.LabelPair, v float64) (float64, bool) {
	return c.observeSeries(seriesKey(name, labels), counterSeries{bucket: bucketKey{hist, le}, rank: rank}, v)
}

// observeSeries is observe for the series of key, new ones made as blank.
func (c *Counters) observeSeries(key uint64, blank counterSeries, v float64) (float64, bool) {
	s := c.series[key]
	switch {
	case v < 0 || s != nil && s.seen == c.scrape:
		return 0, false
	case s == nil && (len(c.series) >= maxSeries || c.budget != nil && !c.budget.take(c.ns)):
		if _, asleep := c.asleep[key]; asleep {
			// A retired series back with no room to follow it: its last
			// value is in the retired sum, and the page's beside it
			// counted the series twice (then, woken, the counter fell by
			// as much: a reset to the aggregator). It stays retired, at
			// that value, until there is room.
			return 0, false
		}
		// Summed as the page has it, and once: a line given twice was
		// summed twice (then, with room, once: a drop, a reset to the
		// aggregator).
		if _, again := c.raw[key]; again {
			return 0, false
		}
		if c.raw == nil {
			c.raw = map[uint64]struct{}{}
		}
		c.raw[key] = struct{}{}
		return v, true
	case s == nil:
		s = &blank
		if old, ok := c.wake(key); ok {
			s = &old
		}
		c.series[key] = s
	}
	return s.advance(v, c.scrape), true
}

// advance takes v (not below 0) as the series' value at scrape and returns
// it made monotonic: a value below the last is the series restarted (while
// away, for one woken), and its last value goes into its offset.
func (s *counterSeries) advance(v float64, scrape uint64) float64 {
	offset := s.offset
	if v < s.last {
		offset += s.last
	}
	if r := v + offset; math.IsInf(r, 0) {
		// Past float64's range (a hostile page's 1e308 after a restart):
		// the series' last value stands. Skipped while marked seen, it
		// was neither summed nor added at its last value, and its
		// counter fell by all of it (a reset to the aggregator).
		s.seen = scrape
		return s.last + s.offset
	}
	s.offset, s.last, s.seen = offset, v, scrape
	return v + s.offset
}

// finish adds, to every counter the page has, the series of that counter it
// lacked this time (at their last value) and those retired; it forgets
// series absent for retireAfter scrapes.
func (c *Counters) finish(a *accumulator) {
	// The series the page lacked, in the order of their keys: float sums
	// in the map's (random) order differed by an ulp from scrape to scrape
	// of the same page, which, on a rounding edge of the wire's
	// resolution, made a counter drop, and the aggregator count a reset.
	c.unseen = c.unseen[:0]
	for key, s := range c.series {
		if s.seen != c.scrape {
			c.unseen = append(c.unseen, key)
		}
	}
	slices.Sort(c.unseen)
	for _, key := range c.unseen {
		s := c.series[key]
		// A series of a name that did not win its value on this page (a
		// deprecated name beside the new one: vLLM emits both, the same
		// number under each) is no part of it: carried over (the
		// deprecated name gone after an upgrade in place), its value was
		// counted twice, and kept so once retired.
		won := c.wins(a, s)
		if c.scrape-s.seen >= retireAfter {
			if !won {
				delete(c.series, key)
				if c.budget != nil {
					c.budget.give(c.ns, 1)
				}
				continue
			}
			if s.bucket.hist > 0 {
				if c.retiredHist == nil {
					c.retiredHist = map[bucketKey]float64{}
				}
				c.retiredHist[s.bucket] += s.last + s.offset
			} else {
				c.retired[s.id] += s.last + s.offset
			}
			if len(c.asleep) < maxAsleep {
				if c.asleep == nil {
					c.asleep = map[uint64]counterSeries{}
				}
				c.asleep[key] = *s
			}
			delete(c.series, key)
			if c.budget != nil {
				c.budget.give(c.ns, 1)
			}
			continue
		}
		switch {
		case !won:
		case s.bucket.hist > 0:
			a.addToBucket(s.bucket, s.last+s.offset)
		case a.raw[s.id].n > 0:
			a.raw[s.id].sum += s.last + s.offset
		}
	}
	for id, r := range c.retired {
		if r != 0 && a.raw[id].n > 0 {
			a.raw[id].sum += r
		}
	}
	for k, r := range c.retiredHist {
		a.addToBucket(k, r)
	}
	c.rememberWinners(a)
	if len(c.retiredHist) > maxRetiredBuckets {
		for k := range c.retiredHist {
			if !a.hasBucket(k) {
				delete(c.retiredHist, k)
			}
		}
	}
}

// wake takes the series of key back from those retired, its part of the
// retired sums with it; false when it is not remembered, or its bucket's
// retired sum was dropped since (maxRetiredBuckets).
func (c *Counters) wake(key uint64) (counterSeries, bool) {
	s, ok := c.asleep[key]
	if !ok {
		return s, false
	}
	delete(c.asleep, key)
	part := s.last + s.offset
	if s.bucket.hist == 0 {
		c.retired[s.id] -= part
		return s, true
	}
	r, kept := c.retiredHist[s.bucket]
	if !kept {
		return s, false
	}
	if r -= part; r == 0 {
		delete(c.retiredHist, s.bucket)
	} else {
		c.retiredHist[s.bucket] = r
	}
	return s, true
}

// rememberWinners keeps the rank of the name that made each counter's and
// each histogram's value on this page, for a page without it (wins).
func (c *Counters) rememberWinners(a *accumulator) {
	for id := range a.raw {
		if a.raw[id].n > 0 {
			c.won[id] = a.raw[id].rank + 1
		}
	}
	for h := range a.hist {
		if len(a.hist[h].bounds) > 0 {
			c.wonHist[h] = a.hist[h].rank + 1
		}
	}
}

// wins reports whether s's name is the one whose series make its value
// on this page (the lowest rank the page has), or, where the page has
// none, the one that last made it (any while none has). Every name won a
// page without the value: a deprecated name's series, gone with the
// other's (an idle engine restarted, its histograms empty), was retired
// into the sum beside the winner's, counted twice, then taken back when
// it came back: a drop, a reset to the aggregator.
func (c *Counters) wins(a *accumulator, s *counterSeries) bool {
	if s.bucket.hist > 0 {
		if h := &a.hist[s.bucket.hist-1]; len(h.bounds) > 0 {
			return h.rank == s.rank
		}
		w := c.wonHist[s.bucket.hist-1]
		return w == 0 || w-1 == s.rank
	}
	if r := &a.raw[s.id]; r.n > 0 {
		return r.rank == s.rank
	}
	w := c.won[s.id]
	return w == 0 || w-1 == s.rank
}

// hasBucket says whether the page has bucket k's bound.
func (a *accumulator) hasBucket(k bucketKey) bool {
	return slices.Contains(a.hist[k.hist-1].bounds, k.le)
}

// addToBucket adds v to a bucket the page has (a histogram absent from the
// page stays absent; a bound it lacks is not made up).
func (a *accumulator) addToBucket(k bucketKey, v float64) {
	h := &a.hist[k.hist-1]
	for i, b := range h.bounds {
		if b == k.le {
			h.counts[i] += v
			return
		}
	}
}

// seriesKey identifies a series by its sample name and label set, whatever
// the order of its labels: the sum of each label's hash, each mixed
// (mix64) first. Summed as FNV gave them, two labels whose values differ
// in their last byte cancelled out: {engine="1", le="0.01"} and
// {engine="0", le="0.02"} were one series, and one of a data-parallel
// server's buckets was dropped as the other given twice.
func seriesKey(name string, labels []*dto.LabelPair) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	key := mix64(h.Sum64())
	for _, lp := range labels {
		if lp.GetValue() == "" {
			// A label of no value is no label, as Prometheus reads it:
			// {engine="0",x=""} is {engine="0"} given again, not a second
			// series summed beside it.
			continue
		}
		h.Reset()
		_, _ = h.Write([]byte(lp.GetName()))
		_, _ = h.Write([]byte{0xff})
		if le, ok := bucketLabel(lp); ok {
			// A bucket's bound by its number, as Prometheus normalizes
			// it: le="0.1" and le="0.10" are one bucket, whose count
			// was summed twice (and the +Inf bucket raised to it).
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(le))
			_, _ = h.Write(b[:])
		} else {
			_, _ = h.Write([]byte(lp.GetValue()))
		}
		key += mix64(h.Sum64()) // order-independent
	}
	return key
}

// bucketLabel is lp's bound when it is a bucket's (le) and a number.
func bucketLabel(lp *dto.LabelPair) (float64, bool) {
	if lp.GetName() != model.BucketLabel {
		return 0, false // not parsed: a failed parse allocates its error
	}
	le, err := strconv.ParseFloat(lp.GetValue(), 64)
	return le, err == nil
}

// mix64 is SplitMix64's finalizer: every bit of x moves about half of the
// result's, so sums of mixed hashes keep no linear trace of their inputs.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
