package provision

import "github.com/prometheus/client_golang/prometheus"

// metrics are the controller's series on the aggregator's /metrics.
type metrics struct {
	c         *Controller
	leader    prometheus.GaugeFunc
	workloads *prometheus.GaugeVec
	changes   *prometheus.CounterVec
	errors    *prometheus.CounterVec
}

func newMetrics(c *Controller) *metrics {
	m := &metrics{c: c,
		leader: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pulse_provisioner_leader",
			Help: "1 while this replica holds the provisioner's Lease and provisions ScaledObjects."}, func() float64 {
			if c.Provisioning().Leading {
				return 1
			}
			return 0
		}),
		workloads: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pulse_provisioner_workloads",
			Help: "Workloads annotated for autoscaling, by state: provisioned, invalid (an annotation), conflict (a ScaledObject not pulse's)."},
			[]string{"state"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_provisioner_changes_total",
			Help: "ScaledObjects created, updated and deleted by the provisioner."}, []string{"action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pulse_provisioner_errors_total",
			Help: "Provisioning failures by reason: invalid_annotation, conflict, api (the API server refused or failed; retried)."},
			[]string{"reason"}),
	}
	for _, s := range []string{StateProvisioned, StateInvalid, StateConflict} {
		m.workloads.WithLabelValues(s)
	}
	for _, a := range []string{"create", "update", "delete"} {
		m.changes.WithLabelValues(a)
	}
	for _, r := range []string{"invalid_annotation", "conflict", "api"} {
		m.errors.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leader, m.workloads, m.changes, m.errors}
}

// refresh recounts the workloads by state.
func (m *metrics) refresh() {
	counts := map[string]float64{StateProvisioned: 0, StateInvalid: 0, StateConflict: 0}
	for _, s := range m.c.Provisioning().Workloads {
		counts[s.State]++
	}
	for s, n := range counts {
		m.workloads.WithLabelValues(s).Set(n)
	}
}
