package scaler

import (
	"errors"
	"slices"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RefusedMetricName is the MetricName of a refused trigger's record: its
// metadata did not parse, so it has no metric name of its own.
const RefusedMetricName = "refused"

// RefusedMetricLabel is the metric label of a refused trigger's series:
// no metric a trigger can name (a Prometheus metric name) is written so.
const RefusedMetricLabel = "(refused)"

// refusalLogEvery rate-limits the log line of one ScaledObject's refusals.
const refusalLogEvery = time.Minute

// Reasons of pulse_aggregator_refused_triggers_total besides the metadata
// key at fault.
const (
	ReasonNamespace   = "namespace"   // another namespace than the ScaledObject's
	ReasonUnforwarded = "unforwarded" // a raw metric no agent forwards
	ReasonMetadata    = "metadata"    // no one key at fault
)

var descRefused = prometheus.NewDesc("pulse_aggregator_refused_triggers_total",
	"Trigger requests refused for their ScaledObject's metadata (InvalidArgument), by reason: the metadata key at fault, namespace, unforwarded or metadata.",
	[]string{"reason"}, nil)

// refusals counts refused requests by reason and rate-limits their log.
type refusals struct {
	counts map[string]float64 // by reason; mu of the recorder
	// logged: when each ScaledObject's refusal was last logged, by
	// namespace; at most maxDecisions in all (nLogged).
	logged  map[string]map[TriggerID]time.Time
	nLogged int
}

// shouldLog reports whether id's refusal at now is logged (once a
// refusalLogEvery), and records it. Past maxDecisions ScaledObjects the
// namespace holding the most gives its expired entries, else its oldest:
// all were cleared, and one tenant's 10,000 broken ScaledObjects had every
// tenant's refusals logged at every poll.
func (f *refusals) shouldLog(id TriggerID, now time.Time) bool {
	ns := f.logged[id.Namespace]
	last, seen := ns[id]
	if seen && now.Sub(last) < refusalLogEvery {
		return false
	}
	if !seen && f.nLogged >= maxDecisions {
		f.forgetOfMost(now)
		ns = f.logged[id.Namespace]
	}
	if ns == nil {
		ns = map[TriggerID]time.Time{}
		f.logged[id.Namespace] = ns
	}
	if !seen {
		f.nLogged++
	}
	ns[id] = now
	return true
}

// forgetOfMost drops the expired entries of the namespace with the most,
// or, when none is, its older half: a batch at once, so that a flood of new
// ScaledObjects costs a scan of that namespace once every half of it, not
// at each refusal, under the recorder's lock.
func (f *refusals) forgetOfMost(now time.Time) {
	most := ""
	for n, m := range f.logged {
		if most == "" || len(m) > len(f.logged[most]) {
			most = n
		}
	}
	m := f.logged[most]
	before := len(m)
	for id, at := range m {
		if now.Sub(at) >= refusalLogEvery {
			delete(m, id)
		}
	}
	if len(m) == before {
		type entry struct {
			id TriggerID
			at time.Time
		}
		es := make([]entry, 0, len(m))
		for id, at := range m {
			es = append(es, entry{id, at})
		}
		slices.SortFunc(es, func(a, b entry) int { return a.at.Compare(b.at) })
		for _, e := range es[:max(1, len(es)/2)] { // the older half
			delete(m, e.id)
		}
	}
	f.nLogged -= before - len(m)
	if len(m) == 0 {
		delete(f.logged, most)
	}
}

// refuse records a request refused for its metadata: in the trigger
// records (/debug/triggers, pulse_aggregator_trigger_failed), in
// pulse_aggregator_refused_triggers_total by reason, and in the log, once a
// minute per ScaledObject. err is the InvalidArgument answer.
func (s *Server) refuse(ref *externalscaler.ScaledObjectRef, t Trigger, reason string, err error) {
	r := s.decisions
	id := TriggerID{Namespace: ref.GetNamespace(), ScaledObject: ref.GetName(), MetricName: RefusedMetricName}
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Message()
	}
	now := r.now()
	r.mu.Lock()
	r.putLocked(&Evaluation{TriggerID: id, Trigger: t, At: now, Err: codes.InvalidArgument.String() + ": " + msg, Refused: true})
	r.refused.counts[reason]++
	log := r.refused.shouldLog(id, now)
	r.mu.Unlock()
	if log {
		s.log.Warn("ScaledObject trigger refused", "namespace", id.Namespace, "scaledObject", id.ScaledObject, "reason", reason, "error", msg)
	}
}

// refusalReason is the reason label of a refused trigger's error.
func refusalReason(err error) string {
	var me *MetadataError
	if errors.As(err, &me) && me.Key != "" && (slices.Contains(pulseKeys, me.Key) || me.Key == "metricName") {
		return me.Key
	}
	return ReasonMetadata
}

func (c decisionCollector) collectRefused(ch chan<- prometheus.Metric) {
	r := c.s.decisions
	r.mu.Lock()
	counts := make(map[string]float64, len(r.refused.counts))
	for k, v := range r.refused.counts {
		counts[k] = v
	}
	r.mu.Unlock()
	for reason, n := range counts {
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, n, reason)
	}
}

var (
	descStreams = prometheus.NewDesc("pulse_aggregator_scaler_streams",
		"KEDA's StreamIsActive and StreamMetricSpec streams open now.", nil, nil)
	descSeriesLeftOut = prometheus.NewDesc("pulse_aggregator_trigger_series_left_out",
		"Triggers whose series this page leaves out, past --max-trigger-series (the triggers shown are shared among their namespaces in turn; /debug/triggers has every one).", nil, nil)
	descStreamsReclaimed = prometheus.NewDesc("pulse_aggregator_scaler_streams_reclaimed_total",
		"Streams ended (ResourceExhausted) to give their place to another namespace's: every place taken, the other namespace below its share of --max-scaler-streams, and this one's the most, above its share.", nil, nil)
	descStreamsRefused = prometheus.NewDesc("pulse_aggregator_scaler_streams_refused_total",
		"Streams refused (ResourceExhausted) past a bound, by the bound: all (--max-scaler-streams) or namespace (--max-scaler-streams-per-namespace).",
		[]string{"limit"}, nil)
)

// collectStreams gives the open streams and those refused, both bounds'
// series from the start.
func (c decisionCollector) collectStreams(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(c.s.OpenStreams()))
	for limit, name := range []string{limitAll: "all", limitNamespace: "namespace"} {
		ch <- prometheus.MustNewConstMetric(descStreamsRefused, prometheus.CounterValue, float64(c.s.streamsRefused[limit].Load()), name)
	}
	ch <- prometheus.MustNewConstMetric(descStreamsReclaimed, prometheus.CounterValue, float64(c.s.streamsReclaimed.Load()))
}
