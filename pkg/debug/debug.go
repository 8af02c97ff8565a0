// Package debug serves the aggregator's read-only view of its state:
//
//	GET /debug/workloads                     every workload
//	GET /debug/workloads/{namespace}         one namespace's workloads
//	GET /debug/workloads/{namespace}/{name}  one workload (every kind of that name)
//	GET /debug/triggers                      every ScaledObject trigger's last answer
//	GET /debug/triggers/{namespace}          one namespace's ScaledObjects'
//	GET /debug/provisioning                  the ScaledObjects kept for annotated workloads
//	GET /debug/provisioning/{namespace}      one namespace's
//
// (A namespace's own paths, for a tenant granted them alone: RBAC
// nonResourceURLs "/debug/workloads/team-a", "/debug/workloads/team-a/*",
// "/debug/triggers/team-a", "/debug/provisioning/team-a".)
//
// as JSON, or as a table with ?format=table or Accept: text/plain.
// ?window=10s averages gauges and takes rates over that window instead of
// showing each pod's latest values.
package debug

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/slots"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Handler serves the debug endpoints from a store.
type Handler struct {
	Store *store.Store
	// FreshFor is how recent a pod's last sample must be to count as fresh.
	FreshFor time.Duration
	// MaxWindow bounds ?window.
	MaxWindow time.Duration
	// Triggers gives the triggers' last evaluations; nil: not served.
	Triggers TriggerSource
	// Provisioning gives the ScaledObject provisioner's state; nil: not
	// served.
	Provisioning ProvisioningSource

	answers slots.Slots
	callers slots.Slots
	// namespaced counts the answers of a namespace's paths (InFlightNamespaced).
	namespaced slots.Slots
}

// InFlight bounds the debug answers under way, and InFlightPerNamespace
// those of one namespace's paths (a tenant granted its own alone): each
// decodes the series it shows (a view of every workload: the whole store)
// and holds it, and the records it shows, until its client has read it
// (the page itself is written as it is made: writeList, writeRows); past
// either, 503 at once, as /metrics answers. The aggregator's KEDA answers
// and ingest never wait for more than these, and one tenant asking in a
// loop holds one of them.
const (
	InFlight             = 4
	InFlightPerNamespace = 1
	// InFlightPerCaller bounds those of one caller (WithCaller): a tenant
	// granted four namespaces' pages, or four accounts of its namespace,
	// asking for four large answers and reading none, held every answer
	// from every other reader.
	InFlightPerCaller = 1
	// InFlightNamespaced bounds the answers of namespaces' paths in all:
	// the last answer is a cluster-wide path's, which only a reader
	// granted every namespace reaches (the operator). Four tenants, each
	// asking for a large page of its own namespace and reading none, held
	// every answer, the operator's too, for as long as answerWrite, again
	// and again.
	InFlightNamespaced = InFlight - 1
)

// answerWrite bounds the writing of an answer: a client that does not read
// gives its slot back then (the http port's own bound is a minute).
var answerWrite = 10 * time.Second

type callerKey struct{}

// WithCaller returns ctx naming who asks: whose rate the request's review
// was within (a ServiceAccount's namespace, or a user). A request without
// one (a port with no review) has no bound of its caller's.
func WithCaller(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, callerKey{}, who)
}

// TriggerSource holds the last evaluation of every trigger pulse answered.
type TriggerSource interface {
	// EvaluationsOf returns the last evaluations of namespace ns's
	// ScaledObjects' triggers ("": every namespace's).
	EvaluationsOf(ns string) []scaler.Evaluation
}

var _ TriggerSource = (*scaler.Server)(nil)

// Register adds the endpoints to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/workloads", h.checked(h.serve, true))
	mux.HandleFunc("GET /debug/workloads/{namespace}", h.checked(h.serve, true))
	mux.HandleFunc("GET /debug/workloads/{namespace}/{name}", h.checked(h.serve, true))
	if h.Triggers != nil {
		mux.HandleFunc("GET /debug/triggers", h.checked(h.serveTriggers, false))
		mux.HandleFunc("GET /debug/triggers/{namespace}", h.checked(h.serveTriggers, false))
	}
	if h.Provisioning != nil {
		mux.HandleFunc("GET /debug/provisioning", h.checked(h.serveProvisioning, false))
		mux.HandleFunc("GET /debug/provisioning/{namespace}", h.checked(h.serveProvisioning, false))
	}
}

// checked answers 400 to a ?format= the endpoint does not have (a format
// asked for and silently not given is worse than a refusal), or a ?window=
// to one not windowed, and 503 past
// the answers under way (InFlight, InFlightPerNamespace).
func (h *Handler) checked(next http.HandlerFunc, windowed bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// Each read by its one value: a second (?format=&format=table),
		// or a pair Go's parser drops (a semicolon: ?format=table;x=1),
		// was a format or window asked for and silently not given.
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			http.Error(w, fmt.Sprintf("query: %s", wire.CleanText(err.Error(), 128)), http.StatusBadRequest)
			return
		}
		for _, k := range []string{"format", "window"} {
			if len(q[k]) > 1 {
				http.Error(w, fmt.Sprintf("%s: asked %d times; ask it once", k, len(q[k])), http.StatusBadRequest)
				return
			}
		}
		if f := q.Get("format"); f != "" && f != "json" && f != "table" {
			http.Error(w, fmt.Sprintf("format %q: json (the default) or table", wire.CleanText(f, 64)), http.StatusBadRequest)
			return
		}
		if q.Has("window") && !windowed {
			// As a format: a window asked for and not applied.
			http.Error(w, "window: only /debug/workloads takes one (a trigger's window is its own)", http.StatusBadRequest)
			return
		}
		who, _ := r.Context().Value(callerKey{}).(string)
		if who != "" {
			if !h.callers.Take(who, 0, InFlightPerCaller) {
				http.Error(w, fmt.Sprintf("%d debug answer of yours is under way (a client not reading its own holds it, for at most %s): try again", InFlightPerCaller, answerWrite), http.StatusServiceUnavailable)
				return
			}
			defer h.callers.Give(who)
		}
		ns := r.PathValue("namespace")
		if ns != "" {
			if !h.namespaced.Take("", InFlightNamespaced, 0) {
				http.Error(w, fmt.Sprintf("%d debug answers of namespaces' pages are under way (a client not reading its own holds one, for at most %s; the last answer is kept for the cluster-wide pages): try again", InFlightNamespaced, answerWrite), http.StatusServiceUnavailable)
				return
			}
			defer h.namespaced.Give("")
		}
		if !h.answers.Take(ns, InFlight, InFlightPerNamespace) {
			http.Error(w, fmt.Sprintf("%d debug answers are under way, or %d of namespace %q (a client not reading its own holds one, for at most %s): try again", InFlight, InFlightPerNamespace, wire.CleanText(ns, 64), answerWrite), http.StatusServiceUnavailable)
			return
		}
		defer h.answers.Give(ns)
		if who == "" {
			// A port with no review (--debug-addr, the operator's through
			// a port-forward): a page of megabytes on a slow link is not
			// cut; the port's own bound (a minute) holds.
			next(w, r)
			return
		}
		next(&boundedWriter{ResponseWriter: w}, r)
	}
}

// boundedWriter bounds an answer's writing to answerWrite from its first
// byte (its making, a view of the store, is not counted: a large page
// made under load is not cut; its encoding, written as it goes, is
// after its first 32 KiB: about 0.5 s for 10,000 triggers).
type boundedWriter struct {
	http.ResponseWriter
	started bool
}

func (b *boundedWriter) start() {
	if !b.started {
		b.started = true
		_ = http.NewResponseController(b.ResponseWriter).SetWriteDeadline(time.Now().Add(answerWrite))
	}
}

func (b *boundedWriter) WriteHeader(code int) {
	b.start()
	b.ResponseWriter.WriteHeader(code)
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	b.start()
	return b.ResponseWriter.Write(p)
}

// Unwrap is the writer bounded (http.ResponseController's).
func (b *boundedWriter) Unwrap() http.ResponseWriter { return b.ResponseWriter }

// wantsTable: ?format= decides; without it, an Accept of text/plain (an
// explicit ?format=json was answered a table to such a client).
func wantsTable(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "table"
	}
	return strings.HasPrefix(r.Header.Get("Accept"), "text/plain")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "the answer could not be encoded: "+err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write(append(b, '\n'))
}

// Document is the JSON answer.
type Document struct {
	Workloads []Workload `json:"workloads"`
}

// Workload is one workload in the JSON answer.
type Workload struct {
	Namespace string             `json:"namespace"`
	Kind      string             `json:"kind"`
	Name      string             `json:"name"`
	Pods      []Pod              `json:"pods"`
	Averages  map[string]float64 `json:"averages"`
}

// Pod is one pod in the JSON answer.
type Pod struct {
	Name        string   `json:"name"`
	Ready       bool     `json:"ready"`
	Terminating bool     `json:"terminating,omitempty"`
	Demand      bool     `json:"demand,omitempty"` // a router's entry: pendingRequests or arrivedRequests
	Fresh       bool     `json:"fresh"`
	AgeSeconds  *float64 `json:"ageSeconds"` // null: never reported
	Missing     string   `json:"missing,omitempty"`
	Error       string   `json:"error,omitempty"`
	// Rejected names the values refused from the pod's last sample (bad
	// input: the values shown for them are older).
	Rejected string             `json:"rejected,omitempty"`
	Values   map[string]float64 `json:"values"`
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	var window time.Duration
	if s := r.URL.Query().Get("window"); s != "" {
		// At most what the store keeps now (the longest window a
		// trigger asks for, at least 10 s, within --max-window): a
		// longer one was answered over what was kept, a minute's mean
		// over its last 10 s, as if over the minute. At least a second,
		// as a trigger's: a shorter one holds one sample or none, and
		// its rates were left out, unsaid.
		most := h.Store.Retention()
		if h.MaxWindow > 0 {
			most = min(most, h.MaxWindow)
		}
		d, err := time.ParseDuration(s)
		if err != nil || d != 0 && (d < scaler.MinDuration || d > most) {
			http.Error(w, fmt.Sprintf("window %q: want 0 (each pod's latest sample) or a duration from %s to %s (what the store keeps now: the longest window a trigger asks for, at least 10s, within --max-window)", wire.CleanText(s, 64), scaler.MinDuration, most), http.StatusBadRequest)
			return
		}
		window = d
	}
	opts := store.ViewOptions{Window: window, FreshFor: h.FreshFor}
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	switch {
	case name != "":
		opts.Match = func(k store.Key) bool { return k.Namespace == ns && k.Name == name }
	case ns != "":
		opts.Match = func(k store.Key) bool { return k.Namespace == ns }
	}
	// Each workload is viewed as it is written: an answer holds one
	// workload's view, not the store's every pod.
	views := h.Store.Views(opts)
	if name != "" {
		one := slices.Collect(views)
		if len(one) == 0 {
			http.Error(w, fmt.Sprintf("no workload %q/%q", wire.CleanText(ns, 64), wire.CleanText(name, 64)), http.StatusNotFound)
			return
		}
		views = slices.Values(one)
	}
	workloads := func(yield func(Workload) bool) {
		for v := range views {
			if !yield(toWorkload(v)) {
				return
			}
		}
	}
	if wantsTable(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		writeTable(w, workloads)
		return
	}
	writeList(w, "workloads", workloads, func(wl Workload, err error) failedWorkload {
		return failedWorkload{Namespace: wl.Namespace, Kind: wl.Kind, Name: wl.Name, Error: "this workload could not be encoded: " + err.Error()}
	})
}

func toWorkload(v store.WorkloadView) Workload {
	out := Workload{Namespace: v.Namespace, Kind: v.Kind, Name: v.Name, Averages: clean(v.Averages), Pods: []Pod{}}
	for _, p := range v.Pods {
		pod := Pod{Name: p.Name, Ready: p.Ready, Terminating: p.Terminating, Demand: p.Demand, Fresh: p.Fresh, Missing: p.Missing, Error: p.Error, Rejected: p.Rejected, Values: clean(p.Values)}
		if p.Age >= 0 {
			age := math.Round(p.Age.Seconds()*1000) / 1000
			pod.AgeSeconds = &age
		}
		out.Pods = append(out.Pods, pod)
	}
	return out
}

// clean drops values JSON cannot carry.
func clean(m map[string]float64) map[string]float64 {
	for k, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			delete(m, k)
		}
	}
	return m
}

// tableMetrics are the columns of the table, when present.
var tableMetrics = []string{"waiting", "running", "kvCacheUsage", "requestsPerSecond", "generationTokensPerSecond", "ttftSeconds", "gpuUtilization"}

func writeTable(w http.ResponseWriter, workloads iter.Seq[Workload]) {
	writeRows(w, func(yield func([]string) bool) {
		row := make([]string, 0, 4+len(tableMetrics))
		if !yield(append(append(row[:0], "WORKLOAD", "POD", "STATE", "AGE"), tableMetrics...)) {
			return
		}
		for wl := range workloads {
			id := cell(store.Key{Namespace: wl.Namespace, Kind: wl.Kind, Name: wl.Name}.String())
			for _, p := range wl.Pods {
				state := podState(p)
				age := "-"
				if p.AgeSeconds != nil {
					age = fmt.Sprintf("%.1fs", *p.AgeSeconds)
				}
				// A pod that is not fresh, or whose last sample was
				// refused in part, shows no values: they are not what it
				// reports now (the JSON keeps them, beside "fresh" and
				// "rejected").
				vals := p.Values
				if state != "fresh" {
					vals = nil
				}
				if !yield(withValues(append(row[:0], id, cell(p.Name), cell(state), age), vals)) {
					return
				}
			}
			if !yield(withValues(append(row[:0], id, "= average", "", ""), wl.Averages)) {
				return
			}
		}
	})
	fmt.Fprintln(w, "\n-: no value: the pod is not fresh, or the metric is not on its page (gpuUtilization needs the agent's NVML and the kubelet's pod-resources socket)")
}

// podState is a pod's STATE in the table.
func podState(p Pod) string {
	switch {
	case p.Demand && p.Fresh:
		if v, ok := p.Values["pendingRequests"]; ok {
			return fmt.Sprintf("router: %g held", v)
		}
		return "router"
	case p.Terminating:
		return "terminating"
	case !p.Ready:
		return "starting"
	case p.Missing != "":
		return "missing:" + p.Missing
	case !p.Fresh:
		return "stale"
	case p.Rejected != "":
		return "rejected:" + strings.ReplaceAll(p.Rejected, " ", "-")
	}
	return "fresh"
}

// withValues is row with the table's metrics of vals, "-" for each absent.
func withValues(row []string, vals map[string]float64) []string {
	for _, m := range tableMetrics {
		if v, ok := vals[m]; ok {
			row = append(row, fmt.Sprintf("%.4g", v))
		} else {
			row = append(row, "-")
		}
	}
	return row
}
