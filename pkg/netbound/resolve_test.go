package netbound

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

type resolverFunc func(ctx context.Context, host string) ([]string, error)

func (f resolverFunc) LookupHost(ctx context.Context, host string) ([]string, error) {
	return f(ctx, host)
}

// TestResolveGivesTheAddressesTheRelayKnows: a name's IPs become sorted
// addresses at the entry's port, each once and in netip's form (an
// IPv4-mapped IP as IPv4, IPv6 bracketed), so that an address the agent
// names is one the relay keys; an IP literal is not looked up; a lookup is
// bounded by LookupTimeout, and its error comes back with the host.
func TestResolveGivesTheAddressesTheRelayKnows(t *testing.T) {
	var deadline time.Duration
	r := resolverFunc(func(ctx context.Context, host string) ([]string, error) {
		if d, ok := ctx.Deadline(); ok {
			deadline = time.Until(d)
		}
		if host == "pulse-aggregator" {
			return []string{"10.0.0.9", "::ffff:10.0.0.2", "fd00::1", "10.0.0.2", "not-an-ip"}, nil
		}
		return nil, errors.New("no such host") // an IP literal looked up fails too
	})
	host, addrs, err := Resolve(context.Background(), r, "pulse-aggregator:9091")
	if err != nil || host != "pulse-aggregator" {
		t.Fatalf("%q, %v", host, err)
	}
	// IPv4 alone where both families are given: a replica behind a
	// dual-stack headless Service has an IP of each, and a stream to
	// each was two streams of a node at one replica, each one's full
	// catalogue superseding the other's, for ever.
	if want := []string{"10.0.0.2:9091", "10.0.0.9:9091"}; !slices.Equal(addrs, want) {
		t.Fatalf("addresses %q, want %q", addrs, want)
	}
	// The relay's allow-list (ResolveAll) has both: whichever family an
	// agent's own lookup gave it, the relay knows the address.
	if _, all, err := ResolveAll(context.Background(), r, "pulse-aggregator:9091"); err != nil || !slices.Equal(all, []string{"10.0.0.2:9091", "10.0.0.9:9091", "[fd00::1]:9091"}) {
		t.Fatalf("ResolveAll: %q, %v", all, err)
	}
	v6 := resolverFunc(func(context.Context, string) ([]string, error) { return []string{"fd00::2", "fd00::1"}, nil })
	if _, addrs, err := Resolve(context.Background(), v6, "pulse-aggregator:9091"); err != nil || !slices.Equal(addrs, []string{"[fd00::1]:9091", "[fd00::2]:9091"}) {
		t.Fatalf("a name of IPv6 alone: %q, %v", addrs, err)
	}
	if deadline <= 0 || deadline > LookupTimeout {
		t.Fatalf("the lookup's deadline %v from now: want within %v", deadline, LookupTimeout)
	}
	if _, addrs, err := Resolve(context.Background(), r, "[::ffff:10.1.2.3]:9091"); err != nil || !slices.Equal(addrs, []string{"10.1.2.3:9091"}) {
		t.Fatalf("an IP literal: %q, %v", addrs, err)
	}
	if host, _, err := Resolve(context.Background(), r, "gone:9091"); err == nil || host != "gone" {
		t.Fatalf("a failed lookup: %q, %v", host, err)
	}
	if _, _, err := Resolve(context.Background(), r, "no-port"); err == nil {
		t.Fatal("an entry with no port was resolved")
	}
}
