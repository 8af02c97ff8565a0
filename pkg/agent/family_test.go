package agent

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/store"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/vllmsim"
)

// bothFamilies resolves every name to one IPv4 and one IPv6 address: a
// replica behind a dual-stack headless Service (ipFamilyPolicy
// PreferDualStack or RequireDualStack), whose DNS answers A and AAAA.
type bothFamilies struct{}

func (bothFamilies) LookupHost(context.Context, string) ([]string, error) {
	return []string{"127.0.0.1", "::1"}, nil
}

// TestOneReplicaOfADualStackServiceGetsOneStream: an --aggregator name
// resolving to a replica's IPv4 and IPv6 addresses got a stream to each,
// two streams of one node at one replica; each one's full catalogue
// superseded the other (Aborted), which reconnected and superseded it in
// turn, for ever: the node's streams to every replica flapped (a warning,
// a full catalogue and a token review at each; found in a review). A
// replica is streamed to at one address (netbound.Resolve).
func TestOneReplicaOfADualStackServiceGetsOneStream(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := grpc.NewServer()
	pulsev1.RegisterIngestServer(g, ingest.New(store.New(store.Options{}), ingest.Options{Registerer: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	defer g.Stop()
	ln4, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln4.Addr().String())
	ln6, err := net.Listen("tcp", "[::1]:"+port) // the same replica's other address
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	go func() { _ = g.Serve(ln4) }()
	go func() { _ = g.Serve(ln6) }()
	sim := httptest.NewServer(vllmsim.New(vllmsim.Options{Engines: 1}).Handler())
	defer sim.Close()

	o := NewOptions()
	o.StaticTargets, o.NVML, o.NodeName, o.HTTPAddr = filepath.Join(t.TempDir(), "targets.yaml"), gpu.ModeOff, "n1", "127.0.0.1:0"
	if err := os.WriteFile(o.StaticTargets, []byte("targets:\n- namespace: demo\n  pod: llama-0\n  workspace: llama\n  url: "+sim.URL+"/metrics\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Aggregators, o.Transport = []string{"pulse-aggregator-ingest.pulse.svc:" + port}, TransportGRPC
	o.ScrapeInterval, o.ReconnectMaxBackoff = 200*time.Millisecond, 500*time.Millisecond
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{Resolver: bothFamilies{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Ten samples taken: at two streams, each stream's first listing had
	// superseded the other's several times by then.
	for deadline := time.Now().Add(30 * time.Second); ingestCounter(t, reg, "pulse_aggregator_pod_samples_total", "outcome", "ok") < 10; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 10 samples taken in 30 s")
		}
	}
	if n := ingestCounter(t, reg, "pulse_aggregator_rejected_reports_total", "reason", "superseded"); n > 0 {
		addrs, _ := a.aggregatorConnected()
		t.Fatalf("the node's streams superseded each other %v times at one replica (addresses %v): want one stream", n, addrs)
	}
	// The assertion that holds whatever the timing: one stream.
	if addrs, ok := a.aggregatorConnected(); !ok || len(addrs) != 1 {
		t.Fatalf("streams to %v (connected %v): want one, to one address of the replica", addrs, ok)
	}
}

// ingestCounter is the ingest server's counter name of label=value, 0 when
// none was counted.
func ingestCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// answers resolves every name to its answers in turn, the last one from
// then on.
type answers struct{ each [][]string }

func (a *answers) LookupHost(context.Context, string) ([]string, error) {
	ips := a.each[0]
	if len(a.each) > 1 {
		a.each = a.each[1:]
	}
	return ips, nil
}

// TestAPartialAnswerKeepsTheStreamsFamily: Go's resolver answers a name
// of both IP families with one family's addresses alone, no error, when
// the other's query failed. Each such answer moved every stream of a
// dual-stack --aggregator name to the other family, and the next full
// answer moved it back: two reconnects, full catalogues and token reviews
// at every replica for one DNS hiccup (left open by the twenty-second
// session's review). One answer of the other family is kept out; a name
// that changed family is followed at its second answer.
func TestAPartialAnswerKeepsTheStreamsFamily(t *testing.T) {
	both, v6 := []string{"10.0.0.2", "fd00::2"}, []string{"fd00::2"}
	o := NewOptions()
	o.StaticTargets, o.NVML, o.NodeName, o.HTTPAddr = filepath.Join(t.TempDir(), "targets.yaml"), gpu.ModeOff, "n1", "127.0.0.1:0"
	if err := os.WriteFile(o.StaticTargets, []byte("targets: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Aggregators = []string{"pulse-aggregator-ingest.pulse.svc:9091"}
	r := &answers{each: [][]string{both, v6, both, v6, v6, v6}}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{Resolver: r})
	if err != nil {
		t.Fatal(err)
	}
	res := newResolved()
	for i, want := range []string{
		"10.0.0.2:9091",  // both: IPv4
		"10.0.0.2:9091",  // IPv6 alone, once: a partial answer, kept out
		"10.0.0.2:9091",  // both again
		"10.0.0.2:9091",  // IPv6 alone, once
		"[fd00::2]:9091", // and again: the name changed family
		"[fd00::2]:9091", // and stays
	} {
		got, ok := a.wanted(context.Background(), &res)
		if !ok || len(got) != 1 || !got[want] {
			t.Errorf("answer %d: streams to %v, want %s alone", i, got, want)
		}
	}
}
