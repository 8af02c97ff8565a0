package agent

import (
	"context"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/pulse-io/pulse/pkg/logging"
)

// fanOut keeps one stream to every aggregator address. An --aggregator
// name that resolves to several addresses (a headless Service) gets a stream
// to each, so that every replica holds the full state; names are resolved
// again every --resolve-interval, and replicas that appear or vanish get a
// stream or lose theirs without a restart.
func (a *Agent) fanOut(ctx context.Context) {
	var wg sync.WaitGroup
	cancels := map[string]context.CancelFunc{}
	known := map[string][]string{}   // per --aggregator entry, its last good addresses
	names := map[string]string{}     // address → the name it was resolved from (for TLS)
	warned := map[string]time.Time{} // per entry, the last resolve warning
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()
	t := time.NewTicker(a.opts.ResolveInterval)
	defer t.Stop()
	for {
		want := map[string]bool{}
		for _, entry := range a.opts.Aggregators {
			addrs, err := a.resolve(ctx, entry)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// A failed lookup keeps the streams it had: a DNS hiccup
				// must not cut healthy streams.
				if time.Since(warned[entry]) >= warnEvery {
					a.log.Warn("resolve aggregator", logging.KeyAggregator, entry, logging.KeyErr, err)
					warned[entry] = time.Now()
				}
				addrs = known[entry]
			}
			known[entry] = addrs
			// An entry with no address still shows, as not connected.
			if len(addrs) == 0 {
				if err == nil && time.Since(warned[entry]) >= warnEvery {
					a.log.Warn("aggregator name resolves to no address", logging.KeyAggregator, entry)
					warned[entry] = time.Now()
				}
				a.m.connected.WithLabelValues(entry).Set(0)
			} else if !slices.Contains(addrs, entry) {
				a.m.connected.DeleteLabelValues(entry)
			}
			host, _, _ := net.SplitHostPort(entry)
			for _, addr := range addrs {
				want[addr] = true
				names[addr] = host
			}
		}
		for addr := range want {
			if _, ok := cancels[addr]; ok {
				continue
			}
			sctx, cancel := context.WithCancel(ctx)
			cancels[addr] = cancel
			s := newStreamer(a, addr, names[addr])
			a.m.connected.WithLabelValues(addr).Set(0) // from the start
			a.streamersMu.Lock()
			a.streamers[addr] = s
			a.streamersMu.Unlock()
			a.log.Info("aggregator added", logging.KeyAggregator, addr)
			wg.Add(1)
			go func() { defer wg.Done(); s.run(sctx) }()
		}
		for addr, cancel := range cancels {
			if want[addr] {
				continue
			}
			cancel()
			delete(cancels, addr)
			a.streamersMu.Lock()
			delete(a.streamers, addr)
			a.streamersMu.Unlock()
			a.m.connected.DeleteLabelValues(addr)
			a.log.Info("aggregator removed", logging.KeyAggregator, addr)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// resolve turns host:port into one address per IP of host.
func (a *Agent) resolve(ctx context.Context, entry string) ([]string, error) {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return nil, err
	}
	if net.ParseIP(host) != nil {
		return []string{entry}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := a.deps.Resolver.LookupHost(rctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip, port))
	}
	sort.Strings(out)
	return out, nil
}
