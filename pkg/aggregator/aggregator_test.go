package aggregator

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func TestDebugOnItsOwnAddress(t *testing.T) {
	o := NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr, o.Serving.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
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
}
