package aggregator

import (
	"log/slog"
	"net/http"
	runtimedebug "runtime/debug"
	"strings"
	"testing"

	"github.com/pulse-io/pulse/test/syncbuf"
)

func TestDebugOnItsOwnAddress(t *testing.T) {
	a := start(t, func(o *Options) { o.Serving.DebugAddr = "127.0.0.1:0" })
	get := func(url string) int {
		for range 50 {
			resp, err := http.Get(url)
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
		}
		t.Fatalf("GET %s never answered", url)
		return 0
	}
	if code := get("http://" + a.DebugAddr() + "/debug/workloads"); code != 200 {
		t.Fatalf("debug address: %d", code)
	}
	if code := get("http://" + a.HTTPAddr() + "/debug/workloads"); code != 404 {
		t.Fatalf("main HTTP address still serves the debug endpoint: %d", code)
	}
	if code := get("http://" + a.HTTPAddr() + "/metrics"); code != 200 {
		t.Fatalf("metrics: %d", code)
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	o := NewOptions()
	o.Certs.Enabled, o.Certs.Namespace, o.ScalerTLS.CertFile, o.AgentAuth.Mode, o.IngestTLS.CertFile = true, "", "x", "maybe", "y"
	err := o.Validate()
	for _, want := range []string{"--manage-certs and --tls-cert-file", "--namespace", "--cert-dns-name", "--ingest-tls", "--agent-auth", "go together"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
	o = NewOptions()
	o.IngestTLS.Managed = true
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--ingest-managed-tls needs --manage-certs") {
		t.Errorf("Validate() = %v, want --ingest-managed-tls to need --manage-certs", err)
	}
	o.IngestTLS.CertFile, o.IngestTLS.KeyFile = "c", "k"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Errorf("Validate() = %v, want managed and file TLS refused together", err)
	}
}

// TestWarnsWhenMaxPodsOutgrowMemory: --forward-histograms took a pod held
// from 27 to 81 KB, 796 MiB at the chart's default maxPods against its
// 512Mi limit, without a word until the OOM kill. The aggregator now warns,
// at its start and at the first histograms, when --max-pods pods would not
// fit in 80 % of its memory limit (GOMEMLIMIT, from the container's).
func TestWarnsWhenMaxPodsOutgrowMemory(t *testing.T) {
	old := runtimedebug.SetMemoryLimit(512 << 20)
	defer runtimedebug.SetMemoryLimit(old)
	for _, tc := range []struct {
		maxPods    int
		histograms bool
		warn       bool
	}{{10000, false, false}, {10000, true, true}, {5000, true, false}, {20000, false, true}} {
		var logs syncbuf.Buffer
		o := NewOptions()
		o.Store.MaxPods = tc.maxPods
		a := &Aggregator{opts: o, log: slog.New(slog.NewTextHandler(&logs, nil))}
		a.warnIfPodsOutgrowMemory(tc.histograms)
		if got := strings.Contains(logs.String(), "may not fit the memory limit"); got != tc.warn {
			t.Errorf("maxPods %d, histograms %v: warned %v, want %v\n%s", tc.maxPods, tc.histograms, got, tc.warn, logs.String())
		}
	}
}
