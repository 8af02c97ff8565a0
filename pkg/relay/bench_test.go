package relay

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// BenchmarkRoundTrip: a batch from an agent to a replica and its ack back,
// on loopback, directly and through a relay: what the relay adds to each
// (docs/performance.md, "A relay").
func BenchmarkRoundTrip(b *testing.B) {
	agg := startAggregator(b, 100)
	d := &dns{addrs: map[string][]string{"aggregator": {"127.0.0.1"}}}
	_, at := startRelay(b, Config{Aggregators: []string{"aggregator:" + port(agg.addr)}, Resolver: d})
	direct := func() pulsev1.Ingest_ReportClient {
		conn, err := grpc.NewClient(agg.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		s, err := pulsev1.NewIngestClient(conn).Report(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		name string
		open func() pulsev1.Ingest_ReportClient
	}{
		{"direct", direct},
		{"relay", func() pulsev1.Ingest_ReportClient { return agentStream(context.Background(), b, at, agg.addr) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := c.open()
			if err := s.Send(hello("node-1")); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Recv(); err != nil {
				b.Fatal(err)
			}
			msg := batch(1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				msg.GetBatch().Seq = uint64(i)
				if err := s.Send(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Recv(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
