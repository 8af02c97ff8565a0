package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pulse-io/pulse/test/h2settings"
	"github.com/pulse-io/pulse/test/httpflood"
)

// startServer runs a relay's Server on free loopback ports, its
// aggregator an address no one serves, until the test ends.
func startServer(t *testing.T) (*Options, *Server) {
	t.Helper()
	o := NewOptions()
	o.Listen, o.HTTPAddr, o.Aggregators = freeAddr(t), freeAddr(t), []string{"127.0.0.1:1"}
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
