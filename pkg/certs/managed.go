package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/logging"
)

// The keys of the managed Secret.
const (
	KeyCACert     = "ca.crt"
	KeyCAKey      = "ca.key"
	KeyServerCert = "tls.crt"
	KeyServerKey  = "tls.key"
	KeyClientCert = "client.crt"
	KeyClientKey  = "client.key"
	// KeyRelayCert and KeyRelayKey: pulse-relay's server pair (with
	// RelaySecretName), copied into its own Secret for the relays.
	KeyRelayCert = "relay.crt"
	KeyRelayKey  = "relay.key"
	// KeyNextCACert and KeyNextCAKey: the CA that follows, made halfway
	// through the current one's life and trusted (published in the bundle)
	// from then on; it signs the pairs from the current one's renewal.
	// KeyPrevCACert: the CA before, trusted until it expires.
	KeyNextCACert = "ca-next.crt"
	KeyNextCAKey  = "ca-next.key"
	KeyPrevCACert = "ca-previous.crt"
)

// ClusterTriggerAuthentications is KEDA's resource.
var ClusterTriggerAuthentications = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "clustertriggerauthentications"}

// ManagedOptions configure certificates the aggregator makes itself.
type ManagedOptions struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace and SecretName: where the CA, server and client pairs live.
	Namespace, SecretName string
	// DNSNames and IPs the server certificate names (the scaler Service).
	DNSNames []string
	IPs      []net.IP
	// Validity of the certificates; they are renewed two thirds through it.
	Validity time.Duration
	// KEDANamespace and TriggerAuthName: the ClusterTriggerAuthentication
	// KEDA uses, and the Secret of KEDA's client pair it reads, which KEDA
	// resolves in its own namespace.
	KEDANamespace, TriggerAuthName string
	// CAConfigMap, when set, is a ConfigMap (in Namespace) where the CAs'
	// certificates alone (ca.crt: the bundle, never a key) are published
	// for the agents, which connect to the ingest port over TLS and verify
	// it.
	CAConfigMap string
	// RelaySecretName, when set, is a Secret (in Namespace, type
	// kubernetes.io/tls) where a server pair for pulse-relay, naming
	// RelayDNSNames, is kept with the CAs' bundle (tls.crt, tls.key,
	// ca.crt): the relays serve the agents with it, and the agents verify
	// it with the CA they already trust. It holds no CA key, which the
	// relays never need.
	RelaySecretName string
	RelayDNSNames   []string
	// RetiredRelaySecretName, when set, is the relays' Secret of a
	// release that no longer has the aggregator keep it (the relay
	// disabled, or its certificate now the user's): removed when it is
	// one the aggregator made (labelled managed-by pulse-aggregator), so
	// that no key of a relay that is gone stays behind, valid, until the
	// release is uninstalled. A Secret of that name without the label is
	// left alone. Never RelaySecretName.
	RetiredRelaySecretName string
	// Owner, if set, owns the Secrets and the ClusterTriggerAuthentication
	// (a cluster-scoped object, the chart's ClusterRole, can own both
	// namespaced and cluster-scoped ones): deleting it deletes them. It is
	// added to existing ones that lack it.
	Owner *metav1.OwnerReference
	Log   *slog.Logger
	Now   func() time.Time
}

// Managed keeps a CA, a server and a client certificate in a Secret, renews
// them well before they expire, ensures KEDA's ClusterTriggerAuthentication,
// and serves the server certificate per handshake from an informer's copy
// of the Secret, so a renewal (by any replica) needs no restart.
type Managed struct {
	o ManagedOptions
	// served: what load made of the Secret, as one (three stored apart,
	// two loads at once, the informer's and a renewal's, could leave the
	// scaler and ingest ports on two pairs and Ready reading a third's
	// end); nil before the first.
	served atomic.Pointer[served]
	// refused: why the watched Secret was not loaded (not this
	// release's), for Ready to say while none is.
	refused atomic.Pointer[string]
	gap     time.Duration // the least time between Ensures a copy's change runs (copyGap)
	// loading makes publish's check that its copy is current and its
	// load one step against the watch's load: a newer version the watch
	// loaded between the two was loaded over by the older copy, and served
	// so until the next check, up to an hour.
	loading sync.Mutex
	// last: the Secret last loaded (this release's), from which a deleted
	// one is made again, its CAs as they were.
	last atomic.Pointer[corev1.Secret]
	// owner: the Owner as ownerStands last read it, its UID that of the
	// ClusterRole of its name made again; nil: the Owner as given.
	owner atomic.Pointer[metav1.OwnerReference]
	// missingSince: when a replica that has loaded no Secret first found
	// it missing, its copies there (awaitRunning); nil otherwise.
	missingSince atomic.Pointer[time.Time]
	// ownerGone: why ownerStands last found the owner gone, not to be
	// read, or being deleted (the API's answer); no copy is created then
	// (the garbage collector would delete it). nil: it stands.
	ownerGone atomic.Pointer[error]
}

// NewManaged returns a Managed; Run makes and serves the certificates.
func NewManaged(o ManagedOptions) *Managed {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Validity <= 0 {
		o.Validity = 90 * 24 * time.Hour
	}
	return &Managed{o: o, gap: copyGap}
}

// served is one server pair as each port serves it, and its end.
type served struct {
	scaler   *tls.Config // client certificates required
	ingest   *tls.Config // server authentication only
	notAfter time.Time
}

// ServerConfig takes the current certificate per handshake.
func (m *Managed) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if c := m.served.Load(); c != nil {
			return c.scaler, nil
		}
		return nil, errors.New("certificates are not ready yet")
	}}
}

// ServerOnlyConfig takes the current certificate per handshake and asks
// no client certificate: the ingest port's, whose agents authenticate with
// tokens (--agent-auth) and verify the server with the published CA.
func (m *Managed) ServerOnlyConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		if c := m.served.Load(); c != nil {
			return c.ingest, nil
		}
		return nil, errors.New("certificates are not ready yet")
	}}
}

// Ready returns nil once a certificate is loaded and the scaler port can
// complete a handshake, until the certificate served has expired (its
// renewal failing: a Secret update refused, say): a replica serving it
// answers no handshake of KEDA's or the agents', and was still Ready.
func (m *Managed) Ready() error {
	if m.served.Load() == nil {
		if why := m.refused.Load(); why != nil {
			return fmt.Errorf("managed certificates are not loaded: %s", *why)
		}
		return errors.New("managed certificates are not loaded yet")
	}
	if end := m.NotAfter(); !m.o.Now().Before(end) {
		return fmt.Errorf("the served certificate expired at %s: its renewal is failing (see the log)", end.UTC().Format(time.RFC3339))
	}
	return nil
}

// NotAfter is the end of the certificate served (zero before one is).
func (m *Managed) NotAfter() time.Time {
	if c := m.served.Load(); c != nil {
		return c.notAfter
	}
	return time.Time{}
}

// Run watches the Secret and ensures the certificates every check period.
func (m *Managed) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(m.o.Client, 0, informers.WithNamespace(m.o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", m.o.SecretName).String()
		}))
	// A copy edited or deleted (by hand, or by another controller) is put
	// right at once: each is watched, and a change to one runs Ensure. It
	// was put right only at the next check, up to an hour later, and a
	// relay that restarted meanwhile on a garbled key did not start. So is
	// the Secret deleted (made again from the one last loaded).
	kick := make(chan struct{}, 1)
	kickOnce := func(any) {
		select {
		case kick <- struct{}{}:
		default: // one is pending already
		}
	}
	inf := f.Core().V1().Secrets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: m.watched, UpdateFunc: func(_, n any) { m.watched(n) },
		DeleteFunc: kickOnce}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	wctx, cancel := context.WithCancel(ctx)
	var stops []func()
	defer func() {
		cancel() // before the shutdowns, which wait for the watches to end
		for _, stop := range stops {
			stop()
		}
	}()
	for _, c := range m.copies() {
		stop, err := m.watchCopy(wctx, c, kick)
		if err != nil {
			return err
		}
		stops = append(stops, stop)
	}
	every := min(time.Hour, m.o.Validity/10)
	var last time.Time
	for {
		wait := every
		last = time.Now()
		switch err := m.Ensure(ctx); {
		case errors.Is(err, errStale):
			m.o.Log.Info("ensure managed certificates: again", logging.KeyErr, err)
			wait = m.gap
		case err != nil:
			m.o.Log.Warn("ensure managed certificates", logging.KeyErr, err)
			wait = 10 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		case <-kick:
			// Our own writes come back as one more event each, whose
			// Ensure finds every copy right and writes nothing. A writer
			// that keeps changing a copy is met at most every copyGap.
			if d := time.Until(last.Add(m.gap)); d > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(d):
				}
			}
		}
	}
}

// copyGap is the least time between two Ensures that a copy's change runs.
const copyGap = 5 * time.Second

// copyRef names an object Ensure writes (or removes) from the managed
// Secret.
type copyRef struct {
	namespace, name string
	configMap       bool
}

// copies are the objects Ensure keeps from the managed Secret: KEDA's
// credentials, the CAs' bundle for the agents, the relays' Secret, and
// the relays' Secret retired.
func (m *Managed) copies() []copyRef {
	c := []copyRef{{namespace: m.o.KEDANamespace, name: m.o.TriggerAuthName}}
	if m.o.CAConfigMap != "" {
		c = append(c, copyRef{namespace: m.o.Namespace, name: m.o.CAConfigMap, configMap: true})
	}
	for _, n := range []string{m.o.RelaySecretName, m.o.RetiredRelaySecretName} {
		if n != "" {
			c = append(c, copyRef{namespace: m.o.Namespace, name: n})
		}
	}
	return c
}

// watchCopy watches the one object c (a name's field selector, which is
// what RBAC's resourceNames allow to list and watch) and sends on kick at
// each change to it; stop ends the watch.
func (m *Managed) watchCopy(ctx context.Context, c copyRef, kick chan<- struct{}) (stop func(), err error) {
	f := informers.NewSharedInformerFactoryWithOptions(m.o.Client, 0, informers.WithNamespace(c.namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.name).String()
		}))
	inf := f.Core().V1().Secrets().Informer()
	if c.configMap {
		inf = f.Core().V1().ConfigMaps().Informer()
	}
	changed := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if o, ok := obj.(metav1.Object); !ok || o.GetName() != c.name || o.GetNamespace() != c.namespace {
			return
		}
		select {
		case kick <- struct{}{}:
		default: // one is pending already
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: changed, UpdateFunc: func(_, n any) { changed(n) }, DeleteFunc: changed}); err != nil {
		return nil, fmt.Errorf("watch %s/%s: %w", c.namespace, c.name, err)
	}
	f.Start(ctx.Done())
	return f.Shutdown, nil
}

// Ensure creates or renews the certificates and KEDA's credentials.
func (m *Managed) Ensure(ctx context.Context) error {
	// The owner is read at every Ensure, before anything is written: a
	// ClusterRole of its name made again is adopted whether or not this
	// replica finds the Secret missing (one that found it made again by
	// another replica put the UID gone back on it and on each copy).
	ownerErr := m.ownerStands(ctx)
	secrets := m.o.Client.CoreV1().Secrets(m.o.Namespace)
	sec, err := secrets.Get(ctx, m.o.SecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// A Secret deleted while this replica runs (by hand, or by the
		// garbage collector, its owner made again) is made again from the
		// one it last loaded: made anew, a new CA signed at once, and the
		// agents and KEDA, trusting the CAs published before, were cut off
		// until each read the new bundle. A new CA is made by deleting
		// the Secret while no replica runs (docs/scaledobject.md). A
		// replica that has loaded none waits madeGrace while KEDA's copy
		// stands (awaitRunning), so that a running one makes it first.
		if ownerErr != nil {
			return ownerErr
		}
		last, again := m.last.Load(), "created"
		if last == nil {
			if err := m.awaitRunning(ctx); err != nil {
				return err
			}
		}
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.o.SecretName, Namespace: m.o.Namespace,
			Labels: map[string]string{managedBy: managedByAggregator}, OwnerReferences: m.owners(nil)}, Type: corev1.SecretTypeOpaque}
		if last != nil {
			sec.Data, again = maps.Clone(last.Data), "made again from the Secret last loaded, its CAs kept"
		}
		if last == nil || m.due(sec) {
			if err := m.renew(sec); err != nil {
				return err
			}
		}
		if sec, err = secrets.Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create certificate secret: %w", err) // another replica may have won: retried
		}
		m.o.Log.Info("managed certificates "+again, logging.KeySecret, m.o.Namespace+"/"+m.o.SecretName)
	case err != nil:
		return fmt.Errorf("get certificate secret: %w", err)
	default:
		m.missingSince.Store(nil)
		if err := m.notOurs("Secret", sec.Namespace+"/"+sec.Name, sec); err != nil {
			return err
		}
		due, unowned := m.due(sec), m.unowned(sec.OwnerReferences)
		if due {
			if err := m.renew(sec); err != nil {
				return err
			}
		}
		if due || unowned {
			sec.OwnerReferences = m.owners(sec.OwnerReferences)
			if sec, err = secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("update certificate secret: %w", err)
			}
		}
		if due {
			m.o.Log.Info("managed certificates renewed", logging.KeySecret, m.o.Namespace+"/"+m.o.SecretName)
		}
	}
	return m.publish(ctx, sec)
}

// ownerStands reads the Owner's ClusterRole (nil with no Owner): an error
// when it is gone, being deleted (its deletionTimestamp set: a foreground
// deletion, a finalizer) or not read, and the caller makes no Secret then
// (one made would be deleted with its owner, and made again, over and
// over). It records ownerGone (gone, 403 or being deleted: mayCreate
// refuses the copies) and adopts the UID of a ClusterRole of its name made
// again (m.owner), which owns what is made from then on.
func (m *Managed) ownerStands(ctx context.Context) error {
	owner := m.ownerRef()
	if owner == nil {
		return nil
	}
	now, gone, err := OwnerNow(ctx, m.o.Client, *owner)
	if gone {
		m.ownerGone.Store(&err)
	} else {
		m.ownerGone.Store(nil)
	}
	switch {
	case err != nil && gone:
		// A Secret made now is deleted with it, and made again while it
		// stays.
		return fmt.Errorf("certificate secret not made: the ClusterRole %s that would own it is deleted or being deleted, and the garbage collector would delete it; the pair loaded is served on (%w)", owner.Name, err)
	case err != nil:
		return fmt.Errorf("certificate secret not made: its owner, %w", err)
	case now.UID != owner.UID:
		// Made again (its name is this release's, as notOurs has it): it
		// owns what is made from now on, and the Secret is made again from
		// the one last loaded, its CAs kept.
		m.owner.Store(&now)
		m.o.Log.Info("the owner ClusterRole was made again: what is made from now on is owned by it", logging.KeyName, owner.Name)
	}
	return nil
}

// OwnerNow is owner, a ClusterRole, as the API has it now (the UID of one
// of its name made again since); an error, gone true, when it is not there
// or being deleted (its deletionTimestamp set: a foreground deletion, a
// finalizer), whose garbage collector would delete what is made for it at
// once, or when its read is refused (403: the chart grants that read by
// the ClusterRole itself, which goes with it); an error, gone false, when
// it could not be read otherwise. The certificates and the provisioner's
// Lease read their owner with it before they make anything.
func OwnerNow(ctx context.Context, c kubernetes.Interface, owner metav1.OwnerReference) (now metav1.OwnerReference, gone bool, err error) {
	cr, err := c.RbacV1().ClusterRoles().Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case err != nil:
		return metav1.OwnerReference{}, apierrors.IsNotFound(err) || apierrors.IsForbidden(err), fmt.Errorf("ClusterRole %s: %w", owner.Name, err)
	case cr.DeletionTimestamp != nil:
		return metav1.OwnerReference{}, true, fmt.Errorf("ClusterRole %s is being deleted", owner.Name)
	}
	owner.UID = cr.UID
	return owner, false, nil
}

// mayCreate is an error while the owner is gone (or not to be read) or
// being deleted: an object created then is owned by it alone, deleted by
// the garbage collector, and created again at its watch's next event.
func (m *Managed) mayCreate(kind, name string) error {
	if why := m.ownerGone.Load(); why != nil {
		return fmt.Errorf("%s %s not made: the ClusterRole that would own it is deleted, being deleted or not to be read (%w)", kind, name, *why)
	}
	return nil
}

// ownerRef is the owner of what is made: the Owner, its UID as
// ownerStands last read it.
func (m *Managed) ownerRef() *metav1.OwnerReference {
	if o := m.owner.Load(); o != nil {
		return o
	}
	return m.o.Owner
}

// awaitRunning is nil once a replica that has loaded no Secret may make
// one from nothing (a new CA): when no copy of one made before is there
// (KEDA's credentials, ours), or madeGrace after it first found it missing.
// A running replica makes a deleted Secret again from the one it loaded,
// its CAs kept, within copyGap of the deletion; one just started (a
// rollout, a restart) made it first with a new CA, every replica loaded
// that, and KEDA and the agents were cut off until they read it.
func (m *Managed) awaitRunning(ctx context.Context) error {
	cur, err := m.o.Client.CoreV1().Secrets(m.o.KEDANamespace).Get(ctx, m.o.TriggerAuthName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && m.notOurs("Secret", "", cur) != nil:
		return nil // none made before: nothing to keep
	case err != nil:
		return fmt.Errorf("certificate secret not made: KEDA credentials secret %s/%s: %w", m.o.KEDANamespace, m.o.TriggerAuthName, err)
	}
	now := m.o.Now()
	since := m.missingSince.Load()
	if since == nil {
		since = &now
		m.missingSince.Store(since)
	}
	if now.Sub(*since) < madeGrace {
		return fmt.Errorf("certificate secret not made yet: it was deleted, and a running replica makes it again from the one it loaded, its CAs kept; made anew (a new CA) %s after this replica found it missing", madeGrace)
	}
	return nil
}

// madeGrace is how long a replica that has loaded no Secret waits for a
// running one to make a deleted Secret again before it makes a new one.
const madeGrace = 30 * time.Second

// errStale: publish's copy of the Secret is no longer its current
// version; Run tries again after copyGap.
var errStale = errors.New("the certificate secret changed while it was published: published again from the newer version")

// publish serves sec's pair and trust, and publishes the CAs' bundle and
// KEDA's credentials, unless sec is no longer the Secret's current
// version (errStale): the watch then has (or will have) the newer one,
// which this copy loaded over, serving the older pair and bundle. The
// newer one is published at the next try. Left to the next check, a
// version not written by a replica (a label added by hand, the garbage
// collector's) left the copies unpublished for up to an hour, a renewed
// CA among them.
func (m *Managed) publish(ctx context.Context, sec *corev1.Secret) error {
	m.loading.Lock()
	// The watch's load of this Secret waits for the check: bounded here,
	// as the client sets no timeout of its own.
	sctx, cancel := context.WithTimeout(ctx, staleCheckTimeout)
	err := m.current(sctx, sec)
	cancel()
	if err == nil {
		err = m.load(sec)
	}
	m.loading.Unlock()
	if err != nil {
		return err
	}
	if err := m.ensureCA(ctx, sec); err != nil {
		return err
	}
	// Each copy apart: the relays' failing (its RBAC missing, say) kept
	// KEDA's credentials from being renewed.
	return errors.Join(m.ensureKEDA(ctx, sec), m.ensureRelay(ctx, sec), m.retireRelay(ctx))
}

// retireRelay removes RetiredRelaySecretName (when set) if the aggregator
// made it. A replica of the release before, still keeping it, may write it
// again while the two run side by side: each watches it, and the one that
// retires it removes it again, until the older replicas are gone.
func (m *Managed) retireRelay(ctx context.Context) error {
	name := m.o.RetiredRelaySecretName
	if name == "" {
		return nil
	}
	ss := m.o.Client.CoreV1().Secrets(m.o.Namespace)
	cur, err := ss.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("retired relay certificate secret %s/%s: %w", m.o.Namespace, name, err)
	case cur.Labels[managedBy] != managedByAggregator:
		return nil // not one the aggregator made: someone else's to keep
	}
	uid := cur.UID
	if err := ss.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the retired relay certificate secret %s/%s: %w", m.o.Namespace, name, err)
	}
	m.o.Log.Info("relay certificate secret removed: no relay of this release uses it", logging.KeySecret, m.o.Namespace+"/"+name)
	return nil
}

// ensureRelay writes the relays' pair and the CAs' bundle into
// RelaySecretName (when set): the bundle as ca.crt, which the relays
// need to verify the aggregators' ingest certificate too.
func (m *Managed) ensureRelay(ctx context.Context, sec *corev1.Secret) error {
	if m.o.RelaySecretName == "" {
		return nil
	}
	cert, key := pairPEM(sec.Data[KeyRelayCert], sec.Data[KeyRelayKey])
	want := map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key, KeyCACert: m.bundle(sec)}
	if err := m.ensureCopy(ctx, sec, m.o.Namespace, m.o.RelaySecretName, corev1.SecretTypeTLS, want); err != nil {
		return fmt.Errorf("relay certificate secret %s/%s: %w", m.o.Namespace, m.o.RelaySecretName, err)
	}
	return nil
}

// ensureCopy creates or updates the Secret ns/name to hold data (of type
// typ, which an existing Secret keeps: it cannot change), unless sec is
// no longer the managed Secret's current version (errStale: Run tries
// again from the newer one).
func (m *Managed) ensureCopy(ctx context.Context, sec *corev1.Secret, ns, name string, typ corev1.SecretType, data map[string][]byte) error {
	ss := m.o.Client.CoreV1().Secrets(ns)
	cur, err := ss.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if err := m.mayCreate("Secret", ns+"/"+name); err != nil {
			return err
		}
		_, err = ss.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{managedBy: managedByAggregator}, OwnerReferences: m.owners(nil)}, Type: typ, Data: data}, metav1.CreateOptions{})
		if err == nil {
			m.o.Log.Info("certificate secret created", logging.KeySecret, ns+"/"+name)
		}
	case err == nil && m.notOurs("Secret", ns+"/"+name, cur) != nil:
		return m.notOurs("Secret", ns+"/"+name, cur)
	case err == nil && (!equalData(cur.Data, data) || m.unowned(cur.OwnerReferences)):
		if err := m.current(ctx, sec); err != nil {
			return err
		}
		cur.Data = data
		cur.OwnerReferences = m.owners(cur.OwnerReferences)
		_, err = ss.Update(ctx, cur, metav1.UpdateOptions{})
	}
	return err
}

// ensureCA publishes the CAs' bundle in CAConfigMap (when set), the trust
// the agents mount; it changes when the next CA is made, when it becomes
// the current one and when the previous one expires, and the agents
// re-read it on every connect.
func (m *Managed) ensureCA(ctx context.Context, sec *corev1.Secret) error {
	if m.o.CAConfigMap == "" {
		return nil
	}
	want := map[string]string{KeyCACert: string(m.bundle(sec))}
	cms := m.o.Client.CoreV1().ConfigMaps(m.o.Namespace)
	cur, err := cms.Get(ctx, m.o.CAConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if err := m.mayCreate("ConfigMap", m.o.Namespace+"/"+m.o.CAConfigMap); err != nil {
			return err
		}
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: m.o.CAConfigMap, Namespace: m.o.Namespace,
			Labels: map[string]string{managedBy: managedByAggregator}, OwnerReferences: m.owners(nil)}, Data: want}, metav1.CreateOptions{})
		if err == nil {
			m.o.Log.Info("CA certificate published for the agents", logging.KeyName, m.o.Namespace+"/"+m.o.CAConfigMap)
		}
	case err == nil && m.notOurs("ConfigMap", m.o.Namespace+"/"+m.o.CAConfigMap, cur) != nil:
		return m.notOurs("ConfigMap", m.o.Namespace+"/"+m.o.CAConfigMap, cur)
	case err == nil && (cur.Data[KeyCACert] != want[KeyCACert] || m.unowned(cur.OwnerReferences)):
		if err := m.current(ctx, sec); err != nil {
			return err
		}
		cur.Data = want
		cur.OwnerReferences = m.owners(cur.OwnerReferences)
		_, err = cms.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("CA ConfigMap %s/%s: %w", m.o.Namespace, m.o.CAConfigMap, err)
	}
	return nil
}

// bundle is the CAs trusted: the current one, the next (once made) and the
// previous (until it expires), in PEM. It is what the agents and KEDA are
// given, so that a new CA is trusted everywhere long before it signs the
// server's certificate, and the old one as long as anything it signed may
// be presented.
//
// Each is re-encoded from the certificate parsed: the raw entries were
// passed on, and a CA key pasted into ca.crt by hand reached the agents'
// ConfigMap and KEDA's Secret.
func (m *Managed) bundle(sec *corev1.Secret) []byte {
	pems := [][]byte{sec.Data[KeyCACert]}
	if next, err := parseCert(sec.Data[KeyNextCACert]); err == nil && m.o.Now().Before(next.NotAfter) {
		pems = append(pems, sec.Data[KeyNextCACert])
	}
	if prev, err := parseCert(sec.Data[KeyPrevCACert]); err == nil && m.o.Now().Before(prev.NotAfter) {
		pems = append(pems, sec.Data[KeyPrevCACert])
	}
	return certsPEM(pems...)
}

// halfway and twoThirds are how far through its validity c is due for a
// follower, and for renewal.
func halfway(c *x509.Certificate) time.Time { return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2) }
func twoThirds(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// nextDue is when the next CA is made and published: halfway through
// ca's life, or, where that is more than half a validity before ca is
// replaced (at two thirds through it: the validity was lowered since ca
// was made), half a validity before that, so that the next CA, made for
// three validities, still has two and a half left when it signs.
func (m *Managed) nextDue(ca *x509.Certificate) time.Time {
	later := twoThirds(ca).Add(-m.o.Validity / 2)
	if h := halfway(ca); h.After(later) {
		return h
	}
	return later
}

// nextFit is whether the next CA and its key are readable and it
// outlives what it will sign when it replaces ca (at two thirds through
// ca's life, or now, if that is past): made before the validity was
// lowered, it can expire first; and an aggregator not running across the
// switch and the next CA's expiry (scaled to zero, a cluster stopped) put
// the expired next CA in place at its start, every handshake failing.
func (m *Managed) nextFit(sec *corev1.Secret, ca *x509.Certificate) bool {
	next, certErr := parseCert(sec.Data[KeyNextCACert])
	_, keyErr := caKey(sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey])
	at := twoThirds(ca)
	if now := m.o.Now(); now.After(at) {
		at = now
	}
	return certErr == nil && keyErr == nil && !next.NotAfter.Before(at.Add(m.o.Validity))
}

// switchOverlap is how long a next CA is published before it signs, at
// the least: the agents' ConfigMap and KEDA's Secret take a minute or two
// to carry it. A next CA made at two thirds through the current one's life
// (no check ran from halfway to there: the aggregator scaled to zero, a
// cluster stopped) signed at once, and KEDA's and the agents' handshakes
// failed until they read it, though the current CA had a third of its life
// left.
const switchOverlap = time.Hour

// awaitsNext reports whether ca, past two thirds of its life, still signs
// because its next CA (fit, or to be made now) has not been published for
// switchOverlap yet, and ca outlives that wait twice over.
func (m *Managed) awaitsNext(sec *corev1.Secret, ca *x509.Certificate) bool {
	now := m.o.Now()
	if !now.After(twoThirds(ca)) || ca.NotAfter.Sub(now) <= 2*switchOverlap {
		return false
	}
	if !m.nextFit(sec, ca) {
		return true // to be made now, and waited for
	}
	next, _ := parseCert(sec.Data[KeyNextCACert])
	return now.Before(next.NotBefore.Add(certBackdate + switchOverlap))
}

// due reports whether any certificate or key is missing, unreadable, not
// its certificate's, not signed by the CA (a pair's), not for the
// configured names, or two thirds through
// its validity, or the next CA is due and none that would outlive what it
// signs is made.
func (m *Managed) due(sec *corev1.Secret) bool {
	if _, err := caKey(sec.Data[KeyCACert], sec.Data[KeyCAKey]); err != nil {
		return true // nothing could be signed at the next renewal
	}
	if ca, err := parseCert(sec.Data[KeyCACert]); err == nil && m.o.Now().After(m.nextDue(ca)) {
		if !m.nextFit(sec, ca) {
			return true
		}
	}
	for _, pair := range m.pairs() {
		// A key lost or garbled (or not its certificate's) made every
		// Ensure fail, every 10 s, for ever: it is issued again.
		if _, err := tls.X509KeyPair(sec.Data[pair[0]], sec.Data[pair[1]]); err != nil {
			return true
		}
	}
	certs := []string{KeyCACert}
	for _, pair := range m.pairs() {
		certs = append(certs, pair[0])
	}
	var ca *x509.Certificate
	for _, k := range certs {
		c, err := parseCert(sec.Data[k])
		if err != nil {
			return true
		}
		// A pair the CA did not sign (the CA replaced in the Secret,
		// by hand or from a backup) was served on, the bundle holding the
		// new CA alone: every new handshake failed until the pair's two
		// thirds, 60 days by default.
		if ca == nil {
			ca = c
		} else if c.CheckSignatureFrom(ca) != nil {
			return true
		}
		// A CA past two thirds that waits for its next one (published,
		// fit) is not due: it signs on until the switch.
		waits := k == KeyCACert && m.awaitsNext(sec, c) && m.nextFit(sec, c)
		if m.o.Now().After(twoThirds(c)) && !waits {
			return true
		}
		if k == KeyServerCert && !covers(c, m.o.DNSNames, m.o.IPs) || k == KeyRelayCert && !covers(c, m.o.RelayDNSNames, nil) {
			return true
		}
	}
	return false
}

// pairs are the keys of the pairs the Secret keeps: the server's, KEDA's
// and, with RelaySecretName, the relays'.
func (m *Managed) pairs() [][2]string {
	p := [][2]string{{KeyServerCert, KeyServerKey}, {KeyClientCert, KeyClientKey}}
	if m.o.RelaySecretName != "" {
		p = append(p, [2]string{KeyRelayCert, KeyRelayKey})
	}
	return p
}

// covers says whether c names every one of dns and ips (more is no
// renewal: in a rollout that changes the names, each version re-issued the
// certificate with its own, and the two took turns every few seconds,
// each serving half the time a certificate without its names).
func covers(c *x509.Certificate, dns []string, ips []net.IP) bool {
	for _, d := range dns {
		if !slices.Contains(c.DNSNames, d) {
			return false
		}
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// certBackdate: a certificate is valid from this long before it is issued
// (clocks a little behind). carryNamesFor: how long after a certificate
// was issued a renewal keeps its names (namesFor): a rollout's.
const (
	certBackdate  = 5 * time.Minute
	carryNamesFor = time.Hour
)

// namesFor is what the certificate of key issued now names: dns and ips,
// and those of sec's certificate of key that they lack, where that one was
// issued within carryNamesFor (a renewal for names in a rollout: another
// version's, whose certificate was just issued, are kept, and it finds its
// own still named). Otherwise dns and ips alone: a name the operator took
// out of the configuration was carried into every renewal within two
// thirds of a certificate's life, each a new full validity, for as long as
// renewals came.
func (m *Managed) namesFor(sec *corev1.Secret, key string, dns []string, ips []net.IP) ([]string, []net.IP) {
	c, err := parseCert(sec.Data[key])
	if err != nil || m.o.Now().Sub(c.NotBefore) > carryNamesFor+certBackdate {
		return dns, ips
	}
	dns, ips = slices.Clone(dns), slices.Clone(ips)
	for _, d := range c.DNSNames {
		if !slices.Contains(dns, d) {
			dns = append(dns, d)
		}
	}
	for _, ip := range c.IPAddresses {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	return dns, ips
}

// renew writes new server and client pairs into sec, signed by the
// current CA. The CA lives three validities. Halfway through it (nextDue)
// the next CA is made, and published beside it; two thirds through, the next one
// becomes the current one (it has been trusted for a sixth of the CA's
// life: a CA renewed at once cut KEDA and the agents off until they read
// the new one), and the old one stays trusted until it expires. A CA
// missing or unreadable is made anew.
func (m *Managed) renew(sec *corev1.Secret) error {
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	now := m.o.Now()
	newCA := func() (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
		return issue(nil, nil, "pulse-aggregator-ca", now, 3*m.o.Validity, true, 0, nil, nil)
	}
	ca, caErr := parseCert(sec.Data[KeyCACert])
	signer, keyErr := caKey(sec.Data[KeyCACert], sec.Data[KeyCAKey])
	next, nextErr := parseCert(sec.Data[KeyNextCACert])
	nextKey, nextKeyErr := caKey(sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey])
	if caErr == nil && !m.nextFit(sec, ca) {
		nextErr = errors.New("the next CA would expire before what it signs") // made again when due
	}
	// A CA whose certificate reads but whose key is lost stays trusted
	// (as the previous CA) until it expires: KEDA's client certificate and
	// the server certificates other replicas serve are its, until each
	// reads the new ones (it was dropped, and KEDA's handshakes failed).
	// (A previous CA is left as it is otherwise: the bundle passes it on
	// until it expires.)
	keepPrev := func() {
		if caErr == nil && now.Before(ca.NotAfter) {
			sec.Data[KeyPrevCACert] = certsPEM(sec.Data[KeyCACert])
		}
	}
	var err error
	// Until: what the pairs issued now may outlive (a CA that waits for
	// its next one signs nothing that outlives it).
	until := now.Add(m.o.Validity)
	switch {
	case caErr == nil && keyErr == nil && m.awaitsNext(sec, ca):
		if nextErr != nil || nextKeyErr != nil {
			if _, _, sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey], err = newCA(); err != nil {
				return err
			}
		}
		until = ca.NotAfter
	case (caErr != nil || keyErr != nil) && nextErr == nil && nextKeyErr == nil:
		// The current CA is unreadable: the next one, published already,
		// takes its place.
		keepPrev()
		ca, signer, sec.Data[KeyCACert], sec.Data[KeyCAKey] = next, nextKey, sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey]
		delete(sec.Data, KeyNextCACert)
		delete(sec.Data, KeyNextCAKey)
	case caErr != nil || keyErr != nil:
		keepPrev()
		if ca, signer, sec.Data[KeyCACert], sec.Data[KeyCAKey], err = newCA(); err != nil {
			return err
		}
		delete(sec.Data, KeyNextCACert)
		delete(sec.Data, KeyNextCAKey)
	case now.After(twoThirds(ca)):
		sec.Data[KeyPrevCACert] = certsPEM(sec.Data[KeyCACert])
		if nextErr == nil && nextKeyErr == nil {
			ca, signer, sec.Data[KeyCACert], sec.Data[KeyCAKey] = next, nextKey, sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey]
		} else if ca, signer, sec.Data[KeyCACert], sec.Data[KeyCAKey], err = newCA(); err != nil {
			return err
		}
		delete(sec.Data, KeyNextCACert)
		delete(sec.Data, KeyNextCAKey)
	case now.After(m.nextDue(ca)) && (nextErr != nil || nextKeyErr != nil):
		if _, _, sec.Data[KeyNextCACert], sec.Data[KeyNextCAKey], err = newCA(); err != nil {
			return err
		}
	}
	return m.issuePairs(sec, ca, signer, now, until)
}

// issuePairs writes into sec the server's, KEDA's and (with
// RelaySecretName) the relays' pairs, signed by ca, valid until until.
func (m *Managed) issuePairs(sec *corev1.Secret, ca *x509.Certificate, signer *ecdsa.PrivateKey, now, until time.Time) error {
	var err error
	dns, ips := m.namesFor(sec, KeyServerCert, m.o.DNSNames, m.o.IPs)
	relayDNS, _ := m.namesFor(sec, KeyRelayCert, m.o.RelayDNSNames, nil)
	if _, _, sec.Data[KeyServerCert], sec.Data[KeyServerKey], err = issue(ca, signer, "pulse-aggregator", now, until.Sub(now), false,
		x509.ExtKeyUsageServerAuth, dns, ips); err != nil {
		return err
	}
	if _, _, sec.Data[KeyClientCert], sec.Data[KeyClientKey], err = issue(ca, signer, "keda-operator", now, until.Sub(now), false,
		x509.ExtKeyUsageClientAuth, nil, nil); err != nil || m.o.RelaySecretName == "" {
		return err
	}
	_, _, sec.Data[KeyRelayCert], sec.Data[KeyRelayKey], err = issue(ca, signer, "pulse-relay", now, until.Sub(now), false,
		x509.ExtKeyUsageServerAuth, relayDNS, nil)
	return err
}

// watched loads the watched Secret, unless it is not this release's (no
// label of ours, or another release's): Ensure refused such a Secret, and
// the watch served its pair and trusted its CA for KEDA's client
// certificates all the same (another release's keeping the chart's
// default name, or a shared issuer's), with the replica Ready. A pair
// served before is kept; Ready says why none is, when none is.
func (m *Managed) watched(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	if err := m.notOurs("Secret", sec.Namespace+"/"+sec.Name, sec); err != nil {
		why := err.Error()
		m.refused.Store(&why)
		m.o.Log.Warn("managed certificate secret not loaded", logging.KeyErr, err)
		return
	}
	m.refused.Store(nil) // ours again: a refusal is no longer why none is loaded
	m.loading.Lock()
	defer m.loading.Unlock()
	if err := m.load(sec); err != nil {
		m.o.Log.Warn("managed certificate secret not usable", logging.KeyErr, err)
	}
}

// load makes the Secret's server pair the one served, trusting the CAs'
// bundle for client certificates.
func (m *Managed) load(sec *corev1.Secret) error {
	pair, err := tls.X509KeyPair(sec.Data[KeyServerCert], sec.Data[KeyServerKey])
	if err != nil {
		return fmt.Errorf("server pair: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(m.bundle(sec)) {
		return errors.New("no CA certificate")
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Errorf("server pair: %w", err)
	}
	m.last.Store(sec)
	m.served.Store(&served{notAfter: leaf.NotAfter,
		scaler: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair},
			ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert},
		ingest: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}})
	return nil
}

// ensureKEDA writes KEDA's client pair into a Secret in KEDA's namespace
// and the ClusterTriggerAuthentication mapping it to the external scaler's
// caCert, tlsClientCert and tlsClientKey.
func (m *Managed) ensureKEDA(ctx context.Context, sec *corev1.Secret) error {
	cert, key := pairPEM(sec.Data[KeyClientCert], sec.Data[KeyClientKey])
	want := map[string][]byte{"ca.crt": m.bundle(sec), "tls.crt": cert, "tls.key": key}
	if err := m.ensureCopy(ctx, sec, m.o.KEDANamespace, m.o.TriggerAuthName, corev1.SecretTypeOpaque, want); err != nil {
		return fmt.Errorf("KEDA credentials secret %s/%s: %w", m.o.KEDANamespace, m.o.TriggerAuthName, err)
	}
	refs := []any{}
	for _, pk := range [][2]string{{"caCert", "ca.crt"}, {"tlsClientCert", "tls.crt"}, {"tlsClientKey", "tls.key"}} {
		refs = append(refs, map[string]any{"parameter": pk[0], "name": m.o.TriggerAuthName, "key": pk[1]})
	}
	cta := m.o.Dynamic.Resource(ClusterTriggerAuthentications)
	existing, err := cta.Get(ctx, m.o.TriggerAuthName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if err := m.mayCreate("ClusterTriggerAuthentication", m.o.TriggerAuthName); err != nil {
			return err
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "keda.sh/v1alpha1", "kind": "ClusterTriggerAuthentication",
			"metadata": map[string]any{"name": m.o.TriggerAuthName, "labels": map[string]any{managedBy: managedByAggregator}},
			"spec":     map[string]any{"secretTargetRef": refs}}}
		obj.SetOwnerReferences(m.owners(nil))
		_, err = cta.Create(ctx, obj, metav1.CreateOptions{})
		if err == nil {
			m.o.Log.Info("ClusterTriggerAuthentication created", logging.KeyName, m.o.TriggerAuthName)
		}
	} else if err == nil {
		if err := m.notOurs("ClusterTriggerAuthentication", m.o.TriggerAuthName, existing); err != nil {
			return err
		}
		// Its spec compared whole: compared by their number, refs naming
		// another Secret or key stood, and every provisioned ScaledObject
		// failed its TLS; another way to credentials (podIdentity, an
		// env) stood beside the refs, and the chart's admission policy
		// refused every update of it.
		got, _, _ := unstructured.NestedMap(existing.Object, "spec")
		want := map[string]any{"secretTargetRef": refs}
		if unowned := m.unowned(existing.GetOwnerReferences()); !reflect.DeepEqual(got, want) || unowned {
			existing.Object["spec"] = want
			existing.SetOwnerReferences(m.owners(existing.GetOwnerReferences()))
			_, err = cta.Update(ctx, existing, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("ClusterTriggerAuthentication %s: %w", m.o.TriggerAuthName, err)
	}
	return nil
}

// current is errStale when sec is no longer the Secret's current version,
// or the read's error. A replica slow between its read and its write once
// put an older CA bundle (and KEDA's older credentials) back over a newer
// replica's, for up to an hour: the write is left to the next Ensure (Run
// tries again after copyGap). It was left to the next check, and a
// version written by no replica between publish's check and a copy's
// left that copy unwritten until then.
func (m *Managed) current(ctx context.Context, sec *corev1.Secret) error {
	now, err := m.o.Client.CoreV1().Secrets(m.o.Namespace).Get(ctx, m.o.SecretName, metav1.GetOptions{})
	switch {
	case err != nil:
		return fmt.Errorf("get certificate secret: %w", err)
	case now.ResourceVersion != sec.ResourceVersion:
		return errStale
	}
	return nil
}

// staleCheckTimeout bounds publish's read of the Secret, made while the
// watch's load waits.
const staleCheckTimeout = 10 * time.Second

// The label on everything the aggregator makes.
const (
	managedBy           = "app.kubernetes.io/managed-by"
	managedByAggregator = "pulse-aggregator"
)

// notMade is an error when an object the aggregator would write exists
// and was not made by it (it lacks the managed-by label every one it makes
// has): a user's Secret that happened to have the name chosen (KEDA's
// credentials are written into KEDA's namespace, the
// ClusterTriggerAuthentication is cluster-wide) was overwritten with
// pulse's certificates, its own data lost. It is left as it is, and the
// error says what to do.
func notMade(kind, name string, labels map[string]string) error {
	if labels[managedBy] == managedByAggregator {
		return nil
	}
	return fmt.Errorf("%s %s exists and was not made by pulse (it lacks the label %s=%s): it is left as it is; remove it, or give the aggregator another name for it", kind, name, managedBy, managedByAggregator)
}

// notOurs says why an object of pulse's name is not this release's to
// write: not made by pulse (notMade), or owned by another release's
// ClusterRole (an Owner of the same kind and another name). Two releases
// given one name (KEDA's credentials, scaler.managedCerts.triggerAuthName,
// are cluster-wide) each took the other's copy over, writing it back and
// forth every few seconds, and KEDA's TLS to one of them failed meanwhile.
// An owner of our name with another uid (our ClusterRole made again) is
// ours.
func (m *Managed) notOurs(kind, name string, obj metav1.Object) error {
	if err := notMade(kind, name, obj.GetLabels()); err != nil {
		return err
	}
	if m.o.Owner == nil {
		return nil
	}
	// The first owner of the kind is the release that made it (owners
	// adds ours after any there): a copy the two releases fought over
	// before carries both, and each refused it, for good, its
	// credentials left to expire.
	for _, r := range obj.GetOwnerReferences() {
		if r.Kind != m.o.Owner.Kind || r.APIVersion != m.o.Owner.APIVersion {
			continue
		}
		if r.Name != m.o.Owner.Name {
			return fmt.Errorf("%s %s is another release's (owned by %s %s, not this release's %s): it is left as it is; give this release another name for it", kind, name, r.Kind, r.Name, m.o.Owner.Name)
		}
		return nil
	}
	return nil
}

// unowned reports whether an Owner is set and refs lack it.
func (m *Managed) unowned(refs []metav1.OwnerReference) bool {
	owner := m.ownerRef()
	if owner == nil {
		return false
	}
	for _, r := range refs {
		if r.UID == owner.UID {
			return false
		}
	}
	return true
}

// owners returns refs with the Owner added (once).
func (m *Managed) owners(refs []metav1.OwnerReference) []metav1.OwnerReference {
	if m.unowned(refs) {
		return append(refs, *m.ownerRef())
	}
	return refs
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if !bytes.Equal(a[k], v) {
			return false
		}
	}
	return true
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// caKey is the key of a CA whose certificate is in certPEM: an error when
// it is unreadable, or not that certificate's (x509.CreateCertificate
// refuses it: every renewal failed, every 10 s, until the certificates
// expired and no replica was ready).
func caKey(certPEM, keyPEM []byte) (*ecdsa.PrivateKey, error) {
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if c, err := parseCert(certPEM); err == nil && !key.PublicKey.Equal(c.PublicKey) {
		return nil, errors.New("the key is not its CA certificate's")
	}
	return key, nil
}

// certsPEM is the certificate of each of pems in PEM, each re-encoded
// from what parses: anything else a hand-edited entry holds (a private
// key pasted after its certificate) is not passed on.
func certsPEM(pems ...[]byte) []byte {
	var out []byte
	for _, b := range pems {
		if c, err := parseCert(b); err == nil {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	return out
}

// pairPEM is a pair's certificates and key as copied out of the Secret (to
// KEDA's namespace, to the relays'): as tls.X509KeyPair reads the pair (as
// due judges it), each encoded again, and nothing else the Secret's values
// hold. Copied as they were, a CA key pasted after a pair's certificate by
// hand (which tls.X509KeyPair passes over, so the pair still read as
// sound) went on to KEDA's namespace and the relays' Secret, where any
// relay pod could mint KEDA's certificates (found in a review,
// 2026-12-07). An EC key is written as the pair's own are (SEC1), any
// other as PKCS #8; a pair that does not load is copied as it is (due
// issues it again).
func pairPEM(cert, key []byte) (certOut, keyOut []byte) {
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return cert, key
	}
	for _, der := range pair.Certificate {
		certOut = append(certOut, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	var der []byte
	typ := "EC PRIVATE KEY"
	if k, ok := pair.PrivateKey.(*ecdsa.PrivateKey); ok {
		der, err = x509.MarshalECPrivateKey(k)
	} else {
		typ = "PRIVATE KEY"
		der, err = x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	}
	if err != nil {
		return certOut, key
	}
	return certOut, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// issue makes a certificate: self-signed when parent is nil.
func issue(parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string, now time.Time, validity time.Duration, isCA bool,
	usage x509.ExtKeyUsage, dns []string, ips []net.IP) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-certBackdate), NotAfter: now.Add(validity), DNSNames: dns, IPAddresses: ips,
		KeyUsage: x509.KeyUsageDigitalSignature}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}
