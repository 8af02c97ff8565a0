package netbound

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"
)

// Resolver resolves a host name; net.DefaultResolver is one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// LookupTimeout bounds one name's lookup.
const LookupTimeout = 5 * time.Second

// Resolve turns an --aggregator entry, host:port, into the addresses an
// agent streams to: ResolveAll's, of one IP family. A name of IPs of both
// families gives its IPv4 ones alone: a replica behind a dual-stack
// headless Service (PreferDualStack, RequireDualStack) has an IP of each,
// and a stream to each was two streams of a node at one replica, each
// one's full catalogue superseding the other's, for ever.
func Resolve(ctx context.Context, r Resolver, entry string) (host string, addrs []string, err error) {
	host, addrs, err = ResolveAll(ctx, r, entry)
	return host, oneFamily(addrs), err
}

// ResolveAll turns an --aggregator entry, host:port, into one address for
// each IP of host at port, of either family, sorted, each in its canonical
// form (Canonical); an IP literal is itself. The lookup takes at most
// LookupTimeout. The relay resolves its allow-list with it: every address
// an agent's Resolve gives (whichever family its own lookup had) is one
// the relay knows.
func ResolveAll(ctx context.Context, r Resolver, entry string) (host string, addrs []string, err error) {
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return "", nil, err
	}
	ips := []string{host}
	if net.ParseIP(host) == nil {
		lctx, cancel := context.WithTimeout(ctx, LookupTimeout)
		defer cancel()
		if ips, err = r.LookupHost(lctx, host); err != nil {
			return host, nil, err
		}
	}
	for _, ip := range ips {
		if a := Canonical(net.JoinHostPort(ip, port)); a != "" {
			addrs = append(addrs, a)
		}
	}
	slices.Sort(addrs)
	return host, slices.Compact(addrs), nil
}

// oneFamily is addrs (canonical ip:ports) of one IP family: its IPv4
// ones when it has both.
func oneFamily(addrs []string) []string {
	v4 := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if ap, err := netip.ParseAddrPort(a); err == nil && ap.Addr().Is4() {
			v4 = append(v4, a)
		}
	}
	if len(v4) == 0 || len(v4) == len(addrs) {
		return addrs
	}
	return v4
}

// Canonical is addr, an ip:port, in netip's form (an IPv4-mapped IPv6 IP
// as IPv4), or "" when addr is not one.
func Canonical(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return ""
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}
