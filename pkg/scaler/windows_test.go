package scaler

import (
	"math"
	"testing"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
)

// TestRetentionFollowsTheLiveTriggers: the store keeps the longest window
// a live trigger asks for: 10 s to start with, 45 s from the first
// evaluation asking for it, and 10 s again once no trigger has asked for
// 45 s in five minutes; once a window has been held that long, the answers
// over it are those of a store keeping --max-window.
func TestRetentionFollowsTheLiveTriggers(t *testing.T) {
	f := newFixture(t)
	full := store.New(store.Options{Retention: time.Minute, Now: f.clock.Now}) // as without following
	f.server = New(f.store, Options{MaxWindow: time.Minute, Now: f.clock.Now, FollowWindows: true})
	if got := f.store.Retention(); got != DefaultWindow {
		t.Fatalf("retention %s before any trigger, want %s", got, DefaultWindow)
	}
	for _, st := range []*store.Store{f.store, full} {
		st.Upsert(store.Source{Node: "n"}, []store.PodInfo{{UID: "uid-a", Namespace: "demo", Name: "a", Ready: true,
			Workloads: []store.Key{llama}}}, true)
	}
	var tokens float64
	report := func() {
		f.ms += 1000
		tokens += float64(f.ms / 1000 % 5 * 100)
		f.clock.Add(time.Second)
		r := store.Report{UID: "uid-a"}
		r.TimeMs = f.ms
		r.Values.Set(metric.Waiting, float64(f.ms/1000%7))
		r.Values.Set(metric.PromptTokens, tokens)
		f.store.Add([]store.Report{r})
		full.Add([]store.Report{r})
	}
	same := func(window string) { t.Helper(); sameAsFull(t, f, full, window) }
	report()
	for range 30 {
		report()
		same("10s")
	}
	// Asked for now: the store keeps 45 s from here (the first windows are
	// short, as after a restart).
	tr, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "window": "45s"}), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.server.Evaluate(tr); err != nil {
		t.Fatal(err)
	}
	if got := f.store.Retention(); got != 45*time.Second {
		t.Fatalf("retention %s after a 45s trigger, want 45s", got)
	}
	for range 46 {
		report()
	}
	for range 60 {
		report()
		same("45s")
	}
	for range 6 * 60 {
		report()
		same("10s")
	}
	if got := f.store.Retention(); got != DefaultWindow {
		t.Fatalf("retention %s after five minutes with no 45s trigger, want %s", got, DefaultWindow)
	}
	// What the store holds: 10 s, the sample before, at most 4 awaiting
	// their trim.
	r := f.store.Read(nil, llama, metric.Canonical[0], 10*time.Second, time.Hour, false)
	if n := r.Pods[0].Samples; n > 10+1+4 {
		t.Fatalf("%d samples held at a 10 s retention", n)
	}
}

// sameAsFull: over window, the fixture's server answers as one over full,
// a store keeping a minute.
func sameAsFull(t *testing.T, f *fixture, full *store.Store, window string) {
	t.Helper()
	for _, m := range []string{"waiting", "promptTokensPerSecond"} {
		tr, err := ParseTrigger(ref(map[string]string{"workspace": "llama", "metric": m, "window": window, "staleAfter": "10m", "threshold": "100"}), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.server.Evaluate(tr)
		if err != nil {
			t.Fatal(err)
		}
		want, err := New(full, Options{MaxWindow: time.Minute, Now: f.clock.Now}).Evaluate(tr)
		if err != nil {
			t.Fatal(err)
		}
		if math.Float64bits(got.Value) != math.Float64bits(want.Value) {
			t.Fatalf("%s over %s: %v, want %v (a store keeping a minute)", m, window, got.Value, want.Value)
		}
	}
}
