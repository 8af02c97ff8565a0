// Package discovery finds the pods an agent scrapes: from a static file, or
// from the API server, scoped to the agent's own node.
package discovery

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/vllm"
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
	// Ready: the pod serves traffic and is scraped. A pod that is not
	// ready is starting (loading its model): listed, not scraped.
	Ready bool
	// Terminating: the pod is being deleted: listed as such, not scraped.
	Terminating bool
	// Created: the pod's creationTimestamp; ReadySince: while it is Ready,
	// its Ready condition's lastTransitionTime (zero when unknown: static
	// targets). The planner's lead time is a replica's startup from them.
	Created, ReadySince time.Time
	// UnreadySince: while it is not Ready and was since its containers
	// last started (it served, and lost its readiness: a failed probe, not
	// a start), its Ready condition's lastTransitionTime; zero otherwise.
	UnreadySince time.Time
	URL          string
	// Demand is set for a demand source's entry (a router's series for
	// one workload, see DemandTargets); nil for a model server.
	Demand *vllm.Demand
}

// PodUID is the uid of the pod t is of: for a demand source's entry
// (POD_UID/demand/WORKLOAD) its router's. A model server's uid is its
// pod's whatever it holds: a static target's in a namespace named demand
// (static/demand/POD) was cut as a demand entry's, and every such target
// had the pod uid "static".
func (t Target) PodUID() string {
	if t.Demand == nil {
		return t.UID
	}
	pod, _ := store.DemandPodUID(t.UID)
	return pod
}

// Equal reports whether two targets are the same in every field.
func (t Target) Equal(o Target) bool {
	return t.UID == o.UID && t.Namespace == o.Namespace && t.Pod == o.Pod && t.Ready == o.Ready &&
		t.Terminating == o.Terminating && t.Created.Equal(o.Created) && t.ReadySince.Equal(o.ReadySince) && t.UnreadySince.Equal(o.UnreadySince) && t.URL == o.URL && slices.Equal(t.Workloads, o.Workloads) && t.Demand.Equal(o.Demand)
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
	// Ready defaults to true; false lists a starting pod (not scraped).
	Ready *bool `json:"ready"`
	// Terminating lists a pod being deleted (not scraped).
	Terminating bool `json:"terminating"`
	// Annotations: a demand source's pulse.io/demand-* annotations, as on
	// a pod (then no workload key is needed).
	Annotations map[string]string `json:"annotations"`
}

// LoadStaticTargets reads a static targets file. Every problem is reported,
// not only the first.
func LoadStaticTargets(path string) ([]Target, error) {
	raw, err := os.ReadFile(path) //nolint:gosec // G304: the file --static-targets names
	if err != nil {
		return nil, fmt.Errorf("read static targets: %w", err)
	}
	var f staticFile
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, fmt.Errorf("static targets file %s is not a valid targets YAML: %s", path, yamlProblem(err))
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
		t := Target{UID: "static/" + st.Namespace + "/" + st.Pod, Namespace: st.Namespace, Pod: st.Pod, Ready: true, URL: st.URL,
			Terminating: st.Terminating}
		if st.Ready != nil {
			t.Ready = *st.Ready // a terminating pod may still be Ready
		}
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
		if u, err := url.Parse(st.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("url %q is not an http(s) URL", st.URL)
		}
		if IsDemandSource(st.Annotations) {
			ds, err := DemandTargets(t, st.Annotations)
			if err != nil {
				bad("%v", err)
			}
			out = append(out, ds...)
			continue
		}
		if len(t.Workloads) == 0 {
			bad("name a workload: workspace, inferenceSet, deployment or workload")
		}
		out = append(out, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

var (
	yamlTypeError = regexp.MustCompile(`cannot unmarshal (\w+) into Go struct field \w+\.([\w.]+) of type (\S+)`)
	yamlPrefixes  = []string{"error converting YAML to JSON: yaml: ", "error unmarshaling JSON: while decoding JSON: json: ", "yaml: "}
)

// yamlProblem says what sigs.k8s.io/yaml found wrong in YAML terms: it
// converts YAML to JSON first, so its errors speak of JSON and Go types.
func yamlProblem(err error) string {
	s := err.Error()
	for _, p := range yamlPrefixes {
		s = strings.TrimPrefix(s, p)
	}
	if m := yamlTypeError.FindStringSubmatch(s); m != nil {
		return fmt.Sprintf("%s: want a %s, got a %s", m[2], m[3], m[1])
	}
	return strings.Replace(s, "unknown field", "unknown key", 1)
}
