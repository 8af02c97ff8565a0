package aggregator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/pulse-io/pulse/pkg/provision"
)

// TestProvisioningWired: with --provision-scaledobjects the aggregator
// takes the Lease, provisions for an annotated Deployment, and shows it on
// /debug/provisioning and /metrics.
func TestProvisioningWired(t *testing.T) {
	sch := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(sch); err != nil {
		t.Fatal(err)
	}
	meta := metadatafake.NewSimpleMetadataClient(sch, &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "demo", UID: "u1", Annotations: map[string]string{provision.AnnotationAutoscale: "true"}}})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{provision.ScaledObjects: "ScaledObjectList"})
	kube := kubefake.NewClientset()
	kube.Resources = []*metav1.APIResourceList{{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "deployments", Kind: "Deployment"}}}}

	a := startWith(t, func(o *Options) {
		o.Provision.Enabled, o.Provision.ScalerAddress, o.Certs.Namespace = true, "pulse-aggregator.pulse-system.svc:9090", "pulse-system"
	}, Deps{Kube: kube, Dynamic: dyn, Metadata: meta})
	var p provision.Provisioning
	waitUntil(t, "the Deployment provisioned", func() error {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/debug/provisioning")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		p = provision.Provisioning{}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			return err
		}
		if !p.Leading || len(p.Workloads) != 1 || p.Workloads[0].State != provision.StateProvisioned {
			return fmt.Errorf("%+v", p)
		}
		return nil
	})
	ctx := context.Background()
	if _, err := dyn.Resource(provision.ScaledObjects).Namespace("demo").Get(ctx, "llama", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	lease, err := kube.CoordinationV1().Leases("pulse-system").Get(ctx, "pulse-aggregator-provisioner", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != p.Identity {
		t.Fatalf("Lease %+v, %v; identity %s", lease, err, p.Identity)
	}
	resp, err := http.Get("http://" + a.HTTPAddr() + "/debug/provisioning?format=table")
	if err != nil {
		t.Fatal(err)
	}
	table, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(table), "leads and provisions") || !strings.Contains(string(table), "Deployment demo/llama  provisioned") {
		t.Errorf("table:\n%s", table)
	}
	resp, err = http.Get("http://" + a.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"pulse_provisioner_leader 1", `pulse_provisioner_changes_total{action="create"} 1`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func waitUntil(t *testing.T, what string, check func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = check(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

func TestProvisionOptions(t *testing.T) {
	o := NewOptions()
	o.Provision.Enabled, o.Certs.Namespace = true, ""
	o.Provision.RenewDeadline = time.Hour
	err := o.Validate()
	for _, want := range []string{"--provision-scaler-address", "--leader-elect-namespace", "--leader-elect-lease-duration"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to name %s", err, want)
		}
	}
}
