package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Health service names, as KEDA's http-add-on serves them: kubelet gRPC
// probes name one with `service:`. The empty name is readiness too.
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
)

// warmup holds a starting aggregator's answers back until the agents have
// had time to reconnect, so that no answer is a partial total: it ends when
// the expected number of agents has sent a batch, or after its duration.
type warmup struct {
	store    *store.Store
	start    time.Time
	d        time.Duration
	now      func() time.Time
	log      *slog.Logger
	expected atomic.Int64 // 0: unknown
	// over: the warm-up's end has come, and the store may adopt the API's
	// replicas on nodes no agent streams from (apiReplicas); done: answers
	// go out, once a sweep has run with over set (sweep). Answers began
	// with over, up to a housekeeping tick (2 s) before the first sweep
	// that could adopt: a workload with replicas on a node whose agent was
	// lost was planned from the others alone meanwhile, and an HPA sync
	// then scaled it down.
	over, done atomic.Bool
	mu         sync.Mutex // held while the warm-up ends
	// sweep is the store's Sweep, run as the warm-up ends (nil: none);
	// ready, when set, says whether what that sweep adopts from (the pod
	// cache) is there: the warm-up does not end before it is. Ended at a
	// check before the cache's first list (with no warm-up, always), the
	// sweep adopted nothing, and answers began up to a housekeeping tick
	// before one that could.
	sweep func()
	ready func() error
}

func newWarmup(st *store.Store, d time.Duration, expected int, now func() time.Time, log *slog.Logger) *warmup {
	w := &warmup{store: st, start: now(), d: d, now: now, log: log}
	w.expected.Store(int64(expected))
	return w // with no warm-up (d ≤ 0), the first check ends it, sweeping first
}

// check returns nil once the warm-up has ended, and why not before. At its
// end it runs a sweep that may adopt the API's replicas before any answer.
func (w *warmup) check() error {
	if w.done.Load() {
		return nil
	}
	heard, expected := w.store.HeardSources(), w.expected.Load()
	elapsed := w.now().Sub(w.start)
	if elapsed >= w.d || (expected > 0 && int64(heard) >= expected) {
		if w.ready != nil {
			if err := w.ready(); err != nil {
				return fmt.Errorf("aggregator warming up: %w", err)
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.done.Load() {
			w.over.Store(true)
			if w.sweep != nil {
				w.sweep()
			}
			w.done.Store(true)
			w.log.Info("warm-up over: answering KEDA", logging.KeyAgents, heard, logging.KeyExpected, expected, logging.KeyElapsed, elapsed.Round(time.Millisecond))
		}
		return nil
	}
	want := "an unknown number of"
	if expected > 0 {
		want = fmt.Sprint(expected)
	}
	return fmt.Errorf("aggregator warming up: %d of %s agents have reported; answers start when all have, or in %s at the latest",
		heard, want, (w.d - elapsed).Round(100*time.Millisecond))
}

// followDaemonSet sets the expected agents from the agent DaemonSet's
// desiredNumberScheduled (one agent per node that should run one) until
// the warm-up ends.
func (w *warmup) followDaemonSet(ctx context.Context, kube kubernetes.Interface, namespace, name string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	warned := false
	for !w.done.Load() {
		ds, err := kube.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			w.expected.Store(int64(ds.Status.DesiredNumberScheduled))
		case ctx.Err() != nil:
			return
		case !warned:
			warned = true
			w.log.Warn("agent DaemonSet not readable: the warm-up waits its full duration", logging.KeyDaemonSet, namespace+"/"+name, logging.KeyErr, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// health answers liveness and readiness, over HTTP (/livez, /readyz) and as
// the gRPC health service (services liveness, readiness and "").
type health struct {
	healthpb.UnimplementedHealthServer
	// every is the housekeeping period; the server is live while the last
	// housekeeping tick is at most 1.5 × every old.
	every    time.Duration
	lastTick atomic.Int64 // Unix nanoseconds
	stopping atomic.Bool
	mu       sync.Mutex
	checks   []readyCheck
	// watchers counts the Watch streams open, at most maxWatchers.
	watchers atomic.Int32
}

// maxWatchers bounds the health Watch streams open on both gRPC ports
// together. Nothing authenticates one (the kubelet's probes call Check):
// each lived until the server stopped, held a goroutine reading the
// checks every second, and kept its connection from the ingest port's
// idle close; a client of any pod opened them without end.
const maxWatchers = 32

type readyCheck struct {
	name string
	fn   func() error
}

var _ healthpb.HealthServer = (*health)(nil)

func newHealth(every time.Duration) *health {
	h := &health{every: every}
	h.tick()
	return h
}

func (h *health) tick() { h.lastTick.Store(time.Now().UnixNano()) }

// addCheck adds a readiness condition.
func (h *health) addCheck(name string, fn func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, readyCheck{name, fn})
}

func (h *health) live() error {
	if h.stopping.Load() {
		return errors.New("shutting down")
	}
	age := time.Since(time.Unix(0, h.lastTick.Load()))
	if limit := h.every * 3 / 2; age > limit {
		return fmt.Errorf("housekeeping stalled: last tick %s ago (limit %s)", age.Round(time.Millisecond), limit)
	}
	return nil
}

func (h *health) ready() error {
	if err := h.live(); err != nil {
		return err
	}
	h.mu.Lock()
	checks := h.checks
	h.mu.Unlock()
	var errs []error
	for _, c := range checks {
		if err := c.fn(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	return errors.Join(errs...)
}

func (h *health) status(service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	var err error
	switch service {
	case ServiceLiveness:
		err = h.live()
	case ServiceReadiness, "":
		err = h.ready()
	default:
		// Cut: the name is anyone's who reaches the port, and quoted a
		// name of control bytes is four times its size (4 MiB sent, 16
		// answered).
		return 0, status.Errorf(codes.NotFound, "unknown service %q: liveness or readiness", wire.CleanText(service, 64))
	}
	if err != nil {
		return healthpb.HealthCheckResponse_NOT_SERVING, nil
	}
	return healthpb.HealthCheckResponse_SERVING, nil
}

// Check answers a kubelet gRPC probe.
func (h *health) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, err := h.status(req.GetService())
	if err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// Watch sends the status at once and on every change (checked every second).
// At most maxWatchers are open at once; past it a Watch is
// ResourceExhausted.
func (h *health) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if h.watchers.Add(1) > maxWatchers {
		h.watchers.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "%d health watches are open, the most the aggregator holds: call Check", maxWatchers)
	}
	defer h.watchers.Add(-1)
	var last healthpb.HealthCheckResponse_ServingStatus = -1
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st, err := h.status(req.GetService())
		if err != nil {
			// The health protocol: a service not known is watched as
			// SERVICE_UNKNOWN, the stream kept open (Check answers
			// NotFound).
			st = healthpb.HealthCheckResponse_SERVICE_UNKNOWN
		}
		if st != last {
			if err := stream.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		if h.stopping.Load() {
			return nil
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-t.C:
		}
	}
}

func (h *health) serveHTTP(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := check(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ok:\n%s\n", err)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}
}
