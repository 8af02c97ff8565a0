package vllmsim

import (
	"compress/gzip"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// Handler serves:
//
//	GET  /metrics  the page (OpenMetrics when the Accept header asks for it
//	               first; gzip when accepted)
//	GET  /load     the current State as JSON
//	POST /load     a Load as JSON: set waiting/running/swapped/kvCacheUsage
//	POST /model    a QueueModel as JSON: drive the load by the queueing model
//	POST /hang     {"seconds": N}: make /metrics hang N seconds (0 ends it)
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("GET /load", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.State())
	})
	mux.HandleFunc("POST /load", func(w http.ResponseWriter, r *http.Request) {
		var l Load
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			http.Error(w, "decode load: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.SetLoad(l)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /model", func(w http.ResponseWriter, r *http.Request) {
		var m QueueModel
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			http.Error(w, "decode model: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.SetModel(m)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /hang", func(w http.ResponseWriter, r *http.Request) {
		var h struct{ Seconds float64 }
		if err := json.NewDecoder(r.Body).Decode(&h); err != nil {
			http.Error(w, "decode hang: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.SetHang(time.Duration(h.Seconds * float64(time.Second)))
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	hang := s.hang
	s.mu.Unlock()
	if hang > 0 {
		select {
		case <-time.After(hang):
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
