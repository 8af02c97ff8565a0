package provision

import "github.com/prometheus/client_golang/prometheus"

// metrics are the controller's series on the aggregator's /metrics.
type metrics struct {
	c         *Controller
	leader    prometheus.GaugeFunc
	workloads *prometheus.GaugeVec
	changes   *prometheus.CounterVec
	errors    *prometheus.CounterVec
	// eventsDropped: Events not sent, past their namespace's bucket.
	eventsDropped prometheus.Counter
}

func newMetrics(c *Controller) *metrics {
	m := &metrics{c: c,
		leader: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pulse_provisioner_leader",
			Help: "1 while this replica provisions ScaledObjects: it holds the provisioner's Lease, or runs with --leader-elect=false."}, func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.leading {
				return 1
			}
			return 0
		}),
		workloads: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pulse_provisioner_workloads",
			Help: "Workloads annotated for autoscaling, by state: provisioned, invalid (an annotation), conflict (a ScaledObject not pulse's), error (the API server refused or failed the write; retried). 0 on a replica not leading."},
			[]string{"state"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_provisioner_changes_total",
			Help: "ScaledObjects created, updated and deleted by the provisioner."}, []string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_provisioner_errors_total",
			Help: "Provisioning failures by reason: invalid_annotation, conflict, api (the API server refused or failed; retried), sync (ScaledObjects not listed within 2m of a term: the Lease given back), watch (a workload kind not listed or watched: the aggregator's role, or the API server)."},
			[]string{"reason"}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pulse_provisioner_events_dropped_total",
			Help: "Events on workloads not sent: past their namespace's bucket (25 at once, 1 a second after); the workload's state on /debug/provisioning and in the log still says it."}),
	}
	for _, s := range states {
		m.workloads.WithLabelValues(s)
	}
	for _, a := range []string{"create", "update", "delete"} {
		m.changes.WithLabelValues(a)
	}
	for _, r := range []string{"invalid_annotation", "conflict", "api", "sync", "watch"} {
		m.errors.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leader, m.workloads, m.changes, m.errors, m.eventsDropped}
}

// set sets the workloads by state from counts.
func (m *metrics) set(counts map[string]int) {
	for _, s := range states {
		m.workloads.WithLabelValues(s).Set(float64(counts[s]))
	}
}

// states are the workloads gauge's states.
var states = []string{StateProvisioned, StateInvalid, StateConflict, StateError}
