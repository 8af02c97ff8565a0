package scaler

import (
	"math"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A stream's place among the open ones (Server.enter): reclaimed is set
// when another namespace's stream takes it (its handler then returns
// errReclaimed); a place reclaimed is given back by the reclaim, not by
// leave.
//
// wake (capacity 1) is the one channel its handler waits on besides its
// context: signalled when the place is reclaimed, when the server shuts
// down, and, as its sub's ready, when the pusher hands a state over; the
// handler then reads which. A handler that waited on each in a select
// parked with a sudog on each channel (96 bytes of heap each, four for a
// StreamIsActive, three for a StreamMetricSpec) and a channel of its own
// for each of the reclaim and the hand-over.
type place struct {
	ns        string
	idx       int // in Server.places[ns]
	wake      chan struct{}
	reclaimed atomic.Bool
}

// signal wakes p's handler (a wake already pending serves).
func (p *place) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// errReclaimed ends a stream whose place another namespace took.
var errReclaimed = status.Error(codes.ResourceExhausted,
	"this stream's place was given to another namespace's: the aggregator holds the most streams it may, and this namespace more than its share (KEDA retries; polls are answered as before)")

// enter takes a place for a stream of a ScaledObject of namespace ns. Nil
// with a nil error once Shutdown has begun (the handler then returns nil
// at once: EOF for KEDA); nil with ResourceExhausted past MaxStreams or
// MaxStreamsPerNamespace. With every place taken, a namespace holding
// fewer than its share (MaxStreams over the namespaces holding one, its
// own counted) takes the last place of the namespace holding the most,
// when that one holds more than its share: two namespaces' ScaledObjects
// took every place (half each, the per-namespace default), and every
// other tenant's streams were refused for as long as they held them.
func (s *Server) enter(ns string) (*place, error) {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closing {
		return nil, nil
	}
	perNS := s.maxPerNS
	if perNS <= 0 {
		perNS = math.MaxInt
	}
	if !s.slots.Take(ns, s.maxStreams, perNS) && !s.reclaimFor(ns, perNS) {
		all, inNS := s.slots.Held(ns)
		if s.maxStreams > 0 && all >= s.maxStreams {
			s.streamsRefused[limitAll].Add(1)
			return nil, status.Errorf(codes.ResourceExhausted, "the aggregator holds %d streams open, the most it may, and namespace %q its share or more: this one is refused (KEDA retries; polls are answered as before)", all, ns)
		}
		s.streamsRefused[limitNamespace].Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "namespace %q holds %d streams open, the most one namespace may: this one is refused (KEDA retries; polls are answered as before)", ns, inNS)
	}
	p := &place{ns: ns, idx: len(s.places[ns]), wake: make(chan struct{}, 1)}
	if s.places == nil {
		s.places = map[string][]*place{}
	}
	s.places[ns] = append(s.places[ns], p)
	s.streams.Add(1)
	s.open.Add(1)
	return p, nil
}

// reclaimFor gives ns the last place of the namespace holding the most
// (its newest, but for the places moved as others ended),
// when every place is taken, ns holds fewer than its share and below
// perNS, and that namespace more than its share; closeMu held.
func (s *Server) reclaimFor(ns string, perNS int) bool {
	all, mine := s.slots.Held(ns)
	if s.maxStreams <= 0 || all < s.maxStreams || mine >= perNS {
		return false
	}
	holders := len(s.places)
	if mine == 0 {
		holders++
	}
	share := s.maxStreams / holders
	if mine >= share {
		return false
	}
	victim, most := "", 0
	for k, ps := range s.places {
		if len(ps) > most || len(ps) == most && k < victim {
			victim, most = k, len(ps)
		}
	}
	if most <= share || victim == ns {
		return false
	}
	ps := s.places[victim]
	p := ps[len(ps)-1]
	s.dropPlace(p)
	s.slots.Give(victim)
	p.reclaimed.Store(true)
	p.signal()
	s.streamsReclaimed.Add(1)
	return s.slots.Take(ns, s.maxStreams, perNS)
}

// dropPlace removes p from the places held, the last of its namespace's
// in its stead (at every stream's end: a scan of a namespace's 20,000
// places was one too many); closeMu held.
func (s *Server) dropPlace(p *place) {
	ps := s.places[p.ns]
	last := ps[len(ps)-1]
	ps[p.idx], last.idx = last, p.idx
	ps[len(ps)-1] = nil
	ps = ps[:len(ps)-1]
	if len(ps) == 0 {
		delete(s.places, p.ns)
	} else {
		s.places[p.ns] = ps
	}
}

// leave gives back p's place (unless it was reclaimed: the reclaim gave
// it).
func (s *Server) leave(p *place) {
	s.closeMu.Lock()
	if !p.reclaimed.Load() {
		s.dropPlace(p)
		s.slots.Give(p.ns)
	}
	s.closeMu.Unlock()
	s.open.Add(-1)
	s.streams.Done()
}
