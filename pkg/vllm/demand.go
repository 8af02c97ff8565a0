package vllm

import (
	"bytes"
	"fmt"
	"math"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pulse-io/pulse/pkg/metric"
)

// Demand says how a router's page reports one workload's demand: which
// metric (the first of Metrics on the page), and which series (those whose
// Label has the value Match), summed.
type Demand struct {
	Metrics []string
	Label   string
	Match   string
	// Arrivals: the metric counts requests that arrived (a counter), not
	// requests held now (a gauge).
	Arrivals bool
}

// Equal reports whether two demands read the same series.
func (d *Demand) Equal(o *Demand) bool {
	if d == nil || o == nil {
		return d == o
	}
	return slices.Equal(d.Metrics, o.Metrics) && d.Label == o.Label && d.Match == o.Match && d.Arrivals == o.Arrivals
}

// Demand presets (docs/scaledobject.md, "Demand before the first pod").
var DemandPresets = map[string]Demand{
	// The Gateway API Inference Extension's endpoint picker: requests held
	// in its flow-control queue, not yet sent to any model server
	// (pkg/epp/metrics: inference_extension_flow_control_queue_size; llm-d's
	// EPP exports the same gauge as llm_d_epp_flow_control_queue_size too,
	// so only the first present is read: their sum would count twice),
	// labelled with the model after rewrite, target_model_name, which
	// llm-d's autoscaler also matches to scale from zero.
	"epp": {Metrics: []string{"llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size"}, Label: "target_model_name"},
	// vLLM production-stack's router holds no request: with no endpoint for
	// a model it answers 503. It counts every request it receives, with or
	// without a backend (src/vllm_router/services/metrics_service:
	// vllm:num_incoming_requests_total, label model): arrivals.
	"production-stack": {Metrics: []string{"vllm:num_incoming_requests_total"}, Label: "model", Arrivals: true},
}

// ExtractDemand reads one workload's demand from a router's page: the sum
// of the matching series of the first of d.Metrics the page has, as
// PendingRequests (held) or ArrivedRequests (arrivals). A page with none of
// the metrics reports 0: a labelled gauge with no series yet is not
// exported at all by Prometheus' client libraries.
func (e *Extractor) ExtractDemand(page []byte, d *Demand) (Page, error) {
	bp := e.bufs.Get().(*[]byte)
	defer e.bufs.Put(bp)
	kept := (*bp)[:0]
	for len(page) > 0 {
		var line []byte
		line, page = nextLine(page)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		n := nameEnd(line)
		if !slices.Contains(d.Metrics, string(line[:n])) {
			continue
		}
		end, value, ok := labelsAndValue(line, n)
		if !ok {
			return Page{}, &ParseError{fmt.Errorf("malformed sample line %q", truncate(line))}
		}
		kept = append(append(append(append(kept, line[:end]...), ' '), value...), '\n')
	}
	*bp = kept
	p := e.parsers.Get().(*expfmt.TextParser)
	defer e.parsers.Put(p)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		return Page{}, &ParseError{err}
	}
	id := metric.PendingRequests
	if d.Arrivals {
		id = metric.ArrivedRequests
	}
	var out Page
	out.Set(id, 0)
	for _, name := range d.Metrics {
		mf, ok := fams[name]
		if !ok {
			continue
		}
		sum := 0.0
		for _, m := range mf.Metric {
			v := m.GetUntyped().GetValue()
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || labelValue(m.GetLabel(), d.Label) != d.Match {
				continue
			}
			sum += v
		}
		out.Set(id, sum)
		break
	}
	return out, nil
}

// labelValue is the value of the label name, "" when absent.
func labelValue(labels []*dto.LabelPair, name string) string {
	for _, lp := range labels {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// ValidateDemand checks a demand's metric and label names.
func ValidateDemand(d *Demand) error {
	if len(d.Metrics) == 0 {
		return fmt.Errorf("no metric")
	}
	for _, m := range d.Metrics {
		if !model.LegacyValidation.IsValidMetricName(m) {
			return fmt.Errorf("metric %q is not a valid metric name", m)
		}
	}
	if !model.LegacyValidation.IsValidLabelName(d.Label) {
		return fmt.Errorf("label %q is not a valid label name", d.Label)
	}
	return nil
}
