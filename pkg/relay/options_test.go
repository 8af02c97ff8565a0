package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/pulse-io/pulse/test/httpflood"
)

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
	o := NewOptions()
	o.Listen, o.HTTPAddr, o.Aggregators = freeAddr(t), freeAddr(t), []string{"127.0.0.1:1"}
	s, err := NewServer(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
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
