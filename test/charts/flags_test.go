package charts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pulse-io/pulse/pkg/agent"
	"github.com/pulse-io/pulse/pkg/aggregator"
	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/relay"
	"github.com/pulse-io/pulse/pkg/wire"
)

// binaryOptions are the options of the binary a container runs, by the
// image's name.
func binaryOptions(image string) (string, app.Options) {
	name, _, _ := strings.Cut(filepath.Base(image), ":")
	switch name {
	case "pulse-aggregator":
		return name, aggregator.NewOptions()
	case "pulse-agent":
		return name, agent.NewOptions()
	case "pulse-relay":
		return name, relay.NewOptions()
	}
	return name, nil
}

// accepts is the error the container's binary would stop at before its
// work: its flags parsed (app.Parse) and checked (Validate) with the
// container's environment (a value from the downward API as a name).
func accepts(t *testing.T, c corev1.Container) error {
	t.Helper()
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			// What the downward API gives a pod of the release.
			v = map[string]string{"metadata.namespace": "pulse-system", "metadata.name": "pulse-0", "spec.nodeName": "node-0"}[e.ValueFrom.FieldRef.FieldPath]
		}
		t.Setenv(e.Name, v)
	}
	name, o := binaryOptions(c.Image)
	if o == nil {
		t.Fatalf("container %s: image %s is no pulse binary", c.Name, c.Image)
	}
	var stderr bytes.Buffer
	if code, done := app.Parse(name, c.Args, io.Discard, &stderr, o); done {
		return fmt.Errorf("%s exits %d: %s", name, code, strings.TrimSpace(stderr.String()))
	}
	if err := o.Validate(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// renderedBinariesAccept renders chart with args: helm's output, whether
// it rendered, and what the binaries refuse of their rendered flags.
func renderedBinariesAccept(t *testing.T, chart string, args ...string) (out string, rendered bool, err error) {
	t.Helper()
	out, rerr := render(t, chart, args...)
	if rerr != nil {
		return out, false, nil
	}
	var errs []error
	for key, d := range docs(t, out) {
		kind, _, _ := strings.Cut(key, "/")
		if kind != "Deployment" && kind != "DaemonSet" {
			continue
		}
		c, err := podContainer(d)
		if err == nil {
			err = accepts(t, c)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	return out, true, errors.Join(errs...)
}

// edgeValue is a value set on a chart: refused (naming key) or rendered.
type edgeValue struct {
	chart, set, key string
	refused         bool
	also            []string
}

var relayOn = []string{"--set", "relay.enabled=true"}

// edgeValues: the values the binaries refuse (a port of 0 they take, to
// listen where the kernel picks, but the API server refuses it as a
// containerPort), and those at the edge of what they take. A number as a
// string (--set-string) renders, as before the schema.
var edgeValues = []edgeValue{
	// The aggregator's values.
	{"aggregator", "provisioning.maxReplicas=10001", "provisioning.maxReplicas", true, nil},
	{"aggregator", "provisioning.maxReplicas=-1", "provisioning.maxReplicas", true, nil},
	{"aggregator", "provisioning.maxReplicas=10000", "", false, nil},
	{"aggregator", "provisioning.leaderElection.renewDeadline=15s", "provisioning.leaderElection", true, nil},
	{"aggregator", "provisioning.leaderElection.retryPeriod=9s", "provisioning.leaderElection", true, nil},
	{"aggregator", "provisioning.leaderElection.retryPeriod=0s", "provisioning.leaderElection", true, nil},
	{"aggregator", "provisioning.leaderElection.retryPeriod=8s", "", false, nil},
	{"aggregator", "provisioning.leaderElection.leaseDuration=1m30s", "", false, nil},
	{"aggregator", "provisioning.leaderElection.leaseDuration=15", "provisioning.leaderElection.leaseDuration", true, []string{"--set", "provisioning.leaderElection.enabled=false,replicaCount=1"}},
	{"aggregator", "provisioning.leaderElection.retryPeriod=9s", "", false, []string{"--set", "provisioning.leaderElection.enabled=false,replicaCount=1"}},
	{"aggregator", "maxPods=null", "maxPods", true, nil},
	{"aggregator", "scaler.port=null", "port", true, nil},
	{"aggregator", "logLevel=null", "logLevel", true, nil},
	{"aggregator", "agentAuth.mode=null", "mode", true, nil},
	{"aggregator", "maxWindow=3000000h", "maxWindow", true, nil},
	{"aggregator", "logLevel=info+99999999999999999999", "logLevel", true, nil},
	{"aggregator", "logLevel=WARN+2", "", false, nil},
	{"aggregator", "replicaCount=2", "", false, []string{"--set-string", "maxPods=10000,scaler.port=9090"}},
	{"aggregator", "replicaCount=2", "maxPods", true, []string{"--set-string", "maxPods=0"}},
	{"aggregator", "replicaCount=2", "gcPercent", true, []string{"--set-string", "gcPercent=20000"}},
	{"aggregator", "replicaCount=2", "terminationGracePeriodSeconds", true, []string{"--set-string", "terminationGracePeriodSeconds=99999999999999999999"}},
	{"aggregator", "replicaCount=2", "ingest.maxConnections", true, []string{"--set-string", "ingest.maxConnections=99999999999999999999"}},
	{"aggregator", "replicaCount=2", "relay.maxConnections", true, []string{"--set", "relay.enabled=true", "--set-string", "relay.maxConnections=0"}},
	// Absent from a release made before the key, upgraded with
	// --reuse-values (the old chart's defaults): as before the schema.
	{"aggregator", "gcPercent=null", "", false, nil},
	{"aggregator", "relay.healthPort=null", "", false, nil},
	{"aggregator", "relay.shutdownDelay=null", "", false, relayOn},
	// A duration of the number 0, as the binaries take it.
	{"aggregator", "shutdownDelay=0", "", false, nil},
	{"aggregator", "warmup.duration=0", "", false, nil},
	{"aggregator", "relay.shutdownDelay=0", "", false, relayOn},
	{"aggregator", "relay.shutdownDelay=", "", false, relayOn},
	{"aggregator", "relay.port=null", "relay.enabled", true, []string{"--set-string", "relay.enabled=true"}},
	{"aggregator", "scaler.maxStreams=0", "scaler.maxStreams", true, nil},
	{"aggregator", "scaler.maxStreamsPerNamespace=-1", "scaler.maxStreamsPerNamespace", true, nil},
	{"aggregator", "scaler.maxConnectionsPerAddress=0", "scaler.maxConnectionsPerAddress", true, nil},
	{"aggregator", "scaler.managedCerts.validity=30m", "scaler.managedCerts.validity", true, nil},
	{"aggregator", "scaler.managedCerts.validity=87601h", "scaler.managedCerts.validity", true, nil},
	{"aggregator", "scaler.managedCerts.validity=0s", "scaler.managedCerts.validity", true, nil},
	{"aggregator", "scaler.managedCerts.validity=0", "scaler.managedCerts.validity", true, nil},
	{"aggregator", "scaler.managedCerts.validity=1h", "", false, nil},
	{"aggregator", "scaler.managedCerts.secretName=Certs_X", "scaler.managedCerts.secretName", true, nil},
	{"aggregator", "scaler.managedCerts.triggerAuthName=Pulse_Creds", "scaler.managedCerts.triggerAuthName", true, nil},
	{"aggregator", "scaler.managedCerts.caConfigMap=CA_Map", "scaler.managedCerts.caConfigMap", true, nil},
	{"aggregator", "scaler.managedCerts.kedaNamespace=keda.system", "scaler.managedCerts.kedaNamespace", true, nil},
	{"aggregator", "scaler.managedCerts.secretName=pulse-creds", "scaler.managedCerts.secretName", true, []string{"--set", "scaler.managedCerts.kedaNamespace=pulse-system"}},
	{"aggregator", "scaler.managedCerts.secretName=pulse-creds", "", false, nil},
	{"aggregator", "clusterDomain=cluster.local.", "clusterDomain", true, nil},
	{"aggregator", "agentAuth.audience=", "agentAuth.audience", true, nil},
	{"aggregator", "agentAuth.audience=", "", false, []string{"--set", "agentAuth.mode=none"}},
	{"aggregator", "scaler.managedCerts.validity=87600h", "", false, nil},
	{"aggregator", "ingest.maxConnections=0", "ingest.maxConnections", true, nil},
	{"aggregator", "ingest.maxConnectionsPerAddress=0", "ingest.maxConnectionsPerAddress", true, nil},
	{"aggregator", "maxWindow=10s", "maxWindow", true, nil},
	{"aggregator", "maxWindow=5", "maxWindow", true, nil},
	{"aggregator", "maxWindow=1h", "", false, nil},
	{"aggregator", "maxPods=0", "maxPods", true, nil},
	{"aggregator", "maxPods=16777217", "maxPods", true, nil},
	{"aggregator", "maxPods=16777216", "", false, nil},
	{"aggregator", "maxPodsPerNamespace=-1", "maxPodsPerNamespace", true, nil},
	{"aggregator", "podExpiry=0s", "podExpiry", true, nil},
	{"aggregator", "podExpiry=-1m", "podExpiry", true, nil},
	{"aggregator", "gcPercent=10001", "gcPercent", true, nil},
	{"aggregator", "gcPercent=-1", "gcPercent", true, nil},
	{"aggregator", "gcPercent=0", "", false, nil},
	{"aggregator", "shutdownDelay=2m", "shutdownDelay", true, nil},
	{"aggregator", "shutdownDelay=-1s", "shutdownDelay", true, nil},
	{"aggregator", "shutdownDelay=1m", "", false, nil},
	{"aggregator", "shutdownDelay=0s", "", false, nil},
	{"aggregator", "warmup.duration=-1s", "warmup.duration", true, nil},
	{"aggregator", "warmup.duration=0s", "", false, nil},
	{"aggregator", "logLevel=verbose", "logLevel", true, nil},
	{"aggregator", "logFormat=yaml", "logFormat", true, nil},
	{"aggregator", "scaler.port=0", "scaler.port", true, nil},
	{"aggregator", "scaler.port=65536", "scaler.port", true, nil},
	{"aggregator", "http.healthPort=70000", "http.healthPort", true, nil},
	{"aggregator", "agentAuth.mode=oidc", "agentAuth.mode", true, nil},
	{"aggregator", "relay.resolveInterval=50ms", "relay.resolveInterval", true, relayOn},
	{"aggregator", "relay.resolveInterval=100ms", "", false, relayOn},
	{"aggregator", "relay.shutdownDelay=61s", "relay.shutdownDelay", true, relayOn},
	{"aggregator", "relay.shutdownDelay=1m", "", false, relayOn},
	{"aggregator", "relay.shutdownDelay=0s", "", false, relayOn},
	{"aggregator", "relay.maxConnections=0", "relay.maxConnections", true, relayOn},
	{"aggregator", "relay.maxConnectionsPerAddress=0", "relay.maxConnectionsPerAddress", true, relayOn},
	{"aggregator", "relay.port=0", "relay.port", true, relayOn},
	// The agent's.
	{"daemonset", "scrapeInterval=50ms", "scrapeInterval", true, nil},
	{"daemonset", "scrapeInterval=1", "scrapeInterval", true, nil},
	{"daemonset", "scrapeInterval=100ms", "", false, nil},
	{"daemonset", "scrapeTimeout=1s", "", false, nil},
	{"daemonset", "scrapeTimeout=2s", "scrapeTimeout", true, nil},
	{"daemonset", "scrapeTimeout=999ms", "", false, nil},
	{"daemonset", "scrapeTimeout=-1s", "scrapeTimeout", true, nil},
	{"daemonset", "maxPods=0", "maxPods", true, nil},
	{"daemonset", "maxPods=null", "maxPods", true, nil},
	{"daemonset", "transport=null", "transport", true, nil},
	{"daemonset", "scrapeInterval=3000000h", "scrapeInterval", true, nil},
	{"daemonset", "aggregator=pulse-aggregator-ingest", "aggregator", true, nil},
	{"daemonset", `aggregator=a:9091\,b:9091`, "", false, nil},
	{"daemonset", `aggregator=a:9091\, b:9091\,`, "", false, nil},
	{"daemonset", "aggregator=a:9091 b:9091", "aggregator", true, nil},
	{"daemonset", "replicas=1", "maxPods", true, []string{"--set-string", "maxPods=0"}},
	{"daemonset", "relay=pulse-relay", "relay", true, nil},
	{"daemonset", "relay=pulse-relay:9091", "", false, nil},
	{"daemonset", "extraMetrics={foo-bar}", "extraMetrics", true, nil},
	{"daemonset", "extraMetrics={running:max}", "extraMetrics", true, nil},
	{"daemonset", "extraMetrics={vllm:num_requests_running:max}", "", false, nil},
	{"daemonset", "transport=quic", "transport", true, nil},
	{"daemonset", "logLevel=verbose", "logLevel", true, nil},
	{"daemonset", "httpPort=0", "httpPort", true, nil},
	{"daemonset", "healthPort=65536", "healthPort", true, nil},
	{"daemonset", "auth.expirationSeconds=599", "auth.expirationSeconds", true, nil},
	{"daemonset", "auth.expirationSeconds=600", "", false, nil},
	{"daemonset", tooManyExtraMetrics(), "extraMetrics", true, nil},
}

// tooManyExtraMetrics sets one extraMetrics entry more than the agent takes.
func tooManyExtraMetrics() string {
	var names []string
	for i := range wire.MaxExtraMetrics + 1 {
		names = append(names, fmt.Sprintf("m%d", i))
	}
	return "extraMetrics={" + strings.Join(names, ",") + "}"
}

// TestEveryRenderRunsItsBinaries: whatever a chart renders, its binaries
// start with: a value they refuse is refused by helm, saying which value,
// rather than rendered into a rollout that crash-loops on the binary's
// message (left open by a review, 2026-12-07: ten such values rendered).
// The defaults and every ci/*-values.yaml render and start; each bad
// value of edgeValues is refused by helm, naming its key; each value at
// the edge of what the binaries take renders.
func TestEveryRenderRunsItsBinaries(t *testing.T) {
	for _, c := range []string{"daemonset", "aggregator"} {
		chart := filepath.Join(root, "deploy", c)
		files, _ := filepath.Glob(filepath.Join(chart, "ci", "*-values.yaml"))
		for _, args := range append([][]string{nil}, valuesArgs(files)...) {
			_, rendered, err := renderedBinariesAccept(t, chart, args...)
			if !rendered || err != nil {
				t.Errorf("%s %v: rendered %v, binaries: %v", c, args, rendered, err)
			}
		}
	}
	for _, c := range edgeValues {
		chart := filepath.Join(root, "deploy", c.chart)
		args := append([]string{"--set", c.set}, c.also...)
		out, rendered, err := renderedBinariesAccept(t, chart, args...)
		// helm's schema errors name a value by its JSON pointer.
		pointer := "'/" + strings.ReplaceAll(c.key, ".", "/") + "'"
		switch {
		case rendered && err != nil:
			t.Errorf("%s %v rendered, and the binary refuses it: %v", c.chart, args, err)
		case !c.refused && !rendered:
			t.Errorf("%s %v: refused, want it rendered (the binaries take it):\n%s", c.chart, args, lastLines(out))
		case c.refused && rendered:
			t.Errorf("%s %v rendered, want it refused", c.chart, args)
		case c.refused && !strings.Contains(out, c.key) && !strings.Contains(out, pointer):
			t.Errorf("%s %v: refused without naming %s:\n%s", c.chart, args, c.key, lastLines(out))
		}
	}
}

func valuesArgs(files []string) [][]string {
	var out [][]string
	for _, f := range files {
		out = append(out, []string{"-f", f})
	}
	return out
}

// lastLines is s's last three lines: what a failed render says.
func lastLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-3, 0):], "\n")
}

// TestTheAgentsSchemaKnowsPulsesOwnMetrics: the agent refuses to forward
// a gauge under a name of pulse's own metrics (a trigger's metricName of
// that name reads pulse's); the chart's schema refuses the same names.
func TestTheAgentsSchemaKnowsPulsesOwnMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "daemonset", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			ExtraMetrics struct {
				Items struct {
					Not struct {
						Pattern string `json:"pattern"`
					} `json:"not"`
				} `json:"items"`
			} `json:"extraMetrics"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	want := "^(" + strings.Join(metric.Names(), "|") + ")(:(sum|mean|max))?$"
	if got := schema.Properties.ExtraMetrics.Items.Not.Pattern; got != want {
		t.Fatalf("extraMetrics' items refuse %q, want %q (pkg/metric's names)", got, want)
	}
}
