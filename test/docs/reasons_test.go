package docs

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// TestMissingReasonsNamedInDocsExist: a reason the docs give for a pod
// reported missing (`timeout`, `too_large`, ...) is one the agent sends:
// the label value of pulse_agent_scrape_errors_total{reason} and the
// "missing" field of /debug/workloads (wire.ReasonName).
func TestMissingReasonsNamedInDocsExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for v := range pulsev1.MissingReason_name {
		if v != 0 {
			reasons[wire.ReasonName(pulsev1.MissingReason(v))] = true
		}
	}
	// "reported missing (`timeout`)", "missing, `timeout`", "a page error
	// (`too_large`)": the reason in code marks just after the words.
	cited := regexp.MustCompile("(?:missing|page error|error)[ ,:(]*`([a-z_]+)`")
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	sort.Strings(docs)
	checked := 0
	for _, f := range docs {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			for _, m := range cited.FindAllStringSubmatch(line, -1) {
				checked++
				if !reasons[m[1]] {
					rel, _ := filepath.Rel(root, f)
					t.Errorf("%s: names the missing reason %q, which the agent never sends (it sends %v)", rel, m[1], slices.Sorted(maps.Keys(reasons)))
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no reason found: the pattern is wrong")
	}
}

// TestTheRelaysConnectionsPerAddressFigure: README's relay section gives
// the agents one relay may carry at the aggregator's default
// --max-ingest-connections-per-address. An agent holds up to
// relay.MaxStreamsPerReplica streams at a replica, and an aged connection
// drains beside its replacement: the figure said 1,024 at 8, as if an
// agent held one, where the chart (deploy/aggregator) counts two.
func TestTheRelaysConnectionsPerAddressFigure(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(raw)), " ")
	m := regexp.MustCompile("at the default ([0-9]+), ([0-9,]+) agents a relay at ([0-9]+)").FindStringSubmatch(text)
	if m == nil {
		t.Fatal(`README.md has no "at the default N, M agents a relay at S"`)
	}
	perAddr, _ := strconv.Atoi(m[1])
	agents, _ := strconv.Atoi(strings.ReplaceAll(m[2], ",", ""))
	streams, _ := strconv.Atoi(m[3])
	if want := perAddr / 2 * streams / relay.MaxStreamsPerReplica; agents != want {
		t.Errorf("README.md: %q; at %d connections an address, twice over for an aged one, of %d streams, %d each an agent: %d agents", m[0], perAddr, streams, relay.MaxStreamsPerReplica, want)
	}
}
