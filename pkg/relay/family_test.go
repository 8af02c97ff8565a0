package relay

import (
	"context"
	"net"
	"testing"
)

// TestAReplicaIsForwardedToAtEitherFamily: the relay's resolution is an
// allow-list (no open proxy), not a choice of streams: a replica behind a
// dual-stack headless Service is a replica at its IPv6 address as at its
// IPv4 one. An agent naming the IPv6 one (one older than netbound's
// IPv4 preference, or one whose own lookup got the AAAA answer alone, Go's
// resolver giving a partial answer when the A query fails) was refused,
// Unavailable, "not an aggregator replica", each refusal spending the
// relay's one lookup a second.
func TestAReplicaIsForwardedToAtEitherFamily(t *testing.T) {
	agg := startAggregator(t, 100)
	ln6, err := net.Listen("tcp", "[::1]:"+port(agg.addr)) // the same replica's other address
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	go func() { _ = agg.srv.Serve(ln6) }()
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1", "::1"}}}
	_, at := startRelay(t, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	for _, upstream := range []string{agg.addr, "[::1]:" + port(agg.addr)} {
		s := agentStream(context.Background(), t, at, upstream)
		if err := s.Send(hello("node-1")); err != nil {
			t.Fatal(err)
		}
		if m, err := s.Recv(); err != nil || m.GetWelcome().GetAggregatorVersion() != "for node-1" {
			t.Errorf("a stream for %s: %v, %v; want forwarded", upstream, m, err)
		}
	}
}
