// Package router is a simulated router in front of model servers, for
// pulse's demand-source tests: requests for a model with no backend are
// held (the Gateway API Inference Extension endpoint picker's flow-control
// queue) or refused with 503 and counted (vLLM production-stack's router),
// and its /metrics page reports them under those routers' own metric names.
package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
)

// Options pick the router's kind.
type Options struct {
	// ProductionStack: refuse requests with no backend (503) and count
	// them in vllm:num_incoming_requests_total{model}; otherwise hold them
	// and report inference_extension_flow_control_queue_size.
	ProductionStack bool
	// LLMD: also report llm-d's llm_d_epp_flow_control_queue_size with
	// the same value, as llm-d's endpoint picker does.
	LLMD bool
}

// Server is a router. Safe for concurrent use.
type Server struct {
	opts     Options
	mu       sync.Mutex
	held     map[string]int
	incoming map[string]int
	backend  map[string]bool
	released map[string]chan struct{}
}

// New returns a router with no backend for any model.
func New(opts Options) *Server {
	return &Server{opts: opts, held: map[string]int{}, incoming: map[string]int{}, backend: map[string]bool{}, released: map[string]chan struct{}{}}
}

// Handler serves /metrics and the OpenAI-style /v1/completions.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", s.metrics)
	mux.HandleFunc("/v1/completions", s.complete)
	return mux
}

// SetBackend says whether model has a ready backend: held requests of a
// model that gets one are released (answered 200).
func (s *Server) SetBackend(model string, up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backend[model] = up
	if ch, ok := s.released[model]; ok && up {
		close(ch)
		delete(s.released, model)
	}
}

// Held is the number of requests for model held now.
func (s *Server) Held(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[model]
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model string `json:"model"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model == "" {
		http.Error(w, "want a JSON body with a model", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.incoming[body.Model]++
	if s.backend[body.Model] {
		s.mu.Unlock()
		_, _ = fmt.Fprintln(w, `{"choices":[{"text":"ok"}]}`)
		return
	}
	if s.opts.ProductionStack {
		s.mu.Unlock()
		http.Error(w, "Model existed before but is now scaled to zero", http.StatusServiceUnavailable)
		return
	}
	ch, ok := s.released[body.Model]
	if !ok {
		ch = make(chan struct{})
		s.released[body.Model] = ch
	}
	s.held[body.Model]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.held[body.Model]--
		s.mu.Unlock()
	}()
	select {
	case <-ch:
		_, _ = fmt.Fprintln(w, `{"choices":[{"text":"ok"}]}`)
	case <-r.Context().Done():
	}
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	var b strings.Builder
	if s.opts.ProductionStack {
		b.WriteString("# HELP vllm:num_incoming_requests_total Total valid incoming requests to router (including when no backends available)\n")
		b.WriteString("# TYPE vllm:num_incoming_requests_total counter\n")
		for _, m := range sortedKeys(s.incoming) {
			fmt.Fprintf(&b, "vllm:num_incoming_requests_total{model=%q} %d\n", m, s.incoming[m])
		}
	} else {
		names := []string{"inference_extension_flow_control_queue_size"}
		if s.opts.LLMD {
			names = append(names, "llm_d_epp_flow_control_queue_size")
		}
		for _, name := range names {
			fmt.Fprintf(&b, "# HELP %s Current number of requests actively held in the Flow Control queue.\n# TYPE %s gauge\n", name, name)
			for _, m := range sortedKeys(s.held) {
				// One series per fairness id and priority, as the endpoint
				// picker labels them; a model's requests are summed.
				fmt.Fprintf(&b, "%s{fairness_id=\"default\",inference_pool=\"pool\",model_name=%q,priority=\"0\",target_model_name=%q} %d\n", name, m, m, s.held[m])
			}
		}
	}
	// A family the router also exports, which pulse does not read.
	b.WriteString("# TYPE process_open_fds gauge\nprocess_open_fds 12\n")
	_, _ = w.Write([]byte(b.String()))
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
