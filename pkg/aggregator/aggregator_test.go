package aggregator

import (
	"net/http"
	"strings"
	"testing"
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
