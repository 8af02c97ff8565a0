//go:build e2e

// Package e2e runs pulse against a real kube-apiserver and the real KEDA
// operator: `make e2e` (see README.md in this directory).
package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/vllmsim"
)

const (
	ns        = "pulse-system"
	appNS     = "demo"
	node      = "gpu-node-1"
	otherNode = "gpu-node-2"
)

var (
	crdGVR       = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	workspaceGVR = schema.GroupVersionResource{Group: "kaito.sh", Version: "v1beta1", Resource: "workspaces"}
	infSetGVR    = schema.GroupVersionResource{Group: "kaito.sh", Version: "v1alpha1", Resource: "inferencesets"}
	soGVR        = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}
)

type env struct {
	t       *testing.T
	dir     string
	tools   string
	bins    string
	cp      *controlPlane
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	ctx     context.Context
	keda    *proc
	kedaMet string // the operator's metrics URL
	// kedaAdapter serves external.metrics.k8s.io: the HPA's path to pulse.
	kedaAdapter *proc
	agg         *proc
	aggArgs     []string
	aggHTTP     string
	scaler      string
	agent       *proc
	// clientTLS is a KEDA-like client's side of the scaler port's mutual TLS.
	clientTLS *tls.Config
	// agentTokenFile is the token of the agent's pod on gpu-node-1.
	agentTokenFile string
	// extra are other processes a case started (their logs are dumped on
	// failure).
	extra []*proc
	// kedaWrap, when set, wraps the KEDA operator's command (the real-node
	// test runs it where it resolves the cluster's Service names).
	kedaWrap func(bin string, args []string) (string, []string)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newEnv is the e2e's environment: the tools and binaries make e2e
// built, a control plane (started, or PULSE_E2E_KUBECONFIG's), connected.
func newEnv(t *testing.T) *env {
	tools, bins := os.Getenv("PULSE_E2E_TOOLS"), os.Getenv("PULSE_E2E_BIN")
	if tools == "" || bins == "" {
		t.Fatal("PULSE_E2E_TOOLS and PULSE_E2E_BIN must be set: run `make e2e`")
	}
	e := &env{t: t, dir: t.TempDir(), tools: tools, bins: bins, ctx: context.Background()}
	if d := os.Getenv("PULSE_E2E_LOGS"); d != "" {
		e.dir = d
		must(t, os.MkdirAll(d, 0o755))
	}
	t.Logf("logs in %s", e.dir)
	if kc := os.Getenv("PULSE_E2E_KUBECONFIG"); kc != "" {
		e.cp = useCluster(t, kc, e.dir)
	} else {
		e.cp = startControlPlane(t, tools, e.dir, cpOptions{})
	}
	e.connect()
	return e
}

func TestE2E(t *testing.T) {
	e := newEnv(t)
	defer func() {
		if t.Failed() {
			procs := append(append(e.cp.procs, e.keda, e.kedaAdapter, e.agg, e.agent), e.extra...)
			dumpLogs(t, procs...)
			summary(t, e.scaledObjectConditions(), procs...)
		}
	}()

	e.startKEDA()
	e.installCharts()
	e.installKaitoCRDs()

	// Simulated vLLM pods: two of Workspace llama (also of InferenceSet
	// llama-set) on gpu-node-1, one on gpu-node-2 that must never be scraped.
	sims := map[string]*countingSim{"llama-0": newSim(t), "llama-1": newSim(t), "elsewhere-0": newSim(t)}
	e.createNamespace(appNS)
	e.createNode(node)
	e.createNode(otherNode)
	e.createPod("llama-0", node, sims["llama-0"])
	e.createPod("llama-1", node, sims["llama-1"])
	e.createPod("elsewhere-0", otherNode, sims["elsewhere-0"])

	e.startAggregator()
	e.startAgent()
	waitFor(t, 60*time.Second, "the aggregator shows llama's two pods, fresh", func() error {
		return e.expectPods("llama", 2)
	})
	// The binary sets Go's GC percent from --gc-percent (50 by default),
	// unless GOGC is in its environment (inherited from this test's).
	wantGC := 50.0
	if v, err := strconv.Atoi(os.Getenv("GOGC")); err == nil {
		wantGC = float64(v)
	}
	if got := e.aggMetric("go_gc_gogc_percent", nil); got != wantGC {
		t.Errorf("the aggregator's go_gc_gogc_percent %v, want %v", got, wantGC)
	}
	// A token bound to a pod on another node cannot speak for this one.
	e.otherNodeTokenRefused()
	// The scaler port refuses a client without a certificate.
	if conn, err := grpc.NewClient(e.scaler, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		_, err := externalscaler.NewExternalScalerClient(conn).GetMetricSpec(e.ctx, &externalscaler.ScaledObjectRef{
			Name: "x", Namespace: appNS, ScalerMetadata: map[string]string{"workspace": "llama"}})
		conn.Close()
		if err == nil {
			t.Fatal("the scaler port answered a plaintext client")
		}
	}

	e.createWorkload(workspaceGVR, "llama", map[string]any{"inference": map[string]any{"replicas": int64(0)}})
	e.createWorkload(infSetGVR, "llama-set", map[string]any{"replicas": int64(0)})
	// KEDA polls this one every 5 minutes, longer than the test: every
	// activation it sees comes through StreamIsActive.
	e.createScaledObject("llama-so", "Workspace", "kaito.sh/v1beta1", "llama", 300, nil, nil)

	t.Run("push activation 0 to 1", func(t *testing.T) { e.pushActivation(t, sims) })
	t.Run("demand at zero: a request held at the router activates an empty Workspace", func(t *testing.T) { e.demandAtZero(t) })
	t.Run("cron and pulse together", func(t *testing.T) { e.cronAndPulse(t) })
	t.Run("KEDA's value is pulse's", func(t *testing.T) { e.sameValue(t, sims) })
	t.Run("aggregator killed and restarted", func(t *testing.T) { e.aggregatorRestart(t, sims) })
	t.Run("one annotation instead of a ScaledObject", func(t *testing.T) { e.provisioning(t) })
	t.Run("scale-up while new pods load does not run away", func(t *testing.T) { e.scaleUpWhileLoading(t) })
	t.Run("the planner: a load step, the HPA asks for the plan", func(t *testing.T) { e.plannerStep(t) })
	t.Run("a draining pod still Ready: the HPA asks for what pulse does", func(t *testing.T) { e.drainingPod(t) })
	t.Run("a step of load through pulse and through Prometheus", func(t *testing.T) { e.stepLatency(t) })
	if n := sims["elsewhere-0"].calls(); n != 0 {
		t.Fatalf("the pod on %s was scraped %d times", otherNode, n)
	}
}

// connect makes the admin's clients of the control plane.
func (e *env) connect() {
	var err error
	e.kube, err = kubernetes.NewForConfig(e.cp.admin)
	must(e.t, err)
	e.dyn, err = dynamic.NewForConfig(e.cp.admin)
	must(e.t, err)
}

// countingSim is a simulated vLLM server that counts its scrapes.
type countingSim struct {
	*vllmsim.Server
	port  string
	count *int64
}

func newSim(t *testing.T) *countingSim {
	s := vllmsim.New(vllmsim.Options{})
	var n int64
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			n++
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return &countingSim{Server: s, port: u.Port(), count: &n}
}

func (c *countingSim) calls() int64 { return *c.count }

func (c *countingSim) setWaiting(w float64) {
	c.SetLoad(vllmsim.Load{Waiting: &w, Running: vllmsim.F(1), KVCacheUsage: vllmsim.F(0.5)})
}

// scaledObjectConditions is a line for each ScaledObject whose Ready
// condition is not True (KEDA's reason and message: why it does not scale),
// for a failed run's summary.
func (e *env) scaledObjectConditions() []string {
	if e.dyn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	list, err := e.dyn.Resource(soGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"ScaledObjects: " + err.Error()}
	}
	var out []string
	for _, so := range list.Items {
		conds, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
		var parts []string
		ready := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			typ, _ := m["type"].(string)
			st, _ := m["status"].(string)
			msg, _ := m["message"].(string)
			ready = ready || (typ == "Ready" && st == "True")
			parts = append(parts, fmt.Sprintf("%s=%s (%s)", typ, st, msg))
		}
		if !ready {
			out = append(out, fmt.Sprintf("ScaledObject %s/%s not Ready: %s", so.GetNamespace(), so.GetName(), strings.Join(parts, "; ")))
		}
	}
	return out
}

func (e *env) startKEDA() {
	t := e.t
	crds, err := filepath.Glob(filepath.Join(e.tools, "..", "keda-crds", "*.yaml"))
	must(t, err)
	if len(crds) == 0 {
		t.Fatal("no KEDA CRDs next to the tools (run test/e2e/tools/build.sh)")
	}
	for _, f := range crds {
		e.applyYAMLFile(f)
	}
	for _, f := range crds {
		e.waitCRD(strings.TrimSuffix(strings.SplitN(filepath.Base(f), "_", 2)[1], ".yaml") + "." + strings.SplitN(filepath.Base(f), "_", 2)[0])
	}
	e.createNamespace("keda")
	certDir := filepath.Join(e.dir, "keda-certs")
	must(t, os.MkdirAll(certDir, 0o755))
	crt, key := e.cp.pki.issue(t, "keda", "keda-operator", nil, []string{"localhost", "keda-operator.keda.svc"}, nil, 0)
	for src, dst := range map[string]string{crt: "tls.crt", key: "tls.key", filepath.Join(e.cp.pki.dir, "ca.crt"): "ca.crt"} {
		b, err := os.ReadFile(src)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(certDir, dst), b, 0o600))
	}
	metPort, metricsServicePort := freePort(t), freePort(t)
	e.kedaMet = fmt.Sprintf("http://127.0.0.1:%d/metrics", metPort)
	bin, args := filepath.Join(e.tools, "keda-operator"), []string{"--leader-elect=false", "--cert-dir=" + certDir,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metPort),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", freePort(t)),
		fmt.Sprintf("--metrics-service-bind-address=127.0.0.1:%d", metricsServicePort),
		"--enable-webhook-patching=false", "--enable-apiservice-patching=false", "--zap-log-level=info"}
	if e.kedaWrap != nil {
		bin, args = e.kedaWrap(bin, args)
	}
	e.keda = start(t, e.dir, "keda-operator", []string{"KUBECONFIG=" + e.cp.kubeconfig, "WATCH_NAMESPACE=",
		"KEDA_CLUSTER_OBJECT_NAMESPACE=keda", "POD_NAMESPACE=keda", "OPERATOR_NAME=keda-operator"}, bin, args...)
	waitFor(t, 60*time.Second, "the KEDA operator serves metrics", func() error {
		if e.keda.cmd.ProcessState != nil {
			t.Fatalf("keda-operator exited:\n%s", e.keda.tail(40))
		}
		_, err := e.kedaMetrics()
		return err
	})
	if e.cp.local() {
		e.startKEDAAdapter(certDir, metricsServicePort)
	}
}

func (e *env) kedaMetrics() ([]byte, error) {
	resp, err := http.Get(e.kedaMet)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// applyYAMLFile creates every object of a YAML file.
func (e *env) applyYAMLFile(path string) {
	b, err := os.ReadFile(path)
	must(e.t, err)
	for _, doc := range strings.Split(string(b), "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var u unstructured.Unstructured
		must(e.t, yaml.Unmarshal([]byte(doc), &u.Object))
		if len(u.Object) == 0 {
			continue
		}
		gvr := crdGVR
		if u.GetKind() != "CustomResourceDefinition" {
			e.t.Fatalf("%s: only CRDs are applied from files, got %s", path, u.GetKind())
		}
		_, err := e.dyn.Resource(gvr).Create(e.ctx, &u, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			e.t.Fatalf("create %s: %v", u.GetName(), err)
		}
	}
}

func (e *env) waitCRD(name string) {
	waitFor(e.t, 30*time.Second, "CRD "+name+" established", func() error {
		u, err := e.dyn.Resource(crdGVR).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("not established")
	})
}

func (e *env) createNamespace(name string) {
	_, err := e.kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

// helm runs helm with the admin's kubeconfig.
func (e *env) helm(args ...string) string {
	cmd := exec.Command(filepath.Join(e.tools, "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cp.kubeconfig, "HELM_CACHE_HOME="+filepath.Join(e.dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(e.dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(e.dir, "helm-data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// noTokenSecrets: the aggregator's ServiceAccount may create Secrets (its
// managed certificates', in its namespace and KEDA's: RBAC cannot bound a
// create by name) and read them back by name. One of type
// service-account-token, made under such a name, the API server fills with
// a ServiceAccount's token (in KEDA's namespace, the operator's). The
// chart's admission policy refuses it such a Secret, and an ordinary one
// still passes.
func (e *env) noTokenSecrets() {
	t := e.t
	cfg := rest.CopyConfig(e.cp.admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":pulse-aggregator"}
	as, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	for _, n := range []string{ns, "keda"} {
		token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pulse-probe-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
			Type: corev1.SecretTypeServiceAccountToken}
		// The policy is enforced once the API server has loaded it: a
		// create let through meanwhile is deleted and tried again.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			_, err := as.CoreV1().Secrets(n).Create(e.ctx, token, metav1.CreateOptions{})
			if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
				if !strings.Contains(err.Error(), "no ServiceAccount token Secret") {
					t.Fatalf("%s: a token Secret refused, but not by the chart's policy: %v", n, err)
				}
				break
			}
			if err != nil {
				t.Fatalf("%s: creating a token Secret as the aggregator: %v", n, err)
			}
			must(t, e.kube.CoreV1().Secrets(n).Delete(e.ctx, token.Name, metav1.DeleteOptions{}))
			if time.Now().After(deadline) {
				t.Fatalf("%s: the aggregator's ServiceAccount still creates ServiceAccount token Secrets a minute after the chart's install", n)
			}
		}
		plain := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pulse-probe-plain"}}
		if _, err := as.CoreV1().Secrets(n).Create(e.ctx, plain, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: an ordinary Secret refused to the aggregator: %v", n, err)
		}
		must(t, e.kube.CoreV1().Secrets(n).Delete(e.ctx, plain.Name, metav1.DeleteOptions{}))
	}
	e.oneTriggerAuth(cfg)
	e.policiesTypeChecked()
}

// policiesTypeChecked: the controller manager's type checker finds nothing
// to warn of in the chart's admission policies' expressions, checked
// against the types of what they match (Secrets, KEDA's CRD). A warning is
// an expression the API server may fail to evaluate, and failurePolicy
// Fail makes that a refusal of every write it matches.
func (e *env) policiesTypeChecked() {
	t := e.t
	policies := e.kube.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=pulse-aggregator"}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		list, err := policies.List(e.ctx, sel)
		must(t, err)
		checked := 0
		for _, p := range list.Items {
			if p.Status.TypeChecking != nil && p.Status.ObservedGeneration == p.Generation {
				checked++
			}
		}
		if len(list.Items) == 2 && checked == 2 {
			for _, p := range list.Items {
				for _, w := range p.Status.TypeChecking.ExpressionWarnings {
					t.Errorf("admission policy %s: %s: %s", p.Name, w.FieldRef, w.Warning)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart's admission policies: %d found, %d type-checked a minute after the install; want 2 of 2", len(list.Items), checked)
		}
	}
}

// oneTriggerAuth: the aggregator's ServiceAccount may create
// ClusterTriggerAuthentications (RBAC cannot bound a create by name), and
// any tenant's ScaledObject may name one, its secrets read in KEDA's
// namespace. The chart's admission policy refuses it one of any name but
// its own, and its own reading any Secret but its own (pulse-creds, its
// refs to itself: admitted, then found to exist, or made; dry runs).
func (e *env) oneTriggerAuth(as *rest.Config) {
	t := e.t
	dyn, err := dynamic.NewForConfig(as)
	must(t, err)
	gvr := schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "clustertriggerauthentications"}
	ctas := dyn.Resource(gvr)
	cta := func(name string, secret ...string) *unstructured.Unstructured {
		refs := []any{}
		for _, s := range secret {
			refs = append(refs, map[string]any{"parameter": "tlsClientKey", "name": s, "key": "tls.key"})
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"secretTargetRef": refs}}}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		_, err := ctas.Create(e.ctx, cta("pulse-probe-other"), metav1.CreateOptions{})
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) {
			if !strings.Contains(err.Error(), "makes one ClusterTriggerAuthentication, pulse-creds") {
				t.Fatalf("a ClusterTriggerAuthentication of another name refused, but not by the chart's policy: %v", err)
			}
			break
		}
		if err != nil {
			t.Fatalf("creating a ClusterTriggerAuthentication of another name as the aggregator: %v", err)
		}
		must(t, e.dyn.Resource(gvr).Delete(e.ctx, "pulse-probe-other", metav1.DeleteOptions{}))
		if time.Now().After(deadline) {
			t.Fatal("the aggregator's ServiceAccount still creates ClusterTriggerAuthentications of any name a minute after the chart's install")
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := ctas.Create(e.ctx, cta("pulse-creds", "pulse-creds"), dry); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the aggregator's own ClusterTriggerAuthentication refused: %v", err)
	}
	_, err = ctas.Create(e.ctx, cta("pulse-creds", "pulse-creds", "keda-operator-token"), dry)
	if err == nil || !strings.Contains(err.Error(), "reads its own Secret, pulse-creds, alone") {
		t.Fatalf("the aggregator's ClusterTriggerAuthentication reading another Secret: %v, want it refused by the chart's policy", err)
	}
}

func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	must(t, err)
	return filepath.Join(wd, "..", "..")
}

func (e *env) installCharts() {
	t := e.t
	root := repoRoot(t)
	out := e.helm("install", "pulse-aggregator", filepath.Join(root, "deploy", "aggregator"), "--namespace", ns, "--create-namespace",
		"--set", "agentAuth.mode=tokenreview,ingest.tls.secretName=pulse-ingest-tls")
	if !strings.Contains(out, "scalerAddress: pulse-aggregator.pulse-system.svc.cluster.local:9090") {
		t.Fatalf("the aggregator chart's notes do not give the scalerAddress:\n%s", out)
	}
	e.helm("install", "pulse-agent", filepath.Join(root, "deploy", "daemonset"), "--namespace", ns,
		"--set", "aggregatorTLS.caSecretName=pulse-ingest-ca,auth.enabled=true")
	e.noTokenSecrets()

	// What the API server accepted.
	ds, err := e.kube.AppsV1().DaemonSets(ns).Get(e.ctx, "pulse-agent", metav1.GetOptions{})
	must(t, err)
	spec := ds.Spec.Template.Spec
	if spec.NodeSelector["nvidia.com/gpu.present"] != "true" || len(spec.Tolerations) == 0 || spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("DaemonSet scheduling: %v %v", spec.NodeSelector, spec.Tolerations)
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
		len(c.SecurityContext.Capabilities.Drop) != 1 || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("DaemonSet container: %+v", c)
	}
	if v := spec.Volumes[0]; v.HostPath == nil || v.HostPath.Path != "/var/lib/kubelet/pod-resources" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("pod-resources volume: %+v %+v", spec.Volumes, c.VolumeMounts)
	}
	dep, err := e.kube.AppsV1().Deployments(ns).Get(e.ctx, "pulse-aggregator", metav1.GetOptions{})
	must(t, err)
	// The chart probes /readyz and /livez with an exec of the binary's
	// probe of the health port on the pod's loopback (not the ingest port:
	// TLS, and its connections bounded; not a port other pods reach, whose
	// connections could fill its bounds).
	if rp := dep.Spec.Template.Spec.Containers[0].ReadinessProbe; *dep.Spec.Replicas != 2 || rp.Exec == nil ||
		!slices.Equal(rp.Exec.Command, []string{"/pulse-aggregator", "probe", "http://127.0.0.1:8081/readyz"}) {
		t.Errorf("aggregator Deployment: replicas %d, readiness %+v", *dep.Spec.Replicas, rp)
	}
	if svc, err := e.kube.CoreV1().Services(ns).Get(e.ctx, "pulse-aggregator-ingest", metav1.GetOptions{}); err != nil || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("the ingest Service must publish warming (not ready) replicas: %v", err)
	}
	svc, err := e.kube.CoreV1().Services(ns).Get(e.ctx, "pulse-aggregator", metav1.GetOptions{})
	must(t, err)
	if svc.Spec.Ports[0].Port != 9090 {
		t.Errorf("scaler Service ports %+v", svc.Spec.Ports)
	}
	headless, err := e.kube.CoreV1().Services(ns).Get(e.ctx, "pulse-aggregator-ingest", metav1.GetOptions{})
	must(t, err)
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("ingest Service is not headless: %q", headless.Spec.ClusterIP)
	}
	_, err = e.kube.PolicyV1().PodDisruptionBudgets(ns).Get(e.ctx, "pulse-aggregator", metav1.GetOptions{})
	must(t, err)
	// Secure by default: only KEDA, the agents and the http port's clients
	// reach the aggregator's pods (the probes' port is on the pod's
	// loopback).
	np, err := e.kube.NetworkingV1().NetworkPolicies(ns).Get(e.ctx, "pulse-aggregator", metav1.GetOptions{})
	must(t, err)
	if len(np.Spec.Ingress) != 3 || np.Spec.Ingress[0].Ports[0].Port.String() != "scaler" || np.Spec.Ingress[1].Ports[0].Port.String() != "ingest" ||
		np.Spec.Ingress[2].Ports[0].Port.String() != "http" {
		t.Errorf("aggregator NetworkPolicy ingress %+v", np.Spec.Ingress)
	}
	for _, name := range []string{"pulse-agent", "pulse-aggregator"} {
		_, err := e.kube.RbacV1().ClusterRoles().Get(e.ctx, name, metav1.GetOptions{})
		must(t, err)
		_, err = e.kube.RbacV1().ClusterRoleBindings().Get(e.ctx, name, metav1.GetOptions{})
		must(t, err)
		_, err = e.kube.CoreV1().ServiceAccounts(ns).Get(e.ctx, name, metav1.GetOptions{})
		must(t, err)
	}
}

// tokenKubeconfig writes a kubeconfig that authenticates as a chart's
// ServiceAccount (TokenRequest), so that the chart's RBAC is what is used.
func (e *env) tokenKubeconfig(sa string) string {
	tr, err := e.kube.CoreV1().ServiceAccounts(ns).CreateToken(e.ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	must(e.t, err)
	path := filepath.Join(e.dir, sa+".kubeconfig")
	e.cp.writeKubeconfig(e.t, path, &clientcmdapi.AuthInfo{Token: tr.Status.Token})
	return path
}

func ptr[T any](v T) *T { return &v }

func (e *env) installKaitoCRDs() {
	crd := func(name, group, kind, plural, version, specPath, statusPath, selectorPath string) {
		scale := map[string]any{"specReplicasPath": specPath, "statusReplicasPath": statusPath}
		if selectorPath != "" {
			// The HPA (1 to N) needs the target's /scale to carry a selector.
			scale["labelSelectorPath"] = selectorPath
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{
				"group": group, "scope": "Namespaced",
				"names": map[string]any{"kind": kind, "listKind": kind + "List", "plural": plural, "singular": strings.ToLower(kind)},
				"versions": []any{map[string]any{
					"name": version, "served": true, "storage": true,
					"schema":       map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
					"subresources": map[string]any{"status": map[string]any{}, "scale": scale},
				}},
			},
		}}
		_, err := e.dyn.Resource(crdGVR).Create(e.ctx, u, metav1.CreateOptions{})
		must(e.t, err)
		e.waitCRD(name)
	}
	// As Kaito declares them: the Workspace's scale subresource has no
	// selector (KEDA scales it 0 <-> 1), the InferenceSet's has
	// .status.selector (kubebuilder selectorpath), so the HPA can scale it.
	crd("workspaces.kaito.sh", "kaito.sh", "Workspace", "workspaces", "v1beta1", ".spec.inference.replicas", ".status.inference.replicas", "")
	crd("inferencesets.kaito.sh", "kaito.sh", "InferenceSet", "inferencesets", "v1alpha1", ".spec.replicas", ".status.replicas", ".status.selector")
}

// createNode registers a node object (no kubelet behind it), so that pods
// bound to it are not orphans.
func (e *env) createNode(name string) {
	_, err := e.kube.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

// createPod makes a Kaito inference pod object of Workspace llama (and
// InferenceSet llama-set) on nodeName, Running and Ready at 127.0.0.1, its
// page on the sim's port. No kubelet runs: the test sets the status.
func (e *env) createPod(name, nodeName string, sim *countingSim) {
	t := e.t
	waitFor(t, 30*time.Second, "default ServiceAccount of "+appNS, func() error {
		_, err := e.kube.CoreV1().ServiceAccounts(appNS).Get(e.ctx, "default", metav1.GetOptions{})
		return err
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS,
			Labels:      map[string]string{"kaito.sh/workspace": "llama", "inferenceset.kaito.sh/created-by": "llama-set"},
			Annotations: map[string]string{"pulse.io/port": sim.port}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	e.runReady(pod)
	sim.setWaiting(0)
}

// runReady creates pod and sets its status as a kubelet would: Running and
// Ready at 127.0.0.1 (no kubelet runs).
func (e *env) runReady(pod *corev1.Pod) {
	created, err := e.kube.CoreV1().Pods(appNS).Create(e.ctx, pod, metav1.CreateOptions{})
	must(e.t, err)
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
	_, err = e.kube.CoreV1().Pods(appNS).UpdateStatus(e.ctx, created, metav1.UpdateOptions{})
	must(e.t, err)
}

// waitValue waits until pulse serves want for the trigger metadata md of
// the ScaledObject so.
func (e *env) waitValue(t *testing.T, what string, md map[string]string, so string, want float64) {
	waitFor(t, 60*time.Second, what, func() error {
		v, err := e.pulseValue(md, so)
		if err != nil {
			return err
		}
		if v != want {
			return fmt.Errorf("value %v, want %v", v, want)
		}
		return nil
	})
}

func (e *env) startAggregator() {
	t := e.t
	if e.aggArgs == nil {
		scaler, ingest, httpPort := freePort(t), freePort(t), freePort(t)
		e.scaler = fmt.Sprintf("127.0.0.1:%d", scaler)
		e.aggHTTP = fmt.Sprintf("127.0.0.1:%d", httpPort)
		srvCrt, srvKey := e.cp.pki.issue(t, "scaler", "pulse-aggregator", nil, []string{"localhost"},
			[]net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
		e.aggArgs = []string{"--scaler-addr=" + e.scaler, fmt.Sprintf("--ingest-addr=127.0.0.1:%d", ingest),
			"--http-addr=" + e.aggHTTP, "--resolve-scale-targets", "--kubeconfig=" + e.tokenKubeconfig("pulse-aggregator"),
			// The scaler port: mutual TLS with certificates the aggregator
			// makes itself, and KEDA's ClusterTriggerAuthentication pulse-creds.
			"--manage-certs", "--namespace=" + ns, "--cert-ip=127.0.0.1", "--cert-dns-name=localhost",
			// Agents come over TLS with a pod-bound token (the chart's
			// agentAuth.mode=tokenreview and its RBAC).
			"--ingest-tls-cert-file=" + srvCrt, "--ingest-tls-key-file=" + srvKey,
			"--agent-auth=tokenreview", "--agent-service-account=" + ns + "/pulse-agent",
			// The warm-up ends when the one agent has reported.
			"--expected-agents=1", "--log-format=text"}
		e.aggArgs = append(e.aggArgs, provisionArgs(e.scaler)...)
	}
	e.agg = start(t, e.dir, "pulse-aggregator", nil, filepath.Join(e.bins, "pulse-aggregator"), e.aggArgs...)
	if e.clientTLS == nil {
		e.kedaCredentials()
	}
	waitFor(t, 30*time.Second, "aggregator listening", func() error {
		resp, err := http.Get("http://" + e.aggHTTP + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
}

func (e *env) ingestAddr() string {
	for _, a := range e.aggArgs {
		if v, ok := strings.CutPrefix(a, "--ingest-addr="); ok {
			return v
		}
	}
	return ""
}

// agentToken writes a token of the agent's ServiceAccount for audience
// pulse, bound to a pod of the agent on nodeName (as the kubelet projects it).
func (e *env) agentToken(nodeName string) string {
	t := e.t
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pulse-agent-" + nodeName, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: nodeName, ServiceAccountName: "pulse-agent", AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{Name: "agent", Image: "pulse-agent"}}}}
	created, err := e.kube.CoreV1().Pods(ns).Create(e.ctx, pod, metav1.CreateOptions{})
	must(t, err)
	tr, err := e.kube.CoreV1().ServiceAccounts(ns).CreateToken(e.ctx, "pulse-agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"pulse"}, ExpirationSeconds: ptr(int64(3600)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: created.Name, UID: created.UID}}},
		metav1.CreateOptions{})
	must(t, err)
	path := filepath.Join(e.dir, "agent-token-"+nodeName)
	must(t, os.WriteFile(path, []byte(tr.Status.Token), 0o600))
	return path
}

func (e *env) agentTokenPath() string {
	if e.agentTokenFile == "" {
		e.agentTokenFile = e.agentToken(node)
	}
	return e.agentTokenFile
}

func (e *env) startAgent() {
	e.agent = start(e.t, e.dir, "pulse-agent", nil, filepath.Join(e.bins, "pulse-agent"),
		"--aggregator-ca-file="+filepath.Join(e.cp.pki.dir, "ca.crt"), "--token-file="+e.agentTokenPath(),
		"--kubeconfig="+e.tokenKubeconfig("pulse-agent"), "--node-name="+node, "--aggregator="+e.ingestAddr(),
		"--scrape-interval=500ms", "--reconnect-max-backoff=1s", fmt.Sprintf("--http-addr=127.0.0.1:%d", freePort(e.t)),
		"--nvml=auto", "--pod-resources-socket="+filepath.Join(e.dir, "no-kubelet.sock"), "--log-format=text")
}

// otherNodeTokenRefused: a token bound to a pod on gpu-node-2 cannot open
// a stream for gpu-node-1, and gpu-node-1's token cannot report a pod that
// the API places on gpu-node-2 (rejected and counted).
func (e *env) otherNodeTokenRefused() {
	t := e.t
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.cp.pki.caPEM)
	conn, err := grpc.NewClient(e.ingestAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, MinVersion: tls.VersionTLS12})))
	must(t, err)
	defer conn.Close()
	open := func(tokenFile string) grpc.BidiStreamingClient[pulsev1.AgentMessage, pulsev1.AggregatorMessage] {
		token, err := os.ReadFile(tokenFile)
		must(t, err)
		ctx := metadata.AppendToOutgoingContext(e.ctx, "authorization", "Bearer "+string(token))
		stream, err := pulsev1.NewIngestClient(conn).Report(ctx)
		must(t, err)
		must(t, stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Hello{Hello: &pulsev1.Hello{
			Node: node, ProtocolVersion: pulsev1.ProtocolVersion_PROTOCOL_VERSION_1}}}))
		return stream
	}
	if _, err := open(e.agentToken(otherNode)).Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a gpu-node-2 token speaking for gpu-node-1: %v, want PermissionDenied", err)
	}
	// The pod that token is bound to stands for an agent on gpu-node-2,
	// which runs none: it goes, or gpu-node-2 would be a node whose agent
	// is lost, and its pod elsewhere-0 a replica the aggregator holds
	// unseen (docs/planner.md, rule 8).
	must(t, e.kube.CoreV1().Pods(ns).Delete(e.ctx, "pulse-agent-"+otherNode, metav1.DeleteOptions{}))

	before := e.rejected("other_node")
	stream := open(e.agentTokenPath())
	if _, err := stream.Recv(); err != nil { // the welcome
		t.Fatal(err)
	}
	// An upsert (a full catalogue from this node would replace the real
	// agent's list, which this stream, being node-1's, may do).
	other, err := e.kube.CoreV1().Pods(appNS).Get(e.ctx, "elsewhere-0", metav1.GetOptions{})
	must(t, err)
	must(t, stream.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{Full: false,
		Upsert: []*pulsev1.Pod{{Id: 1, Uid: string(other.UID), Namespace: appNS, Name: other.Name, Ready: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}}}}}))
	waitFor(t, 30*time.Second, "the gpu-node-2 pod rejected and counted", func() error {
		if got := e.rejected("other_node"); got <= before {
			return fmt.Errorf("rejected other_node %v, before %v", got, before)
		}
		return e.expectPods("llama", 2) // and not listed
	})
	_ = stream.CloseSend()
}

// rejected reads pulse_aggregator_rejected_reports_total{reason}.
func (e *env) rejected(reason string) float64 {
	return e.aggMetric("pulse_aggregator_rejected_reports_total", map[string]string{"reason": reason})
}

// aggMetric reads one series of the aggregator's /metrics (0 when it
// cannot be read).
func (e *env) aggMetric(name string, labels map[string]string) float64 {
	resp, err := http.Get("http://" + e.aggHTTP + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	v, _ := scanMetric(page, name, labels)
	return v
}

// expectPods checks that the aggregator shows n fresh pods of a workload and
// no pod of another node.
func (e *env) expectPods(workload string, n int) error {
	resp, err := http.Get("http://" + e.aggHTTP + "/debug/workloads/" + appNS + "/" + workload + "?format=table")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fresh := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] != "=" && f[3] == "fresh" {
			fresh++
		}
	}
	if fresh != n {
		return fmt.Errorf("%d fresh pods, want %d:\n%s", fresh, n, b)
	}
	if strings.Contains(string(b), "elsewhere") {
		return fmt.Errorf("a pod of another node is listed:\n%s", b)
	}
	return nil
}

func (e *env) createWorkload(gvr schema.GroupVersionResource, name string, spec map[string]any) {
	kind := map[string]string{"workspaces": "Workspace", "inferencesets": "InferenceSet"}[gvr.Resource]
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": appNS}, "spec": spec}}
	_, err := e.dyn.Resource(gvr).Namespace(appNS).Create(e.ctx, u, metav1.CreateOptions{})
	must(e.t, err)
}

// replicas reads a workload's /scale subresource.
func (e *env) replicas(gvr schema.GroupVersionResource, name string) (int64, error) {
	u, err := e.dyn.Resource(gvr).Namespace(appNS).Get(e.ctx, name, metav1.GetOptions{}, "scale")
	if err != nil {
		return 0, err
	}
	r, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	return r, nil
}

// createScaledObject: a ScaledObject on a workload, with a pulse trigger
// (metadata md, which may omit the workload) and extra triggers.
func (e *env) createScaledObject(name, kind, apiVersion, target string, pollingInterval int64, md map[string]any, extra []any) {
	meta := map[string]any{"scalerAddress": e.scaler, "threshold": "10", "activationThreshold": "0", "window": "2s"}
	for k, v := range md {
		meta[k] = v
	}
	triggers := append([]any{map[string]any{"type": "external-push", "metadata": meta,
		"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}}, extra...)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
		"metadata": map[string]any{"name": name, "namespace": appNS},
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"apiVersion": apiVersion, "kind": kind, "name": target},
			"minReplicaCount": int64(0), "maxReplicaCount": int64(3),
			"pollingInterval": pollingInterval, "cooldownPeriod": int64(3),
			"triggers": triggers,
		}}}
	_, err := e.dyn.Resource(soGVR).Namespace(appNS).Create(e.ctx, u, metav1.CreateOptions{})
	must(e.t, err)
}

// scaleTo sets a workload's replicas through its /scale subresource.
func (e *env) scaleTo(gvr schema.GroupVersionResource, name string, replicas int64) {
	waitFor(e.t, 10*time.Second, "scale "+name, func() error {
		sc, err := e.dyn.Resource(gvr).Namespace(appNS).Get(e.ctx, name, metav1.GetOptions{}, "scale")
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedField(sc.Object, replicas, "spec", "replicas"); err != nil {
			return err
		}
		_, err = e.dyn.Resource(gvr).Namespace(appNS).Update(e.ctx, sc, metav1.UpdateOptions{}, "scale")
		return err
	})
}

// activate takes llama to 0 replicas, raises a queue and returns the time
// until KEDA has scaled llama to 1. KEDA polls llama-so only every 5
// minutes: the scale-up comes through StreamIsActive.
func (e *env) activate(t *testing.T, sim *countingSim, waiting float64) time.Duration {
	sim.setWaiting(0)
	e.scaleTo(workspaceGVR, "llama", 0)
	// Wait until pulse's value over the trigger's window is 0: the stream
	// has then said false (which KEDA ignores), so the rise is a change.
	md := map[string]string{"threshold": "10", "activationThreshold": "0", "window": "2s"}
	waitFor(t, 30*time.Second, "llama inactive", func() error {
		v, err := e.pulseValue(md, "llama-so")
		if err != nil {
			return err
		}
		if v != 0 {
			return fmt.Errorf("value %v", v)
		}
		return nil
	})
	// The change lands at a random point of the agent's scrape interval
	// (500 ms here), as a real load change does.
	time.Sleep(500*time.Millisecond + rand.N(500*time.Millisecond))
	start := time.Now()
	sim.setWaiting(waiting)
	waitFor(t, 60*time.Second, "KEDA scales llama 0 → 1", func() error {
		r, err := e.replicas(workspaceGVR, "llama")
		if err != nil {
			return err
		}
		if r != 1 {
			return fmt.Errorf("replicas %d", r)
		}
		return nil
	})
	d := time.Since(start)
	sim.setWaiting(0)
	return d
}

// pushActivation measures the time from a load change to the Workspace's
// /scale update, over several runs.
func (e *env) pushActivation(t *testing.T, sims map[string]*countingSim) {
	var lat []time.Duration
	for run := range 5 {
		lat = append(lat, e.activate(t, sims["llama-0"], 4))
		t.Logf("run %d: load change → /scale update in %s", run+1, lat[len(lat)-1].Round(time.Millisecond))
	}
	sorted := slices.Clone(lat)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	report := fmt.Sprintf("push activation (load change → Workspace /scale at 1), %d runs: median %s, max %s, all %v",
		len(lat), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), lat)
	t.Log(report)
	if p := os.Getenv("PULSE_E2E_REPORT"); p != "" {
		_ = os.WriteFile(p, []byte(report+"\n"), 0o644)
	}
}

// kedaCredentials waits for what the aggregator ensures for KEDA — a Secret
// with KEDA's client pair in KEDA's namespace and the ClusterTriggerAuthentication
// pulse-creds mapping it to caCert, tlsClientCert and tlsClientKey — and
// makes the test's own KEDA-like client from the same Secret.
func (e *env) kedaCredentials() {
	t := e.t
	var sec *corev1.Secret
	waitFor(t, 60*time.Second, "the aggregator's managed KEDA credentials", func() error {
		var err error
		if sec, err = e.kube.CoreV1().Secrets("keda").Get(e.ctx, "pulse-creds", metav1.GetOptions{}); err != nil {
			return err
		}
		cta, err := e.dyn.Resource(schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "clustertriggerauthentications"}).
			Get(e.ctx, "pulse-creds", metav1.GetOptions{})
		if err != nil {
			return err
		}
		refs, _, _ := unstructured.NestedSlice(cta.Object, "spec", "secretTargetRef")
		if len(refs) != 3 {
			return fmt.Errorf("secretTargetRef %v", refs)
		}
		return nil
	})
	pair, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	must(t, err)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(sec.Data["ca.crt"])
	e.clientTLS = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// pulseValue asks the aggregator what KEDA would get, over mutual TLS.
func (e *env) pulseValue(md map[string]string, soName string) (float64, error) {
	conn, err := grpc.NewClient(e.scaler, grpc.WithTransportCredentials(credentials.NewTLS(e.clientTLS)))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	resp, err := externalscaler.NewExternalScalerClient(conn).GetMetrics(e.ctx, &externalscaler.GetMetricsRequest{
		ScaledObjectRef: &externalscaler.ScaledObjectRef{Name: soName, Namespace: appNS, ScalerMetadata: md}, MetricName: "x"})
	if err != nil {
		return 0, err
	}
	return resp.MetricValues[0].MetricValueFloat, nil
}

// sameValue: KEDA's own keda_scaler_metrics_value for the trigger equals
// the value pulse serves.
func (e *env) sameValue(t *testing.T, sims map[string]*countingSim) {
	sims["llama-0"].setWaiting(7)
	sims["llama-1"].setWaiting(5)
	md := map[string]string{"inferenceSet": "llama-set", "threshold": "10", "activationThreshold": "0", "window": "2s"}
	waitFor(t, 60*time.Second, "KEDA reports pulse's value", func() error {
		want, err := e.pulseValue(md, "llama-set-so")
		if err != nil {
			return err
		}
		if want != 12 {
			return fmt.Errorf("pulse serves %v, want 12 (7 + 5 waiting)", want)
		}
		page, err := e.kedaMetrics()
		if err != nil {
			return err
		}
		got, ok := scanMetric(page, "keda_scaler_metrics_value", map[string]string{"scaledObject": "llama-set-so", "triggerIndex": "0"})
		if !ok || math.Abs(got-want) > 0.001 {
			return fmt.Errorf("keda_scaler_metrics_value = %v (found %v), pulse %v", got, ok, want)
		}
		return nil
	})
	sims["llama-0"].setWaiting(0)
	sims["llama-1"].setWaiting(0)
}

// cronAndPulse: a ScaledObject with a cron trigger and pulse on the
// InferenceSet; both triggers report and the workload is scaled.
func (e *env) cronAndPulse(t *testing.T) {
	cron := map[string]any{"type": "cron", "metadata": map[string]any{
		"timezone": "Etc/UTC", "start": "0 0 * * *", "end": "59 23 * * *", "desiredReplicas": "2"}}
	e.createScaledObject("llama-set-so", "InferenceSet", "kaito.sh/v1alpha1", "llama-set", 2,
		map[string]any{"inferenceSet": "llama-set"}, []any{cron})
	waitFor(t, 90*time.Second, "both triggers report to KEDA and the InferenceSet is scaled up", func() error {
		page, err := e.kedaMetrics()
		if err != nil {
			return err
		}
		for _, idx := range []string{"0", "1"} {
			if _, ok := scanMetric(page, "keda_scaler_metrics_value", map[string]string{"scaledObject": "llama-set-so", "triggerIndex": idx}); !ok {
				return fmt.Errorf("no keda_scaler_metrics_value for trigger %s", idx)
			}
		}
		r, err := e.replicas(infSetGVR, "llama-set")
		if err != nil {
			return err
		}
		if r < 1 {
			return fmt.Errorf("InferenceSet replicas %d", r)
		}
		return nil
	})
}

// aggregatorRestart: KEDA reports the scaler's error while the aggregator
// is down, and recovers when it comes back, fed again by the same agent.
func (e *env) aggregatorRestart(t *testing.T, sims map[string]*countingSim) {
	// KEDA counts a failed GetMetricSpec as a ScaledObject error and a
	// failed GetMetrics as a scaler error: either says pulse is down.
	errorsNow := func() (float64, error) {
		page, err := e.kedaMetrics()
		if err != nil {
			return 0, err
		}
		so, _ := scanMetric(page, "keda_scaled_object_errors_total", map[string]string{"scaledObject": "llama-set-so"})
		sc, _ := scanMetric(page, "keda_scaler_detail_errors_total", map[string]string{"scaledObject": "llama-set-so"})
		return so + sc, nil
	}
	// Read before the stop, or the rise is measured from a page not read
	// (it was taken as 0).
	var before float64
	waitFor(t, 30*time.Second, "KEDA's error counters read before the stop", func() error {
		var err error
		before, err = errorsNow()
		return err
	})
	e.agg.stop()
	waitFor(t, 60*time.Second, "KEDA reports the scaler error", func() error {
		now, err := errorsNow()
		if err != nil || now <= before {
			return fmt.Errorf("KEDA's error counters for llama-set-so: %v (%v), before %v", now, err, before)
		}
		return nil
	})
	e.startAggregator()
	waitFor(t, 60*time.Second, "the same agent feeds the new aggregator", func() error { return e.expectPods("llama", 2) })
	// KEDA recovers: its stream to the new aggregator pushes again.
	d := e.activate(t, sims["llama-1"], 3)
	t.Logf("after the restart: load change → /scale update in %s", d.Round(time.Millisecond))
	if e.agent.cmd.ProcessState != nil {
		t.Fatal("the agent exited")
	}
}
