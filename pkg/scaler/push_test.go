package scaler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestStreamsOfManyWorkloadsSeeOnlyTheirOwn: 40 workloads spread over the
// pusher's shards, two streams each. Raising one workload's queue pushes
// true to its two streams and to no other; each stream ends with exactly
// the two states it went through. No recheck comes within the test: every
// push is the store telling of a change.
func TestStreamsOfManyWorkloadsSeeOnlyTheirOwn(t *testing.T) {
	f := newFixture(t)
	f.server.recheck = time.Hour
	const workloads = 40
	key := func(w int) store.Key {
		return store.Key{Namespace: "demo", Kind: store.KindWorkspace, Name: fmt.Sprint("w", w)}
	}
	var infos []store.PodInfo
	for w := range workloads {
		infos = append(infos, store.PodInfo{UID: fmt.Sprint("uid-", w), Namespace: "demo", Name: fmt.Sprint("p", w), Ready: true, Workloads: []store.Key{key(w)}})
	}
	f.store.Upsert(store.Source{Node: "node-1"}, infos, false)
	report := func(waiting func(w int) float64) {
		f.ms += 1000
		var rs []store.Report
		for w := range workloads {
			r := store.Report{UID: fmt.Sprint("uid-", w)}
			r.TimeMs = f.ms
			r.Values.Set(metric.Waiting, waiting(w))
			rs = append(rs, r)
		}
		f.store.Add(rs)
	}
	report(func(int) float64 { return 0 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make([][]chan bool, workloads)
	for w := range workloads {
		for range 2 {
			s, err := f.client.StreamIsActive(ctx, ref(map[string]string{"workspace": fmt.Sprint("w", w), "window": "1s", "activationThreshold": "1"}))
			if err != nil {
				t.Fatal(err)
			}
			ch := make(chan bool, 8)
			go func(s grpc.ServerStreamingClient[externalscaler.IsActiveResponse]) {
				for {
					r, err := s.Recv()
					if err != nil {
						close(ch)
						return
					}
					ch <- r.Result
				}
			}(s)
			if first := <-ch; first {
				t.Fatalf("w%d: first state true, want false", w)
			}
			got[w] = append(got[w], ch)
		}
	}
	if n := len(f.server.push.shards); n < 1 || n > maxShards {
		t.Fatalf("%d shards", n)
	}
	for raised := range workloads {
		report(func(w int) float64 {
			if w <= raised {
				return 5
			}
			return 0
		})
		for _, ch := range got[raised] {
			if v := <-ch; !v {
				t.Fatalf("w%d raised: pushed false", raised)
			}
		}
	}
	// Every stream went false → true once: nothing else is waiting in any
	// of them (a spurious push of a state already sent would be).
	for w := range workloads {
		for i, ch := range got[w] {
			select {
			case v, ok := <-ch:
				if ok {
					t.Fatalf("w%d stream %d: pushed %v again", w, i, v)
				}
			default:
			}
		}
	}
	if n := f.server.OpenStreams(); n != 2*workloads {
		t.Fatalf("%d streams open, want %d", n, 2*workloads)
	}
}

// TestPushHandsTheNewestStateOver: a handler that has not taken one state
// gets the newest, and the pusher never waits for it (a KEDA that stopped
// reading blocks its own stream, not the others of its shard).
func TestPushHandsTheNewestStateOver(t *testing.T) {
	f := newFixture(t)
	f.pods("a")
	md := map[string]string{"workspace": "llama", "window": "1s", "activationThreshold": "1"}
	tr, err := f.server.parse(ref(md))
	if err != nil {
		t.Fatal(err)
	}
	u := &sub{t: tr, ready: make(chan struct{}, 1)}
	for i, waiting := range []float64{5, 0, 5, 0} {
		f.report(map[string]float64{"a": waiting})
		f.server.push.evaluate(u) // returns although nobody takes
		if u.last != (waiting > 1) {
			t.Fatalf("evaluation %d: last %v after waiting %v", i, u.last, waiting)
		}
	}
	<-u.ready
	if u.take() {
		t.Fatal("took true, want the newest state, false")
	}
	select {
	case <-u.ready:
		t.Fatal("two wake-ups for one state")
	default:
	}
}
