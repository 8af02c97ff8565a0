package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// kedaClient is what KEDA builds from the ClusterTriggerAuthentication's
// Secret: the CA, and the client pair.
func kedaClient(t *testing.T, client *fake.Clientset) *tls.Config {
	t.Helper()
	s, err := client.CoreV1().Secrets("keda").Get(context.Background(), "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(s.Data["ca.crt"])
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

func TestManagedCertificates(t *testing.T) {
	// The certificates are first made 21 days ago (of 30), so that "now"
	// is two thirds through their validity and they are valid for real TLS.
	m, client, dyn, clock := managed(t, 21*24*time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	theCredentialsArePutRight(ctx, t, m, dyn)

	addr := serveConfig(t, m.ServerConfig())
	keda := kedaClient(t, client)
	first, err := check(t, addr, keda)
	if err != nil {
		t.Fatalf("KEDA's client over the managed certificates: %v", err)
	}
	if _, err := check(t, addr, &tls.Config{RootCAs: keda.RootCAs, MinVersion: tls.VersionTLS12}); err == nil {
		t.Fatal("a client without a certificate was served")
	}

	// The ingest port: the same server certificate, no client certificate
	// asked; an agent trusts the CA published in the ConfigMap, which
	// holds the CA's certificate and nothing else.
	cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("CA ConfigMap: %v", err)
	}
	if len(cm.Data) != 1 || cm.Data["ca.crt"] == "" {
		t.Fatalf("CA ConfigMap holds %d keys: want ca.crt alone", len(cm.Data))
	}
	agentRoots := x509.NewCertPool()
	agentRoots.AppendCertsFromPEM([]byte(cm.Data["ca.crt"]))
	if _, err := check(t, serveConfig(t, m.ServerOnlyConfig()), &tls.Config{RootCAs: agentRoots, MinVersion: tls.VersionTLS12}); err != nil {
		t.Fatalf("an agent trusting the published CA, on the ingest port's config: %v", err)
	}

	// Two thirds through the validity: renewed, served on the next
	// handshake (taken from the informer's copy), no restart.
	clock.Add(21*24*time.Hour + time.Minute)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	keda = kedaClient(t, client)
	var second int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		second, err = check(t, addr, keda)
		if err == nil && second != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("renewed certificate not served: serial %d (first %d), %v", second, first, err)
		}
	}
	notReadyOnceExpired(ctx, t, m, client, clock)
}

// theCredentialsArePutRight: KEDA's ClusterTriggerAuthentication is made,
// and a ref edited to another Secret (as many refs as before) is put back
// at the next check: compared by their number, it stood. So is the spec
// whole: another way to credentials beside the refs stood.
func theCredentialsArePutRight(ctx context.Context, t *testing.T, m *Managed, dyn *dynamicfake.FakeDynamicClient) {
	t.Helper()
	// Made, with KEDA's credentials and ClusterTriggerAuthentication.
	var cta *unstructured.Unstructured
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if cta, err = dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ClusterTriggerAuthentication: %v", err)
		}
	}
	refs, _, _ := unstructured.NestedSlice(cta.Object, "spec", "secretTargetRef")
	if len(refs) != 3 || refs[0].(map[string]any)["parameter"] != "caCert" {
		t.Fatalf("secretTargetRef = %v", refs)
	}
	refs[0].(map[string]any)["name"] = "elsewhere"
	_ = unstructured.SetNestedSlice(cta.Object, refs, "spec", "secretTargetRef")
	_ = unstructured.SetNestedField(cta.Object, "azure-workload", "spec", "podIdentity", "provider")
	if _, err := dyn.Resource(ClusterTriggerAuthentications).Update(ctx, cta, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if cta, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if refs, _, _ = unstructured.NestedSlice(cta.Object, "spec", "secretTargetRef"); refs[0].(map[string]any)["name"] != "pulse-creds" {
		t.Fatalf("a ref naming another Secret after a check: %v", refs)
	} else if spec, _, _ := unstructured.NestedMap(cta.Object, "spec"); len(spec) != 1 {
		t.Fatalf("the spec after a check: %v, want its refs alone", spec)
	}
}

// notReadyOnceExpired: m's renewal failing (the Secret's updates refused)
// until the certificate served expires, m is not ready (it answers no
// handshake), as it said it was.
func notReadyOnceExpired(ctx context.Context, t *testing.T, m *Managed, client *fake.Clientset, clock *testClock) {
	t.Helper()
	if err := m.Ready(); err != nil {
		t.Fatalf("ready with a certificate served: %v", err)
	}
	client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("admission webhook denied the request")
	})
	clock.Add(31 * 24 * time.Hour)
	if err := m.Ensure(ctx); err == nil {
		t.Fatal("Ensure with the Secret's updates refused: no error")
	}
	if err := m.Ready(); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("ready with the certificate served expired: %v", err)
	}
}

// With an Owner, what Managed makes is owned by it; a Secret made before
// (without the owner) gets it added, its certificates kept.
func TestManagedOwner(t *testing.T) {
	ctx := context.Background()
	owner := &metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-aggregator", UID: "cr-uid"}
	client := fake.NewClientset(clusterRole("pulse-aggregator", "cr-uid"))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ClusterTriggerAuthentications: "ClusterTriggerAuthenticationList"})
	opts := ManagedOptions{Client: client, Dynamic: dyn, Namespace: "pulse-system", SecretName: "pulse-aggregator-certs",
		DNSNames: []string{"localhost"}, KEDANamespace: "keda", TriggerAuthName: "pulse-creds",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	// Made before the owner was known.
	if err := NewManaged(opts).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	before, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(before.OwnerReferences) != 0 {
		t.Fatalf("owner references without an Owner: %v", before.OwnerReferences)
	}
	opts.Owner = owner
	for range 2 { // the second pass changes nothing
		if err := NewManaged(opts).Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	owned := func(what string, refs []metav1.OwnerReference) {
		t.Helper()
		if len(refs) != 1 || refs[0] != *owner {
			t.Errorf("%s owner references %v, want [%v]", what, refs, *owner)
		}
	}
	after, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("certificate Secret", after.OwnerReferences)
	if string(after.Data[KeyCACert]) != string(before.Data[KeyCACert]) {
		t.Error("adding the owner replaced the CA")
	}
	kedaSecret, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("KEDA's Secret", kedaSecret.OwnerReferences)
	cta, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("ClusterTriggerAuthentication", cta.GetOwnerReferences())

	// Made with the owner from the start.
	client2 := fake.NewClientset(clusterRole("pulse-aggregator", "cr-uid"))
	dyn2 := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ClusterTriggerAuthentications: "ClusterTriggerAuthenticationList"})
	opts.Client, opts.Dynamic = client2, dyn2
	if err := NewManaged(opts).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := client2.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("new certificate Secret", s2.OwnerReferences)
	cta2, err := dyn2.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned("new ClusterTriggerAuthentication", cta2.GetOwnerReferences())
}

// agentRoots are the CAs the agents trust: the ConfigMap's bundle.
func agentRoots(t *testing.T, client *fake.Clientset) *x509.CertPool {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(context.Background(), "pulse-aggregator-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(cm.Data[KeyCACert]))
	return roots
}

// clusterRole is the ClusterRole name, of UID uid: an Owner.
func clusterRole(name, uid string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}}
}

// TestTheCAIsRolledOverWithoutACut: the CA and both pairs were replaced at
// once, and the server at once trusted and presented only the new CA's:
// KEDA and the agents, holding the old CA, were cut off until they read
// the new one. Now the next CA is made halfway through the current one's
// life and published beside it; two thirds through it signs the pairs, and
// the old CA stays trusted. KEDA's credentials and the agents' CA as they
// were before the switch still work after it.
func TestTheCAIsRolledOverWithoutACut(t *testing.T) {
	ctx := context.Background()
	m, client, clock, secret := rollover(t)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	first := secret()
	clock.Add(46 * 24 * time.Hour) // past halfway: the next CA, published
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	half := secret()
	if string(half[KeyCACert]) != string(first[KeyCACert]) || len(half[KeyNextCACert]) == 0 {
		t.Fatal("halfway: want the same CA and a next one")
	}
	kedaBefore := kedaClient(t, client)
	agentBefore := agentRoots(t, client)
	clock.Add(15 * 24 * time.Hour) // past two thirds: now, the next CA signs
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	after := secret()
	if string(after[KeyCACert]) != string(half[KeyNextCACert]) || string(after[KeyPrevCACert]) != string(first[KeyCACert]) {
		t.Fatal("two thirds through: want the next CA current and the old one previous")
	}
	addr := serveConfig(t, m.ServerConfig())
	if _, err := check(t, addr, kedaBefore); err != nil {
		t.Fatalf("KEDA's credentials of before the switch, after it: %v", err)
	}
	if _, err := check(t, addr, kedaClient(t, client)); err != nil {
		t.Fatalf("KEDA's credentials of after the switch: %v", err)
	}
	if _, err := check(t, serveConfig(t, m.ServerOnlyConfig()), &tls.Config{RootCAs: agentBefore, MinVersion: tls.VersionTLS12}); err != nil {
		t.Fatalf("an agent trusting the CAs published before the switch, after it: %v", err)
	}
}

// managed is a Managed of 30-day certificates (its CA lives 90 days: 45
// halfway, 60 two thirds) whose clock is back days back.
func managed(t *testing.T, back time.Duration) (*Managed, *fake.Clientset, *dynamicfake.FakeDynamicClient, *testClock) {
	t.Helper()
	client := fake.NewClientset()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ClusterTriggerAuthentications: "ClusterTriggerAuthenticationList"})
	clock := &testClock{t: time.Now().Add(-back)}
	m := NewManaged(ManagedOptions{Client: client, Dynamic: dyn, Namespace: "pulse-system", SecretName: "pulse-aggregator-certs",
		DNSNames: []string{"localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: 30 * 24 * time.Hour,
		KEDANamespace: "keda", TriggerAuthName: "pulse-creds", CAConfigMap: "pulse-aggregator-ca",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: clock.Now})
	return m, client, dyn, clock
}

// rollover is managed 61 days back, and a reader of its Secret.
func rollover(t *testing.T) (*Managed, *fake.Clientset, *testClock, func() map[string][]byte) {
	m, client, _, clock := managed(t, 61*24*time.Hour)
	secret := func() map[string][]byte {
		s, err := client.CoreV1().Secrets("pulse-system").Get(context.Background(), "pulse-aggregator-certs", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	return m, client, clock, secret
}

// edit changes the managed Secret's data as a hand edit would.
func edit(t *testing.T, client *fake.Clientset, change func(data map[string][]byte)) {
	t.Helper()
	secrets := client.CoreV1().Secrets("pulse-system")
	s, err := secrets.Get(context.Background(), "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	change(s.Data)
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nextPublished is rollover ensured, then again 46 days on: the next CA
// made and published.
func nextPublished(t *testing.T) (*Managed, *fake.Clientset, *testClock, func() map[string][]byte) {
	t.Helper()
	m, client, clock, secret := rollover(t)
	if err := m.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Add(46 * 24 * time.Hour)
	if err := m.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m, client, clock, secret
}

// TestAnUnreadableCAGivesWayToTheNext: a current CA whose key is lost once
// the next one is published is replaced by that one (it deleted both and
// made a new, unpublished CA), and a next CA whose key is lost is made
// again before the switch.
func TestAnUnreadableCAGivesWayToTheNext(t *testing.T) {
	ctx := context.Background()
	m, client, _, secret := nextPublished(t)
	half := secret()
	broken := func(key string) {
		edit(t, client, func(data map[string][]byte) { data[key] = []byte("lost") })
		if err := m.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}
	broken(KeyNextCAKey)
	remade := secret()
	if string(remade[KeyCACert]) != string(half[KeyCACert]) || len(remade[KeyNextCACert]) == 0 || string(remade[KeyNextCACert]) == string(half[KeyNextCACert]) {
		t.Fatal("a next CA whose key is lost: want the same CA and a next one made again")
	}
	broken(KeyCAKey)
	if got := secret(); string(got[KeyCACert]) != string(remade[KeyNextCACert]) {
		t.Fatal("a current CA whose key is lost: want the published next CA in its place")
	}
}

// ensured is a Managed whose Ensure has run, its client, and the Secret
// it made as the API has it.
func ensured(t *testing.T) (*Managed, *fake.Clientset, *corev1.Secret) {
	t.Helper()
	m, client, _, _ := managed(t, 0)
	ctx := context.Background()
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	sec, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m, client, sec
}

// TestAnOlderCopyDoesNotUndoANewerOne: a replica slow between reading the
// Secret and writing the CA ConfigMap and KEDA's credentials put the older
// bundle back over a newer replica's, for up to an hour. A write from a
// copy that is no longer the Secret's current version is left to the
// Ensure of the newer one.
func TestAnOlderCopyDoesNotUndoANewerOne(t *testing.T) {
	m, client, old := ensured(t)
	ctx := context.Background()
	secrets := client.CoreV1().Secrets("pulse-system")
	old.ResourceVersion = "1"
	newer := old.DeepCopy()
	newer.ResourceVersion = "2"
	if _, err := secrets.Update(ctx, newer, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The published copies as a newer replica left them.
	cms := client.CoreV1().ConfigMaps("pulse-system")
	cm, _ := cms.Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
	cm.Data[KeyCACert] = "the newer bundle"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	keda := client.CoreV1().Secrets("keda")
	ks, _ := keda.Get(ctx, "pulse-creds", metav1.GetOptions{})
	ks.Data["ca.crt"] = []byte("the newer bundle")
	if _, err := keda.Update(ctx, ks, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.ensureCA(ctx, old); !errors.Is(err, errStale) {
		t.Fatalf("ensureCA of an older copy: %v, want errStale", err)
	}
	if err := m.ensureKEDA(ctx, old); !errors.Is(err, errStale) {
		t.Fatalf("ensureKEDA of an older copy: %v, want errStale", err)
	}
	cm, _ = cms.Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
	ks, _ = keda.Get(ctx, "pulse-creds", metav1.GetOptions{})
	if cm.Data[KeyCACert] != "the newer bundle" || string(ks.Data["ca.crt"]) != "the newer bundle" {
		t.Fatal("an older copy of the Secret wrote its bundle over the newer one")
	}
	// Nor is it served: the watch loaded a newer pair (issued again) while
	// Ensure held the older copy, which it then loaded over it.
	if err := m.renew(newer); err != nil {
		t.Fatal(err)
	}
	newer.ResourceVersion = "3"
	if _, err := secrets.Update(ctx, newer, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.load(newer); err != nil {
		t.Fatal(err)
	}
	if err := m.publish(ctx, old); !errors.Is(err, errStale) {
		t.Fatalf("publish of an older copy: %v, want errStale (Run tries again)", err)
	}
	served := m.served.Load().ingest.Certificates[0].Certificate[0]
	if want, _ := parseCert(newer.Data[KeyServerCert]); !bytes.Equal(served, want.Raw) {
		t.Fatal("an older copy of the Secret was loaded over the newer pair the watch had loaded")
	}
}

// anotherWriterAtRead answers the n-th read of the managed Secret with
// another writer's version of it; it counts the reads.
func anotherWriterAtRead(client *fake.Clientset, n int32) *atomic.Int32 {
	var gets atomic.Int32
	client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != "pulse-aggregator-certs" || gets.Add(1) != n {
			return false, nil, nil
		}
		sec, err := client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, "pulse-system", "pulse-aggregator-certs")
		if err != nil {
			return true, nil, err
		}
		other := sec.(*corev1.Secret).DeepCopy()
		other.ResourceVersion = "written-by-another"
		return true, other, nil
	})
	return &gets
}

// TestACopyFoundStaleIsPublishedAgainSoon: a version of the Secret
// written by no replica (a label added by hand, the garbage collector's)
// between a replica's write and its publish left the copies (the CAs'
// bundle, KEDA's credentials) unpublished until the next check, an hour
// (a renewed CA among them). Run now tries again after copyGap.
func TestACopyFoundStaleIsPublishedAgainSoon(t *testing.T) {
	m, client, _, _ := managed(t, 0)
	// publish's check, after the Secret was made: another writer's
	// version stands.
	gets := anotherWriterAtRead(client, 2)
	ctx := running(t, m)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the CAs' bundle was not published after a copy found stale")
		}
	}
	if gets.Load() < 3 {
		t.Fatalf("%d reads of the Secret: want the stale check and another Ensure", gets.Load())
	}
}

// TestALostKeyIsIssuedAgain: a server key lost, or a client key garbled,
// made every Ensure fail (every 10 s, for ever) and the garbled key was
// copied to KEDA. Both pairs are now issued again, and serve.
func TestALostKeyIsIssuedAgain(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := managed(t, 0)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	edit(t, client, func(data map[string][]byte) {
		delete(data, KeyServerKey)
		data[KeyClientKey] = []byte("garbled")
	})
	if err := m.Ensure(ctx); err != nil {
		t.Fatalf("Ensure with the server key lost and the client key garbled: %v", err)
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaClient(t, client)); err != nil {
		t.Fatalf("KEDA against the aggregator after the keys were issued again: %v", err)
	}
}

// TestALoweredValidityLeavesNoCut: the next CA was made halfway through
// the current one's life, for three of the validity then configured, and
// took over at two thirds. With the validity lowered (90 days to 7: a CA
// of 270 days, its next made for 21 days at day 135), the next CA expired
// before it took over, was put in place all the same (every handshake
// failing), and was replaced at once by a CA never published. The next CA
// is now made half a validity before it takes over, and one that would
// expire before what it signs is made again: hour by hour over 200 days,
// the CA that signs is never expired, and was published before it signed.
func TestALoweredValidityLeavesNoCut(t *testing.T) {
	ctx := context.Background()
	m, client, _, clock := managed(t, 200*24*time.Hour)
	m.o.Validity = 90 * 24 * time.Hour
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	lowered := NewManaged(m.o)
	lowered.o.Validity = 7 * 24 * time.Hour
	published := func() string {
		cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[KeyCACert]
	}
	before, signing, switches := published(), "", 0
	for hour := 1; hour <= 200*24; hour++ {
		clock.Add(time.Hour)
		if err := lowered.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		s, ca := signingCA(t, client)
		if !clock.Now().Before(ca.NotAfter) {
			t.Fatalf("hour %d: the CA that signs expired at %s", hour, ca.NotAfter)
		}
		if string(s.Data[KeyCACert]) != signing {
			if signing != "" && !strings.Contains(before, string(s.Data[KeyCACert])) {
				t.Fatalf("hour %d: a CA signs that was not published before", hour)
			}
			signing = string(s.Data[KeyCACert])
			switches++
		}
		before = published()
	}
	if switches < 3 {
		t.Fatalf("%d CAs signed over 200 days at a 7-day validity, want the rollover to go on", switches)
	}
}

// TestAnExpiredNextCAIsNotPutInPlace: the next CA is made halfway through
// the current one's life (day 45 of 90 at a 30-day validity) for three
// validities (to day 136). An aggregator that is not running from day 50
// to day 141 (scaled to zero, a cluster stopped) finds at its start both
// CAs expired; nextFit measured the next one against the switch as it was
// due (day 60 plus a validity), not against now, so the expired next CA
// was put in place and signed the pairs: every handshake failed until the
// next check (up to an hour), and the replica said it was ready. A CA is
// made anew.
func TestAnExpiredNextCAIsNotPutInPlace(t *testing.T) {
	ctx := context.Background()
	m, client, _, clock := managed(t, 141*24*time.Hour)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(46 * 24 * time.Hour) // the next CA, published
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(95 * 24 * time.Hour) // back to now: both CAs expired
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ca := signingCA(t, client); !clock.Now().Before(ca.NotAfter) {
		t.Errorf("the CA that signs expired at %s (now %s)", ca.NotAfter.Format(time.DateOnly), clock.Now().Format(time.DateOnly))
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaClient(t, client)); err != nil {
		t.Errorf("KEDA after the start: %v (ready: %v)", err, m.Ready())
	}
}

// signingCA is the managed Secret and the CA that signs its pairs.
func signingCA(t *testing.T, client *fake.Clientset) (*corev1.Secret, *x509.Certificate) {
	t.Helper()
	s, err := client.CoreV1().Secrets("pulse-system").Get(context.Background(), "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := parseCert(s.Data[KeyCACert])
	if err != nil {
		t.Fatal(err)
	}
	return s, ca
}

// TestACAKeyNotItsCertificatesGivesWay: another CA's key in ca.key parsed,
// so it was kept, and every renewal failed (x509 refuses a key not its
// parent's) until the certificates expired and no replica was ready. It
// is now the CA's loss: the published next CA takes its place, and the CA
// whose key was lost stays trusted as the previous one, so that KEDA's
// credentials from before (its client certificate that CA's) still
// connect.
func TestACAKeyNotItsCertificatesGivesWay(t *testing.T) {
	ctx := context.Background()
	m, client, clock, secret := nextPublished(t)
	before := secret()
	oldKEDA := kedaClient(t, client)
	_, _, _, otherKey, err := issue(nil, nil, "another-ca", clock.Now(), time.Hour, true, 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	edit(t, client, func(data map[string][]byte) { data[KeyCAKey] = otherKey })
	if err := m.Ensure(ctx); err != nil {
		t.Fatalf("Ensure with another CA's key in ca.key: %v", err)
	}
	if got := secret(); string(got[KeyCACert]) != string(before[KeyNextCACert]) {
		t.Fatal("a CA key not its certificate's: want the published next CA in its place")
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), oldKEDA); err != nil {
		t.Fatalf("KEDA's credentials from before the key was lost: %v", err)
	}
	clock.Add(20 * 24 * time.Hour) // past the new leaves' two thirds
	if err := m.Ensure(ctx); err != nil {
		t.Fatalf("the next renewal: %v", err)
	}
}

// ensuredAfter is managed ensured, its Secret changed by change, and
// ensured again.
func ensuredAfter(t *testing.T, change func(data map[string][]byte)) (*Managed, *fake.Clientset) {
	t.Helper()
	m, client, _ := ensured(t)
	edit(t, client, change)
	if err := m.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m, client
}

// TestAKeyPastedIntoTheCACertificateIsNotPassedOn: the bundle given to the
// agents (the ConfigMap) and to KEDA is the CA certificates alone, each
// re-encoded from what parses: the raw entries were copied, and a key
// pasted after the CA certificate by hand was published with it.
func TestAKeyPastedIntoTheCACertificateIsNotPassedOn(t *testing.T) {
	ctx := context.Background()
	m, client := ensuredAfter(t, func(data map[string][]byte) {
		data[KeyCACert] = append(append([]byte(nil), data[KeyCACert]...), data[KeyCAKey]...)
	})
	cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for where, b := range map[string]string{"the agents' ConfigMap": cm.Data[KeyCACert], "KEDA's Secret": string(ks.Data["ca.crt"])} {
		if strings.Contains(b, "PRIVATE KEY") || !strings.Contains(b, "BEGIN CERTIFICATE") {
			t.Errorf("%s's CA bundle:\n%s\nwant certificates alone", where, b)
		}
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaClient(t, client)); err != nil {
		t.Fatalf("KEDA against the aggregator: %v", err)
	}
}

// TestAKeyPastedAfterAPairsCertificateIsNotPassedOn: the pairs copied out
// of the Secret (KEDA's client pair to its namespace, the relays' pair to
// theirs) hold their certificate and key alone. A CA key pasted after a
// pair's certificate by hand (tls.X509KeyPair passes over it, so the pair
// still read as sound) was copied on with it (found in a review,
// 2026-12-07).
func TestAKeyPastedAfterAPairsCertificateIsNotPassedOn(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := managed(t, 0)
	m.o.RelaySecretName = "pulse-relay-tls"
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	edit(t, client, func(data map[string][]byte) {
		data[KeyClientCert] = append(append([]byte(nil), data[KeyClientCert]...), data[KeyCAKey]...)
		data[KeyRelayCert] = append(append([]byte(nil), data[KeyRelayCert]...), data[KeyCAKey]...)
	})
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	ks, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-relay-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for where, b := range map[string][]byte{"KEDA's tls.crt": ks.Data["tls.crt"], "the relays' tls.crt": rs.Data["tls.crt"]} {
		if bytes.Contains(b, []byte("PRIVATE KEY")) || bytes.Count(b, []byte("BEGIN CERTIFICATE")) != 1 {
			t.Errorf("%s:\n%s\nwant one certificate alone", where, b)
		}
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaClient(t, client)); err != nil {
		t.Fatalf("KEDA against the aggregator: %v", err)
	}
	// A key of another form that tls.X509KeyPair reads (PKCS #8, as a
	// hand edit may write it) is copied as a key, not as nothing (a first
	// form of the copy read SEC1 alone, and KEDA's tls.key was empty while
	// the pair read as sound: found in a review of it).
	edit(t, client, func(data map[string][]byte) {
		k, err := parseKey(data[KeyClientKey])
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		data[KeyClientKey] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	})
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if ks, err = client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(ks.Data["tls.crt"], ks.Data["tls.key"]); err != nil {
		t.Errorf("KEDA's pair, its key PKCS #8 in the Secret: %v", err)
	}
}

// TestARolloutOfOtherNamesIssuesOnce: two replicas of other server names
// (a rollout that adds the ingest Service's names, or changes the cluster
// domain) share the Secret. The certificate issued for the new names keeps
// the old ones beside them while it is within two thirds of its life, so
// the old replica finds its names and issues nothing: each had re-issued
// with its own, and the two took turns every few seconds, half the time
// serving a certificate without the other's names. The renewal past two
// thirds names the configured ones alone.
func TestARolloutOfOtherNamesIssuesOnce(t *testing.T) {
	ctx := context.Background()
	old, client, dyn, clock := managed(t, 0)
	updates := secretUpdates(client)
	if err := old.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	o := old.o
	o.DNSNames = []string{"localhost", "pulse-aggregator.pulse-system.svc.cluster.local"}
	o.Dynamic = dyn
	next := NewManaged(o)
	for range 5 {
		for _, m := range []*Managed{next, old} {
			if err := m.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	sec, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCert(sec.Data[KeyServerCert])
	if err != nil || *updates != 1 || !covers(c, o.DNSNames, o.IPs) {
		t.Fatalf("after five rounds of both replicas: %d updates of the Secret, names %v (%v); want 1, naming both", *updates, c.DNSNames, err)
	}
	// Past two thirds the renewal names the new replica's alone.
	clock.Add(21*24*time.Hour + time.Minute)
	if err := next.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	sec, _ = client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if c, err = parseCert(sec.Data[KeyServerCert]); err != nil || len(c.DNSNames) != 2 || !covers(c, o.DNSNames, o.IPs) {
		t.Fatalf("renewed past two thirds: names %v (%v), want %v", c.DNSNames, err, o.DNSNames)
	}
}

// relaySecret reads the relays' Secret.
func relaySecret(t *testing.T, client *fake.Clientset) *corev1.Secret {
	t.Helper()
	s, err := client.CoreV1().Secrets("pulse-system").Get(context.Background(), "pulse-relay-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("relay secret: %v", err)
	}
	return s
}

// servesRelay serves s's pair and returns the serial a client trusting
// only s's ca.crt verifies for localhost.
func servesRelay(t *testing.T, s *corev1.Secret) int64 {
	t.Helper()
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("relay pair: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data[KeyCACert]) {
		t.Fatal("relay secret: no CA certificate")
	}
	addr := serveConfig(t, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}})
	serial, err := check(t, addr, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: "localhost"})
	if err != nil {
		t.Fatalf("an agent trusting the relay secret's CA, to the relay's pair: %v", err)
	}
	return serial
}

func TestTheRelaysPairIsKeptInASecretOfItsOwn(t *testing.T) {
	m, client, _, clock := managed(t, 21*24*time.Hour)
	m.o.RelaySecretName, m.o.RelayDNSNames = "pulse-relay-tls", []string{"localhost"}
	ctx := context.Background()
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	s := relaySecret(t, client)
	if s.Type != corev1.SecretTypeTLS || len(s.Data) != 3 {
		t.Fatalf("relay secret of type %q with %d keys: want kubernetes.io/tls with tls.crt, tls.key and ca.crt", s.Type, len(s.Data))
	}
	// The CA's key stays in the aggregator's Secret: the bundle is
	// certificates alone.
	if bytes.Contains(s.Data[KeyCACert], []byte("PRIVATE KEY")) || s.Data[KeyCAKey] != nil {
		t.Fatal("the relay secret holds a CA key")
	}
	cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
	if err != nil || cm.Data[KeyCACert] != string(s.Data[KeyCACert]) {
		t.Fatalf("the relay secret's ca.crt is not the bundle the agents trust (%v)", err)
	}
	first := servesRelay(t, s)

	// Renewed with the others, two thirds through.
	clock.Add(21*24*time.Hour + time.Minute)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if second := servesRelay(t, relaySecret(t, client)); second == first {
		t.Fatal("the relay's pair was not renewed with the others")
	}

	// A name more: issued again for it (the names it had kept beside it
	// until the renewal past two thirds: TestARolloutOfOtherNamesIssuesOnce).
	m.o.RelayDNSNames = []string{"pulse-relay.pulse-system.svc.cluster.local"}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := parseCert(relaySecret(t, client).Data[corev1.TLSCertKey])
	if err != nil || !slices.Contains(c.DNSNames, "pulse-relay.pulse-system.svc.cluster.local") {
		t.Fatalf("relay certificate after a change of names: %v (%v)", c.DNSNames, err)
	}
	// A garbled key in the relay secret (an edit by hand) is put right.
	s = relaySecret(t, client)
	s.Data[corev1.TLSPrivateKeyKey] = []byte("garbled")
	if _, err := client.CoreV1().Secrets("pulse-system").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(relaySecret(t, client).Data[corev1.TLSCertKey], relaySecret(t, client).Data[corev1.TLSPrivateKeyKey]); err != nil {
		t.Fatalf("the relay secret's key was not put right: %v", err)
	}
}

// TestARelayCopyRefusedLeavesKEDAsCredentials: the relays' Secret refused
// (its RBAC missing) is an error, and KEDA's credentials are written all
// the same: they had waited behind it.
func TestARelayCopyRefusedLeavesKEDAsCredentials(t *testing.T) {
	m, client, _, _ := managed(t, 0)
	m.o.RelaySecretName, m.o.RelayDNSNames = "pulse-relay-tls", []string{"localhost"}
	client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.CreateAction).GetObject().(*corev1.Secret).Name == "pulse-relay-tls" {
			return true, nil, errors.New("forbidden")
		}
		return false, nil, nil
	})
	if err := m.Ensure(context.Background()); err == nil || !strings.Contains(err.Error(), "relay certificate secret") {
		t.Fatalf("Ensure = %v, want the relay secret's failure", err)
	}
	if _, err := client.CoreV1().Secrets("keda").Get(context.Background(), "pulse-creds", metav1.GetOptions{}); err != nil {
		t.Fatalf("KEDA's credentials behind a refused relay copy: %v", err)
	}
}

// TestACopyChangedIsPutRightAtOnce: a copy edited or deleted while Run
// runs (the relays' key garbled by hand, the agents' CA bundle deleted,
// KEDA's key garbled) is put right by the watch on it, not at the next
// check, which is an hour away here.
func TestACopyChangedIsPutRightAtOnce(t *testing.T) {
	m, client, _, _ := managed(t, 0)
	m.o.RelaySecretName, m.o.RelayDNSNames = "pulse-relay-tls", []string{"localhost"}
	ctx := running(t, m)
	secrets := client.CoreV1().Secrets
	get := func(ns, name string) *corev1.Secret {
		s, err := secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return s
	}
	pairOK := func(ns, name, cert, key string) bool {
		s := get(ns, name)
		if s == nil {
			return false
		}
		_, err := tls.X509KeyPair(s.Data[cert], s.Data[key])
		return err == nil
	}
	relayOK := func() bool {
		return pairOK("pulse-system", "pulse-relay-tls", corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
	}
	kedaOK := func() bool { return pairOK("keda", "pulse-creds", "tls.crt", "tls.key") }
	caOK := func() bool {
		cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
		return err == nil && strings.Contains(cm.Data[KeyCACert], "BEGIN CERTIFICATE")
	}
	eventually(t, "the first Ensure", func() bool { return relayOK() && kedaOK() && caOK() })

	garble := func(ns, name, key string) {
		t.Helper()
		s := get(ns, name)
		s.Data[key] = []byte("garbled")
		if _, err := secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	garble("pulse-system", "pulse-relay-tls", corev1.TLSPrivateKeyKey)
	eventually(t, "the relays' key put right", relayOK)
	garble("keda", "pulse-creds", "tls.key")
	eventually(t, "KEDA's key put right", kedaOK)
	if err := client.CoreV1().ConfigMaps("pulse-system").Delete(ctx, "pulse-aggregator-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agents' CA bundle made again", caOK)
	if err := secrets("pulse-system").Delete(ctx, "pulse-relay-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the relays' Secret made again", relayOK)
}

// TestARetiredRelaySecretIsRemoved: with the relay gone, the relays'
// Secret the aggregator made is removed (its key was left valid until the
// release was uninstalled), also when a replica of the release before
// writes it again while both run; one of that name not made by the
// aggregator is left alone.
func TestARetiredRelaySecretIsRemoved(t *testing.T) {
	before, client, dyn, clock := managed(t, 0)
	before.o.RelaySecretName, before.o.RelayDNSNames = "pulse-relay-tls", []string{"localhost"}
	ctx := context.Background()
	if err := before.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	relaySecret(t, client)
	o := before.o
	o.RelaySecretName, o.RelayDNSNames, o.RetiredRelaySecretName = "", nil, "pulse-relay-tls"
	o.Dynamic, o.Now = dyn, clock.Now
	after := NewManaged(o)
	gone := func() bool {
		_, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-relay-tls", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	if err := after.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone() {
		t.Fatal("the relays' Secret is still there with the relay gone")
	}
	if err := after.Ensure(ctx); err != nil { // nothing to remove: no error
		t.Fatal(err)
	}

	// Side by side: the replica before writes it again, twice; the one
	// after removes it again each time. Run ensures once at its start and
	// then not for an hour, so one of the two at least is the watch's.
	after.gap = 10 * time.Millisecond
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- after.Run(rctx) }()
	for range 2 {
		if err := before.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the relays' Secret, written again by the replica before, removed again", gone)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Not the aggregator's: kept.
	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pulse-relay-tls", Namespace: "pulse-system"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: []byte("theirs")}}
	if _, err := client.CoreV1().Secrets("pulse-system").Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := after.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if gone() {
		t.Fatal("a Secret of that name the aggregator did not make was removed")
	}
}

// eventually polls cond until it holds, failing after a minute: the
// changes it waits for come from watches, not from a period.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// TestObjectsNotMadeByPulseAreLeftAlone: a Secret in KEDA's namespace, a
// ClusterTriggerAuthentication (cluster-wide) or a ConfigMap that happened
// to have the name the aggregator was given was overwritten with pulse's
// certificates, its owner's data lost. Each one the aggregator did not
// make (no managed-by label) is now left as it is, with an error naming
// it; the others are still written, and once it is gone the aggregator
// makes its own.
func TestObjectsNotMadeByPulseAreLeftAlone(t *testing.T) {
	m, client, dyn, _ := managed(t, 0)
	ctx := context.Background()
	theirs := map[string][]byte{"token": []byte("theirs")}
	if _, err := client.CoreV1().Secrets("keda").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pulse-creds", Namespace: "keda"}, Data: theirs}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps("pulse-system").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pulse-aggregator-ca", Namespace: "pulse-system"},
		Data: map[string]string{"ca.crt": "theirs"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	theirRefs := []any{map[string]any{"parameter": "token", "name": "elsewhere", "key": "token"}}
	cta := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
		"metadata": map[string]any{"name": "pulse-creds"}, "spec": map[string]any{"secretTargetRef": theirRefs}}}
	if _, err := dyn.Resource(ClusterTriggerAuthentications).Create(ctx, cta, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	err := m.Ensure(ctx)
	if err == nil {
		t.Fatal("Ensure over objects pulse did not make: no error")
	}
	for _, want := range []string{"ConfigMap pulse-system/pulse-aggregator-ca exists and was not made by pulse"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Ensure: %v; want it to name %q", err, want)
		}
	}
	// The CA ConfigMap's refusal stops the rest of that pass (as any
	// failure to publish the agents' trust does); KEDA's copies are
	// refused on their own once it is gone.
	if err := client.CoreV1().ConfigMaps("pulse-system").Delete(ctx, "pulse-aggregator-ca", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "Secret keda/pulse-creds exists and was not made by pulse") {
		t.Fatalf("Ensure: %v; want it to name KEDA's namespace's Secret", err)
	}
	if s, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil || !equalData(s.Data, theirs) {
		t.Fatalf("KEDA's namespace's Secret pulse-creds: %v %v; want their data as it was", s.Data, err)
	}
	got, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs, _, _ := unstructured.NestedSlice(got.Object, "spec", "secretTargetRef"); !reflect.DeepEqual(refs, theirRefs) {
		t.Fatalf("their ClusterTriggerAuthentication's refs %v, want %v", refs, theirRefs)
	}
	// The agents' trust was published, and the aggregator serves its pair.
	if cm, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{}); err != nil || cm.Labels[managedBy] != managedByAggregator {
		t.Fatalf("CA ConfigMap: %v %v; want the aggregator's", cm, err)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}

	// Their Secret removed: the aggregator makes its own, and leaves their
	// ClusterTriggerAuthentication; then that removed too, its own.
	if err := client.CoreV1().Secrets("keda").Delete(ctx, "pulse-creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "ClusterTriggerAuthentication pulse-creds exists and was not made by pulse") {
		t.Fatalf("Ensure: %v; want it to name the ClusterTriggerAuthentication", err)
	}
	if got, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if refs, _, _ := unstructured.NestedSlice(got.Object, "spec", "secretTargetRef"); !reflect.DeepEqual(refs, theirRefs) {
		t.Fatalf("their ClusterTriggerAuthentication's refs %v, want %v", refs, theirRefs)
	}
	if err := dyn.Resource(ClusterTriggerAuthentications).Delete(ctx, "pulse-creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil || len(s.Data["tls.crt"]) == 0 {
		t.Fatalf("KEDA's credentials: %v; want the aggregator's", err)
	}
}

// TestTheCertificateSecretNotMadeByPulseIsLeftAlone: a Secret of the
// certificates' name that the aggregator did not make is not renewed over.
func TestTheCertificateSecretNotMadeByPulseIsLeftAlone(t *testing.T) {
	m, client, _, _ := managed(t, 0)
	ctx := context.Background()
	theirs := map[string][]byte{"tls.crt": []byte("theirs")}
	if _, err := client.CoreV1().Secrets("pulse-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pulse-aggregator-certs", Namespace: "pulse-system"}, Data: theirs}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "Secret pulse-system/pulse-aggregator-certs exists and was not made by pulse") {
		t.Fatalf("Ensure: %v; want the Secret named as not pulse's", err)
	}
	if s, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{}); err != nil || !equalData(s.Data, theirs) {
		t.Fatalf("the Secret: %v %v; want their data as it was", s.Data, err)
	}
}

// TestANameTakenOutIsNotIssuedAgain: a renewal within two thirds of the
// certificate's life kept every name of the one before, so a name taken
// out of the configuration (a wrong --cert-dns-name corrected) was issued
// again, a new full validity, at every renewal that came: signed by the
// CA KEDA, the agents and the relays trust, for months. Only a
// certificate issued within the hour (another version's, in a rollout)
// has its names kept; a rollout from an older one settles in two issues,
// naming both versions'.
func TestANameTakenOutIsNotIssuedAgain(t *testing.T) {
	ctx := context.Background()
	m, client, dyn, clock := managed(t, 0)
	updates := secretUpdates(client)
	serverNames := func() []string {
		sec, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := parseCert(sec.Data[KeyServerCert])
		if err != nil {
			t.Fatal(err)
		}
		return c.DNSNames
	}
	m.o.DNSNames = []string{"localhost", "wrong.example"}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(10 * 24 * time.Hour)
	m.o.DNSNames = []string{"localhost", "right.example"}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if names := serverNames(); slices.Contains(names, "wrong.example") {
		t.Fatalf("renewed ten days on, the certificate still names the name taken out: %v", names)
	}
	// A rollout from that certificate, ten days on, of a version naming
	// another: two issues, then both versions' names.
	clock.Add(10 * 24 * time.Hour)
	o := m.o
	o.DNSNames = []string{"localhost", "other.example"}
	o.Dynamic = dyn
	next := NewManaged(o)
	*updates = 0
	for range 5 {
		for _, r := range []*Managed{next, m} {
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if names := serverNames(); *updates != 2 || !slices.Contains(names, "right.example") || !slices.Contains(names, "other.example") {
		t.Fatalf("a rollout: %d updates of the Secret, names %v; want 2, naming both versions'", *updates, names)
	}
}

// secretUpdates counts the updates of the managed certificates' Secret.
func secretUpdates(client *fake.Clientset) *int {
	n := new(int)
	client.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).Name == "pulse-aggregator-certs" {
			*n++
		}
		return false, nil, nil
	})
	return n
}

// TestACAMadeAtTheSwitchIsPublishedBeforeItSigns: no check from halfway
// through the CA's life to two thirds (the aggregator scaled to zero, a
// cluster stopped) left no next CA at the switch, and the pairs were
// signed at once by a CA made that instant, which neither KEDA's bundle
// nor the agents' ConfigMap held, though the current CA had a third of its
// life left. The next CA is made and published, the current one signs
// (nothing that outlives it) for switchOverlap, then the next one takes
// over.
func TestACAMadeAtTheSwitchIsPublishedBeforeItSigns(t *testing.T) {
	ctx := context.Background()
	m, client, _, clock := managed(t, 0)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	bundle := func() *x509.CertPool {
		keda, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		p.AppendCertsFromPEM(keda.Data["ca.crt"])
		return p
	}
	serving := func() (*x509.Certificate, *x509.Certificate) {
		s, ca := signingCA(t, client)
		leaf, err := parseCert(s.Data[KeyServerCert])
		if err != nil {
			t.Fatal(err)
		}
		return leaf, ca
	}
	before := bundle()
	_, first := serving()
	clock.Add(61 * 24 * time.Hour) // past two thirds of the CA's life, no check since its start
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	leaf, ca := serving()
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: before, DNSName: "localhost", CurrentTime: clock.Now()}); err != nil {
		t.Fatalf("the server certificate issued at the switch, against KEDA's bundle of before: %v", err)
	}
	if !ca.Equal(first) || leaf.NotAfter.After(first.NotAfter) {
		t.Fatalf("signed by %s until %s; want the CA of before, nothing past its end %s", ca.Subject, leaf.NotAfter, first.NotAfter)
	}
	clock.Add(switchOverlap / 2)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ca = serving(); !ca.Equal(first) {
		t.Fatal("the next CA signed before it was published for switchOverlap")
	}
	clock.Add(switchOverlap)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	leaf, ca = serving()
	if ca.Equal(first) {
		t.Fatal("the CA past two thirds still signs after switchOverlap")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: bundle(), DNSName: "localhost", CurrentTime: clock.Now()}); err != nil {
		t.Fatalf("after the switch, against KEDA's bundle: %v", err)
	}
}

// TestAnotherReleasesCopyIsLeftAlone: two releases given one name for
// KEDA's credentials (the ClusterTriggerAuthentication is cluster-wide,
// the Secret in KEDA's namespace) each took the other's copy over, its
// owner added, and wrote it back and forth every few seconds, KEDA's TLS
// to one of them failing meanwhile. A copy owned by another release's
// ClusterRole is left as it is, with an error naming it; one owned by a
// ClusterRole of our name made again (another uid) is ours.
func TestAnotherReleasesCopyIsLeftAlone(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(clusterRole("pulse-a", "uid-a"), clusterRole("pulse-b", "uid-b"))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{ClusterTriggerAuthentications: "ClusterTriggerAuthenticationList"})
	release := func(ns, role, uid string) ManagedOptions {
		return ManagedOptions{Client: client, Dynamic: dyn, Namespace: ns, SecretName: "pulse-aggregator-certs",
			DNSNames: []string{"localhost"}, KEDANamespace: "keda", TriggerAuthName: "pulse-creds",
			Owner: &metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: role, UID: types.UID(uid)},
			Log:   slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	if err := NewManaged(release("team-a", "pulse-a", "uid-a")).Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	theirs, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = NewManaged(release("team-b", "pulse-b", "uid-b")).Ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "Secret keda/pulse-creds is another release's (owned by ClusterRole pulse-a") {
		t.Fatalf("a second release's Ensure: %v; want KEDA's Secret refused as the first release's", err)
	}
	now, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil || !equalData(now.Data, theirs.Data) || len(now.OwnerReferences) != 1 || now.OwnerReferences[0].Name != "pulse-a" {
		t.Fatalf("KEDA's Secret after the second release: %v, owners %v; want the first's, unchanged", err, now.OwnerReferences)
	}
	cta, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil || len(cta.GetOwnerReferences()) != 1 || cta.GetOwnerReferences()[0].Name != "pulse-a" {
		t.Fatalf("the ClusterTriggerAuthentication: %v, owners %v; want the first release's alone", err, cta.GetOwnerReferences())
	}
	// The first release's ClusterRole made again (uninstalled and
	// installed): its copies are still its own.
	if err := NewManaged(release("team-a", "pulse-a", "uid-a2")).Ensure(ctx); err != nil {
		t.Fatalf("the first release, its ClusterRole made again: %v", err)
	}
	// A copy the two fought over before this check carries both owners,
	// the maker's first: it is the maker's still, and the other's not.
	now, err = client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now.OwnerReferences = append(now.OwnerReferences, metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-b", UID: "uid-b"})
	if _, err := client.CoreV1().Secrets("keda").Update(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := NewManaged(release("team-a", "pulse-a", "uid-a2")).Ensure(ctx); err != nil {
		t.Fatalf("the maker, with the other's owner added before: %v", err)
	}
	if err := NewManaged(release("team-b", "pulse-b", "uid-b")).Ensure(ctx); err == nil || !strings.Contains(err.Error(), "another release's (owned by ClusterRole pulse-a") {
		t.Fatalf("the other, its owner added before: %v; want refused as the maker's", err)
	}
}

// TestASecretNotOursIsNotServed: a Secret of the watched name that is not
// this release's (no label of ours: another release's keeping the chart's
// default name, or one made by hand from a shared issuer) was refused by
// Ensure, and loaded by the watch all the same: the scaler port served its
// pair and trusted its CA for KEDA's client certificates, with the replica
// Ready. The watch now loads only this release's Secret, and Ready says
// why none is loaded.
func TestASecretNotOursIsNotServed(t *testing.T) {
	made, client, _, _ := managed(t, 0)
	if err := made.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	ours, err := client.CoreV1().Secrets("pulse-system").Get(context.Background(), "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	theirs := ours.DeepCopy()
	theirs.Labels = nil
	m, _, _, _ := managed(t, 0)
	m.watched(theirs)
	if err := m.Ready(); err == nil || !strings.Contains(err.Error(), "not loaded") || !strings.Contains(err.Error(), "pulse-system/pulse-aggregator-certs") {
		t.Fatalf("Ready() = %v after a Secret not ours was watched; want not loaded, naming it", err)
	}
	if m.served.Load() != nil {
		t.Fatal("a Secret not ours is served")
	}
	// This release's Secret, unusable (its key garbled): Ready no longer
	// gives the refusal of the Secret before it as the reason.
	garbled := ours.DeepCopy()
	garbled.Data[KeyServerKey] = []byte("garbled")
	m.watched(garbled)
	if err := m.Ready(); err == nil || strings.Contains(err.Error(), "another release's") || strings.Contains(err.Error(), "pulse-system/pulse-aggregator-certs") {
		t.Fatalf("Ready() = %v after this release's Secret, garbled, was watched; want not loaded yet, not the earlier refusal", err)
	}
	m.watched(ours)
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready() = %v after this release's Secret was watched", err)
	}
}

// TestAPairNotSignedByTheCurrentCAIsIssuedAgain: the Secret's CA replaced
// by hand with another sound CA (a CA of one's own pasted in, the CA of a
// backup or another release's Secret copied over it) left the pairs as
// they were, signed by the CA no longer there: due() checks each pair's
// key, names and age, never its issuer. The published bundle then held
// the new CA alone, and neither the agents nor KEDA could verify the
// server (nor the scaler port KEDA's client certificate) until the pairs
// came two thirds through their life, 60 days with the defaults.
func TestAPairNotSignedByTheCurrentCAIsIssuedAgain(t *testing.T) {
	_, _, caPEM, keyPEM, err := issue(nil, nil, "another-ca", time.Now(), 90*24*time.Hour, true, 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, client := ensuredAfter(t, func(data map[string][]byte) {
		data[KeyCACert], data[KeyCAKey] = caPEM, keyPEM
	})
	if _, err := check(t, serveConfig(t, m.ServerOnlyConfig()), &tls.Config{RootCAs: agentRoots(t, client), MinVersion: tls.VersionTLS12}); err != nil {
		t.Errorf("an agent trusting the published bundle, after the CA was replaced: %v", err)
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaClient(t, client)); err != nil {
		t.Errorf("KEDA with its credentials as published, after the CA was replaced: %v", err)
	}
}

// TestTheSecretDeletedKeepsTheCAsClientsTrust: the managed Secret deleted
// (by hand to force a renewal, or by the garbage collector once its owner
// ClusterRole is made again) was made anew from nothing: a new CA signed
// the new pairs at once and the bundle published held it alone, so the
// agents (their ConfigMap carries the new CA a minute or two later) and
// KEDA (which keeps its scaler's TLS until a call fails) were cut off,
// where a CA renewal publishes the next CA an hour at least before it
// signs. The replica still serves (and its informer held) the Secret
// before: at the least the CA it published stays trusted.
func TestTheSecretDeletedKeepsTheCAsClientsTrust(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := managed(t, 0)
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	kedaBefore := kedaClient(t, client)
	agentBefore := agentRoots(t, client)
	if err := client.CoreV1().Secrets("pulse-system").Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := check(t, serveConfig(t, m.ServerOnlyConfig()), &tls.Config{RootCAs: agentBefore, MinVersion: tls.VersionTLS12}); err != nil {
		t.Errorf("an agent trusting the bundle published before the deletion: %v", err)
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaBefore); err != nil {
		t.Errorf("KEDA with the credentials of before the deletion: %v", err)
	}
}

// running runs m, a copy's change met within 10 ms, until the test ends;
// the context is Run's.
func running(t *testing.T, m *Managed) context.Context {
	m.gap = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ctx
}

// TestADeletedSecretIsMadeAgainAtOnce: the managed Secret deleted while a
// replica runs is made again at once, from the one it last loaded (the
// deletion was seen only at the next check, up to an hour later).
func TestADeletedSecretIsMadeAgainAtOnce(t *testing.T) {
	m, client, _, _ := managed(t, 0)
	ctx := running(t, m)
	secrets := client.CoreV1().Secrets("pulse-system")
	ca := func() []byte {
		s, err := secrets.Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return s.Data[KeyCACert]
	}
	eventually(t, "the first Ensure", func() bool { return ca() != nil && m.Ready() == nil })
	// The Ensures our own writes to the copies run come and go first:
	// one after the deletion would make the Secret again without its
	// watch.
	for n, still := len(client.Actions()), 0; still < 10; time.Sleep(50 * time.Millisecond) {
		if k := len(client.Actions()); k != n {
			n, still = k, 0
		} else {
			still++
		}
	}
	before := ca()
	if err := secrets.Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Secret made again, its CA kept", func() bool { return bytes.Equal(ca(), before) })
}

// deleteInTheForeground marks the ClusterRole pulse-aggregator being
// deleted in the foreground, as the API server does: its deletionTimestamp
// and the foregroundDeletion finalizer set, the garbage collector then
// deleting its dependents before it removes the finalizer.
func deleteInTheForeground(t *testing.T, client *fake.Clientset) {
	t.Helper()
	ctx := context.Background()
	roles := client.RbacV1().ClusterRoles()
	cr, err := roles.Get(ctx, "pulse-aggregator", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleting := metav1.Now()
	cr.DeletionTimestamp, cr.Finalizers = &deleting, []string{metav1.FinalizerDeleteDependents}
	if _, err := roles.Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ownedManaged is managed's, its owner the ClusterRole pulse-aggregator
// (uid-1), made, and its Secret made.
func ownedManaged(t *testing.T) (*Managed, *fake.Clientset, *dynamicfake.FakeDynamicClient, *testClock) {
	t.Helper()
	ctx := context.Background()
	m, client, dyn, clock := managed(t, 0)
	m.o.Owner = &metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "pulse-aggregator", UID: "uid-1"}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, clusterRole("pulse-aggregator", "uid-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return m, client, dyn, clock
}

// TestASecretIsNotMadeForAnOwnerGone: the ClusterRole that owns what the
// aggregator makes deleted while it runs: the garbage collector deletes
// the Secret, and one made again with the owner read at the start would
// be deleted again, and made again, over and over. It is not made; the
// pair loaded is served on. (One made again, another UID, owns what is
// made from then: TestTheSecretDeletedWithItsOwnerMadeAgainKeepsTheCA.)
func TestASecretIsNotMadeForAnOwnerGone(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := ownedManaged(t)
	roles := client.RbacV1().ClusterRoles()
	if err := roles.Delete(ctx, "pulse-aggregator", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	secrets := client.CoreV1().Secrets("pulse-system")
	if err := secrets.Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "ClusterRole pulse-aggregator that would own it is deleted") {
		t.Fatalf("Ensure: %v, want the owner named as gone", err)
	}
	if _, err := secrets.Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Secret: %v, want none made", err)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready: %v, want the pair loaded served on", err)
	}
}

// TestAReplicaJustStartedKeepsTheCAOfADeletedSecret: the managed Secret
// deleted while a replica runs (by hand, or by a clean-up) is to be made
// again from the one that replica last loaded, its CAs as they were. A
// replica started just then (a rollout, a scale-up, a restart) has loaded
// none: its first Ensure found the Secret missing and made it from
// nothing, a new CA signing at once, and won the Create over the running
// replica's, which then loaded it too. KEDA's credentials and the agents'
// bundle of before were cut off until each read the new ones.
func TestAReplicaJustStartedKeepsTheCAOfADeletedSecret(t *testing.T) {
	ctx := context.Background()
	old, client, _, _ := managed(t, 0)
	if err := old.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	kedaBefore := kedaClient(t, client)
	agentBefore := agentRoots(t, client)
	secrets := client.CoreV1().Secrets("pulse-system")
	if err := secrets.Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := NewManaged(old.o) // a replica just started: nothing loaded
	_ = fresh.Ensure(ctx)      // its first Ensure, before the running replica's kick
	_ = old.Ensure(ctx)        // the running replica's, on the deletion
	for _, m := range []*Managed{fresh, old} {
		_ = m.Ensure(ctx) // each again, 10 s on
	}
	for name, m := range map[string]*Managed{"the replica just started": fresh, "the running replica": old} {
		if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaBefore); err != nil {
			t.Errorf("%s, KEDA with its credentials of before the deletion: %v", name, err)
		}
		if _, err := check(t, serveConfig(t, m.ServerOnlyConfig()), &tls.Config{RootCAs: agentBefore, MinVersion: tls.VersionTLS12}); err != nil {
			t.Errorf("%s, an agent trusting the bundle of before the deletion: %v", name, err)
		}
	}
}

// TestAReplicaJustStartedMakesTheSecretWhenNoneDoes: the new-CA procedure
// (the aggregator scaled to zero, the Secret deleted, then scaled up):
// no replica holds the Secret, and one just started makes it, a new CA,
// though the copies of the one before are there. (A guard for the fix of
// the test above: it passes on the current code.)
func TestAReplicaJustStartedMakesTheSecretWhenNoneDoes(t *testing.T) {
	ctx := context.Background()
	old, client, _, clock := managed(t, 0)
	if err := old.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	secrets := client.CoreV1().Secrets("pulse-system")
	before, err := secrets.Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := secrets.Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := NewManaged(old.o)
	var err2 error
	for range 10 { // its Ensures, 10 s apart
		if err2 = fresh.Ensure(ctx); err2 == nil {
			break
		}
		clock.Add(10 * time.Second)
	}
	if err2 != nil {
		t.Fatalf("no Secret made within 100 s: %v", err2)
	}
	now, err := secrets.Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(now.Data[KeyCACert], before.Data[KeyCACert]) {
		t.Fatal("want a new CA")
	}
}

// TestASecretIsNotMadeForAnOwnerBeingDeleted: the ClusterRole that owns
// what the aggregator makes deleted in the foreground (helm uninstall
// --cascade=foreground, kubectl delete --cascade=foreground): it stands,
// its deletionTimestamp set, while the garbage collector deletes the
// Secret. The running replica made the Secret again at once (and its
// copies with it), owned by the ClusterRole going away: deleted by the
// garbage collector again, and made again as long as the ClusterRole
// stays (another finalizer on it). It is not made; the pair loaded is
// served on, as for an owner gone.
func TestASecretIsNotMadeForAnOwnerBeingDeleted(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := ownedManaged(t)
	deleteInTheForeground(t, client)
	secrets := client.CoreV1().Secrets("pulse-system")
	if err := secrets.Delete(ctx, "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err == nil || !strings.Contains(err.Error(), "ClusterRole pulse-aggregator") {
		t.Errorf("Ensure: %v, want the owner named as being deleted", err)
	}
	if s, err := secrets.Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the Secret: %v, want none made (made owned by %v)", err, s.OwnerReferences)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready: %v, want the pair loaded served on", err)
	}
}

// TestTheSecretDeletedWithItsOwnerMadeAgainKeepsTheCA: the ClusterRole
// that owns what the aggregator makes deleted and made again (another
// UID) while the replicas run: the garbage collector deletes the Secret
// and its copies (KEDA's credentials, the ClusterTriggerAuthentication,
// the agents' ConfigMap), all owned by the UID gone. docs/scaledobject.md says the
// running replica makes the Secret again from the one it loaded, its CAs
// as they were; it refused (ownerStands), Ready all the while, and
// nothing was made again until a replica restarted, with a new CA: KEDA
// had no credentials meanwhile. Now the ClusterRole of the name made
// again owns what is made again, from the Secret last loaded.
func TestTheSecretDeletedWithItsOwnerMadeAgainKeepsTheCA(t *testing.T) {
	ctx := context.Background()
	m, client, dyn, _ := ownedManaged(t)
	kedaBefore := kedaClient(t, client)
	remakeOwner(t, client)
	collectOwned(t, client, dyn)
	if err := m.Ensure(ctx); err != nil {
		t.Errorf("Ensure: %v", err)
	}
	if _, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); err != nil {
		t.Fatalf("KEDA's credentials: %v; Ready: %v", err, m.Ready())
	}
	if _, err := check(t, serveConfig(t, m.ServerConfig()), kedaBefore); err != nil {
		t.Errorf("KEDA with its credentials of before: %v", err)
	}
	s, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "uid-2" {
		t.Errorf("owner references %v, want the ClusterRole made again's alone", s.OwnerReferences)
	}
}

// remakeOwner deletes the ClusterRole pulse-aggregator (uid-1) and makes
// it again (uid-2), as kubectl delete and a helm upgrade would.
func remakeOwner(t *testing.T, client *fake.Clientset) {
	t.Helper()
	ctx := context.Background()
	roles := client.RbacV1().ClusterRoles()
	if err := roles.Delete(ctx, "pulse-aggregator", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := roles.Create(ctx, clusterRole("pulse-aggregator", "uid-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// collectOwned deletes what the ClusterRole gone (uid-1) owned alone, as
// the garbage collector would: the managed Secret and its copies.
func collectOwned(t *testing.T, client *fake.Clientset, dyn *dynamicfake.FakeDynamicClient) {
	t.Helper()
	if err := client.CoreV1().Secrets("pulse-system").Delete(context.Background(), "pulse-aggregator-certs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	collectCopies(t, client, dyn)
}

// collectCopies deletes the managed Secret's copies (KEDA's credentials,
// the agents' ConfigMap, the ClusterTriggerAuthentication), as the
// garbage collector would, its order its own, before the Secret.
func collectCopies(t *testing.T, client *fake.Clientset, dyn *dynamicfake.FakeDynamicClient) {
	t.Helper()
	ctx := context.Background()
	for _, err := range []error{
		client.CoreV1().Secrets("keda").Delete(ctx, "pulse-creds", metav1.DeleteOptions{}),
		client.CoreV1().ConfigMaps("pulse-system").Delete(ctx, "pulse-aggregator-ca", metav1.DeleteOptions{}),
		dyn.Resource(ClusterTriggerAuthentications).Delete(ctx, "pulse-creds", metav1.DeleteOptions{}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// ownersGone lists what carries an owner reference to uid-1, the
// ClusterRole gone: the garbage collector deletes what has it alone, and
// strips it from what has uid-2 too (an update the replica's watch sees,
// and puts back).
func ownersGone(t *testing.T, client *fake.Clientset, dyn *dynamicfake.FakeDynamicClient) []string {
	t.Helper()
	ctx := context.Background()
	var bad []string
	has := func(what string, refs []metav1.OwnerReference) {
		for _, r := range refs {
			if r.UID == "uid-1" {
				bad = append(bad, what)
			}
		}
	}
	if s, err := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{}); err == nil {
		has("the managed Secret", s.OwnerReferences)
	}
	if s, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); err == nil {
		has("KEDA's credentials", s.OwnerReferences)
	}
	if c, err := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{}); err == nil {
		has("the agents' ConfigMap", c.OwnerReferences)
	}
	if c, err := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{}); err == nil {
		has("the ClusterTriggerAuthentication", c.GetOwnerReferences())
	}
	return bad
}

// TestAReplicaFindingTheSecretMadeAgainAddsNoOwnerGone: two replicas run;
// the ClusterRole is made again and the garbage collector deletes what
// uid-1 owned. The replica whose Ensure comes first adopts uid-2 and
// makes all again; the other found the Secret there and read no
// ClusterRole: it put uid-1 back on each object (the collector strips it,
// and that replica's watch put it back, every 5 s). Each Ensure reads
// the owner now.
func TestAReplicaFindingTheSecretMadeAgainAddsNoOwnerGone(t *testing.T) {
	ctx := context.Background()
	a, client, dyn, _ := ownedManaged(t)
	b := NewManaged(a.o) // a second replica, running, its Secret loaded
	if err := b.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	remakeOwner(t, client)
	collectOwned(t, client, dyn)
	if err := a.Ensure(ctx); err != nil { // made again, owned by uid-2
		t.Fatal(err)
	}
	if err := b.Ensure(ctx); err != nil { // finds it made
		t.Fatal(err)
	}
	if bad := ownersGone(t, client, dyn); len(bad) > 0 {
		t.Errorf("owned by the ClusterRole gone (uid-1) after the second replica's Ensure: %v", bad)
	}
}

// TestACopyDeletedFirstIsNotMadeForTheOwnerGone: the garbage collector
// deletes KEDA's copy before the managed Secret
// (its order is its own): the copy's watch runs Ensure, the Secret is
// still there, and the copy was made again owned by uid-1, gone: deleted
// by the collector, made again, until the Secret goes too.
func TestACopyDeletedFirstIsNotMadeForTheOwnerGone(t *testing.T) {
	ctx := context.Background()
	m, client, _, _ := ownedManaged(t)
	remakeOwner(t, client)
	if err := client.CoreV1().Secrets("keda").Delete(ctx, "pulse-creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.OwnerReferences {
		if r.UID == "uid-1" && len(s.OwnerReferences) == 1 {
			t.Errorf("KEDA's credentials made again owned by uid-1 alone, gone: the collector deletes them again (%v)", s.OwnerReferences)
		}
	}
}

// TestARenewalIsNotHeldByAnOwnerThatCannotBeRead: the owner is read at
// every Ensure; a ClusterRole that cannot be read (the API busy, RBAC
// denied) holds neither the renewal nor the publishing of what stands.
func TestARenewalIsNotHeldByAnOwnerThatCannotBeRead(t *testing.T) {
	for _, denial := range []error{
		apierrors.NewServiceUnavailable("busy"),
		apierrors.NewForbidden(schema.GroupResource{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}, "pulse-aggregator", nil),
	} {
		ctx := context.Background()
		m, client, _, clock := ownedManaged(t)
		s, _ := client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
		before := s.Data[KeyServerCert]
		client.PrependReactor("get", "clusterroles", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, denial })
		clock.Add(21 * 24 * time.Hour)
		if err := m.Ensure(ctx); err != nil {
			t.Errorf("%v: Ensure %v", denial, err)
		}
		s, _ = client.CoreV1().Secrets("pulse-system").Get(ctx, "pulse-aggregator-certs", metav1.GetOptions{})
		if bytes.Equal(before, s.Data[KeyServerCert]) {
			t.Errorf("%v: not renewed", denial)
		}
	}
}

// TestACopyIsNotMadeForAnOwnerGoneOrBeingDeleted: README says that while
// the owner is being deleted or gone "none is made" (gone, the chart's
// grant of its get goes with it: 403). The garbage collector
// deletes the copies before the managed Secret (its order is its own): a
// copy's watch runs Ensure, the Secret still stands, and each copy was
// made again owned by the owner going away alone: collected again, made
// again 5 s on, until the Secret went too. The pair loaded is served on.
func TestACopyIsNotMadeForAnOwnerGoneOrBeingDeleted(t *testing.T) {
	for _, how := range []string{"gone", "being deleted", "not to be read"} {
		ctx := context.Background()
		m, client, dyn, _ := ownedManaged(t)
		roles := client.RbacV1().ClusterRoles()
		switch how {
		case "gone":
			if err := roles.Delete(ctx, "pulse-aggregator", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		case "not to be read":
			// The chart grants its get by the ClusterRole itself: gone, it
			// answers 403, not 404.
			client.PrependReactor("get", "clusterroles", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}, "pulse-aggregator", nil)
			})
		default:
			deleteInTheForeground(t, client)
		}
		collectCopies(t, client, dyn)
		err := m.Ensure(ctx)
		if s, gerr := client.CoreV1().Secrets("keda").Get(ctx, "pulse-creds", metav1.GetOptions{}); gerr == nil {
			t.Errorf("owner %s: KEDA's credentials made again, owned by %v (Ensure: %v)", how, s.OwnerReferences, err)
		}
		if c, gerr := client.CoreV1().ConfigMaps("pulse-system").Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{}); gerr == nil {
			t.Errorf("owner %s: the agents' ConfigMap made again, owned by %v", how, c.OwnerReferences)
		}
		if c, gerr := dyn.Resource(ClusterTriggerAuthentications).Get(ctx, "pulse-creds", metav1.GetOptions{}); gerr == nil {
			t.Errorf("owner %s: the ClusterTriggerAuthentication made again, owned by %v", how, c.GetOwnerReferences())
		}
		if err := m.Ready(); err != nil {
			t.Errorf("owner %s: Ready %v, want the pair loaded served on", how, err)
		}
		// The API's own answer is given, not a guess among three.
		why := map[string]string{"gone": "not found", "being deleted": "is being deleted", "not to be read": "forbidden"}[how]
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("owner %s: Ensure %v, want the API's answer (%q)", how, err, why)
		}
	}
}

// TestACopyFoundStaleAtItsWriteIsPublishedAgainSoon: publish's check found
// its copy current, then a version written by no replica (a label added
// by hand) landed before ensureCA's or ensureCopy's own check. That check
// left the copy unwritten and Ensure returned nil: Run waited for the
// next check, up to an hour, the bundle or KEDA's credentials (a renewed
// CA among them) unpublished. It is errStale, which Run tries again.
func TestACopyFoundStaleAtItsWriteIsPublishedAgainSoon(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(ctx context.Context, client *fake.Clientset) error
	}{
		{"the CAs' bundle", func(ctx context.Context, client *fake.Clientset) error {
			cms := client.CoreV1().ConfigMaps("pulse-system")
			cm, err := cms.Get(ctx, "pulse-aggregator-ca", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cm.Data[KeyCACert] = "an older bundle"
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			return err
		}},
		{"KEDA's credentials", func(ctx context.Context, client *fake.Clientset) error {
			ss := client.CoreV1().Secrets("keda")
			s, err := ss.Get(ctx, "pulse-creds", metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Data["ca.crt"] = []byte("an older bundle")
			_, err = ss.Update(ctx, s, metav1.UpdateOptions{})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, client, _ := ensured(t)
			ctx := context.Background()
			if err := c.edit(ctx, client); err != nil {
				t.Fatal(err)
			}
			// Ensure's read, publish's check, then the copy's own check:
			// another writer's version stands by then.
			anotherWriterAtRead(client, 3)
			if err := m.Ensure(ctx); !errors.Is(err, errStale) {
				t.Fatalf("a copy found stale at its write: Ensure %v, want errStale (Run tries again)", err)
			}
		})
	}
}
