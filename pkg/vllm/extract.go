// Package vllm reads a vLLM /metrics page into pulse's raw values, and
// SGLang's and Hugging Face TGI's pages too (sources.go maps their names
// onto the same values where the meaning is the same).
//
// The fast path (Extractor.Extract) drops every line that feeds no value
// before github.com/prometheus/common/expfmt parses what is left; the full
// path (FullParse) parses every family, as a generic Prometheus scraper would.
// Both give identical values; the fast path is several times cheaper (see
// docs/performance.md).
package vllm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pulse-io/pulse/pkg/metric"
)

// ErrNotVLLM is returned for a page that carries no family of a server
// pulse reads (vllm:, sglang:, tgi_).
var ErrNotVLLM = errors.New("not a vLLM, SGLang or TGI metrics page")

// ParseError is returned when a line that feeds a value does not parse.
type ParseError struct{ Err error }

func (e *ParseError) Error() string { return "parse metrics page: " + e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// Page is what one page says.
type Page struct {
	metric.Values
	// Extra holds one value per configured extra metric, NaN when absent.
	Extra []float64
	// Hist holds the latency histograms, when the Extractor forwards them
	// and the page has any; nil otherwise.
	Hist *metric.Histograms
}

// ExtraMetric is a gauge forwarded by its raw name, with the way its series
// combine into one value.
type ExtraMetric struct {
	Name    string
	Combine string // "sum" (default), "mean" or "max"
}

// ParseExtraMetric parses an agent --extra-metric value: NAME[:sum|mean|max].
func ParseExtraMetric(s string) (ExtraMetric, error) {
	// vLLM names contain colons, so the rule follows the last colon only
	// when it is one of the three words.
	name, comb := s, "sum"
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		switch s[i+1:] {
		case "sum", "mean", "max":
			name, comb = s[:i], s[i+1:]
		}
	}
	if name == "" || !model.LegacyValidation.IsValidMetricName(name) {
		return ExtraMetric{}, fmt.Errorf("extra metric %q: not a valid metric name", s)
	}
	if _, builtin := metric.Lookup(name); builtin {
		// A trigger's metricName of that name reads pulse's own metric,
		// so the gauge would be forwarded for nothing.
		return ExtraMetric{}, fmt.Errorf("extra metric %q: %s is a metric of pulse's own, which a trigger's metricName reads; forward a page's gauge by its raw name (e.g. vllm:...)", s, name)
	}
	return ExtraMetric{Name: name, Combine: comb}, nil
}

// Extractor reads pages. It is safe for concurrent use.
type Extractor struct {
	sources map[string]source
	extras  []ExtraMetric
	parsers sync.Pool
	bufs    sync.Pool
}

// Option changes what an Extractor reads.
type Option func(*Extractor)

// WithHistograms makes the Extractor read the TTFT and ITL histograms'
// buckets (Page.Hist). Without it their lines are skipped like any other.
func WithHistograms() Option {
	return func(e *Extractor) {
		for k, v := range histogramSources {
			e.sources[k] = v
		}
	}
}

// NewExtractor returns an Extractor for the known sources plus extras.
func NewExtractor(extras []ExtraMetric, opts ...Option) (*Extractor, error) {
	e := &Extractor{sources: make(map[string]source, len(knownSources)+len(histogramSources)+len(extras)), extras: extras}
	for k, v := range knownSources {
		e.sources[k] = v
	}
	for _, o := range opts {
		o(e)
	}
	for i, x := range extras {
		if _, ok := e.sources[x.Name]; ok {
			return nil, fmt.Errorf("extra metric %q: already read by pulse", x.Name)
		}
		c := map[string]combine{"sum": sum, "mean": mean, "max": greatest}[x.Combine]
		if c == 0 {
			return nil, fmt.Errorf("extra metric %q: combine %q is not sum, mean or max", x.Name, x.Combine)
		}
		e.sources[x.Name] = source{extra: i + 1, comb: c}
	}
	e.parsers.New = func() any { p := expfmt.NewTextParser(model.UTF8Validation); return &p }
	e.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	return e, nil
}

// Extras returns the extra metrics, in the order of Page.Extra.
func (e *Extractor) Extras() []ExtraMetric { return e.extras }

// Extract reads a page in Prometheus text format 0.0.4 or OpenMetrics 1.0.
// Lines of families pulse does not read are skipped unparsed, so an error in
// one of them does not hide the values pulse needs.
func (e *Extractor) Extract(page []byte) (Page, error) { return e.ExtractWith(page, nil) }

// ExtractWith is Extract with a pod's counter state: when c is not nil,
// counters are made monotonic per series before they are summed (see
// Counters).
func (e *Extractor) ExtractWith(page []byte, c *Counters) (Page, error) {
	bp := e.bufs.Get().(*[]byte)
	defer e.bufs.Put(bp)
	kept, start, isVLLM, err := e.filter(page, (*bp)[:0])
	*bp = kept
	if err != nil {
		return Page{}, err
	}
	if !isVLLM {
		return Page{}, ErrNotVLLM
	}
	p := e.parsers.Get().(*expfmt.TextParser)
	defer e.parsers.Put(p)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(kept))
	if err != nil {
		return Page{}, &ParseError{err}
	}
	var acc accumulator
	acc.init(len(e.extras))
	if c != nil {
		c.begin()
		c.started(start)
	}
	for name, mf := range fams {
		src := e.sources[name]
		if src.hist > 0 {
			for _, m := range mf.Metric {
				le, ok := bucketBound(m.Label)
				v := m.GetUntyped().GetValue()
				if !ok || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					continue // a bucket with no bound, or no count, says nothing (as add skips a negative value)
				}
				if c != nil {
					if v, ok = c.observeBucket(src.hist, src.rank, le, name, m.Label, v); !ok {
						continue
					}
				} else if acc.again(name, mf, m) {
					continue
				}
				acc.addBucket(src, le, v)
			}
			continue
		}
		counter := c != nil && src.extra == 0 && src.id.Kind() == metric.Counter
		for _, m := range mf.Metric {
			v := m.GetUntyped().GetValue()
			if counter && !math.IsNaN(v) && !math.IsInf(v, 0) {
				var ok bool
				if v, ok = c.observe(src.id, src.rank, name, m.Label, v); !ok {
					continue
				}
			} else if acc.again(name, mf, m) {
				continue
			}
			acc.add(src, v)
		}
	}
	if c != nil {
		c.finish(&acc)
	}
	return acc.page(), nil
}

// startTimeName is the server process's start time: Python's
// prometheus_client gives it for a single process, so vLLM's page has it,
// one series without labels (SGLang's, served from a multi-process
// registry, has none, nor has TGI's). Its moving is a restart
// (Counters.started).
const startTimeName = "process_start_time_seconds"

// filter appends to dst the sample lines that feed a value, each reduced
// to `name{labels} value\n` (timestamps and OpenMetrics exemplars
// dropped), and reports whether the page names any family of a server
// pulse reads. start is the server's start time, read alone and never
// parsed with the page (a bad line of it hides nothing): NaN when the
// page has none, several, or one with labels or no number.
func (e *Extractor) filter(page, dst []byte) (_ []byte, start float64, isVLLM bool, err error) {
	kept, starts := 0, 0
	for len(page) > 0 {
		var line []byte
		line, page = nextLine(page)
		if len(line) == 0 {
			continue
		}
		if line[0] == '#' {
			if isEOF(line) {
				break
			}
			if !isVLLM {
				isVLLM = isVLLMComment(line)
			}
			continue
		}
		n := nameEnd(line)
		name := line[:n]
		if !isVLLM && hasServerPrefix(name) {
			isVLLM = true
		}
		if string(name) == startTimeName {
			if starts++; starts == 1 {
				start = startTime(line[n:])
			} else {
				start = math.NaN() // several processes'
			}
			continue
		}
		if _, ok := e.sources[string(name)]; !ok {
			continue
		}
		end, value, err := labelsAndValue(line, n)
		if err != nil {
			return dst, start, isVLLM, &ParseError{err}
		}
		if kept++; kept > maxKeptPageSeries {
			return dst, start, isVLLM, &ParseError{fmt.Errorf("more than %d sample lines of the metrics read", maxKeptPageSeries)}
		}
		dst = append(dst, line[:end]...)
		dst = append(dst, ' ')
		dst = append(dst, value...)
		dst = append(dst, '\n')
	}
	if starts == 0 {
		start = math.NaN()
	}
	return dst, start, isVLLM, nil
}

// startTime is the value of a start time's line after its name: NaN unless
// it is a plain number with no labels before it.
func startTime(rest []byte) float64 {
	f := bytes.Fields(rest)
	if len(f) == 0 || len(f[0]) > maxValueBytes || bytes.ContainsAny(f[0], "{xXpP_") {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// isEOF is whether line is OpenMetrics' end of the page, `# EOF`: nothing
// after it is of the page (Prometheus refuses a page with samples past
// it; they were read, a second page's values summed with the first's).
func isEOF(line []byte) bool {
	return bytes.Equal(bytes.TrimRight(line, " \t\r"), []byte("# EOF"))
}

// beforeEOF is page up to its `# EOF` line (isEOF), or all of it.
func beforeEOF(page []byte) []byte {
	for rest := page; len(rest) > 0; {
		at := len(page) - len(rest)
		var line []byte
		if line, rest = nextLine(rest); len(line) > 0 && line[0] == '#' && isEOF(line) {
			return page[:at]
		}
	}
	return page
}

// nextLine splits the first line off page, its leading blanks trimmed.
func nextLine(page []byte) (line, rest []byte) {
	if i := bytes.IndexByte(page, '\n'); i >= 0 {
		line, rest = page[:i], page[i+1:]
	} else {
		line = page
	}
	return bytes.TrimLeft(line, " \t"), rest
}

// isVLLMComment reports whether a comment line is a HELP or TYPE of a
// family of a server pulse reads. Only its first two words are read: split
// whole, a 1 MiB comment of one-letter words allocated 12 MB a scrape.
func isVLLMComment(line []byte) bool {
	kind, rest := firstWord(line[1:])
	name, _ := firstWord(rest)
	return (bytes.Equal(kind, []byte("TYPE")) || bytes.Equal(kind, []byte("HELP"))) && hasServerPrefix(name)
}

// firstWord is b's first word (blank-separated) and what follows it.
func firstWord(b []byte) (word, rest []byte) {
	b = bytes.TrimLeft(b, " \t")
	i := bytes.IndexAny(b, " \t")
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
}

// nameEnd returns the length of the metric name at the start of line.
func nameEnd(line []byte) int {
	for i, c := range line {
		if c == '{' || c == ' ' || c == '\t' {
			return i
		}
	}
	return len(line)
}

// Bounds of one sample line pulse reads: real pages' lines carry a handful
// of labels (engine, model_name, le, …). expfmt's parser rebuilds a map of
// a line's labels at every label it reads, so its cost grows with the
// square of their number: a line of 40,000 labels took it minutes, and a
// 1 MiB page of lines of 63 labels 0.42 s, twelve times a page of 4.
const (
	maxLineLabels    = 16
	maxLabelSetBytes = 8 << 10
	// maxKeptPageSeries: sample lines kept of one page. Parsed, they
	// hold about 12× their bytes live and allocate up to about 67× in
	// the parse at 16 labels a line (4× for a real vLLM page), measured
	// on 1 MiB pages in a review, 2026-12-07.
	maxKeptPageSeries = 16 << 10
	// maxValueBytes bounds a sample's value token: a float's text is at
	// most 24 bytes (-1.7976931348623157e+308). One of 1 MiB was kept for
	// the parse, which quoted it whole in its error (a control byte four
	// times over): 46 MB allocated and a 4 MB error a scrape of one line.
	maxValueBytes = 64
)

// labelsAndValue finds the end of the label set that starts at line[n] (if
// any) and the value token after it; err says why a line is refused.
func labelsAndValue(line []byte, n int) (end int, value []byte, err error) {
	i := n
	// The text format allows blanks between the name and its labels
	// (`name {l="v"} 5`, which expfmt and Prometheus read): the labels were
	// taken for the value, and the whole page refused.
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	if i < len(line) && line[i] == '{' {
		inQuote, labels := false, 0
		for i++; i < len(line); i++ {
			c := line[i]
			switch {
			case inQuote && c == '\\':
				i++
			case c == '"':
				inQuote = !inQuote
			case !inQuote && c == '=':
				if labels++; labels > maxLineLabels {
					return 0, nil, fmt.Errorf("sample line %q has more than %d labels", truncate(line), maxLineLabels)
				}
			case !inQuote && c == '}':
				goto closed
			}
			if i-n > maxLabelSetBytes {
				return 0, nil, fmt.Errorf("sample line %q has labels of more than %d bytes", truncate(line), maxLabelSetBytes)
			}
		}
		return 0, nil, fmt.Errorf("malformed sample line %q", truncate(line))
	closed:
		i++
	}
	end = i
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	j := i
	for j < len(line) && line[j] != ' ' && line[j] != '\t' {
		j++
	}
	if j == i {
		return 0, nil, fmt.Errorf("malformed sample line %q", truncate(line))
	}
	if j-i > maxValueBytes {
		return 0, nil, fmt.Errorf("sample line %q has a value of more than %d bytes", truncate(line), maxValueBytes)
	}
	return end, line[i:j], nil
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// bucketBound is a bucket series' upper bound, its le label: a number
// above 0, or +Inf. Every histogram pulse reads is of latencies, and no
// bucket of them holds a duration of 0 or less (nor anything below -Inf):
// such a bucket is skipped alone, the histogram's others kept. Sent, one
// pod's bucket at -100 left its workload's pods, merged on the bounds they
// share, only the +Inf bucket, and the quantile Unavailable.
func bucketBound(labels []*dto.LabelPair) (float64, bool) {
	for _, lp := range labels {
		if lp.GetName() == model.BucketLabel {
			le, err := strconv.ParseFloat(lp.GetValue(), 64)
			return le, err == nil && le > 0 // NaN is not above 0
		}
	}
	return 0, false
}

// accumulator combines the series of a page into raw values.
type accumulator struct {
	raw   [metric.NumIDs]slot
	extra []slot
	hist  [metric.NumHists]histSlot
	seriesSeen
}

// seriesSeen is the series (seriesKey) of the family being read, when it
// has more than one (again).
type seriesSeen struct {
	seen   map[uint64]struct{}
	seenOf *dto.MetricFamily
}

// again reports whether m, of family mf (named name), is a series the page
// gave before: a series is taken at its first line, as Prometheus takes
// it (a gauge given twice was summed: waiting read twice what the page
// said). Counters followed per series (Counters) are checked there.
func (a *seriesSeen) again(name string, mf *dto.MetricFamily, m *dto.Metric) bool {
	if len(mf.Metric) < 2 {
		return false
	}
	if a.seenOf != mf {
		if a.seen == nil {
			a.seen = make(map[uint64]struct{}, len(mf.Metric))
		}
		clear(a.seen)
		a.seenOf = mf
	}
	key := seriesKey(name, m.Label)
	if _, ok := a.seen[key]; ok {
		return true
	}
	a.seen[key] = struct{}{}
	return false
}

// histSlot sums a histogram's bucket series by upper bound (engines,
// models): the page's histogram is the pod's.
type histSlot struct {
	rank   uint8
	bounds []float64
	counts []float64
	// over: the page has more bounds than metric.MaxBuckets; the histogram
	// is left out, and no more bounds are searched (each search is linear:
	// a page of thousands of bounds cost seconds before the cap).
	over bool
}

func (a *accumulator) addBucket(src source, le, v float64) {
	if !(le > 0) { // as bucketBound: a typed histogram's bounds too
		return
	}
	h := &a.hist[src.hist-1]
	if len(h.bounds) > 0 && src.rank > h.rank {
		return
	}
	if len(h.bounds) > 0 && src.rank < h.rank {
		*h = histSlot{}
	}
	h.rank = src.rank
	if h.over {
		return
	}
	for i, b := range h.bounds {
		if b == le {
			h.counts[i] += v
			return
		}
	}
	if len(h.bounds) == metric.MaxBuckets {
		h.over = true
		return
	}
	h.bounds = append(h.bounds, le)
	h.counts = append(h.counts, v)
}

// histograms orders each histogram's buckets by bound. A histogram with no
// +Inf bucket, fewer than 2 buckets or more than metric.MaxBuckets is left
// out (the wire carries none of them; a bucket line whose bound or count is
// NaN was dropped as the page was read); counts that decrease with the
// bound (series of an engine with other bounds) are raised to stay
// cumulative.
func (a *accumulator) histograms() *metric.Histograms {
	var out *metric.Histograms
	for h := range a.hist {
		s := &a.hist[h]
		n := len(s.bounds)
		if n < 2 || s.over {
			continue
		}
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(i, j int) bool { return s.bounds[idx[i]] < s.bounds[idx[j]] })
		b := metric.Buckets{Bounds: make([]float64, n), Counts: make([]float64, n)}
		prev := 0.0
		for i, k := range idx {
			b.Bounds[i] = s.bounds[k]
			prev = max(prev, s.counts[k])
			b.Counts[i] = prev
		}
		if !math.IsInf(b.Bounds[n-1], 1) || math.IsInf(prev, 0) {
			continue // no +Inf bucket; or counts summed past float64's range
		}
		if out == nil {
			out = new(metric.Histograms)
		}
		out[h] = b
	}
	return out
}

type slot struct {
	sum, max float64
	n        int
	rank     uint8
	comb     combine
}

func (a *accumulator) init(nExtra int) {
	for i := range a.raw {
		a.raw[i].rank = math.MaxUint8
	}
	a.extra = make([]slot, nExtra)
}

func (a *accumulator) add(src source, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return // a NaN or infinite series says nothing; it is skipped
	}
	if v < 0 && src.extra == 0 {
		// Every value pulse reads is a count, a ratio or a duration: a
		// negative series is bad input, skipped alone, as a counter's is.
		// Summed, an engine's −10 beside another's 7 made the pod's queue
		// −3, which the aggregator refused, the 7 with it. (An extra gauge
		// may be negative: V0's prefix-cache hit rate is −1 when unknown.)
		return
	}
	if v > 1 && src.extra == 0 && src.id.Ratio() {
		// A fraction past 1 (the KV cache's usage) is bad input too,
		// skipped alone: averaged, one engine's 1.5 beside another's 0.3
		// made the pod's 0.9, passed on as real, and its 50000 made
		// 25000, which the aggregator refused, the 0.3 with it.
		return
	}
	var s *slot
	if src.extra > 0 {
		s = &a.extra[src.extra-1]
	} else {
		s = &a.raw[src.id]
		if src.rank > s.rank {
			return
		}
		if src.rank < s.rank {
			*s = slot{rank: src.rank}
		}
	}
	s.comb = src.comb
	if s.n == 0 || v > s.max {
		s.max = v
	}
	s.sum += v
	s.n++
}

func (s *slot) value() float64 {
	switch s.comb {
	case mean:
		return s.sum / float64(s.n)
	case greatest:
		return s.max
	}
	return s.sum
}

func (a *accumulator) page() Page {
	p := Page{Hist: a.histograms()}
	for id := range a.raw {
		// Finite series can sum past the largest float (two of 1e308):
		// an infinite value says nothing, as an infinite series does.
		if s := &a.raw[id]; s.n > 0 && !math.IsInf(s.value(), 0) {
			p.Set(metric.ID(id), s.value())
		}
	}
	if len(a.extra) > 0 {
		p.Extra = make([]float64, len(a.extra))
		for i := range a.extra {
			p.Extra[i] = math.NaN()
			if v := a.extra[i].value(); a.extra[i].n > 0 && !math.IsInf(v, 0) {
				p.Extra[i] = v
			}
		}
	}
	return p
}

// FullParse reads a page the way a generic scraper does: every family is
// parsed by expfmt, then the values pulse needs are picked out. It is the
// baseline of the benchmarks and the reference of the differential test.
// A series given twice holds its first line, as on the fast path, but for
// a typed histogram's: expfmt merges its lines into one series (the
// buckets summed, the last count and sum), which the fast path does not.
func (e *Extractor) FullParse(page []byte) (Page, error) {
	page = beforeEOF(page) // as the fast path reads it
	if len(page) > 0 && page[len(page)-1] != '\n' {
		page = append(page[:len(page):len(page)], '\n')
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return Page{}, &ParseError{err}
	}
	isVLLM := false
	var acc accumulator
	acc.init(len(e.extras))
	for name, mf := range fams {
		isVLLM = isVLLM || hasServerPrefix([]byte(name))
		for _, m := range mf.Metric {
			if acc.again(name, mf, m) {
				continue // a series given again (its labels in any order): the first line holds, as on the fast path
			}
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				if src, ok := e.sources[name+"_bucket"]; ok {
					inf := false
					for _, b := range m.GetHistogram().GetBucket() {
						inf = inf || math.IsInf(b.GetUpperBound(), 1)
						acc.addBucket(src, b.GetUpperBound(), float64(b.GetCumulativeCount()))
					}
					if !inf {
						acc.addBucket(src, math.Inf(1), float64(m.GetHistogram().GetSampleCount()))
					}
				}
				if src, ok := e.sources[name+"_sum"]; ok {
					acc.add(src, m.GetHistogram().GetSampleSum())
				}
				if src, ok := e.sources[name+"_count"]; ok {
					acc.add(src, float64(m.GetHistogram().GetSampleCount()))
				}
			case dto.MetricType_COUNTER:
				if src, ok := e.sources[name]; ok {
					acc.add(src, m.GetCounter().GetValue())
				}
			case dto.MetricType_GAUGE:
				if src, ok := e.sources[name]; ok {
					acc.add(src, m.GetGauge().GetValue())
				}
			default:
				if src, ok := e.sources[name]; ok {
					acc.add(src, m.GetUntyped().GetValue())
				}
			}
		}
	}
	if !isVLLM {
		return Page{}, ErrNotVLLM
	}
	return acc.page(), nil
}
