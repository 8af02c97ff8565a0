package vllm

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"

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
//
// arr, when not nil, is d's arrival state (NewArrivals), kept from scrape
// to scrape of the demand: its series are made monotonic in it.
func (e *Extractor) ExtractDemand(page []byte, d *Demand, arr *Arrivals) (Page, error) {
	w := wantsOf(d)
	r := e.demandFamilies(page, d.Metrics, w)[w.slot(d)]
	if r.err != nil {
		return Page{}, r.err
	}
	return demandPage(r.fams, d, arr), nil
}

// ExtractDemands is ExtractDemand for each of demands, the page read once
// for all that read the same metrics (a router's, one a workload it
// fronts): 64 workloads once read a page of up to 1 MiB 64 times a scrape.
// arrs, nil or one per demand (each nil or its state), are as
// ExtractDemand's.
func (e *Extractor) ExtractDemands(page []byte, demands []*Demand, arrs []*Arrivals) ([]Page, []error) {
	pages, errs := make([]Page, len(demands)), make([]error, len(demands))
	type read struct {
		metrics []string
		want    demandWants
		slots   []demandRead
	}
	var reads []read
	for i, d := range demands {
		k := slices.IndexFunc(reads, func(r read) bool { return slices.Equal(r.metrics, d.Metrics) })
		if k < 0 {
			w := wantsOf(sameMetrics(demands[i:], d.Metrics)...)
			reads = append(reads, read{metrics: d.Metrics, want: w, slots: e.demandFamilies(page, d.Metrics, w)})
			k = len(reads) - 1
		}
		r := reads[k].slots[reads[k].want.slot(d)]
		if errs[i] = r.err; errs[i] == nil {
			var arr *Arrivals
			if i < len(arrs) {
				arr = arrs[i]
			}
			pages[i] = demandPage(r.fams, d, arr)
		}
	}
	return pages, errs
}

// sameMetrics is those of ds that read metrics (ds itself when all do).
func sameMetrics(ds []*Demand, metrics []string) []*Demand {
	if !slices.ContainsFunc(ds, func(d *Demand) bool { return !slices.Equal(d.Metrics, metrics) }) {
		return ds
	}
	var same []*Demand
	for _, d := range ds {
		if slices.Equal(d.Metrics, metrics) {
			same = append(same, d)
		}
	}
	return same
}

// demandWants is which lines of a router's page a group of demands
// reads: those that hold one of pairs (a label and a value matched, as
// the text format writes them: `model="llama"`), or every line (all: one
// of them matches a label's absence, or no label). A router's label values
// are often its clients' to write (vLLM production-stack's router counts a
// request under the model it names before it knows the model): one line
// past the bounds on a line (a 9 KB model name), or 16,384 series of models
// that do not exist, refused the page, and every workload behind the
// router lost its demand. The lines of other values are not read at all,
// and each pair's lines are read apart (demandFamilies): a line that holds
// one workload's pair and fails the bounds (its other labels a client's
// too: the EPP's fairness_id, from a request's header) fails that
// workload's read alone.
type demandWants struct {
	all   bool
	pairs [][]byte
	names []string // each pair's label name
}

// pairOf is d's pair as the text format writes it.
func pairOf(d *Demand) []byte { return []byte(d.Label + `="` + labelEscaper.Replace(d.Match) + `"`) }

// slot is the index of d's read among demandFamilies' (0 with all).
func (w demandWants) slot(d *Demand) int {
	if w.all {
		return 0
	}
	// Made once: made for each pair compared, a router naming 64
	// workloads of long names allocated 3.9 MB a scrape.
	pd := pairOf(d)
	return max(0, slices.IndexFunc(w.pairs, func(p []byte) bool { return bytes.Equal(p, pd) }))
}

// labelEscaper writes a label value as the text format does.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func wantsOf(ds ...*Demand) demandWants {
	var w demandWants
	for i, d := range ds {
		if d.Label == "" || d.Match == "" {
			return demandWants{all: true}
		}
		if !slices.ContainsFunc(ds[:i], func(o *Demand) bool { return o.Label == d.Label && o.Match == d.Match }) {
			w.pairs, w.names = append(w.pairs, pairOf(d)), append(w.names, d.Label)
		}
	}
	return w
}

// matches appends to dst the index of each of w's pairs labels (a
// series' label set, or a line refused) holds at a label's start (after
// the brace, a comma or a blank), or 0 with all. An unescaped quote is
// never within a label's value, so a pair found there is the label
// itself.
func (w demandWants) matches(dst []int, labels []byte) []int {
	if w.all {
		return append(dst, 0)
	}
	// A pair is sought as one run of bytes, name="value"; in a line with
	// a blank beside an '=' (the text format allows them: expfmt reads
	// `model = "llama"`, a line passed over, its demand read 0) by its
	// name, then its '=' and value.
	loose := blankBesideEquals(labels)
	// A quoted label name ("model"="llama") is sought only where one
	// can be: a quote beside an '=' or a blank before one.
	quoted := loose || bytes.Contains(labels, []byte(`"=`))
	for k, p := range w.pairs {
		seek := p
		if loose {
			seek = p[:len(w.names[k])]
		}
		for from := 0; ; {
			i := bytes.Index(labels[from:], seek)
			if i < 0 {
				break
			}
			i += from
			if i > 0 {
				if c := labels[i-1]; (c == '{' || c == ',' || c == ' ' || c == '\t') && (!loose || valueFollows(labels[i+len(seek):], p[len(seek)+1:])) {
					dst = append(dst, k)
					break
				}
			}
			from = i + 1
		}
		if quoted && (len(dst) == 0 || dst[len(dst)-1] != k) && quotedPair(labels, w.names[k], p[len(w.names[k])+1:]) {
			dst = append(dst, k)
		}
	}
	return dst
}

// quotedPair reports whether labels hold the label name written quoted
// ("model"="llama", as the text format allows any label name, and expfmt
// reads), at a label's start, then its '=' and value (blanks allowed
// around the '='). Within a value a quote is escaped: a quoted name found
// is the label's.
func quotedPair(labels []byte, name string, value []byte) bool {
	for from := 0; ; {
		i := bytes.Index(labels[from:], []byte(name)) // no allocation: the compiler converts in place
		if i < 0 {
			return false
		}
		i += from
		if j := i + len(name); i > 1 && labels[i-1] == '"' && j < len(labels) && labels[j] == '"' {
			if c := labels[i-2]; (c == '{' || c == ',' || c == ' ' || c == '\t') && valueFollows(labels[j+1:], value) {
				return true
			}
		}
		from = i + 1
	}
}

// blankBesideEquals reports whether an '=' in b has a blank or tab on
// either side.
func blankBesideEquals(b []byte) bool {
	for i := 0; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '=')
		if j < 0 {
			return false
		}
		i += j
		if i > 0 && (b[i-1] == ' ' || b[i-1] == '\t') || i+1 < len(b) && (b[i+1] == ' ' || b[i+1] == '\t') {
			return true
		}
	}
	return false
}

// valueFollows reports whether rest, what follows a label's name, is its
// '=' and then value (quoted), blanks allowed around the '='.
func valueFollows(rest, value []byte) bool {
	rest = bytes.TrimLeft(rest, " \t")
	if len(rest) == 0 || rest[0] != '=' {
		return false
	}
	return bytes.HasPrefix(bytes.TrimLeft(rest[1:], " \t"), value)
}

// twice is an error where slots, the pairs one series' labels hold, give
// one label twice (a label set the parser refuses, whose line would be
// kept for each workload it names until then).
func (w demandWants) twice(slots []int) error {
	for i, k := range slots {
		for _, o := range slots[:i] {
			if w.names[o] == w.names[k] {
				return fmt.Errorf("a series gives label %q twice", w.names[k])
			}
		}
	}
	return nil
}

// demandRead is one pair's read of a page: its series, or why not.
type demandRead struct {
	fams map[string]*dto.MetricFamily
	err  error
}

// demandFamilies parses the page's series of metrics, each of want's
// pairs' lines apart (one read with all), and no other line: a line past
// the bounds, a pair's lines past maxKeptPageSeries, or a pair's lines
// the parser refuses fail that pair's read, not the others'.
func (e *Extractor) demandFamilies(page []byte, metrics []string, want demandWants) []demandRead {
	n := max(1, len(want.pairs))
	if want.all {
		n = 1
	}
	out := make([]demandRead, n)
	kept, lines := make([][]byte, n), make([]int, n)
	var held [64]int
	for len(page) > 0 {
		var line []byte
		line, page = nextLine(page)
		if len(line) > 0 && line[0] == '#' && isEOF(line) {
			break
		}
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		end := nameEnd(line)
		if !slices.Contains(metrics, string(line[:end])) {
			continue
		}
		// A line that names no pair is passed over unread. One that does
		// is then sought in its series' labels alone: sought past them,
		// one line whose exemplar (or any text after its value) named 64
		// workloads was kept and parsed 64 times, and a 1 MiB router page
		// held 145 MiB live in an agent limited to 128. A line refused is
		// sought whole, so that it fails the workloads it names and no
		// other.
		slots := want.matches(held[:0], line[end:])
		if len(slots) == 0 {
			continue
		}
		lend, value, err := labelsAndValue(line, end)
		if err == nil {
			if slots = want.matches(held[:0], line[end:lend]); len(slots) == 0 {
				continue
			}
			err = want.twice(slots)
		}
		for _, k := range slots {
			switch {
			case out[k].err != nil:
			case err != nil:
				out[k].err = &ParseError{err}
			case lines[k] >= maxKeptPageSeries:
				out[k].err = &ParseError{fmt.Errorf("more than %d sample lines of the metrics read", maxKeptPageSeries)}
			default:
				lines[k]++
				kept[k] = append(append(append(append(kept[k], line[:lend]...), ' '), value...), '\n')
			}
		}
	}
	p := e.parsers.Get().(*expfmt.TextParser)
	defer e.parsers.Put(p)
	for k := range out {
		if out[k].err != nil {
			continue
		}
		fams, err := p.TextToMetricFamilies(bytes.NewReader(kept[k]))
		if err != nil {
			out[k].err = &ParseError{err}
			continue
		}
		out[k].fams = fams
	}
	return out
}

// demandPage sums d's series among fams, the first of its metrics present,
// each made monotonic in arr where d counts arrivals and arr is not nil (a
// page without the metric then carries what arr holds: a router restarted
// reads on, and its series counting again from 0 are its new arrivals).
func demandPage(fams map[string]*dto.MetricFamily, d *Demand, arr *Arrivals) Page {
	id := metric.PendingRequests
	if d.Arrivals {
		id = metric.ArrivedRequests
	} else {
		arr = nil
	}
	if arr != nil {
		arr.scrape++
	}
	sum := 0.0
	for _, name := range d.Metrics {
		mf, ok := fams[name]
		if !ok {
			continue
		}
		var seen seriesSeen // a series given twice is taken once
		for _, m := range mf.Metric {
			v := m.GetUntyped().GetValue()
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || labelValue(m.GetLabel(), d.Label) != d.Match || seen.again(name, mf, m) {
				continue
			}
			if arr != nil {
				v = arr.observe(seriesKey(name, m.GetLabel()), v)
			}
			sum += v
		}
		break
	}
	if arr != nil {
		sum += arr.finish()
	}
	var out Page
	out.Set(id, sum)
	return out
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
	if len(d.Metrics) > MaxDemandMetrics {
		return fmt.Errorf("%d metrics; at most %d", len(d.Metrics), MaxDemandMetrics)
	}
	for _, m := range d.Metrics {
		if len(m) > maxDemandName || !model.LegacyValidation.IsValidMetricName(m) {
			return fmt.Errorf("metric %q is not a valid metric name of at most %d bytes", truncate([]byte(m)), maxDemandName)
		}
	}
	if len(d.Label) > maxDemandName || !model.LegacyValidation.IsValidLabelName(d.Label) {
		return fmt.Errorf("label %q is not a valid label name of at most %d bytes", truncate([]byte(d.Label)), maxDemandName)
	}
	return nil
}

// MaxDemandMetrics bounds the metrics a demand source names (the presets
// name one or two, the first present read), and maxDemandName their names
// and its label's: a router's page is read for them at every scrape.
const (
	MaxDemandMetrics = 8
	maxDemandName    = 256
)
