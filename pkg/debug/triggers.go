package debug

import (
	"fmt"
	"iter"
	"net/http"
	"strings"
	"time"

	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/wire"
)

// TriggersDocument is the JSON answer of /debug/triggers.
type TriggersDocument struct {
	Triggers []Trigger `json:"triggers"`
}

// Trigger is one ScaledObject trigger's last evaluation: why pulse answered
// the number it did.
type Trigger struct {
	scaler.TriggerID
	Workload    string  `json:"workload"` // Kind namespace/name
	Metric      string  `json:"metric"`
	Threshold   float64 `json:"threshold"`
	ValueType   string  `json:"valueType"`
	Aggregation string  `json:"aggregation"`
	MissingPods string  `json:"missingPods"`
	Window      string  `json:"window"`
	// EvaluatedAt is when pulse last answered it (GetMetrics or IsActive).
	EvaluatedAt time.Time `json:"evaluatedAt"`
	// Error is the answer when the evaluation failed; the fields below are
	// then empty.
	Error string `json:"error,omitempty"`
	// Refused: the trigger's metadata was refused (InvalidArgument, the
	// error says which key and why); metricName is then "refused", and the
	// fields above hold what of the metadata parsed. EvaluatedAt is when
	// KEDA last sent it.
	Refused bool `json:"refused,omitempty"`
	// DesiredReplicas is ceil(value / threshold) for valueType total
	// (ceil(value / threshold × ready pods) for average), each in the
	// thousandths KEDA gives the HPA (scaler.KEDAMilli): what the HPA
	// derives before its tolerance, behaviour and min/max.
	DesiredReplicas *int             `json:"desiredReplicas,omitempty"`
	Decision        *scaler.Decision `json:"decision,omitempty"`
}

func (h *Handler) serveTriggers(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("namespace")
	evals := h.Triggers.EvaluationsOf(ns)
	triggers := func(yield func(Trigger) bool) {
		for i := range evals {
			if tr, ok := triggerOf(&evals[i], ns); ok && !yield(tr) {
				return
			}
		}
	}
	if wantsTable(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		writeTriggerTable(w, triggers)
		return
	}
	writeList(w, "triggers", triggers, func(t Trigger, err error) failedTrigger {
		return failedTrigger{TriggerID: t.TriggerID, Error: "this trigger's record could not be encoded: " + err.Error()}
	})
}

// triggerOf is e as the page shows it, and whether namespace ns's page
// ("": the cluster's) shows it: one namespace's shows its ScaledObjects'
// triggers on its own workloads (a trigger across namespaces, allowed by
// the operator, shows the other's pods: left out), and its refused ones
// (no pod of anyone's).
func triggerOf(e *scaler.Evaluation, ns string) (Trigger, bool) {
	t := e.Trigger
	if ns != "" && (e.Namespace != ns || !e.Refused && t.Workload.Namespace != "" && t.Workload.Namespace != ns) {
		return Trigger{}, false
	}
	tr := Trigger{TriggerID: e.TriggerID, Workload: t.Workload.String(),
		Metric: t.Metric, Threshold: t.Threshold, ValueType: t.ValueType, Aggregation: t.Aggregation, MissingPods: t.MissingPods,
		Window: t.Window.String(), EvaluatedAt: e.At.UTC(), Error: e.Err, Refused: e.Refused}
	if e.Err == "" {
		n := e.Desired()
		tr.Decision, tr.DesiredReplicas = &e.Decision, &n
	}
	return tr, true
}

// writeTriggerTable writes one line per trigger, then one per pod under it
// (its use under METRIC, its value under VALUE), with errors and reasons in
// the last column.
func writeTriggerTable(w http.ResponseWriter, triggers iter.Seq[Trigger]) {
	now := time.Now()
	writeRows(w, func(yield func([]string) bool) {
		row := make([]string, 9)
		line := func(cells ...string) bool {
			copy(row, cells)
			clear(row[len(cells):])
			return yield(row)
		}
		// under WHY: a line of the last column alone, under its first
		// cell.
		under := func(first, why string) bool {
			clear(row)
			row[0], row[8] = first, why
			return yield(row)
		}
		if !line("SCALEDOBJECT", "METRIC", "VALUE", "THRESHOLD", "DESIRED", "DIRECTION", "COUNTED/FILLED/LEFT OUT", "AGE", "WHY") {
			return
		}
		for t := range triggers {
			if !triggerRows(t, now, line, under) {
				return
			}
		}
	})
}

// triggerRows gives the table's lines of one trigger, false once the
// writing stopped.
func triggerRows(t Trigger, now time.Time, line func(...string) bool, under func(string, string) bool) bool {
	id := cell(t.Namespace + "/" + t.ScaledObject)
	age := now.Sub(t.EvaluatedAt).Round(100 * time.Millisecond).String()
	if t.Error != "" {
		what := "error"
		if t.Refused {
			what = "refused"
		}
		return line(id, cell(t.Metric), what, fmt.Sprintf("%g", t.Threshold), "-", "-", "-", age, cell(t.Error))
	}
	d := t.Decision
	why := ""
	if d.Plan != nil {
		why = cell(d.Plan.Reason)
	}
	if !line(id, cell(t.Metric), fmt.Sprintf("%.4g", d.Value), fmt.Sprintf("%g", t.Threshold), fmt.Sprint(*t.DesiredReplicas),
		d.Direction, fmt.Sprintf("%d/%d/%d", d.Counted, d.Filled, d.LeftOut), age, why) {
		return false
	}
	if p := d.Plan; p != nil && !planRows(p, under) {
		return false
	}
	for _, p := range d.Pods {
		v := "-"
		if p.Use != scaler.UseLeftOut {
			v = fmt.Sprintf("%.4g", p.Value)
		}
		// A pod row: its value under VALUE, its use under
		// COUNTED/FILLED/LEFT OUT, the reason under WHY.
		if !line("  pod "+cell(p.Name), "", v, "", "", "", p.Use, "", cell(p.Why)) {
			return false
		}
	}
	if d.PodsNotListed > 0 {
		return under(fmt.Sprintf("  and %d more pods", d.PodsNotListed), "(counted with the others above)")
	}
	return true
}

// planRows gives the planner's parts, under WHY.
func planRows(p *planner.Plan, under func(string, string) bool) bool {
	held := ""
	if !p.HeldUntil.IsZero() {
		held = " until " + p.HeldUntil.UTC().Format(time.RFC3339)
	}
	if !under("  plan", fmt.Sprintf("work %.0f/s, capacity %.0f/s per replica (confidence %.2f, %d observations, %d breaks; proven %.0f/s, %s), lead time %s (%d startups), need %.2f, held peak %.2f%s, backlog %.0f (%.0f when capacity asked for now is ready), %d ready (%d without a fresh sample, %d of them refused, %d unseen, %d unready), %d starting, %d stuck, %d terminating",
		p.Work, p.Capacity, p.Confidence, p.Observations, p.Breaks, p.Proven, brokeAt(p.Broke), p.LeadTime.Round(time.Second), p.Startups, p.Need, p.HeldPeak, held, p.Backlog, p.BacklogThen, p.Ready, p.Missing, p.Refused, p.Unseen, p.Unready, p.Starting, p.Stuck, p.Terminating)) {
		return false
	}
	refused := ""
	if p.RefusedWhy != "" {
		refused = ", refused: " + cell(p.RefusedWhy)
	}
	return under("  plan, more", fmt.Sprintf("work per request %.0f, planned for %.0f/s (surge %.0f/s, level's surge %.0f/s, trend %.0f/s, peak %.0f/s), drain need %.2f, KV need %.2f, hold extension %s, rule %s%s",
		p.WorkPerRequest, p.Level, p.Surge, p.LevelSurge, p.Trend, p.PeakWork, p.DrainNeed, p.KVNeed, p.HoldExtra.Round(time.Second), cell(p.Rule), refused))
}

// cell is tenant text (a workload's or pod's name, an error or reason that
// quotes one, a trigger's metadata) as one table cell: line breaks and tabs
// as spaces, other control and format characters as U+FFFD
// (wire.Printable). Printed as it was, a name with a newline forged a row
// under another namespace's name, and escape sequences reached the
// terminal of whoever read the table.
func cell(s string) string {
	return wire.Printable(strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || r == '\r' {
			return ' '
		}
		return r
	}, s))
}

// brokeAt names the level replicas broke at (smoothed), or that none has.
func brokeAt(broke float64) string {
	if broke == 0 {
		return "no break yet"
	}
	return fmt.Sprintf("broke at %.0f/s", broke)
}
