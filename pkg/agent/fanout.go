package agent

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/netbound"
)

// fanOut keeps one stream to every aggregator address. An --aggregator
// name that resolves to several addresses (a headless Service) gets a stream
// to each, so that every replica holds the full state; names are resolved
// again every --resolve-interval, and replicas that appear or vanish get a
// stream or lose theirs without a restart.
func (a *Agent) fanOut(ctx context.Context) {
	var wg sync.WaitGroup
	cancels := map[string]context.CancelFunc{}
	dones := map[string]chan struct{}{} // closed when the address's streamer has returned
	r := newResolved()
	relay, err := a.dialRelay()
	if err != nil {
		a.log.Error("relay address is not usable", logging.KeyAggregator, a.opts.Relay, logging.KeyErr, err)
		return
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
		if relay != nil {
			_ = relay.Close()
		}
	}()
	// No stream before discovery has listed the node's pods once: a
	// stream's first catalogue is full, and the empty one a restarted
	// agent sent while its pod informer synced unlisted every pod of the
	// node on every aggregator replica (their windows and counters
	// dropped, relisted as new a moment later).
	select {
	case <-a.cat.known:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(a.opts.ResolveInterval)
	defer t.Stop()
	for {
		want, ok := a.wanted(ctx, &r)
		if !ok {
			return
		}
		for addr := range want {
			if _, ok := cancels[addr]; ok {
				continue
			}
			sctx, cancel := context.WithCancel(ctx)
			cancels[addr] = cancel
			s := newStreamer(a, addr, r.names[addr], relay)
			a.m.connected.WithLabelValues(addr).Set(0) // from the start
			a.streamersMu.Lock()
			a.streamers[addr] = s
			a.streamersMu.Unlock()
			a.log.Info("aggregator added", logging.KeyAggregator, addr)
			done := make(chan struct{})
			dones[addr] = done
			wg.Add(1)
			go func() { defer wg.Done(); defer close(done); s.run(sctx) }()
		}
		for addr, cancel := range cancels {
			if want[addr] {
				continue
			}
			cancel()
			<-dones[addr] // its last words (connected 0) before its series go
			delete(cancels, addr)
			delete(dones, addr)
			delete(r.names, addr) // it grew by each rollout's pod IPs
			a.streamersMu.Lock()
			delete(a.streamers, addr)
			a.streamersMu.Unlock()
			// Every series of the address: after each aggregator rollout
			// (new pod IPs) the old ones stayed, connected 0, for ever.
			for _, v := range []interface{ DeleteLabelValues(...string) bool }{a.m.connected, a.m.batches, a.m.bytes, a.m.acked} {
				v.DeleteLabelValues(addr)
			}
			a.log.Info("aggregator removed", logging.KeyAggregator, addr)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolved is what fanOut keeps between resolutions: per --aggregator
// entry its last good addresses and its last resolve warning, and the name
// each address was resolved from (for TLS).
type resolved struct {
	known  map[string][]string
	names  map[string]string
	warned map[string]time.Time
	// flipped: the entry's last answer was of the other IP family than
	// its addresses, and kept out (flips).
	flipped map[string]bool
}

func newResolved() resolved {
	return resolved{known: map[string][]string{}, names: map[string]string{}, warned: map[string]time.Time{}, flipped: map[string]bool{}}
}

// wanted resolves every --aggregator entry (netbound.Resolve: one IP
// family, each address one a relay allows, netbound.ResolveAll's) into
// the set of addresses that should have a stream; false when ctx ended
// meanwhile. A failed lookup keeps the entry's last good addresses.
func (a *Agent) wanted(ctx context.Context, r *resolved) (map[string]bool, bool) {
	want := map[string]bool{}
	for _, entry := range a.opts.Aggregators {
		host, addrs, err := netbound.Resolve(ctx, a.deps.Resolver, entry)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false
			}
			// A failed lookup keeps the streams it had: a DNS hiccup
			// must not cut healthy streams.
			if time.Since(r.warned[entry]) >= warnEvery {
				a.log.Warn("resolve aggregator", logging.KeyAggregator, entry, logging.KeyErr, err)
				r.warned[entry] = time.Now()
			}
			addrs = r.known[entry]
		} else if r.flips(entry, addrs) {
			addrs = r.known[entry]
		}
		r.known[entry] = addrs
		// An entry with no address still shows, as not connected.
		if len(addrs) == 0 {
			if err == nil && time.Since(r.warned[entry]) >= warnEvery {
				a.log.Warn("aggregator name resolves to no address", logging.KeyAggregator, entry)
				r.warned[entry] = time.Now()
			}
			a.m.connected.WithLabelValues(entry).Set(0)
		} else if !slices.Contains(addrs, entry) {
			a.m.connected.DeleteLabelValues(entry)
		}
		for _, addr := range addrs {
			want[addr] = true
			r.names[addr] = host
		}
	}
	return want, true
}

// flips reports whether addrs, an entry's answer, is to be kept out: of
// the other IP family than the entry's addresses, and the first such
// answer in a row. Go's resolver answers a name of both families with
// one family's addresses alone when the other's query failed (a DNS
// hiccup: no error); taken at once, each such answer moved every stream
// of a dual-stack name to the other family and the next answer moved it
// back, two reconnects at every replica. A name that changed family is
// followed at its second answer.
func (r *resolved) flips(entry string, addrs []string) bool {
	known := r.known[entry]
	if len(known) == 0 || len(addrs) == 0 || is4(known[0]) == is4(addrs[0]) {
		delete(r.flipped, entry)
		return false
	}
	if r.flipped[entry] {
		delete(r.flipped, entry)
		return false
	}
	r.flipped[entry] = true
	return true
}

// is4 reports whether addr, a canonical ip:port, is of an IPv4 address.
func is4(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().Is4()
}
