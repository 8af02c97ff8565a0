package main

import (
	"context"
	"fmt"
	"time"

	"gonum.org/v1/gonum/stat"

	"github.com/pulse-io/pulse/test/procs"
)

// soakSample is the aggregator's state at one time.
type soakSample struct {
	Seconds    float64 `json:"seconds"` // since the measurement began
	HeapInuse  float64 `json:"heapInuseBytes"`
	HeapLive   float64 `json:"heapLiveBytes"` // what the last GC found live: no sawtooth
	Goroutines float64 `json:"goroutines"`
	FDs        int     `json:"openFds"`
	RSS        int64   `json:"rssBytes"`
	Pods       float64 `json:"pods"`
}

// soakResult is the series and the slopes fitted over its last two thirds
// (the first third is start-up: caches, buffers and windows filling).
type soakResult struct {
	Samples               []soakSample `json:"samples"`
	HeapSlopeBytesPerHour float64      `json:"heapSlopeBytesPerHour"`
	LiveSlopeBytesPerHour float64      `json:"heapLiveSlopeBytesPerHour"`
	GoroutineSlopePerHour float64      `json:"goroutinesSlopePerHour"`
	FDSlopePerHour        float64      `json:"openFdsSlopePerHour"`
	RSSSlopeBytesPerHour  float64      `json:"rssSlopeBytesPerHour"`
	Leak                  bool         `json:"leak"`
	LeakReason            string       `json:"leakReason,omitempty"`
}

// soak samples every o.soakEvery until end, then fits the slopes.
func (f *fleet) soak(ctx context.Context, pid int, end time.Time) (*soakResult, error) {
	r := &soakResult{}
	t0 := time.Now()
	for {
		p, err := procs.Read(pid)
		if err != nil {
			return nil, err
		}
		m, err := f.agg.Metrics(ctx)
		if err != nil {
			return nil, err
		}
		s := soakSample{Seconds: time.Since(t0).Seconds(), HeapInuse: m["go_memstats_heap_inuse_bytes"], HeapLive: m["go_gc_heap_live_bytes"], Goroutines: m["go_goroutines"],
			FDs: p.FDs, RSS: p.RSSBytes, Pods: m["pulse_aggregator_pods"]}
		r.Samples = append(r.Samples, s)
		f.logf("soak %4.0fs: heap %.1f MB (live %.1f MB), %0.f goroutines, %d fds, %.0f pods", s.Seconds, s.HeapInuse/1e6, s.HeapLive/1e6, s.Goroutines, s.FDs, s.Pods)
		if !time.Now().Add(f.o.soakEvery).Before(end.Add(time.Second)) {
			break
		}
		if !procs.Sleep(ctx, f.o.soakEvery) {
			return nil, ctx.Err()
		}
	}
	r.fit()
	return r, nil
}

// fit computes the slopes and judges a leak: over the fitted part, heap
// growing by more than 10 % of its mean, or goroutines or open files by
// more than 1 % of their mean plus 10, is a leak.
func (r *soakResult) fit() {
	tail := r.Samples[len(r.Samples)/3:]
	if len(tail) < 3 {
		r.LeakReason = "too few samples to fit"
		return
	}
	xs := make([]float64, len(tail))
	series := func(get func(soakSample) float64) (slope, mean float64) {
		ys := make([]float64, len(tail))
		for i, s := range tail {
			xs[i], ys[i] = s.Seconds/3600, get(s)
		}
		return slopeOf(xs, ys)
	}
	span := (tail[len(tail)-1].Seconds - tail[0].Seconds) / 3600
	var heapMean, gMean, fdMean float64
	r.HeapSlopeBytesPerHour, heapMean = series(func(s soakSample) float64 { return s.HeapInuse })
	r.GoroutineSlopePerHour, gMean = series(func(s soakSample) float64 { return s.Goroutines })
	r.FDSlopePerHour, fdMean = series(func(s soakSample) float64 { return float64(s.FDs) })
	r.RSSSlopeBytesPerHour, _ = series(func(s soakSample) float64 { return float64(s.RSS) })
	r.LiveSlopeBytesPerHour, _ = series(func(s soakSample) float64 { return s.HeapLive })
	switch {
	case r.HeapSlopeBytesPerHour*span > 0.10*heapMean:
		r.Leak, r.LeakReason = true, fmt.Sprintf("heap grew %.1f MB over %.0f min", r.HeapSlopeBytesPerHour*span/1e6, span*60)
	case r.GoroutineSlopePerHour*span > 0.01*gMean+10:
		r.Leak, r.LeakReason = true, fmt.Sprintf("goroutines grew by %.0f over %.0f min", r.GoroutineSlopePerHour*span, span*60)
	case r.FDSlopePerHour*span > 0.01*fdMean+10:
		r.Leak, r.LeakReason = true, fmt.Sprintf("open files grew by %.0f over %.0f min", r.FDSlopePerHour*span, span*60)
	}
}

// slopeOf is the least-squares slope of ys over xs, and the mean of ys.
func slopeOf(xs, ys []float64) (slope, mean float64) {
	_, slope = stat.LinearRegression(xs, ys, nil, false)
	return slope, stat.Mean(ys, nil)
}
