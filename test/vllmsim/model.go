package vllmsim

import (
	"context"
	"math"
	"time"
)

// QueueModel is a simple queueing model of a vLLM engine: Poisson arrivals,
// a batch of at most BatchCapacity running requests per series, and each
// running request finishing at ServiceRate per second (exponential service).
type QueueModel struct {
	ArrivalRate   float64 `json:"arrivalRate"`   // requests/s over the whole server
	BatchCapacity int     `json:"batchCapacity"` // running requests per series
	ServiceRate   float64 `json:"serviceRate"`   // completions/s per running request
}

// SetModel replaces the queueing model and holds it: Drive no longer
// changes it until ReleaseModel. It takes effect from the next step.
func (s *Server) SetModel(m QueueModel) {
	s.mu.Lock()
	s.model, s.held = m, true
	s.mu.Unlock()
}

// ReleaseModel returns the model to the driver's (the last Drive).
func (s *Server) ReleaseModel() {
	s.mu.Lock()
	s.model, s.held = s.driven, false
	s.mu.Unlock()
}

// Drive is an automatic driver's model (the demo's swinging arrival rate):
// in force unless a model set by SetModel holds.
func (s *Server) Drive(m QueueModel) {
	s.mu.Lock()
	s.driven = m
	if !s.held {
		s.model = m
	}
	s.mu.Unlock()
}

// RunModel advances the queueing model every tick until ctx ends.
func (s *Server) RunModel(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Step(tick.Seconds())
		}
	}
}

// Step advances the queueing model by dt simulated seconds.
func (s *Server) Step(dt float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.model
	if m.BatchCapacity <= 0 || m.ServiceRate <= 0 {
		return
	}
	s.clock += dt
	now := s.clock
	perSeries := m.ArrivalRate * dt / float64(len(s.series))
	pDone := 1 - math.Exp(-m.ServiceRate*dt)
	for _, sr := range s.series {
		for range s.poisson(perSeries) {
			sr.queued = append(sr.queued, now-s.rng.Float64()*dt)
		}
		kept := sr.serving[:0]
		for _, r := range sr.serving {
			if s.rng.Float64() >= pDone {
				kept = append(kept, r)
				continue
			}
			queue := r[1] - r[0]
			service := math.Max(now-r[1], 0.02)
			prefill := service * 0.1
			gen := 1 + int(s.rng.ExpFloat64()*200)
			reason := 0
			if s.rng.Float64() < 0.05 {
				reason = 1
			}
			sr.finish(queue, prefill, service-prefill, 100+s.rng.IntN(900), gen, reason)
		}
		sr.serving = kept
		for len(sr.serving) < m.BatchCapacity && len(sr.queued) > 0 {
			sr.serving = append(sr.serving, [2]float64{sr.queued[0], now})
			sr.queued = sr.queued[1:]
		}
		// Gauges held by SetLoad stay as set.
		if s.pin.Waiting == nil {
			sr.waiting = float64(len(sr.queued))
		}
		if s.pin.Running == nil {
			sr.running = float64(len(sr.serving))
		}
		if s.pin.KVCacheUsage == nil {
			// KV-cache usage follows the batch, rounded to whole blocks of
			// a 27,798-block cache as vLLM reports it.
			sr.kv = math.Round(0.9*float64(len(sr.serving))/float64(m.BatchCapacity)*27798) / 27798
		}
	}
}

// poisson draws from a Poisson distribution with mean lambda (Knuth).
func (s *Server) poisson(lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= s.rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
