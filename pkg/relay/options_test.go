package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/test/h2settings"
	"github.com/pulse-io/pulse/test/httpflood"
)

// startServer runs a relay's Server on free loopback ports, its
// aggregator an address no one serves, until the test ends.
func startServer(t *testing.T, set ...func(*Options)) (*Options, *Server) {
	t.Helper()
	o := NewOptions()
	o.Listen, o.HTTPAddr, o.Aggregators = freeAddr(t), freeAddr(t), []string{"127.0.0.1:1"}
	for _, f := range set {
		f(o)
	}
	s, err := NewServer(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return o, s
}

// TestTheAgentsConnectionsReadIntoPooledBuffers: behind the bound of the
// agents' port every agent's connection held a 4 KiB read buffer of its
// own for its life (gRPC pools its read buffers only for a *net.TCPConn
// or a connection with ReadOnReady). gRPC now reads them through
// netbound.Pooled: the check is that it calls ReadOnReady.
func TestTheAgentsConnectionsReadIntoPooledBuffers(t *testing.T) {
	o, s := startServer(t)
	cc, err := grpc.NewClient(o.Listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The relay has no aggregator to reach: the call fails, but only once
	// the relay has read it.
	_, _ = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	ln := s.agents.Load()
	if ln == nil {
		t.Fatal("the agents' port is not served through netbound.Pooled")
	}
	if n := ln.Reads.Load(); n == 0 {
		t.Fatal("gRPC served a call on the agents' port without reading through ReadOnReady: its read buffer is not pooled")
	}
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestTheHTTPPortHoldsBoundedConnections: the relay's http port (/metrics
// and the probes, open to whom networkPolicy.httpFrom admits) held every
// connection, unbounded and with no idle bound. As the aggregator's, it
// holds at most maxHTTPConnsPerAddress from one address, and a probe from
// another address is answered beside the flood.
func TestTheHTTPPortHoldsBoundedConnections(t *testing.T) {
	o, _ := startServer(t)
	eventually(t, "the http port up", func() error {
		resp, err := http.Get("http://" + o.HTTPAddr + "/livez")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	})
	if accepted, _ := httpflood.Held(t, o.HTTPAddr, "/livez", 2*maxHTTPConnsPerAddress); accepted == 0 || accepted > maxHTTPConnsPerAddress {
		t.Errorf("one address's %d connections, %d held; want 1 to %d", 2*maxHTTPConnsPerAddress, accepted, maxHTTPConnsPerAddress)
	}
	if _, err := httpflood.GetFrom(o.HTTPAddr, "/livez"); err != nil {
		t.Fatalf("the probe beside a flood: %v", err)
	}
}

// TestTheAgentsPortAnnouncesItsBounds: the agents' port held a stream's
// headers up to gRPC's 16 MiB for the stream's life, and let a client grow
// a stream's window to 16 MiB (gRPC's sizing by bandwidth and delay). It
// announces, and so holds, 32 KiB of headers, fixed 64 KiB windows and 16
// streams a connection.
func TestTheAgentsPortAnnouncesItsBounds(t *testing.T) {
	o, _ := startServer(t)
	h2settings.Expect(t, h2settings.Read(t, o.Listen), map[http2.SettingID]uint32{
		http2.SettingMaxHeaderListSize:    MaxHeaderList,
		http2.SettingInitialWindowSize:    64 << 10,
		http2.SettingMaxConcurrentStreams: MaxStreamsPerConnection,
		http2.SettingHeaderTableSize:      0,
	})
}

// TestTheProbesHaveAPortNoPodReaches: the relay's probes were of its http
// port, open to every pod (networkPolicy.httpFrom's default) and bounded
// at 64 connections an address: other pods holding them failed the
// probes, and the kubelet restarted the relays, cutting every agent's
// stream through them. --health-addr serves /livez and /readyz alone (the
// chart's: the pod's loopback, probed by an exec of pulse-relay probe),
// beside a flood of the http port.
func TestTheProbesHaveAPortNoPodReaches(t *testing.T) {
	o, s := startServer(t, func(o *Options) { o.HealthAddr = freeAddr(t) })
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ports up", func() error {
		if s.HealthAddr() == "" {
			return errors.New("no health port yet")
		}
		resp, err := http.Get("http://" + o.HTTPAddr + "/livez")
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	})
	_, release := httpflood.Held(t, o.HTTPAddr, "/livez", 2*maxHTTPConnsPerAddress)
	defer release()
	var out strings.Builder
	if code := app.Probe("pulse-relay", []string{"http://" + s.HealthAddr() + "/livez"}, &out); code != 0 || !strings.Contains(out.String(), "200 OK: ok") {
		t.Fatalf("the probe of the health port beside the http port's flood: %d %q", code, out.String())
	}
	o.HealthAddr = "nonsense"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--health-addr") {
		t.Fatalf("Validate of --health-addr nonsense: %v", err)
	}
}

// TestAStopIsNotReadyBeforeItCloses: at a stop the relay ended every
// stream and closed its ports at once, while the relays' Service still
// sent the agents' reconnects to it (refused, each agent backing off).
// With --shutdown-delay it answers not ready for that long, its ports
// open and its streams forwarded, then stops.
func TestAStopIsNotReadyBeforeItCloses(t *testing.T) {
	agg := startAggregator(t, 100)
	o := NewOptions()
	o.Listen, o.HTTPAddr, o.HealthAddr, o.Aggregators = freeAddr(t), freeAddr(t), freeAddr(t), []string{agg.addr}
	o.ShutdownDelay = time.Minute
	s, err := NewServer(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	waited, release := make(chan time.Duration, 1), make(chan struct{})
	s.wait = func(d time.Duration) { waited <- d; <-release }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	readyz := func(addr string, want int) error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("/readyz of %s: %s, want %d", addr, resp.Status, want)
		}
		return nil
	}
	eventually(t, "ready", func() error { return readyz(o.HealthAddr, http.StatusOK) })
	st := agentStream(context.Background(), t, relayAt{addr: o.Listen, creds: insecure.NewCredentials()}, agg.addr)
	if err := st.Send(hello("node-1")); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("welcome: %v, %v", m, err)
	}
	cancel()
	if d := <-waited; d != time.Minute {
		t.Fatalf("waited %v, want --shutdown-delay", d)
	}
	for _, addr := range []string{o.HealthAddr, o.HTTPAddr} {
		if err := readyz(addr, http.StatusServiceUnavailable); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Send(batch(1)); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetAck().GetSeq() != 1 {
		t.Fatalf("a batch within the delay: %v, %v; want it forwarded and acked", m, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("the stream outlived the stop")
	}
}
