//go:build e2e

package e2e

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The KEDA metrics adapter listens on an address of a bridge the test
// creates: the API server's aggregation layer reaches an APIService only at
// a Service endpoint, which may not be a loopback address, and test servers
// listen only on loopback or on what the test itself creates. Nothing is
// attached to the bridge; packets to its address are delivered locally.
const (
	adapterBridge = "pulse-e2e0"
	adapterIP     = "198.18.0.1" // RFC 2544 benchmarking range
)

var apiServiceGVR = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// adapterAddress creates the bridge and its address, removed when the test
// ends.
func (e *env) adapterAddress() {
	t := e.t
	_ = ipCmd("link", "del", adapterBridge) // left by a killed run
	if err := ipCmd("link", "add", adapterBridge, "type", "bridge"); err != nil {
		t.Fatalf("the KEDA metrics adapter needs an address the API server may use (run as root): %v", err)
	}
	t.Cleanup(func() {
		if err := ipCmd("link", "del", adapterBridge); err != nil {
			t.Errorf("remove the test's bridge: %v", err)
		}
	})
	must(t, ipCmd("addr", "add", adapterIP+"/32", "dev", adapterBridge))
	must(t, ipCmd("link", "set", adapterBridge, "up"))
}

// startKEDAAdapter runs KEDA's metrics adapter (keda-operator-metrics-apiserver)
// and registers it as v1beta1.external.metrics.k8s.io, as KEDA's chart does:
// the HPA controller asks it for pulse's values, and it asks the operator.
func (e *env) startKEDAAdapter(certDir string, metricsServicePort int) {
	t := e.t
	if e.kube == nil {
		t.Fatal("no client")
	}
	e.adapterAddress()
	const svc = "keda-operator-metrics-apiserver"
	crt, key := e.cp.pki.issue(t, "keda-adapter", svc, nil, []string{svc + ".keda.svc", svc + ".keda.svc.cluster.local"},
		[]net.IP{net.ParseIP(adapterIP)}, x509.ExtKeyUsageServerAuth)
	port := freePort(t)
	e.kedaAdapter = start(t, e.dir, "keda-adapter", []string{"KUBECONFIG=" + e.cp.kubeconfig, "WATCH_NAMESPACE=",
		"KEDA_CLUSTER_OBJECT_NAMESPACE=keda", "POD_NAMESPACE=keda"},
		filepath.Join(e.tools, "keda-adapter"),
		fmt.Sprintf("--secure-port=%d", port), "--bind-address="+adapterIP,
		"--cert-dir="+certDir, "--tls-cert-file="+crt, "--tls-private-key-file="+key,
		fmt.Sprintf("--metrics-service-address=localhost:%d", metricsServicePort),
		fmt.Sprintf("--port=%d", freePort(t)), "--lister-kubeconfig="+e.cp.kubeconfig,
		"--authentication-kubeconfig="+e.cp.kubeconfig, "--authorization-kubeconfig="+e.cp.kubeconfig,
		"--zap-log-level=info")

	_, err := e.kube.CoreV1().Services("keda").Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: "keda"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(int32(port))}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// No endpoints controller runs: the Service has no selector, its
	// endpoints are written here.
	_, err = e.kube.CoreV1().Endpoints("keda").Create(e.ctx, &corev1.Endpoints{ //nolint:staticcheck // SA1019: the kube-apiserver's aggregation layer routes by Endpoints
		ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: "keda"},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: adapterIP}}, //nolint:staticcheck // SA1019: as above
			Ports: []corev1.EndpointPort{{Name: "https", Port: int32(port)}}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = e.kube.DiscoveryV1().EndpointSlices("keda").Create(e.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: "keda", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{adapterIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(port))}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	api := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1beta1.external.metrics.k8s.io"},
		"spec": map[string]any{
			"group": "external.metrics.k8s.io", "version": "v1beta1",
			"service":              map[string]any{"namespace": "keda", "name": svc, "port": int64(443)},
			"caBundle":             base64.StdEncoding.EncodeToString(e.cp.pki.caPEM),
			"groupPriorityMinimum": int64(100), "versionPriority": int64(100),
		}}}
	if _, err := e.dyn.Resource(apiServiceGVR).Create(e.ctx, api, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "the KEDA metrics adapter is Available as external.metrics.k8s.io", func() error {
		if e.kedaAdapter.cmd.ProcessState != nil {
			t.Fatalf("keda-adapter exited:\n%s", e.kedaAdapter.tail(40))
		}
		u, err := e.dyn.Resource(apiServiceGVR).Get(e.ctx, "v1beta1.external.metrics.k8s.io", metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Available" {
				if m["status"] == "True" {
					return nil
				}
				return fmt.Errorf("Available=%v: %v", m["status"], m["message"])
			}
		}
		return fmt.Errorf("no Available condition yet")
	})
}
