package agent

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sync"

	"sigs.k8s.io/yaml"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Workload is one workload a pod belongs to.
type Workload struct {
	Kind pulsev1.WorkloadKind
	Name string
}

// Target is one pod to scrape.
type Target struct {
	UID       string
	Namespace string
	Pod       string
	Workloads []Workload
	Ready     bool
	URL       string
}

func (t Target) equal(o Target) bool {
	return t.UID == o.UID && t.Namespace == o.Namespace && t.Pod == o.Pod && t.Ready == o.Ready &&
		t.URL == o.URL && slices.Equal(t.Workloads, o.Workloads)
}

// staticFile is the --static-targets file.
type staticFile struct {
	Targets []staticTarget `json:"targets"`
}

type staticTarget struct {
	Namespace    string `json:"namespace"`
	Pod          string `json:"pod"`
	Workspace    string `json:"workspace"`
	InferenceSet string `json:"inferenceSet"`
	Deployment   string `json:"deployment"`
	Workload     string `json:"workload"`
	URL          string `json:"url"`
}

// LoadStaticTargets reads a static targets file. Every problem is reported,
// not only the first.
func LoadStaticTargets(path string) ([]Target, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read static targets: %w", err)
	}
	var f staticFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, fmt.Errorf("parse static targets %s: %w", path, err)
	}
	var errs []error
	seen := map[string]bool{}
	out := make([]Target, 0, len(f.Targets))
	for i, st := range f.Targets {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("static targets %s: target %d: %s", path, i, fmt.Sprintf(format, a...)))
		}
		if st.Namespace == "" || st.Pod == "" {
			bad("namespace and pod are required")
		}
		t := Target{UID: "static/" + st.Namespace + "/" + st.Pod, Namespace: st.Namespace, Pod: st.Pod, Ready: true, URL: st.URL}
		if seen[t.UID] {
			bad("pod %s/%s is listed twice", st.Namespace, st.Pod)
		}
		seen[t.UID] = true
		for _, w := range []struct {
			kind pulsev1.WorkloadKind
			name string
		}{
			{pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, st.Workspace},
			{pulsev1.WorkloadKind_WORKLOAD_KIND_INFERENCE_SET, st.InferenceSet},
			{pulsev1.WorkloadKind_WORKLOAD_KIND_DEPLOYMENT, st.Deployment},
			{pulsev1.WorkloadKind_WORKLOAD_KIND_CUSTOM, st.Workload},
		} {
			if w.name != "" {
				t.Workloads = append(t.Workloads, Workload{Kind: w.kind, Name: w.name})
			}
		}
		if len(t.Workloads) == 0 {
			bad("name a workload: workspace, inferenceSet, deployment or workload")
		}
		if u, err := url.Parse(st.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("url %q is not an http(s) URL", st.URL)
		}
		out = append(out, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// catalogue assigns each target a small id for the wire and versions the set.
type catalogue struct {
	mu      sync.Mutex
	entries map[string]*entry // by uid
	free    []uint32
	next    uint32
	version uint64
	changed chan struct{}
}

type entry struct {
	id     uint32
	target Target
}

func newCatalogue() *catalogue {
	return &catalogue{entries: map[string]*entry{}, next: 1, changed: make(chan struct{})}
}

// Set replaces the targets. Ids of pods that stay are kept; ids of removed
// pods are reused, which keeps ids small: the streams diff by id and uid, so
// a reused id is sent as a removal plus an upsert.
func (c *catalogue) Set(targets []Target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	keep := make(map[string]bool, len(targets))
	for _, t := range targets {
		keep[t.UID] = true
	}
	for uid, e := range c.entries {
		if !keep[uid] {
			c.free = append(c.free, e.id)
			delete(c.entries, uid)
			changed = true
		}
	}
	for _, t := range targets {
		if e, ok := c.entries[t.UID]; ok {
			if !e.target.equal(t) {
				e.target = t
				changed = true
			}
			continue
		}
		id := c.next
		if n := len(c.free); n > 0 {
			id, c.free = c.free[n-1], c.free[:n-1]
		} else {
			c.next++
		}
		c.entries[t.UID] = &entry{id: id, target: t}
		changed = true
	}
	if changed {
		c.version++
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

// snapshot returns the version, a copy of the entries by id, and a channel
// closed at the next change.
func (c *catalogue) snapshot() (uint64, map[uint32]Target, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint32]Target, len(c.entries))
	for _, e := range c.entries {
		out[e.id] = e.target
	}
	return c.version, out, c.changed
}

// targets returns the current targets.
func (c *catalogue) targets() []Target {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Target, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, e.target)
	}
	return out
}
