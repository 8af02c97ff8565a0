package vllmsim

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Handler serves:
//
//	GET  /health   200 once the simulated model load (Options.LoadTime) is
//	               over, 503 before: a readiness probe's path
//	GET  /metrics  the page (OpenMetrics when the Accept header asks for it
//	               first; gzip when accepted); 503 while the model loads
//	GET    /load   the current State as JSON
//	POST   /load   a Load as JSON: set waiting/running/swapped/kvCacheUsage
//	               and hold them (the queueing model no longer moves them)
//	DELETE /load   release them
//	POST   /model  a QueueModel as JSON: drive the load by it, held until
//	               changed (the demo's own swing no longer applies)
//	DELETE /model  back to the demo's swing
//	POST   /hang   {"seconds": N}: /metrics hangs for the next N seconds
//	               (0 ends it)
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if s.loading(w) {
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.loading(w) {
			return
		}
		s.serveMetrics(w, r)
	})
	mux.HandleFunc("GET /load", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.State())
	})
	mux.HandleFunc("POST /load", func(w http.ResponseWriter, r *http.Request) {
		var l Load
		if err := decodeStrict(r, &l); err != nil {
			http.Error(w, "decode load: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := l.Validate(); err != nil {
			http.Error(w, "load: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.SetLoad(l)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /load", func(w http.ResponseWriter, _ *http.Request) {
		s.ReleaseLoad()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /model", func(w http.ResponseWriter, _ *http.Request) {
		s.ReleaseModel()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /model", func(w http.ResponseWriter, r *http.Request) {
		var m QueueModel
		if err := decodeStrict(r, &m); err != nil {
			http.Error(w, "decode model: "+err.Error(), http.StatusBadRequest)
			return
		}
		if m.ArrivalRate < 0 || m.BatchCapacity < 1 || m.ServiceRate <= 0 || math.IsNaN(m.ArrivalRate) || math.IsInf(m.ArrivalRate, 0) || math.IsInf(m.ServiceRate, 0) {
			http.Error(w, "model: want arrivalRate >= 0, batchCapacity >= 1 and serviceRate > 0", http.StatusBadRequest)
			return
		}
		s.SetModel(m)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /hang", func(w http.ResponseWriter, r *http.Request) {
		var h struct {
			Seconds float64 `json:"seconds"`
		}
		if err := decodeStrict(r, &h); err != nil {
			http.Error(w, "decode hang: "+err.Error(), http.StatusBadRequest)
			return
		}
		if h.Seconds < 0 {
			http.Error(w, "hang: seconds must be 0 or more", http.StatusBadRequest)
			return
		}
		s.SetHang(time.Duration(h.Seconds * float64(time.Second)))
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// decodeStrict decodes a steering request, refusing unknown fields (a typo
// such as {"waitng":5} was once accepted and did nothing).
func decodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Validate refuses values no vLLM page shows: negative counts, a KV-cache
// usage outside 0..1.
func (l Load) Validate() error {
	var errs []error
	for name, v := range map[string]*float64{"waiting": l.Waiting, "running": l.Running, "swapped": l.Swapped} {
		if v != nil && (*v < 0 || math.IsNaN(*v) || math.IsInf(*v, 0)) {
			errs = append(errs, fmt.Errorf("%s %v: want a count of 0 or more", name, *v))
		}
	}
	if v := l.KVCacheUsage; v != nil && !(*v >= 0 && *v <= 1) {
		errs = append(errs, fmt.Errorf("kvCacheUsage %v: want 0 to 1", *v))
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}

// loading answers 503 and reports true while the simulated model loads.
func (s *Server) loading(w http.ResponseWriter) bool {
	left := time.Until(s.readyAt)
	if left <= 0 {
		return false
	}
	http.Error(w, fmt.Sprintf("loading model: %.1fs left", left.Seconds()), http.StatusServiceUnavailable)
	return true
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	hang := time.Until(s.hangUntil)
	s.mu.Unlock()
	if hang > 0 {
		t := time.NewTimer(hang)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	accept := r.Header.Get("Accept")
	om := strings.HasPrefix(strings.TrimSpace(accept), "application/openmetrics-text")
	page := s.Page(om)
	if om {
		w.Header().Set("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	}
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		_, _ = gz.Write(page)
		_ = gz.Close()
		return
	}
	_, _ = w.Write(page)
}
