package vllm

import "slices"

// maxArrivalSeries bounds the series one demand's Arrivals follows (a
// router's series of one model: per endpoint, per status; a few), and
// maxArrivalsAsleep those retired it remembers to continue. Past either a
// series is summed as the page has it, as Counters sums one past its room.
const (
	maxArrivalSeries  = 256
	maxArrivalsAsleep = 64
)

// Arrivals makes one demand's arrival counter (Demand.Arrivals) monotonic
// per series before the series are summed, as Counters does a pod's
// counters: a router's series of one model (one per endpoint it sends to,
// say) that goes away, or restarts alone, dropped the sum, which the
// aggregator reads as a reset of the whole counter, its every other
// series' count taken as new arrivals (a workload woken from zero for a
// thousand requests that never came). A series that goes away keeps its
// last value in the sum; after retireAfter scrapes it is retired (its value
// kept), and one retired that comes back continues from where it was.
//
// One Arrivals belongs to one demand entry and is used by one scrape at a
// time.
type Arrivals struct {
	series  map[uint64]*counterSeries // their id, bucket and rank unused
	asleep  map[uint64]counterSeries
	retired float64
	scrape  uint64
	unseen  []uint64
}

// NewArrivals returns the state of a demand not read before.
func NewArrivals() *Arrivals { return &Arrivals{series: map[uint64]*counterSeries{}} }

// observe is the series of key's value v (not below 0) made monotonic.
func (a *Arrivals) observe(key uint64, v float64) float64 {
	s := a.series[key]
	if s == nil {
		if len(a.series) >= maxArrivalSeries {
			if _, asleep := a.asleep[key]; asleep {
				// A retired series back with no room to follow it: its
				// last value is in the retired sum, and the page's
				// beside it counted it twice (then, woken, the sum fell
				// by as much: a reset to the aggregator, every series'
				// count new arrivals). It stays retired until there is
				// room, as Counters' does.
				return 0
			}
			return v
		}
		s = &counterSeries{}
		if old, ok := a.asleep[key]; ok {
			delete(a.asleep, key)
			a.retired -= old.last + old.offset
			s = &old
		}
		a.series[key] = s
	}
	return s.advance(v, a.scrape)
}

// finish is what the series the page lacked this scrape add to the sum:
// their last values, and those retired; it retires the series absent for
// retireAfter scrapes.
func (a *Arrivals) finish() float64 {
	a.unseen = a.unseen[:0]
	for key, s := range a.series {
		if s.seen != a.scrape {
			a.unseen = append(a.unseen, key)
		}
	}
	slices.Sort(a.unseen) // a fixed order of addition: no ulp's change from scrape to scrape
	sum := 0.0
	for _, key := range a.unseen {
		s := a.series[key]
		if a.scrape-s.seen >= retireAfter {
			a.retired += s.last + s.offset
			if len(a.asleep) < maxArrivalsAsleep {
				if a.asleep == nil {
					a.asleep = map[uint64]counterSeries{}
				}
				a.asleep[key] = *s
			}
			delete(a.series, key)
			continue
		}
		sum += s.last + s.offset
	}
	return sum + a.retired
}
