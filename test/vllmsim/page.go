package vllmsim

import (
	"math"
	"strconv"
	"strings"
)

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
		10.0, 20.0, 40.0, 80.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	tokenBuckets     = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
	iterationBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	paramsNBuckets   = []float64{1, 2, 5, 10, 20}
)

// histogram is one series of a histogram family.
type histogram struct {
	bounds  []float64
	buckets []float64 // cumulative, one per bound
	count   float64
	sum     float64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, buckets: make([]float64, len(bounds))}
}

func (h *histogram) observe(v float64) {
	for i, b := range h.bounds {
		if v <= b {
			h.buckets[i]++
		}
	}
	h.count++
	h.sum += v
}

// pyFloat formats v the way Python's prometheus_client does (repr of a float).
func pyFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case v == math.Trunc(v) && math.Abs(v) < 1e16:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// pageWriter writes a text exposition page.
type pageWriter struct {
	b           strings.Builder
	openMetrics bool
}

func (w *pageWriter) family(name, typ, help string) {
	if w.openMetrics && typ == "counter" {
		name = strings.TrimSuffix(name, "_total")
	}
	w.b.WriteString("# HELP ")
	w.b.WriteString(name)
	w.b.WriteByte(' ')
	w.b.WriteString(help)
	w.b.WriteString("\n# TYPE ")
	w.b.WriteString(name)
	w.b.WriteByte(' ')
	w.b.WriteString(typ)
	w.b.WriteByte('\n')
}

// sample writes name{labels} value; labels are name/value pairs in order.
func (w *pageWriter) sample(name string, labels []string, v float64) {
	w.b.WriteString(name)
	if len(labels) > 0 {
		w.b.WriteByte('{')
		for i := 0; i < len(labels); i += 2 {
			if i > 0 {
				w.b.WriteByte(',')
			}
			w.b.WriteString(labels[i])
			w.b.WriteString(`="`)
			w.b.WriteString(labels[i+1])
			w.b.WriteByte('"')
		}
		w.b.WriteByte('}')
	}
	w.b.WriteByte(' ')
	w.b.WriteString(pyFloat(v))
	w.b.WriteByte('\n')
}

func (w *pageWriter) histogram(name string, labels []string, h *histogram) {
	bl := append(append([]string(nil), labels...), "le", "")
	for i, b := range h.bounds {
		bl[len(bl)-1] = pyFloat(b)
		w.sample(name+"_bucket", bl, h.buckets[i])
	}
	bl[len(bl)-1] = "+Inf"
	w.sample(name+"_bucket", bl, h.count)
	w.sample(name+"_count", labels, h.count)
	w.sample(name+"_sum", labels, h.sum)
}
