// Package charts renders deploy/daemonset and deploy/aggregator with helm
// (the e2e tools' pinned build) and checks what they render against what
// the binaries and the documents say.
package charts

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	pulserelay "github.com/pulse-io/pulse/pkg/relay"
)

// root is the repository root, from this package's directory.
const root = "../.."

// helm returns the pinned helm (HELM, else test/e2e/tools/build.sh helm),
// or skips the test.
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	out, err := exec.Command(filepath.Join(root, "test", "e2e", "tools", "build.sh"), "helm").Output()
	if err != nil {
		t.Skipf("helm not built (test/e2e/tools/build.sh helm): %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "helm")
}

// render runs helm template on chart (a path) as the release named like
// the README installs it, in pulse-system, with args.
func render(t *testing.T, chart string, args ...string) (string, error) {
	t.Helper()
	release := map[string]string{"daemonset": "pulse-agent", "aggregator": "pulse-aggregator"}[filepath.Base(chart)]
	if release == "" {
		release = "pulse-aggregator"
	}
	cmd := exec.Command(helm(t), append([]string{"template", release, chart, "--namespace", "pulse-system"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func valuesFile(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// The daemonset chart documents nvml.mode as auto, on or off. Written so in
// a values file, on and off are YAML booleans: the chart must still render
// the agent's --nvml as the mode, not fail (or render --nvml=true/false,
// which the agent refuses).
func TestAgentNVMLModeFromAValuesFile(t *testing.T) {
	for _, mode := range []string{"auto", "on", "off"} {
		t.Run(mode, func(t *testing.T) {
			out, err := render(t, filepath.Join(root, "deploy", "daemonset"), "-f", valuesFile(t, "nvml:\n  mode: "+mode+"\n"))
			if err != nil {
				t.Fatalf("helm template with nvml.mode: %s in a values file: %v\n%s", mode, err, out)
			}
			if !strings.Contains(out, "- --nvml="+mode+"\n") {
				t.Errorf("want --nvml=%s rendered:\n%s", mode, out)
			}
			if nv := strings.Contains(out, "NVIDIA_VISIBLE_DEVICES"); nv != (mode != "off") {
				t.Errorf("nvml.mode %s: NVIDIA_VISIBLE_DEVICES rendered %v", mode, nv)
			}
		})
	}
}

// README.md, "Security", lists the values that keep
// the old (plaintext) behaviour; the aggregator chart must render with them.
func TestREADMEsOldBehaviourValuesRender(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	para := regexp.MustCompile(`(?s)To keep the old behaviour, set(.*?)on the aggregator\s+chart`).FindSubmatch(readme)
	if para == nil {
		t.Fatal(`README.md has no "To keep the old behaviour, set ... on the aggregator chart"`)
	}
	var args []string
	for _, m := range regexp.MustCompile("`([^`=]+=[^`]*)`").FindAllSubmatch(para[1], -1) {
		args = append(args, "--set", string(m[1]))
	}
	if len(args) == 0 {
		t.Fatal("no values found in the paragraph")
	}
	if out, err := render(t, filepath.Join(root, "deploy", "aggregator"), args...); err != nil {
		t.Errorf("helm template deploy/aggregator %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// renderNotes renders the aggregator chart's NOTES.txt (helm template
// leaves it out) by rendering a copy of the chart in which a template
// holds it.
func renderNotes(t *testing.T, args ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "aggregator")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "deploy", "aggregator"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), notes, 0o600); err != nil {
		t.Fatal(err)
	}
	tpl := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"notes.txt\") . | indent 4 }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(tpl), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := render(t, dir, append(args, "--show-only", "templates/zz-notes.yaml")...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return out
}

// The aggregator's notes print the command that installs the agents. With
// agentAuth.mode tokenreview, an agent whose token carries another audience
// than agentAuth.audience, or whose ServiceAccount is not one of
// agentAuth.serviceAccounts, is refused: the command must give the agents
// what the aggregator will accept.
func TestNotesInstallAgentsTheAggregatorAccepts(t *testing.T) {
	t.Run("audience", func(t *testing.T) {
		out := renderNotes(t, "--set", "agentAuth.audience=pulse-prod")
		if !strings.Contains(out, "auth.audience=pulse-prod") {
			t.Errorf("agentAuth.audience=pulse-prod, but the agent's install command keeps the daemonset chart's auth.audience (pulse):\n%s", agentCommand(out))
		}
	})
	t.Run("service account in another namespace", func(t *testing.T) {
		out := renderNotes(t, "--set", "agentAuth.serviceAccounts[0]=gpu/gpu-agent")
		if !strings.Contains(out, "--namespace gpu ") || !strings.Contains(out, "serviceAccount.name=gpu-agent") {
			t.Errorf("agentAuth.serviceAccounts=[gpu/gpu-agent], but the agent's install command is not in namespace gpu with ServiceAccount gpu-agent:\n%s", agentCommand(out))
		}
		if !strings.Contains(out, "The managed CA is published in") {
			t.Errorf("an agent namespace apart from the aggregator's, without the note that the managed CA is not there:\n%s", out)
		}
	})
	t.Run("relay", func(t *testing.T) {
		out := renderNotes(t, "--set", "relay.enabled=true")
		if !strings.Contains(agentCommand(out), "--set relay=pulse-aggregator-relay.pulse-system.svc.cluster.local:9091") {
			t.Errorf("relay.enabled, but the agent's install command does not name the relay Service:\n%s", agentCommand(out))
		}
	})
	t.Run("service account", func(t *testing.T) {
		out := renderNotes(t, "--set", "agentAuth.serviceAccounts[0]=pulse-system/gpu-agent")
		if !regexp.MustCompile(`helm install gpu-agent |serviceAccount\.name=gpu-agent`).MatchString(out) {
			t.Errorf("agentAuth.serviceAccounts=[pulse-system/gpu-agent], but the agent's install command makes ServiceAccount pulse-agent:\n%s", agentCommand(out))
		}
	})
}

func agentCommand(notes string) string {
	i := strings.Index(notes, "Install the agent with:")
	if i < 0 {
		return notes
	}
	if j := regexp.MustCompile(`\n[ \t]*(\n|Then )`).FindStringIndex(notes[i:]); j != nil {
		return notes[i : i+j[0]]
	}
	return notes[i:]
}

// helm-docs starts a value's description at a comment line "# --"; a
// continuation line of a description that begins with a flag ("#
// --max-pods-per-agent") starts it again, and the chart's README (made by
// make chart-docs) drops everything written before it.
func TestValuesCommentsKeepTheirDescriptions(t *testing.T) {
	restart := regexp.MustCompile(`^\s*#\s*--\S`)
	for _, c := range []string{"daemonset", "aggregator"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", c, "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(b), "\n") {
			if restart.MatchString(l) {
				t.Errorf("deploy/%s/values.yaml:%d: %q restarts the value's description for helm-docs", c, i+1, strings.TrimSpace(l))
			}
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "deploy", "daemonset", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| maxPods \|.*$`).Find(readme)
	if !strings.Contains(string(row), "Catalogue entries") {
		t.Errorf("deploy/daemonset/README.md: maxPods is described as %q", row)
	}
}

// The aggregator chart sets the probes' handlers and takes their timing
// from livenessProbe and readinessProbe; a probe set to null is left out,
// the other kept, in a valid manifest, as the daemonset chart does.
func TestAggregatorProbeSetToNullRenders(t *testing.T) {
	for p, other := range map[string]string{"livenessProbe": "readinessProbe", "readinessProbe": "livenessProbe"} {
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", p+"=null")
		if err != nil || strings.Contains(out, p+":") || !strings.Contains(out, other+":") {
			t.Errorf("--set %s=null: %v; want it left out and %s kept\n%s", p, err, other, out)
		}
	}
}

// The agent's probes are exec probes of its health port on the pod's
// loopback (the http port, reachable from any pod, could be filled by a
// tenant's connections): the port the probes name is the one the agent is
// told to serve, a port moved moves both, and a probe set to null is left
// out.
func TestAgentProbesExecTheHealthPort(t *testing.T) {
	chart := filepath.Join(root, "deploy", "daemonset")
	for _, port := range []string{"", "9099"} {
		args := []string{}
		want := "8082"
		if port != "" {
			args, want = []string{"--set", "healthPort=" + port}, port
		}
		out, err := render(t, chart, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		for _, s := range []string{
			"- --health-addr=127.0.0.1:" + want + "\n",
			`command: ["/pulse-agent", "probe", "http://127.0.0.1:` + want + `/livez"]`,
			`command: ["/pulse-agent", "probe", "http://127.0.0.1:` + want + `/readyz"]`,
		} {
			if !strings.Contains(out, s) {
				t.Errorf("%v: %q not rendered:\n%s", args, s, out)
			}
		}
		if strings.Contains(out, "httpGet") {
			t.Errorf("%v: an httpGet probe rendered:\n%s", args, out)
		}
	}
	out, err := render(t, chart, "--set", "livenessProbe=null")
	if err != nil || strings.Contains(out, "livenessProbe") || !strings.Contains(out, "readinessProbe") {
		t.Errorf("livenessProbe=null: %v\n%s", err, out)
	}
}

// The aggregator's probes, as the agent's: exec probes of its health port
// on the pod's loopback (16 pods, each holding its 64 connections, fill
// the http port's 1,024), no container port or NetworkPolicy rule for it.
func TestAggregatorProbesExecTheHealthPort(t *testing.T) {
	// The relay's too: its http port is open to networkPolicy.httpFrom
	// (anyone by default), whose connections filled its bounds and failed
	// its probes.
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "networkPolicy.enabled=true", "--set", "relay.enabled=true")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, s := range []string{
		"- --health-addr=127.0.0.1:8081\n",
		`command: ["/pulse-aggregator", "probe", "http://127.0.0.1:8081/livez"]`,
		`command: ["/pulse-aggregator", "probe", "http://127.0.0.1:8081/readyz"]`,
		`command: ["/pulse-relay", "probe", "http://127.0.0.1:8081/livez"]`,
		`command: ["/pulse-relay", "probe", "http://127.0.0.1:8081/readyz"]`,
	} {
		if !strings.Contains(out, s) {
			t.Errorf("%q not rendered:\n%s", s, out)
		}
	}
	if strings.Contains(out, "httpGet") || strings.Contains(out, "port: health") || strings.Contains(out, "name: health") {
		t.Errorf("the health port is still reached from outside the pod:\n%s", out)
	}
}

// A probe's handler in a values file (the daemonset chart's before its
// probes became exec probes of the loopback health port; its values then
// carried httpGet) rendered beside the chart's, a manifest the API server
// refuses; and a health port on the http port's made the process fail to
// listen. Both charts refuse them, saying what to give.
func TestAProbesHandlerInTheValuesIsRefused(t *testing.T) {
	for _, c := range []struct {
		chart string
		args  []string
		says  string
	}{
		{"daemonset", []string{"--set", "livenessProbe.httpGet.path=/livez"}, "livenessProbe.httpGet: the chart sets the probe's handler"},
		{"daemonset", []string{"--set", "readinessProbe.exec.command={true}"}, "readinessProbe.exec"},
		{"daemonset", []string{"--set", "healthPort=8081"}, "healthPort must differ from httpPort"},
		// The agent refuses the pair at start: it crash-looped on every node.
		{"daemonset", []string{"--set", "relay=pulse-relay:8443,transport=framed"}, "with relay set, use auto or grpc"},
		{"aggregator", []string{"--set", "readinessProbe.tcpSocket.port=8080"}, "readinessProbe.tcpSocket"},
		{"aggregator", []string{"--set", "http.healthPort=8080"}, "http.healthPort must differ from http.port"},
		// The debug port (on loopback by default) and the others: each
		// clash failed the aggregator's start.
		{"aggregator", []string{"--set", "http.healthPort=8082"}, "the debug port (8082, debug.localhostOnly) must differ from http.healthPort"},
		{"aggregator", []string{"--set", "http.port=9090"}, "http.port must differ from scaler.port"},
		{"aggregator", []string{"--set", "ingest.port=8080"}, "http.port must differ from ingest.port"},
		{"aggregator", []string{"--set", "relay.enabled=true,relay.healthPort=8080"}, "relay.healthPort must differ from relay.port and relay.httpPort"},
		// An agent's connection to a relay carries 32 streams, one a replica.
		{"aggregator", []string{"--set", "relay.enabled=true,replicaCount=17"}, "relay.enabled with more than 16 aggregator replicas"},
	} {
		out, err := render(t, filepath.Join(root, "deploy", c.chart), c.args...)
		if err == nil || !strings.Contains(out, c.says) {
			t.Errorf("%s %v: %v, want it refused saying %q\n%.500s", c.chart, c.args, err, c.says, out)
		}
	}
	// Timing alone renders, and a probe set to null is left out.
	if out, err := render(t, filepath.Join(root, "deploy", "daemonset"), "--set", "livenessProbe.periodSeconds=30", "--set", "readinessProbe=null"); err != nil ||
		!strings.Contains(out, "periodSeconds: 30") || strings.Contains(out, "readinessProbe") {
		t.Errorf("timing alone: %v\n%s", err, out)
	}
}

// TestServiceNamesFitAndTheClusterDomain: a suffix after a full name of up
// to 63 bytes made a Service's name past the 63 Kubernetes allows (the
// install failed at a release name of 40 bytes); the cluster's domain was
// cluster.local in every name the chart wrote (provisioned ScaledObjects
// named an address no other domain resolves); and a ServiceAccount not
// made and not named bound the roles to the namespace's default one.
func TestServiceNamesFitAndTheClusterDomain(t *testing.T) {
	long := strings.Repeat("a", 63)
	serviceNames := regexp.MustCompile(`(?m)^kind: Service\nmetadata:\n  name: (\S+)`)
	for _, c := range []struct {
		chart string
		args  []string
	}{
		{"aggregator", []string{"--set", "fullnameOverride=" + long, "--set", "clusterDomain=example.org", "--set", "provisioning.enabled=true", "--set", "relay.enabled=true"}},
		{"daemonset", []string{"--set", "fullnameOverride=" + long, "--set", "serviceMonitor.enabled=true"}},
	} {
		out, err := render(t, filepath.Join(root, "deploy", c.chart), c.args...)
		if err != nil {
			t.Fatalf("%s: %v\n%.800s", c.chart, err, out)
		}
		names := serviceNames.FindAllStringSubmatch(out, -1)
		if len(names) < 1 {
			t.Fatalf("%s: no Service rendered", c.chart)
		}
		for _, n := range names {
			if len(n[1]) > 63 {
				t.Errorf("%s: Service %s is %d bytes, past 63", c.chart, n[1], len(n[1]))
			}
		}
		if c.chart == "aggregator" && (!strings.Contains(out, "--provision-scaler-address="+long+".pulse-system.svc.example.org:") || strings.Contains(out, "cluster.local")) {
			t.Errorf("aggregator: the names do not use clusterDomain example.org:\n%s", out)
		}
	}
	for _, chart := range []string{"aggregator", "daemonset"} {
		dir := filepath.Join(root, "deploy", chart)
		out, err := render(t, dir, "--set", "serviceAccount.create=false")
		if err == nil || !strings.Contains(out, "needs serviceAccount.name") {
			t.Errorf("%s: no ServiceAccount made or named, with RBAC: %v, want it refused\n%.500s", chart, err, out)
		}
		if out, err := render(t, dir, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=mine"); err != nil || !strings.Contains(out, "serviceAccountName: mine") {
			t.Errorf("%s: a ServiceAccount named: %v\n%.500s", chart, err, out)
		}
	}
}

// TestTheNetworkPolicyLetsInTheAgentsNamespaces: agents whose
// ServiceAccounts (agentAuth.serviceAccounts) are in another namespace,
// where NOTES installs them, were let in from the release namespace
// alone: every ingest connection was dropped.
func TestTheNetworkPolicyLetsInTheAgentsNamespaces(t *testing.T) {
	dir := filepath.Join(root, "deploy", "aggregator")
	out, err := render(t, dir, "--set", "agentAuth.serviceAccounts={agents/pulse-agent,other/pulse-agent}", "--show-only", "templates/networkpolicy.yaml")
	if err != nil || !strings.Contains(out, `values: ["agents","other"]`) {
		t.Errorf("agents in namespaces agents and other: %v\n%s", err, out)
	}
	for _, args := range [][]string{nil, {"--set", "agentAuth.mode=none", "--set", "agentAuth.serviceAccounts={agents/pulse-agent}"}} {
		// The accounts are read with tokenreview alone (as NOTES reads them).
		out, err = render(t, dir, append([]string{"--show-only", "templates/networkpolicy.yaml"}, args...)...)
		if err != nil || strings.Contains(out, "key: kubernetes.io/metadata.name") {
			t.Errorf("agents in the release namespace %v: %v, want no namespaceSelector for them\n%s", args, err, out)
		}
	}
}

// docs splits a rendering into its objects, as kind/name to YAML.
func docs(t *testing.T, out string) map[string]string {
	t.Helper()
	objs := map[string]string{}
	for _, d := range strings.Split(out, "\n---") {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("%v\n%s", err, d)
		}
		if m.Kind != "" {
			objs[m.Kind+"/"+m.Metadata.Name] = d
		}
	}
	return objs
}

func container(t *testing.T, doc string) corev1.Container {
	t.Helper()
	c, err := podContainer(doc)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	return c
}

// podContainer is the one container of a Deployment's or a DaemonSet's
// pod template.
func podContainer(doc string) (corev1.Container, error) {
	var d appsv1.Deployment // a DaemonSet's pod template lies at the same path
	if err := yaml.Unmarshal([]byte(doc), &d); err != nil || len(d.Spec.Template.Spec.Containers) != 1 {
		return corev1.Container{}, fmt.Errorf("not one container: %v", err)
	}
	return d.Spec.Template.Spec.Containers[0], nil
}

// flagValues are the values of flag (e.g. --relay) in args.
func flagValues(args []string, flag string) []string {
	var vs []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// TestTheRelayTheAgentsNameCarriesTheirStreams: with relay.enabled, the
// relay address the daemonset chart's documentation gives is a Service of
// the aggregator chart, its certificate (issued by the aggregator) names
// the agents' --relay host, the relays trust what verifies the ingest
// certificate for the name they dial, the aggregator lets a relay's
// streams open on one connection and admits the relays at its ingest
// port, and none of the aggregator's selectors takes a relay pod.
func TestTheRelayTheAgentsNameCarriesTheirStreams(t *testing.T) {
	aggOut, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true")
	if err != nil {
		t.Fatalf("%v\n%.800s", err, aggOut)
	}
	agg := docs(t, aggOut)
	const relayAddr = "pulse-aggregator-relay.pulse-system.svc.cluster.local:9091"
	agentOut, err := render(t, filepath.Join(root, "deploy", "daemonset"), "--set", "relay="+relayAddr)
	if err != nil {
		t.Fatalf("%v\n%.800s", err, agentOut)
	}
	agent := container(t, docs(t, agentOut)["DaemonSet/pulse-agent"])
	if got := flagValues(agent.Args, "--relay"); len(got) != 1 || got[0] != relayAddr {
		t.Fatalf("agent --relay %v, want %s", got, relayAddr)
	}
	var svc corev1.Service
	must(t, yaml.Unmarshal([]byte(agg["Service/pulse-aggregator-relay"]), &svc))
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].Port != 9091 {
		t.Fatalf("relay Service: %+v", svc.Spec.Ports)
	}
	aggregator := container(t, agg["Deployment/pulse-aggregator"])
	relay := container(t, agg["Deployment/pulse-aggregator-relay"])
	names := flagValues(aggregator.Args, "--relay-cert-dns-name")
	if !slices.Contains(names, strings.TrimSuffix(relayAddr, ":9091")) || !slices.Equal(flagValues(aggregator.Args, "--relay-cert-secret"), []string{"pulse-aggregator-relay-tls"}) {
		t.Errorf("the relay certificate's names %v (secret %v) do not carry the agents' --relay host", names, flagValues(aggregator.Args, "--relay-cert-secret"))
	}
	if s := flagValues(relay.Args, "--streams-per-connection"); !slices.Equal(flagValues(aggregator.Args, "--max-ingest-streams-per-connection"), s) || len(s) != 1 {
		t.Errorf("relay --streams-per-connection %v, aggregator --max-ingest-streams-per-connection %v: want them equal", s, flagValues(aggregator.Args, "--max-ingest-streams-per-connection"))
	}
	relayConnectionsLetIn(t, aggregator.Args, relay.Args)
	// The relay dials a name the ingest certificate carries, and trusts
	// the bundle its Secret holds.
	dial := flagValues(relay.Args, "--aggregator")
	if len(dial) != 1 || !slices.Contains(flagValues(aggregator.Args, "--cert-dns-name"), strings.TrimSuffix(dial[0], ":9091")) {
		t.Errorf("relay --aggregator %v is not among the ingest certificate's names %v", dial, flagValues(aggregator.Args, "--cert-dns-name"))
	}
	if !slices.Equal(flagValues(relay.Args, "--aggregator-ca-file"), []string{"/etc/pulse/relay-tls/ca.crt"}) || len(flagValues(relay.Args, "--tls-cert-file")) != 1 {
		t.Errorf("relay TLS flags: %v", relay.Args)
	}
	var np networkingv1.NetworkPolicy
	must(t, yaml.Unmarshal([]byte(agg["NetworkPolicy/pulse-aggregator"]), &np))
	relayPods := labels.Set{"app.kubernetes.io/name": "pulse-relay", "app.kubernetes.io/instance": "pulse-aggregator"}
	admitted := false
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.String() != "ingest" {
				continue
			}
			for _, from := range rule.From {
				if from.PodSelector != nil && from.NamespaceSelector == nil && labels.SelectorFromSet(from.PodSelector.MatchLabels).Matches(relayPods) {
					admitted = true
				}
			}
		}
	}
	if !admitted {
		t.Errorf("the aggregator's NetworkPolicy admits no relay pod at the ingest port: %+v", np.Spec.Ingress)
	}
	// No selector of the aggregator's takes a relay pod or Service.
	var dep appsv1.Deployment
	must(t, yaml.Unmarshal([]byte(agg["Deployment/pulse-aggregator-relay"]), &dep))
	for kind, sel := range map[string]map[string]string{"Deployment": selectorOf(t, agg["Deployment/pulse-aggregator"]), "NetworkPolicy": np.Spec.PodSelector.MatchLabels} {
		if labels.SelectorFromSet(sel).Matches(labels.Set(dep.Spec.Template.Labels)) {
			t.Errorf("the aggregator's %s selector %v takes the relay's pods %v", kind, sel, dep.Spec.Template.Labels)
		}
	}
	var aggSvc corev1.Service
	must(t, yaml.Unmarshal([]byte(agg["Service/pulse-aggregator"]), &aggSvc))
	if labels.SelectorFromSet(aggSvc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) || labels.SelectorFromSet(aggSvc.Labels).Matches(labels.Set(svc.Labels)) && len(aggSvc.Labels) > 0 {
		t.Errorf("the aggregator's Service selects the relay's pods, or its labels are the relay Service's (a ServiceMonitor would scrape both)")
	}
}

// relayConnectionsLetIn: every connection one relay's agents take to a
// replica (from one pod address), with relay.MaxStreamsPerReplica streams
// an agent, twice over for the replacement of an aged one, is let in.
func relayConnectionsLetIn(t *testing.T, aggregator, relay []string) {
	t.Helper()
	maxConns, _ := strconv.Atoi(flagValues(relay, "--max-connections")[0])
	streams, _ := strconv.Atoi(flagValues(relay, "--streams-per-connection")[0])
	want := 2 * ((maxConns*pulserelay.MaxStreamsPerReplica + streams - 1) / streams)
	if perAddr, _ := strconv.Atoi(flagValues(aggregator, "--max-ingest-connections-per-address")[0]); perAddr < want {
		t.Errorf("aggregator --max-ingest-connections-per-address %d, below %d: twice a relay's %d agents' %d streams each over %d streams a connection", perAddr, want, maxConns, pulserelay.MaxStreamsPerReplica, streams)
	}
}

func selectorOf(t *testing.T, doc string) map[string]string {
	t.Helper()
	var d appsv1.Deployment
	must(t, yaml.Unmarshal([]byte(doc), &d))
	return d.Spec.Selector.MatchLabels
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTheRelaysCertificateCombinationsThatCannotWork: a certificate of
// one's own for the relays with the managed ingest TLS (the agents trust
// only the managed CA) or with a plaintext ingest port (the relays would
// dial TLS), one that is the managed certificates' Secret (the CA key in
// the relay pods), none with an ingest certificate of one's own, and the
// relay's two ports on one number (its pod would never start): each
// refused, saying why.
func TestTheRelaysCertificateCombinationsThatCannotWork(t *testing.T) {
	for _, c := range []struct {
		set  string
		want string
	}{
		{"relay.enabled=true,relay.tls.secretName=mine", "goes with ingest.tls.secretName"},
		{"relay.enabled=true,relay.tls.secretName=mine,ingest.tls.managed=false,agentAuth.mode=none,metricsAuth=none", "goes with ingest.tls.secretName"},
		{"relay.enabled=true,relay.tls.secretName=pulse-aggregator-certs,ingest.tls.secretName=ingest", "mount the managed CA's key"},
		{"relay.enabled=true,ingest.tls.secretName=ingest", "needs relay.tls.secretName"},
		{"relay.enabled=true,relay.httpPort=9091", "must differ"},
	} {
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("--set %s: %v, want it refused saying %q\n%.300s", c.set, err, c.want, out)
		}
	}
	if out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true,relay.tls.secretName=mine,ingest.tls.secretName=ingest"); err != nil {
		t.Errorf("the relays' certificate and the ingest port's both one's own: %v\n%.300s", err, out)
	}
}

// TestTheRelaysSecretIsWatchedAndRetired: with the relay on, the
// aggregator may watch the relays' Secret (an edit is put right at once);
// with it off, or its certificate one's own under another name, the
// aggregator is told to remove the one it made, and may get, watch and
// delete that one Secret alone; with no managed certificates, nothing.
// KEDA's credentials and the agents' CA bundle are watchable too.
func TestTheRelaysSecretIsWatchedAndRetired(t *testing.T) {
	const name = "pulse-aggregator-relay-tls"
	rules := func(agg map[string]string) []rbacv1.PolicyRule {
		var r rbacv1.Role
		must(t, yaml.Unmarshal([]byte(agg["Role/pulse-aggregator-certs"]), &r))
		var keda rbacv1.Role
		must(t, yaml.Unmarshal([]byte(agg["Role/pulse-aggregator-keda-creds"]), &keda))
		return append(r.Rules, keda.Rules...)
	}
	verbs := func(rules []rbacv1.PolicyRule, resource, name string) []string {
		for _, r := range rules {
			if slices.Contains(r.Resources, resource) && slices.Equal(r.ResourceNames, []string{name}) {
				return r.Verbs
			}
		}
		return nil
	}
	for _, c := range []struct {
		set     string
		retired bool
	}{
		{"relay.enabled=false", true},
		{"relay.enabled=true", false},
		{"relay.enabled=true,relay.tls.secretName=mine,ingest.tls.secretName=ingest", true},
		{"relay.enabled=true,relay.tls.secretName=" + name + ",ingest.tls.secretName=ingest", false},
	} {
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", c.set)
		if err != nil {
			t.Fatalf("--set %s: %v\n%.300s", c.set, err, out)
		}
		agg := docs(t, out)
		args := container(t, agg["Deployment/pulse-aggregator"]).Args
		got := flagValues(args, "--relay-cert-secret-retired")
		rs := rules(agg)
		switch {
		case c.retired && (!slices.Equal(got, []string{name}) || !slices.Equal(verbs(rs, "secrets", name), []string{"get", "list", "watch", "delete"})):
			t.Errorf("--set %s: --relay-cert-secret-retired %v, verbs %v: want %s removed, and the verbs to watch and delete it", c.set, got, verbs(rs, "secrets", name), name)
		case !c.retired && len(got) > 0:
			t.Errorf("--set %s: --relay-cert-secret-retired %v, want none", c.set, got)
		case !c.retired && c.set == "relay.enabled=true" && !slices.Contains(verbs(rs, "secrets", name), "watch"):
			t.Errorf("--set %s: the relays' Secret cannot be watched: verbs %v", c.set, verbs(rs, "secrets", name))
		}
		if !slices.Contains(verbs(rs, "secrets", "pulse-creds"), "watch") {
			t.Errorf("--set %s: KEDA's credentials cannot be watched: %v", c.set, verbs(rs, "secrets", "pulse-creds"))
		}
		if !strings.Contains(c.set, "ingest.tls.secretName") && !slices.Contains(verbs(rs, "configmaps", "pulse-aggregator-ca"), "watch") {
			t.Errorf("--set %s: the agents' CA bundle cannot be watched: %v", c.set, verbs(rs, "configmaps", "pulse-aggregator-ca"))
		}
	}
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "scaler.managedCerts.enabled=false,ingest.tls.managed=false,agentAuth.mode=none,metricsAuth=none")
	if err != nil {
		t.Fatalf("no managed certificates: %v\n%.300s", err, out)
	}
	if got := flagValues(container(t, docs(t, out)["Deployment/pulse-aggregator"]).Args, "--relay-cert-secret-retired"); len(got) > 0 {
		t.Errorf("no managed certificates: --relay-cert-secret-retired %v, want none", got)
	}
}

// TestTheRelaysAreKeptThroughADrainAndScraped: with relay.enabled a
// PodDisruptionBudget keeps a drain from taking more than one relay at
// once (none for a single relay: it would block every drain of its
// node), and serviceMonitor scrapes the relays' http port too; each
// selects the relay pods and no aggregator pod.
func TestTheRelaysAreKeptThroughADrainAndScraped(t *testing.T) {
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true,serviceMonitor.enabled=true")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rendered := docs(t, out)
	var dep appsv1.Deployment
	must(t, yaml.Unmarshal([]byte(rendered["Deployment/pulse-aggregator-relay"]), &dep))
	relayPods := labels.Set(dep.Spec.Template.Labels)
	aggPods := labels.Set(selectorOf(t, rendered["Deployment/pulse-aggregator"]))
	var pdb policyv1.PodDisruptionBudget
	must(t, yaml.Unmarshal([]byte(rendered["PodDisruptionBudget/pulse-aggregator-relay"]), &pdb))
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.Selector == nil {
		t.Fatalf("relay PodDisruptionBudget %+v: want maxUnavailable 1 and a selector", pdb.Spec)
	}
	// Relays unready through an aggregator outage (not resolved) must not
	// block a drain.
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
		t.Errorf("relay PodDisruptionBudget unhealthyPodEvictionPolicy %v, want AlwaysAllow", p)
	}
	if sel := labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels); !sel.Matches(relayPods) || sel.Matches(aggPods) {
		t.Errorf("relay PodDisruptionBudget selector %v: want the relay pods %v and not the aggregator's %v", sel, relayPods, aggPods)
	}
	var sm struct {
		Spec struct {
			Selector  metav1.LabelSelector
			Endpoints []struct{ Port, Path, Scheme string }
		}
	}
	must(t, yaml.Unmarshal([]byte(rendered["ServiceMonitor/pulse-aggregator-relay"]), &sm))
	var svc corev1.Service
	must(t, yaml.Unmarshal([]byte(rendered["Service/pulse-aggregator-relay"]), &svc))
	var aggSvc corev1.Service
	must(t, yaml.Unmarshal([]byte(rendered["Service/pulse-aggregator"]), &aggSvc))
	if sel := labels.SelectorFromSet(sm.Spec.Selector.MatchLabels); !sel.Matches(labels.Set(svc.Labels)) || sel.Matches(labels.Set(aggSvc.Labels)) {
		t.Errorf("relay ServiceMonitor selector %v: want the relay Service's labels %v and not the aggregator's %v", sel, svc.Labels, aggSvc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Spec.Endpoints[0].Scheme != "http" {
		t.Errorf("relay ServiceMonitor endpoints %+v: want the http port's /metrics over http", sm.Spec.Endpoints)
	}
	one, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true,relay.replicaCount=1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := docs(t, one)["PodDisruptionBudget/pulse-aggregator-relay"]; ok {
		t.Error("a PodDisruptionBudget for a single relay: it would block every drain of its node")
	}
	// Neither without the relays, nor the budget when it is turned off.
	off, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "serviceMonitor.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ServiceMonitor/pulse-aggregator-relay", "PodDisruptionBudget/pulse-aggregator-relay", "Deployment/pulse-aggregator-relay"} {
		if _, ok := docs(t, off)[k]; ok {
			t.Errorf("relay.enabled false, but %s renders", k)
		}
	}
	noBudget, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true,relay.podDisruptionBudget.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := docs(t, noBudget)["PodDisruptionBudget/pulse-aggregator-relay"]; ok {
		t.Error("relay.podDisruptionBudget.enabled false, but the budget renders")
	}
}

// TestAnImageTagOfDigitsIsAString: a tag of digits (a commit's short hash,
// 5187467) is a number to --set and to a values file, and helm upgrade
// --reuse-values wrote it back as 5.187467e+06: the e2e's relay rollout
// never became ready (InvalidImageName). Each image's tag as a number is
// refused naming --set-string; as a string it renders as given.
func TestAnImageTagOfDigitsIsAString(t *testing.T) {
	for _, c := range []struct{ chart, key, image string }{
		{"daemonset", "image.tag", "ghcr.io/pulse-io/pulse-agent"},
		{"aggregator", "image.tag", "ghcr.io/pulse-io/pulse-aggregator"},
		{"aggregator", "relay.image.tag", "ghcr.io/pulse-io/pulse-relay"},
	} {
		extra := []string{}
		if strings.HasPrefix(c.key, "relay.") {
			extra = []string{"--set", "relay.enabled=true"}
		}
		chart := filepath.Join(root, "deploy", c.chart)
		// As --set reads it (an int64), and as a values file or
		// --reuse-values gives it (a float64).
		block := c.key[:strings.LastIndex(c.key, ".")]
		file := valuesFile(t, strings.ReplaceAll(block, ".", ":\n  ")+":\n"+strings.Repeat("  ", strings.Count(block, ".")+1)+"tag: 5187467\n")
		for _, args := range [][]string{{"--set", c.key + "=5187467"}, {"-f", file}} {
			out, err := render(t, chart, append(extra, args...)...)
			if err == nil || !strings.Contains(out, "--set-string "+c.key+"=TAG") {
				t.Errorf("%s %v: %v, want it refused naming --set-string %s\n%.500s", c.chart, args, err, c.key, out)
			}
		}
		out, err := render(t, chart, append(extra, "--set-string", c.key+"=5187467")...)
		if err != nil || !strings.Contains(out, `image: "`+c.image+`:5187467"`) {
			t.Errorf("%s --set-string %s=5187467: %v, want image %s:5187467\n%.500s", c.chart, c.key, err, c.image, out)
		}
	}
}

// TestExtraArgsAreQuoted: an extra argument with ": " or " #" in it, or
// starting with { or [, broke the manifest's YAML.
func TestExtraArgsAreQuoted(t *testing.T) {
	arg := "--log-level=debug # {not: yaml}"
	for _, chart := range []string{"daemonset", "aggregator"} {
		out, err := render(t, filepath.Join(root, "deploy", chart), "--set-json", `extraArgs=["`+arg+`"]`)
		if err != nil {
			t.Fatalf("%s: %v\n%.500s", chart, err, out)
		}
		found := false
		for _, doc := range docs(t, out) {
			var d appsv1.DaemonSet // the pod template is where a Deployment's is
			if yaml.Unmarshal([]byte(doc), &d) == nil && len(d.Spec.Template.Spec.Containers) > 0 {
				found = found || slices.Contains(d.Spec.Template.Spec.Containers[0].Args, arg)
			}
		}
		if !found {
			t.Errorf("%s: the extra argument %q not rendered as one argument", chart, arg)
		}
	}
}

// TestTheReplicasSpreadOverNodes: the relays had no anti-affinity (the
// aggregator's replicas had), so both could land on one node, and losing
// it cut every agent off. By default each spreads its own pods over nodes:
// the term selects the pods of its Deployment, not the other's.
func TestTheReplicasSpreadOverNodes(t *testing.T) {
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	spread := 0
	for _, doc := range docs(t, out) {
		var d appsv1.Deployment
		if yaml.Unmarshal([]byte(doc), &d) != nil || d.Kind != "Deployment" {
			continue
		}
		a := d.Spec.Template.Spec.Affinity
		if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
			t.Errorf("%s: no preferred anti-affinity by default", d.Name)
			continue
		}
		term := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err != nil || term.TopologyKey != "kubernetes.io/hostname" || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("%s: the term %+v does not spread its own pods over nodes", d.Name, term)
			continue
		}
		spread++
	}
	if spread != 2 {
		t.Fatalf("%d Deployments spread over nodes; want the aggregator's and the relay's", spread)
	}
}

// TestTheDebugReaderGrantsPulsesPagesAlone: a non-resource URL rule holds in
// every server that checks the cluster's RBAC, and the chart's
// <release>-debug-reader granted "/debug/*": whoever was bound to it to
// read pulse's pages could read the API server's /debug/pprof and its
// request dumps (other tenants' requests) too. It names pulse's pages.
func TestTheDebugReaderGrantsPulsesPagesAlone(t *testing.T) {
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "debug.localhostOnly=false")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	pages := map[string]bool{"/debug/workloads": true, "/debug/workloads/*": true, "/debug/triggers": true, "/debug/triggers/*": true,
		"/debug/provisioning": true, "/debug/provisioning/*": true}
	found := false
	for _, doc := range strings.Split(out, "\n---\n") {
		if !strings.Contains(doc, "kind: ClusterRole\n") || !strings.Contains(doc, "name: pulse-aggregator-debug-reader\n") {
			continue
		}
		found = true
		m := regexp.MustCompile(`nonResourceURLs: \[([^\]]*)\]`).FindStringSubmatch(doc)
		if m == nil {
			t.Fatalf("no nonResourceURLs in the debug reader:\n%s", doc)
		}
		for _, u := range strings.Split(m[1], ",") {
			if u = strings.Trim(strings.TrimSpace(u), `"`); !pages[u] {
				t.Errorf("the debug reader grants %q, which is not one of pulse's pages", u)
			}
		}
	}
	if !found {
		t.Fatal("no ClusterRole pulse-aggregator-debug-reader rendered")
	}
}

// TestTheClusterRoleReadsItselfWhereItOwns: the aggregator reads its
// ClusterRole (to own what it creates) only when told its name
// (--owner-cluster-role); with metricsAuth the ClusterRole alone needed
// (its reviews), the rule was granted and never used (found in a review,
// 2026-12-05). The two go together.
func TestTheClusterRoleReadsItselfWhereItOwns(t *testing.T) {
	chart := filepath.Join(root, "deploy", "aggregator")
	for _, args := range [][]string{nil, {"-f", filepath.Join(chart, "ci", "tls-files-rbac-values.yaml"), "--set", "metricsAuth=kubernetes"}} {
		out, err := render(t, chart, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		reads, told := strings.Contains(out, `resources: ["clusterroles"]`), strings.Contains(out, "--owner-cluster-role=")
		if reads != told || !strings.Contains(out, "kind: ClusterRole\n") {
			t.Errorf("%v: the ClusterRole reads itself %v, the aggregator is told its name %v; want both or neither, and a ClusterRole", args, reads, told)
		}
	}
}

// TestTheAgentRunsAsAUserWithoutThePodResourcesSocket: root is for the
// kubelet's pod-resources socket alone; with podResources.enabled false
// the agent, which parses every tenant's pages, still ran as root unless
// its security context was written out by hand. And with nvml.mode off,
// where the agent never dials the socket, it still ran as root with the
// kubelet's directory mounted (found in a review, 2026-12-05).
func TestTheAgentRunsAsAUserWithoutThePodResourcesSocket(t *testing.T) {
	chart := filepath.Join(root, "deploy", "daemonset")
	for _, c := range []struct {
		args    []string
		user    int64
		nonRoot bool
	}{
		{nil, 0, false},
		{[]string{"--set", "podResources.enabled=false"}, 65532, true},
		{[]string{"--set", "podResources.enabled=false", "--set", "securityContext.runAsUser=1000"}, 1000, false},
		{[]string{"--set", "nvml.mode=off"}, 65532, true},
	} {
		out, err := render(t, chart, c.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		if mounted := strings.Contains(out, "/var/lib/kubelet/pod-resources"); mounted != (c.user == 0) {
			t.Errorf("%v: the kubelet's pod-resources directory mounted %v; want it only where the agent runs as root for it", c.args, mounted)
		}
		sc := container(t, docs(t, out)["DaemonSet/pulse-agent"]).SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != c.user || (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) != c.nonRoot ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%v: security context %+v; want user %d, runAsNonRoot %v, the rest kept", c.args, sc, c.user, c.nonRoot)
		}
	}
	// The context emptied (or null) without the socket: the user still,
	// not the image's root (nothing was written, and it ran as root).
	for _, empty := range []string{"securityContext=null", "securityContext=" + "{}"} {
		out, err := render(t, chart, "--set", "podResources.enabled=false", "--set-json", empty)
		if err != nil {
			t.Fatalf("%s: %v\n%s", empty, err, out)
		}
		sc := container(t, docs(t, out)["DaemonSet/pulse-agent"]).SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("podResources.enabled=false, %s: security context %+v; want user 65532, runAsNonRoot", empty, sc)
		}
	}
}

// TestValuesThatCannotWorkAreRefusedSayingWhy: a warmup.agentDaemonSet or
// an agentAuth.serviceAccounts entry with no namespace, and a relay of 0
// streams a connection, rendered a template's panic (an index out of
// range, a division by zero) or a flag the aggregator refuses at its start
// (crash-looping); a podDisruptionBudget default removed with null was
// read as "<nil>", and refused as both set; managed ingest TLS with no CA
// ConfigMap rendered, and no agent could ever connect.
func TestValuesThatCannotWorkAreRefusedSayingWhy(t *testing.T) {
	chart := filepath.Join(root, "deploy", "aggregator")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--set", "warmup.agentDaemonSet=pulse-agent"}, `warmup.agentDaemonSet "pulse-agent": NAMESPACE/NAME`},
		{[]string{"--set", "agentAuth.serviceAccounts={pulse-agent}"}, `agentAuth.serviceAccounts: "pulse-agent" is not NAMESPACE/NAME`},
		{[]string{"--set", "agentAuth.serviceAccounts={pulse-agent}", "--set", "networkPolicy.enabled=false"}, `agentAuth.serviceAccounts: "pulse-agent" is not NAMESPACE/NAME`},
		{[]string{"--set", "relay.enabled=true", "--set", "relay.streamsPerConnection=0"}, "relay.streamsPerConnection must be from 1 to 65536"},
		// Rendered, and every replica crash-looped (found in a review, 2026-12-05).
		{[]string{"--set", "relay.enabled=true", "--set", "relay.streamsPerConnection=70000"}, "relay.streamsPerConnection must be from 1 to 65536"},
		// The managed CA published nowhere (--ca-configmap=, an RBAC rule
		// on a ConfigMap named ""): every agent's handshake failed.
		{[]string{"--set", "scaler.managedCerts.caConfigMap="}, "ingest.tls.managed needs scaler.managedCerts.caConfigMap"},
	} {
		out, err := render(t, chart, c.args...)
		if err == nil || !strings.Contains(out, c.says) {
			t.Errorf("%v: %v; want it refused saying %q:\n%s", c.args, err, c.says, out)
		}
	}
	out, err := render(t, chart, "--set", "replicaCount=2", "--set", "podDisruptionBudget.minAvailable=null", "--set", "podDisruptionBudget.maxUnavailable=1")
	if err != nil || !strings.Contains(docs(t, out)["PodDisruptionBudget/pulse-aggregator"], "maxUnavailable: 1") {
		t.Errorf("minAvailable=null, maxUnavailable=1: %v\n%s", err, out)
	}
}

// TestAppProtocolGRPCOnlyWherePlaintextGRPC: every Service port of the
// aggregator and the relays said appProtocol grpc, which a mesh takes for
// HTTP/2 it can read: the scaler, ingest and relay ports speak TLS by
// default, and the ingest port the agents' framed transport, no gRPC. It
// is said only of a port that speaks gRPC in plaintext.
func TestAppProtocolGRPCOnlyWherePlaintextGRPC(t *testing.T) {
	chart := filepath.Join(root, "deploy", "aggregator")
	for _, c := range []struct {
		args []string
		want map[string]bool // Service/port → appProtocol grpc
	}{
		{[]string{"--set", "relay.enabled=true"}, map[string]bool{}},
		{[]string{"--set", "relay.enabled=true", "--set", "scaler.managedCerts.enabled=false", "--set", "ingest.tls.managed=false",
			"--set", "agentAuth.mode=none", "--set", "metricsAuth=none"},
			map[string]bool{"pulse-aggregator/scaler": true, "pulse-aggregator-relay/relay": true}},
	} {
		out, err := render(t, chart, c.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		got := map[string]bool{}
		for key, doc := range docs(t, out) {
			if !strings.HasPrefix(key, "Service/") {
				continue
			}
			var svc corev1.Service
			must(t, yaml.Unmarshal([]byte(doc), &svc))
			for _, p := range svc.Spec.Ports {
				if p.AppProtocol != nil {
					if *p.AppProtocol != "grpc" {
						t.Errorf("%v: %s port %s appProtocol %q", c.args, svc.Name, p.Name, *p.AppProtocol)
					}
					got[svc.Name+"/"+p.Name] = true
				}
			}
		}
		if !maps.Equal(got, c.want) {
			t.Errorf("%v: appProtocol grpc on %v, want on %v", c.args, got, c.want)
		}
	}
}

// TestTheAggregatorMakesNoTokenSecrets: its managed certificates need
// Secrets created (RBAC cannot bound a create by name) and read back by
// name, so the aggregator's ServiceAccount could make one of type
// service-account-token under such a name and read a ServiceAccount's
// token (in KEDA's namespace, the operator's). Where the cluster has
// admission policies, the chart refuses its ServiceAccount such a Secret
// (the e2e checks the policy on a real API server: noTokenSecrets).
func TestTheAggregatorMakesNoTokenSecrets(t *testing.T) {
	chart := filepath.Join(root, "deploy", "aggregator")
	out, err := render(t, chart, "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "--set", "serviceAccount.name=agg-sa")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	// The chart's other policy, on ClusterTriggerAuthentications, is
	// TestTheAggregatorCreatesOneTriggerAuth's.
	objs := docs(t, out)
	policy := objs["ValidatingAdmissionPolicy/pulse-system-pulse-aggregator-no-token-secrets"]
	binding := objs["ValidatingAdmissionPolicyBinding/pulse-system-pulse-aggregator-no-token-secrets"]
	for _, want := range []string{"name: pulse-system-pulse-aggregator-no-token-secrets\n", `request.userInfo.username == 'system:serviceaccount:pulse-system:agg-sa'`,
		`object.type != 'kubernetes.io/service-account-token'`, `operations: ["CREATE", "UPDATE"]`, "failurePolicy: Fail"} {
		if !strings.Contains(policy, want) {
			t.Errorf("the policy lacks %q:\n%s", want, policy)
		}
	}
	if !strings.Contains(binding, "policyName: pulse-system-pulse-aggregator-no-token-secrets\n") || !strings.Contains(binding, `validationActions: ["Deny"]`) {
		t.Errorf("the binding:\n%s", binding)
	}
	// A cluster without admission policies (before Kubernetes 1.30) is
	// still installed to.
	out, err = render(t, chart)
	if err != nil || strings.Contains(out, "ValidatingAdmissionPolicy") {
		t.Fatalf("without the API: %v\n%.400s", err, out)
	}
}

// TestTheAdmissionPolicyNameIsTheReleases: two aggregator releases of their
// own names (README's "Security", docs/performance.md's shards) in one
// namespace of a long name: each release's ValidatingAdmissionPolicy has a
// name of its own. Cut to 63 characters, both were named alike, and the
// second helm install failed ("exists and cannot be imported").
func TestTheAdmissionPolicyNameIsTheReleases(t *testing.T) {
	ns := "llm-platform-inference-autoscaling-production"
	name := regexp.MustCompile(`(?m)^kind: ValidatingAdmissionPolicy\nmetadata:\n  name: (\S+)`)
	got := map[string]string{}
	for _, rel := range []string{"pulse-aggregator-shard-a", "pulse-aggregator-shard-b"} {
		out, err := exec.Command(helm(t), "template", rel, filepath.Join(root, "deploy", "aggregator"), "--namespace", ns,
			"--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", rel, err, out)
		}
		m := name.FindSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no ValidatingAdmissionPolicy rendered", rel)
		}
		if other, ok := got[string(m[1])]; ok {
			t.Errorf("releases %s and %s in %s both name their ValidatingAdmissionPolicy %q", other, rel, ns, m[1])
		}
		got[string(m[1])] = rel
	}
}

// TestTheScalersClientNameIsPassedOn: with certificates of one's own,
// scaler.tls.clientName is the name a client certificate must carry
// (--tls-client-name); unset, no such flag (any certificate the CA signed).
func TestTheScalersClientNameIsPassedOn(t *testing.T) {
	for name, want := range map[string]string{"keda-operator": "--tls-client-name=keda-operator", "": ""} {
		args := []string{"-f", filepath.Join(root, "deploy", "aggregator", "ci", "tls-files-values.yaml")}
		if name != "" {
			args = append(args, "--set", "scaler.tls.clientName="+name)
		}
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), args...)
		if err != nil {
			t.Fatalf("clientName %q: %v\n%.500s", name, err, out)
		}
		if has := strings.Contains(out, "--tls-client-name"); has != (want != "") || want != "" && !strings.Contains(out, want+"\n") {
			t.Errorf("clientName %q: --tls-client-name rendered %v; want %q", name, has, want)
		}
	}
}

// TestTheAggregatorCreatesOneTriggerAuth: RBAC cannot bound the
// aggregator's create of ClusterTriggerAuthentications by name; the
// chart's admission policy admits the one it names alone (the e2e test
// checks the API server enforces it).
func TestTheAggregatorCreatesOneTriggerAuth(t *testing.T) {
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "scaler.managedCerts.triggerAuthName=team-creds",
		"--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	policy := docs(t, out)["ValidatingAdmissionPolicy/pulse-system-pulse-aggregator-trigger-auth-name"]
	for _, want := range []string{`resources: ["clustertriggerauthentications"]`, "expression: object.metadata.name == 'team-creds'",
		"object.spec.secretTargetRef.all(r, r.name == 'team-creds')", "object.spec.all(k, k == 'secretTargetRef')",
		"system:serviceaccount:pulse-system:pulse-aggregator'"} {
		if !strings.Contains(policy, want) {
			t.Errorf("the policy does not say %q:\n%s", want, policy)
		}
	}
	if !strings.Contains(out, "policyName: pulse-system-pulse-aggregator-trigger-auth-name") {
		t.Error("the policy is not bound")
	}
}

// TestTheAggregatorsGraceHoldsItsDelay: an aggregator killed within its
// --shutdown-delay cut KEDA's streams at once; its grace period is
// terminationGracePeriodSeconds, or the delay and 10s where that is more.
func TestTheAggregatorsGraceHoldsItsDelay(t *testing.T) {
	for _, c := range []struct {
		delay string
		grace string
		want  int64
	}{{"5s", "30", 30}, {"1m", "30", 70}, {"1m", "90", 90}, {"0", "30", 30}} {
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "shutdownDelay="+c.delay, "--set", "terminationGracePeriodSeconds="+c.grace)
		if err != nil {
			t.Fatalf("%+v: %v\n%s", c, err, out)
		}
		var d appsv1.Deployment
		must(t, yaml.Unmarshal([]byte(docs(t, out)["Deployment/pulse-aggregator"]), &d))
		if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != c.want {
			t.Errorf("%+v: grace %v, want %d", c, g, c.want)
		}
	}
}

// TestTheRelaysGraceHoldsItsDelay: a relay pod killed within its
// --shutdown-delay cuts every stream at once; its grace period is
// Kubernetes' 30s, or the delay and 10s where that is more.
func TestTheRelaysGraceHoldsItsDelay(t *testing.T) {
	for delay, want := range map[string]int64{"5s": 30, "45s": 55, "59.5s": 70, "0": 30} {
		out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "--set", "relay.enabled=true", "--set", "relay.shutdownDelay="+delay)
		if err != nil {
			t.Fatalf("%s: %v\n%s", delay, err, out)
		}
		var d appsv1.Deployment
		must(t, yaml.Unmarshal([]byte(docs(t, out)["Deployment/pulse-aggregator-relay"]), &d))
		if g := d.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != want {
			t.Errorf("relay.shutdownDelay %s: grace %v, want %d", delay, g, want)
		}
		flag := map[string]string{"0": "0s"}[delay] // the number 0: the chart's default "0s"
		if flag == "" {
			flag = delay
		}
		if got := flagValues(d.Spec.Template.Spec.Containers[0].Args, "--shutdown-delay"); len(got) != 1 || got[0] != flag {
			t.Errorf("relay.shutdownDelay %s: --shutdown-delay %v", delay, got)
		}
	}
}

// TestAnEmptyAgentDaemonSetIsTheDefault: warmup.agentDaemonSet written
// empty in a values file (`agentDaemonSet:`, YAML's null) is the default,
// as "" is, and as every other name of the chart's left empty is; it
// failed the render with a template error ("invalid value; expected
// string") naming neither the value nor what to give.
func TestAnEmptyAgentDaemonSetIsTheDefault(t *testing.T) {
	out, err := render(t, filepath.Join(root, "deploy", "aggregator"), "-f", valuesFile(t, "warmup:\n  agentDaemonSet:\n"))
	if err != nil {
		t.Fatalf("warmup.agentDaemonSet null: %v\n%s", err, lastLines(out))
	}
	if !strings.Contains(out, "- --agent-daemonset=pulse-system/pulse-agent\n") {
		t.Errorf("warmup.agentDaemonSet null: the default DaemonSet not read:\n%s", out)
	}
}

// TestTheAgentsTokenCarriesAnAudience: with auth.enabled, an empty
// auth.audience rendered a projected token of no audience, which the API
// server gives its own; the aggregator reviews every token for its
// agentAuth.audience (never empty: its chart refuses that), so every
// agent was refused, each DaemonSet pod unready, and the render said
// nothing. It is refused, as the aggregator chart refuses an empty
// agentAuth.audience.
func TestTheAgentsTokenCarriesAnAudience(t *testing.T) {
	chart := filepath.Join(root, "deploy", "daemonset")
	for _, v := range []string{"auth:\n  audience: \"\"\n", "auth:\n  audience:\n"} {
		out, err := render(t, chart, "-f", valuesFile(t, v))
		if err == nil || !strings.Contains(out, "auth.audience") {
			t.Errorf("%q: %v, want it refused naming auth.audience\n%s", v, err, lastLines(out))
		}
	}
	// Without the token the audience is not read.
	if out, err := render(t, chart, "--set", "auth.enabled=false,auth.audience="); err != nil {
		t.Errorf("auth.enabled=false with no audience: %v\n%s", err, lastLines(out))
	}
}

// TestARelayBudgetWithNoBoundIsRefused: relay.podDisruptionBudget's
// maxUnavailable given "" or null rendered a budget of neither bound,
// which keeps no relay up: the drain it was made for was not bounded.
func TestARelayBudgetWithNoBoundIsRefused(t *testing.T) {
	chart := filepath.Join(root, "deploy", "aggregator")
	for _, v := range []string{"\"\"", ""} {
		vals := "relay:\n  enabled: true\n  replicaCount: 2\n  podDisruptionBudget:\n    maxUnavailable: " + v + "\n"
		out, err := render(t, chart, "-f", valuesFile(t, vals))
		if err == nil || !strings.Contains(out, "relay.podDisruptionBudget.maxUnavailable") {
			t.Errorf("maxUnavailable %q: %v, want it refused naming the value\n%s", v, err, lastLines(out))
		}
	}
	if out, err := render(t, chart, "-f", valuesFile(t, "relay:\n  enabled: true\n  replicaCount: 2\n  podDisruptionBudget:\n    maxUnavailable: 50%\n")); err != nil {
		t.Errorf("maxUnavailable 50%%: %v\n%s", err, lastLines(out))
	}
}
