package debug

import (
	"bufio"
	"encoding/json"
	"io"
	"iter"
	"net/http"
	"unicode/utf8"

	"github.com/pulse-io/pulse/pkg/scaler"
)

// writeList writes {"key": [items…]} as json.MarshalIndent writes it with
// an indent of two spaces (writeJSON), encoding and writing one item at a
// time: the whole answer made at once, 10,000 triggers with their pods and
// plans, held some 100 MB live per answer under way, its bytes and the
// encoder's buffer twice. An item that cannot be encoded (a value JSON has
// no form for) is written as failed(item, err) in its place, in the page's
// own field names, naming the item and the error: the answer has begun by
// then, and the others are kept.
func writeList[T, F any](w http.ResponseWriter, key string, items iter.Seq[T], failed func(T, error) F) {
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, listBuffer)
	k, _ := json.Marshal(key)
	_, _ = bw.WriteString("{\n  ")
	_, _ = bw.Write(k)
	_, _ = bw.WriteString(": [")
	n := 0
	for it := range items {
		b, err := json.MarshalIndent(it, "    ", "  ")
		if err != nil {
			if b, err = json.MarshalIndent(failed(it, err), "    ", "  "); err != nil {
				b, _ = json.Marshal(map[string]string{"error": err.Error()}) // not reached: failed's are strings
			}
		}
		if n > 0 {
			_ = bw.WriteByte(',')
		}
		_, _ = bw.WriteString("\n    ")
		if _, err := bw.Write(b); err != nil {
			return // the client is gone, or past answerWrite
		}
		n++
	}
	if n > 0 {
		_, _ = bw.WriteString("\n  ")
	}
	_, _ = bw.WriteString("]\n}\n")
	_ = bw.Flush()
}

// listBuffer is writeList's buffer: the answer is written in pieces of
// this size, not one write per item.
const listBuffer = 32 << 10

// failedTrigger is a trigger's record that could not be encoded, in
// Trigger's names.
type failedTrigger struct {
	scaler.TriggerID
	Error string `json:"error"`
}

// failedWorkload is a workload that could not be encoded, in Workload's
// names.
type failedWorkload struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Error     string `json:"error"`
}

// writeRows writes rows as text/tabwriter aligns them (padding 2, spaces):
// each cell but a row's last padded with spaces to its column's widest
// and two more, the last as it is. Every row has the same number of cells
// (so that, as for tabwriter, each column is one block). rows is walked
// twice, the widths first, then the writing, so no row is held:
// tabwriter holds every row until its Flush, 103 MB live for a table of
// 10,000 triggers with their pods. rows that differ the second time (the
// workloads page views the store as it writes) stay apart: a cell wider
// than its column was is followed by two spaces.
func writeRows(w io.Writer, rows iter.Seq[[]string]) {
	var widths []int
	for r := range rows {
		for i, c := range r[:len(r)-1] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	bw := bufio.NewWriterSize(w, listBuffer)
	for r := range rows {
		for i, c := range r[:len(r)-1] {
			_, _ = bw.WriteString(c)
			n := 2 // past a cell wider than its column was
			if rc := utf8.RuneCountInString(c); i < len(widths) && widths[i] > rc {
				n += widths[i] - rc
			}
			for ; n > 0; n -= len(spaces) {
				_, _ = bw.WriteString(spaces[:min(n, len(spaces))])
			}
		}
		_, _ = bw.WriteString(r[len(r)-1])
		if err := bw.WriteByte('\n'); err != nil {
			return // the client is gone, or past answerWrite
		}
	}
	_ = bw.Flush()
}

const spaces = "                                "
