package debug

import (
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

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
	doc := TriggersDocument{Triggers: []Trigger{}}
	for _, e := range h.Triggers.EvaluationsOf(ns) {
		t := e.Trigger
		// One namespace's: its ScaledObjects' triggers on its own workloads
		// (a trigger across namespaces, allowed by the operator, shows the
		// other's pods: left out), and its refused ones (no pod of anyone's).
		if ns != "" && (e.Namespace != ns || !e.Refused && t.Workload.Namespace != "" && t.Workload.Namespace != ns) {
			continue
		}
		tr := Trigger{TriggerID: e.TriggerID, Workload: t.Workload.String(),
			Metric: t.Metric, Threshold: t.Threshold, ValueType: t.ValueType, Aggregation: t.Aggregation, MissingPods: t.MissingPods,
			Window: t.Window.String(), EvaluatedAt: e.At.UTC(), Error: e.Err, Refused: e.Refused}
		if e.Err == "" {
			d := e.Decision
			n := e.Desired()
			tr.Decision, tr.DesiredReplicas = &d, &n
		}
		doc.Triggers = append(doc.Triggers, tr)
	}
	if wantsTable(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		writeTriggerTable(w, doc)
		return
	}
	writeJSON(w, doc)
}

// writeTriggerTable writes one line per trigger, then one per pod under it
// (its use under METRIC, its value under VALUE), with errors and reasons in
// the last column.
func writeTriggerTable(w http.ResponseWriter, doc TriggersDocument) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCALEDOBJECT\tMETRIC\tVALUE\tTHRESHOLD\tDESIRED\tDIRECTION\tCOUNTED/FILLED/LEFT OUT\tAGE\tWHY")
	now := time.Now()
	for _, t := range doc.Triggers {
		id := cell(t.Namespace + "/" + t.ScaledObject)
		age := now.Sub(t.EvaluatedAt).Round(100 * time.Millisecond).String()
		if t.Error != "" {
			what := "error"
			if t.Refused {
				what = "refused"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t-\t-\t-\t%s\t%s\n", id, cell(t.Metric), what, t.Threshold, age, cell(t.Error))
			continue
		}
		d := t.Decision
		why := ""
		if d.Plan != nil {
			why = cell(d.Plan.Reason)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4g\t%g\t%d\t%s\t%d/%d/%d\t%s\t%s\n", id, cell(t.Metric), d.Value, t.Threshold, *t.DesiredReplicas,
			d.Direction, d.Counted, d.Filled, d.LeftOut, age, why)
		if p := d.Plan; p != nil {
			// The planner's parts, under WHY.
			held := ""
			if !p.HeldUntil.IsZero() {
				held = " until " + p.HeldUntil.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "  plan\t\t\t\t\t\t\t\twork %.0f/s, capacity %.0f/s per replica (confidence %.2f, %d observations, %d breaks; proven %.0f/s, %s), lead time %s (%d startups), need %.2f, held peak %.2f%s, backlog %.0f (%.0f when capacity asked for now is ready), %d ready (%d without a fresh sample, %d of them refused, %d unseen, %d unready), %d starting, %d stuck, %d terminating\n",
				p.Work, p.Capacity, p.Confidence, p.Observations, p.Breaks, p.Proven, brokeAt(p.Broke), p.LeadTime.Round(time.Second), p.Startups, p.Need, p.HeldPeak, held, p.Backlog, p.BacklogThen, p.Ready, p.Missing, p.Refused, p.Unseen, p.Unready, p.Starting, p.Stuck, p.Terminating)
			refused := ""
			if p.RefusedWhy != "" {
				refused = ", refused: " + cell(p.RefusedWhy)
			}
			fmt.Fprintf(tw, "  plan, more\t\t\t\t\t\t\t\twork per request %.0f, planned for %.0f/s (surge %.0f/s, level's surge %.0f/s, trend %.0f/s, peak %.0f/s), drain need %.2f, KV need %.2f, hold extension %s, rule %s%s\n",
				p.WorkPerRequest, p.Level, p.Surge, p.LevelSurge, p.Trend, p.PeakWork, p.DrainNeed, p.KVNeed, p.HoldExtra.Round(time.Second), cell(p.Rule), refused)
		}
		for _, p := range d.Pods {
			v := "-"
			if p.Use != scaler.UseLeftOut {
				v = fmt.Sprintf("%.4g", p.Value)
			}
			// A pod row: its value under VALUE, its use under
			// COUNTED/FILLED/LEFT OUT, the reason under WHY.
			fmt.Fprintf(tw, "  pod %s\t\t%s\t\t\t\t%s\t\t%s\n", cell(p.Name), v, p.Use, cell(p.Why))
		}
		if d.PodsNotListed > 0 {
			fmt.Fprintf(tw, "  and %d more pods\t\t\t\t\t\t\t\t(counted with the others above)\n", d.PodsNotListed)
		}
	}
	_ = tw.Flush()
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
