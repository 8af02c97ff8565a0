package aggregator

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
)

// ownedAggregator is an aggregator with --owner-cluster-role on kube.
func ownedAggregator(t *testing.T, kube *fake.Clientset) *Aggregator {
	t.Helper()
	o := NewOptions()
	o.Serving.IngestAddr, o.Serving.ScalerAddr, o.Serving.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.Warmup.Duration = 0
	o.Kube.OwnerClusterRole = "pulse-aggregator"
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{Kube: kube})
	if err != nil {
		t.Fatalf("one 503 from the API server at start: %v (the process exits 1 and is restarted under CrashLoopBackOff)", err)
	}
	return a
}

// TestAnAPIBlipAtStartIsNoCrash: with --owner-cluster-role (the chart's
// default whenever it renders its ClusterRole) the aggregator read the
// ClusterRole once, before any listener served; one error of the API
// server there (a 503 during a control-plane upgrade, a 429, a timeout)
// ended the process, restarted under CrashLoopBackOff (up to 5 minutes
// between tries) where every other part that needs the API waits for it.
// Now it starts, serves, and reads the owner again until the API answers.
func TestAnAPIBlipAtStartIsNoCrash(t *testing.T) {
	defer func(lo, hi time.Duration) { ownerRetryFirst, ownerRetryLongest = lo, hi }(ownerRetryFirst, ownerRetryLongest)
	ownerRetryFirst, ownerRetryLongest = 10*time.Millisecond, 20*time.Millisecond
	kube := fake.NewClientset(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pulse-aggregator", UID: "cr-uid"}})
	var gets atomic.Int64
	kube.PrependReactor("get", "clusterroles", func(k8stesting.Action) (bool, runtime.Object, error) {
		if gets.Add(1) <= 2 { // the API server's first two answers: unavailable
			return true, nil, apierrors.NewServiceUnavailable("the server is currently unable to handle the request")
		}
		return false, nil, nil
	})
	a := ownedAggregator(t, kube)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + a.HTTPAddr() + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
		}
		if err == nil && resp.StatusCode == http.StatusOK && gets.Load() >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s on: ready %v, %d reads of the ClusterRole; want ready and the third read made", err == nil && resp.StatusCode == http.StatusOK, gets.Load())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if a.owner.UID != "cr-uid" || a.owner.Kind != "ClusterRole" {
		t.Fatalf("owner = %+v, want the ClusterRole's (uid cr-uid)", a.owner)
	}
}

// TestAMissingOwnerEndsTheProcess: a ClusterRole the API says is not
// there is the chart's mistake, not the API's: Run ends with it.
func TestAMissingOwnerEndsTheProcess(t *testing.T) {
	a := ownedAggregator(t, fake.NewClientset())
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "--owner-cluster-role pulse-aggregator") {
			t.Fatalf("Run = %v, want the missing ClusterRole named", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run went on 15 s with no owner ClusterRole")
	}
}

// TestTheOwnerNowIsTheClusterRoleAsItIs: the provisioner's Lease is given
// its owner when a replica makes it (ownerNow, read at each create). The
// owner read once at the start left a ClusterRole made again since
// (another UID) owning nothing new: the Lease made owned by the one gone
// was deleted by the garbage collector, made again by another replica,
// and so on. One being deleted, or gone, owns nothing made now.
func TestTheOwnerNowIsTheClusterRoleAsItIs(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pulse-aggregator", UID: "uid-1"}})
	a := ownedAggregator(t, kube)
	if err := a.resolveOwner(ctx); err != nil {
		t.Fatal(err)
	}
	roles := kube.RbacV1().ClusterRoles()
	if err := roles.Delete(ctx, "pulse-aggregator", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if o, err := a.ownerNow(ctx); err == nil {
		t.Errorf("the owner gone: %+v, want an error", o)
	}
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pulse-aggregator", UID: "uid-2"}}
	if _, err := roles.Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if o, err := a.ownerNow(ctx); err != nil || o.UID != "uid-2" || o.Kind != "ClusterRole" || o.Name != "pulse-aggregator" {
		t.Errorf("the owner made again: %+v, %v; want the ClusterRole of uid-2", o, err)
	}
	deleting := metav1.Now()
	cr.DeletionTimestamp, cr.Finalizers = &deleting, []string{metav1.FinalizerDeleteDependents}
	if _, err := roles.Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if o, err := a.ownerNow(ctx); err == nil || !strings.Contains(err.Error(), "being deleted") {
		t.Errorf("the owner being deleted: %+v, %v; want an error saying so", o, err)
	}
	if a.owner.UID != "uid-1" {
		t.Errorf("the owner read at the start: %+v, want it unchanged (the certificates read their own)", a.owner)
	}
	// The provisioner's election is given it.
	o := NewOptions()
	o.Kube.OwnerClusterRole, o.Certs.Namespace = "pulse-aggregator", "pulse-system"
	o.Provision.Enabled, o.Provision.ScalerAddress = true, "pulse-aggregator.pulse-system.svc:9090"
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := NewWithDeps(o, slog.New(slog.NewTextHandler(io.Discard, nil)), Deps{Kube: kube, Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		Metadata: metadatafake.NewSimpleMetadataClient(runtime.NewScheme())})
	if err != nil {
		t.Fatal(err)
	}
	*p.owner = *a.owner
	if p.election.Owner == nil {
		t.Fatal("the provisioner's election has no owner to read")
	}
	if _, err := p.election.Owner(ctx); err == nil || !strings.Contains(err.Error(), "being deleted") {
		t.Errorf("the election's owner, the ClusterRole being deleted: %v; want an error saying so", err)
	}
}
