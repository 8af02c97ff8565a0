// Package provision keeps a ScaledObject for every workload annotated
// pulse.io/autoscale: "true" (or with keda-kaito-scaler's
// scaledobject.kaito.sh/auto-provision): an external-push trigger on the
// aggregator, the metric, threshold and window, replica bounds and a tuned
// HPA behaviour, all from the workload's annotations with measured defaults.
// It acts only while its replica holds the Lease (leader.go).
package provision

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/planner"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Kind is a kind of workload the controller watches, where the cluster
// serves it.
type Kind struct{ Group, Resource, Kind string }

// Kinds are the workloads pulse provisions for, in the order checked.
var Kinds = []Kind{
	{"kaito.sh", "workspaces", "Workspace"},
	{"kaito.sh", "inferencesets", "InferenceSet"},
	{"apps", "deployments", "Deployment"},
	{"apps", "statefulsets", "StatefulSet"},
	{"leaderworkerset.x-k8s.io", "leaderworkersets", "LeaderWorkerSet"},
}

// Options configure a Controller.
type Options struct {
	// Metadata watches the workloads (their metadata only: the
	// annotations are all that is read).
	Metadata metadata.Interface
	// Dynamic reads and writes ScaledObjects.
	Dynamic dynamic.Interface
	// Discovery finds which kinds the cluster serves, and at which version.
	Discovery discovery.DiscoveryInterface
	// Events records what was done on the workloads.
	Events typedcorev1.EventsGetter
	Target Target
	// MaxWindow is the aggregator's --max-window (bounds pulse.io/window).
	MaxWindow time.Duration
	// MetricMeant, when set, is the name a metric no agent forwards is
	// within a typo of ("" for none: scaler.Server.MetricMeant); such a
	// pulse.io/metric is invalid.
	MetricMeant func(name string) string
	Log         *slog.Logger
	// Resync re-checks every workload this often (repairs edits of the
	// ScaledObjects pulse keeps); default 10m.
	Resync time.Duration
	// Rediscover looks for kinds installed since the start this often;
	// default 1m.
	Rediscover time.Duration
	// SyncTimeout bounds the first list of ScaledObjects (KEDA's CRD not
	// installed, or the aggregator not allowed to list them); default 2m.
	SyncTimeout time.Duration
	// MaxReplicas caps the replica bounds an annotation may ask for (0:
	// none but 10,000; ApplyCap).
	MaxReplicas int64
}

// Controller provisions ScaledObjects.
type Controller struct {
	o     Options
	m     *metrics
	runMu sync.Mutex // one Run at a time

	mu     sync.Mutex
	status map[key]Status
	// counts: the workloads in status by state, kept as status changes
	// (counting them at each change was quadratic in the workloads).
	counts   map[string]int
	leading  bool
	holder   string
	identity string
}

// key is a workload.
type key struct{ Kind, Namespace, Name string }

// String writes the workload as pulse writes every workload (store.Key's
// String): "Workspace demo/llama".
func (k key) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

// Status is what the controller last did for a workload, for the debug
// endpoint.
type Status struct {
	Kind         string    `json:"kind"`
	Namespace    string    `json:"namespace"`
	Name         string    `json:"name"`
	State        string    `json:"state"`
	ScaledObject string    `json:"scaledObject"`
	Message      string    `json:"message"`
	Since        time.Time `json:"since"`
}

// States of a workload.
const (
	StateProvisioned = "provisioned"
	StateInvalid     = "invalid"
	StateConflict    = "conflict"
	StateError       = "error"
)

// New makes a controller; reg (if not nil) gets its metrics.
func New(o Options, reg prometheus.Registerer) *Controller {
	if o.Resync <= 0 {
		o.Resync = 10 * time.Minute
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 2 * time.Minute
	}
	if o.Rediscover <= 0 {
		o.Rediscover = time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{o: o, status: map[key]Status{}, counts: map[string]int{}}
	c.m = newMetrics(c)
	if reg != nil {
		reg.MustRegister(c.m.collectors()...)
	}
	return c
}

// run is one leadership term's state.
type run struct {
	c         *Controller
	queue     workqueue.TypedRateLimitingInterface[key]
	recorder  record.EventRecorder
	events    eventLimiter // Events by namespace (eventQPS)
	sos       cache.SharedIndexInformer
	workloads map[string]*watched // by kind
	mu        sync.Mutex
	// rewrites: when the worker last wrote back what it had written
	// before (within rewriteWindow); wrote: what it last wrote of each
	// workload's ScaledObject (writeOf). The worker's alone.
	rewrites map[key][]time.Time
	wrote    map[key][sha256.Size]byte
	// kept: of each ScaledObject pulse last wrote, the spec it wrote and
	// the spec the API server kept of it (specHash): they differ where the
	// server prunes what its KEDA CRD does not have (behavior tolerance
	// before KEDA 2.18), and a spec kept so is as desired (keptAsWritten).
	kept         map[key]keptSpec
	warnedPruned bool
}

// keptSpec is the spec hash pulse wrote and the one the server kept.
type keptSpec struct{ wrote, got string }

// A ScaledObject that pulse wrote back rewriteLimit times within
// rewriteWindow — made, updated or deleted again as it was before, the
// workload asking for nothing new — has another writer undoing pulse's (a
// provisioner of another release, a GitOps tool's self-heal, a clean-up
// policy): pulse reports the conflict and backs off for
// the rest of the window (retrying with growing delays), then writes again,
// rather than fight it at the API server's pace, an Event and an etcd write
// a round: a writer that keeps undoing it costs about rewriteLimit updates
// a minute or two, for as long as it keeps on.
const (
	rewriteLimit  = 5
	rewriteWindow = time.Minute
)

// errBackOff: the workload is retried later, with growing delays.
var errBackOff = errors.New("backing off")

type watched struct {
	gv       schema.GroupVersion
	informer cache.SharedIndexInformer
	stop     context.CancelFunc // ends the informer
}

// Run provisions until ctx ends. Run it while leading (RunElected).
func (c *Controller) Run(ctx context.Context) error {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	c.clearStatus() // what a run before this one saw may have changed since
	defer c.clearStatus()
	// The informers run for this run only: one that failed to list
	// ScaledObjects returned with its informer still listing on the
	// caller's context, and --leader-elect=false runs again every minute on
	// that context (a reflector more each minute, each a copy of every
	// ScaledObject once the list worked).
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.o.Events.Events("")})
	defer broadcaster.Shutdown()
	r := &run{c: c, workloads: map[string]*watched{}, rewrites: map[key][]time.Time{}, wrote: map[key][sha256.Size]byte{}, kept: map[key]keptSpec{},
		queue:    newQueue(),
		recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "pulse-aggregator"})}
	// The worker is done before the states are cleared: a reconcile still
	// running would report after the clear, on a replica no longer leading.
	var worker sync.WaitGroup
	defer func() {
		r.queue.ShutDown()
		worker.Wait()
	}()

	r.sos = dynamicinformer.NewFilteredDynamicInformer(c.o.Dynamic, ScaledObjects, metav1.NamespaceAll, c.o.Resync,
		cache.Indexers{byTarget: targetIndex}, nil).Informer()
	if err := r.sos.SetTransform(trimScaledObject); err != nil {
		return err
	}
	if _, err := r.sos.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: r.scaledObjectChanged,
		UpdateFunc: func(old, o any) {
			if !statusOnly(old, o) {
				// The old copy's workloads too: a ScaledObject that
				// blocked one and now scales another (or has another
				// owner) unblocks it at once, not at the next resync.
				r.scaledObjectChanged(old)
				r.scaledObjectChanged(o)
			}
		},
		DeleteFunc: r.scaledObjectChanged,
	}); err != nil {
		return err
	}
	go r.sos.Run(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, c.o.SyncTimeout)
	synced := cache.WaitForCacheSync(sctx.Done(), r.sos.HasSynced)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil
	case !synced:
		// The Lease was held, renewed, and nothing provisioned, silently.
		c.m.errors.WithLabelValues("sync").Inc()
		return fmt.Errorf("ScaledObjects not listed within %s: is KEDA's CRD installed, and may the aggregator list and watch scaledobjects.keda.sh?", c.o.SyncTimeout)
	}
	r.discover(ctx)
	worker.Add(1)
	go func() {
		defer worker.Done()
		for r.processNext(ctx) {
		}
	}()
	t := time.NewTicker(c.o.Rediscover)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.discover(ctx)
		}
	}
}

// discover starts an informer for each kind the cluster now serves, and
// one at the version served for a kind watched at another (its version
// retired, or another preferred: the informer of a version no longer
// served listed nothing for the rest of the term, and no annotated
// workload of the kind was provisioned, changed or let go).
func (r *run) discover(ctx context.Context) {
	for _, k := range Kinds {
		r.mu.Lock()
		w := r.workloads[k.Kind]
		r.mu.Unlock()
		gv, err := served(r.c.o.Discovery, k)
		switch {
		case err != nil && w == nil:
			r.c.o.Log.Debug("kind not served", logging.KeyKind, k.Kind, logging.KeyErr, err)
			continue
		case err != nil || w != nil && w.gv == gv:
			// (A kind watched and not served now, its CRD being
			// replaced, keeps its informer: it lists again once served.)
			continue
		case w != nil:
			r.c.o.Log.Info("workloads served at another version: watched at it", logging.KeyKind, k.Kind, logging.KeyVersion, gv.String(), "was", w.gv.String())
			w.stop()
			r.mu.Lock()
			delete(r.workloads, k.Kind)
			r.mu.Unlock()
		}
		inf := metadatainformer.NewFilteredMetadataInformer(r.c.o.Metadata, gv.WithResource(k.Resource), metav1.NamespaceAll,
			r.c.o.Resync, cache.Indexers{}, nil).Informer()
		if err := inf.SetTransform(trimWorkload); err != nil {
			r.c.o.Log.Error("watch", logging.KeyKind, k.Kind, logging.KeyErr, err)
			continue
		}
		kind := k.Kind
		// A kind served and not listable (the aggregator's role lacks it)
		// gave its annotated workloads no state, Event or error: client-go's
		// own log alone said so, at each of its retries.
		var lastErr string
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			r.c.m.errors.WithLabelValues("watch").Inc()
			if msg := err.Error(); msg != lastErr { // the reflector's goroutine alone calls it
				lastErr = msg
				r.c.o.Log.Warn("workloads not listed or watched: those annotated pulse.io/autoscale are not provisioned until they are",
					logging.KeyKind, kind, logging.KeyErr, err)
			}
		}); err != nil {
			r.c.o.Log.Error("watch", logging.KeyKind, kind, logging.KeyErr, err)
			continue
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { r.workloadChanged(kind, o) },
			UpdateFunc: func(old, o any) {
				if annotationsChanged(old, o) {
					r.workloadChanged(kind, o)
				}
			},
			DeleteFunc: func(o any) { r.workloadChanged(kind, o) },
		}); err != nil {
			r.c.o.Log.Error("watch", logging.KeyKind, kind, logging.KeyErr, err)
			continue
		}
		ictx, stop := context.WithCancel(ctx)
		r.mu.Lock()
		r.workloads[kind] = &watched{gv: gv, informer: inf, stop: stop}
		r.mu.Unlock()
		go inf.Run(ictx.Done())
		r.c.o.Log.Info("watching workloads for pulse.io/autoscale", logging.KeyKind, kind, logging.KeyVersion, gv.String())
	}
}

// trimWorkload is what the cache keeps of a workload: its name, namespace,
// uid and resource version, and of its annotations only pulse's and
// keda-kaito-scaler's, each value past maxAnnotationValue bytes cut there
// and marked (Parse refuses it as too long all the same: a value cut alone,
// "true" and 300 spaces and "x", trimmed again to "true", was taken where
// pulsectl check refuses it). Every Deployment,
// StatefulSet, ... of the cluster is watched, annotated or not: one
// tenant's thousands of workloads with 256 KiB annotations
// (last-applied-configuration) were all held, and with them other
// tenants' configurations, in the process that answers KEDA.
func trimWorkload(o any) (any, error) {
	m, ok := o.(*metav1.PartialObjectMetadata)
	if !ok {
		return o, nil // a tombstone: its object was trimmed when cached
	}
	var kept map[string]string
	// Of the keys pulse does not read, the typos Parse would name: its
	// first of the provisioner's annotations, and of autoscale's alone
	// (for a workload not enabled).
	typo, _ := firstTypo(m.Annotations, provisionerTypos)
	autoscaleTypo, _ := firstTypo(m.Annotations, autoscaleTypos)
	// Of keda-kaito-scaler's keys not read, the names Parse would name.
	unread := ignoredKaito(m.Annotations)
	for k, v := range m.Annotations {
		if slices.Contains(unread, k) {
			v = "" // named, not read
		} else if !annotationsRead[k] && k != typo && k != autoscaleTypo {
			continue // another's, or a pulse.io/ key pulse does not read
		}
		if v = strings.TrimSpace(v); len(v) > maxAnnotationValue {
			v = v[:maxAnnotationValue] + "…"
		}
		if kept == nil {
			kept = map[string]string{}
		}
		kept[k] = v
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, DeletionTimestamp: m.DeletionTimestamp, Annotations: kept}}, nil
}

// trimScaledObject is what the cache keeps of a ScaledObject, whoever
// wrote it: its identity and versions, pulse's label, its controller, its
// scaleTargetRef's kind and name (each name cut past 253 bytes: longer
// names no object Kubernetes serves), and, of one with pulse's label, a
// hash of its spec (specHash) to tell whether it is as pulse wants it. An
// update reads the live object first (reconcile). Any tenant may put pulse's
// label on its own ScaledObjects, and a tenant's labels, owners and
// scaleTargetRef are its to size: such ScaledObjects were held whole (800
// KiB and 1.3 MiB each, in the process that answers KEDA).
func trimScaledObject(o any) (any, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return o, nil // a tombstone: its object was trimmed when cached
	}
	out := scaler.TrimmedScaledObject(u)
	// Being deleted (KEDA's finalizer holds it while it restores the
	// target's scale): gone for disable, and not provisioned (reconcile).
	out.SetDeletionTimestamp(u.GetDeletionTimestamp())
	if Managed(u) {
		out.SetLabels(map[string]string{LabelManagedBy: ManagedBy})
		out.Object[specHashKey] = specHash(u.Object["spec"])
	}
	if ref := metav1.GetControllerOf(u); ref != nil {
		out.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: scaler.CutName(ref.APIVersion), Kind: scaler.CutName(ref.Kind), Name: scaler.CutName(ref.Name),
			UID: types.UID(scaler.CutName(string(ref.UID))), Controller: ref.Controller}})
	}
	return out, nil
}

// specHashKey holds, in the cache's copy of a ScaledObject with pulse's
// label, the hash of its spec (no field of the API's).
const specHashKey = "pulseSpecHash"

// specHash is a hash of a ScaledObject's spec as written by anyone
// (canonical).
func specHash(spec any) string {
	b, _ := json.Marshal(canonical(spec)) // maps are written in key order
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// served returns the version at which the cluster serves k, preferring the
// group's preferred version.
func served(d discovery.DiscoveryInterface, k Kind) (schema.GroupVersion, error) {
	groups, err := d.ServerGroups()
	if err != nil {
		return schema.GroupVersion{}, err
	}
	for _, g := range groups.Groups {
		if g.Name != k.Group {
			continue
		}
		versions := []string{g.PreferredVersion.Version}
		for _, v := range g.Versions {
			versions = append(versions, v.Version)
		}
		for _, v := range versions {
			gv := schema.GroupVersion{Group: k.Group, Version: v}
			list, err := d.ServerResourcesForGroupVersion(gv.String())
			if err != nil {
				continue
			}
			for _, res := range list.APIResources {
				if res.Name == k.Resource {
					return gv, nil
				}
			}
		}
	}
	return schema.GroupVersion{}, fmt.Errorf("%s.%s is not served", k.Resource, k.Group)
}

// annotationsChanged: a workload's status changes often; only its
// annotations, its deletion beginning (a finalizer, Kaito's, or a
// foreground deletion keeps it a while, its annotations as they were:
// the update was dropped, and the workload said provisioned until the
// resync) or a resync (same resourceVersion) matter here.
func annotationsChanged(old, o any) bool {
	a, okA := old.(metav1.Object)
	b, okB := o.(metav1.Object)
	if !okA || !okB || a.GetResourceVersion() == b.GetResourceVersion() || a.GetUID() != b.GetUID() {
		return true
	}
	return !maps.Equal(a.GetAnnotations(), b.GetAnnotations()) ||
		(a.GetDeletionTimestamp() == nil) != (b.GetDeletionTimestamp() == nil)
}

func objectOf(o any) (metav1.Object, bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, ok := o.(metav1.Object)
	return m, ok
}

func (r *run) workloadChanged(kind string, o any) {
	if m, ok := objectOf(o); ok {
		r.queue.Add(key{kind, m.GetNamespace(), m.GetName()})
	}
}

// scaledObjectChanged queues the workloads a ScaledObject may concern: its
// owner, its target, and any workload of its name (whose own ScaledObject
// it may block or, deleted, unblock).
func (r *run) scaledObjectChanged(o any) {
	m, ok := objectOf(o)
	if !ok {
		return
	}
	ns := m.GetNamespace()
	if ref := metav1.GetControllerOf(m); ref != nil {
		r.queue.Add(key{ref.Kind, ns, ref.Name})
	}
	if u, ok := m.(*unstructured.Unstructured); ok {
		if kind, name := targetOf(u); name != "" {
			r.queue.Add(key{kind, ns, name})
		}
	}
	for _, k := range Kinds {
		r.queue.Add(key{k.Kind, ns, m.GetName()})
	}
}

func (r *run) processNext(ctx context.Context) bool {
	k, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(k)
	if err := r.reconcile(ctx, k); err != nil {
		if errors.Is(err, errBackOff) {
			r.queue.AddRateLimited(k)
			return true
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			// Changed under us (KEDA adds its label and finalizer): again,
			// from the informer's newer copy.
			r.c.o.Log.Debug("changed meanwhile; again", logging.KeyWorkload, k.String(), logging.KeyErr, err)
			r.queue.AddRateLimited(k)
			return true
		}
		if ctx.Err() != nil {
			return true // no longer leading: not a failure to report
		}
		r.c.m.errors.WithLabelValues("api").Inc()
		r.failed(k, err)
		r.queue.AddRateLimited(k)
		return true
	}
	r.queue.Forget(k)
	return true
}

// live is k's workload in the cache and the version it is served at; none
// when its kind is not watched, or it is gone or being deleted (in the
// foreground, or waiting on a finalizer), and then it is forgotten: the
// garbage collector deletes its ScaledObject, which would otherwise be made
// again at each of its deletions until the workload is gone.
func (r *run) live(k key) (metav1.Object, schema.GroupVersion, error) {
	r.mu.Lock()
	w := r.workloads[k.Kind]
	r.mu.Unlock()
	if w == nil {
		return nil, schema.GroupVersion{}, nil // a ScaledObject's target of a kind not watched
	}
	obj, exists, err := w.informer.GetIndexer().GetByKey(k.Namespace + "/" + k.Name)
	if err != nil {
		return nil, w.gv, err
	}
	var m metav1.Object
	if exists {
		var ok bool
		if m, ok = obj.(metav1.Object); !ok {
			return nil, w.gv, fmt.Errorf("%s %s/%s: unexpected %T", k.Kind, k.Namespace, k.Name, obj)
		}
	}
	if m == nil || m.GetDeletionTimestamp() != nil {
		delete(r.rewrites, k)
		delete(r.wrote, k)
		delete(r.kept, k)
		r.c.forget(k)
		return nil, w.gv, nil
	}
	return m, w.gv, nil
}

// settings are workload k's annotations (of m) read, its name and metric
// checked, and the operator's cap applied; capped: refused for the cap
// alone. The name and metric are checked whatever the cap says: past it,
// a misspelt metric was written to the ScaledObject held at the cap
// (holdAtCap), in place of the trigger that worked.
func (r *run) settings(k key, m metav1.Object) (s Settings, capped bool, perr error) {
	s, perr = Parse(Workload(k), m.GetAnnotations(), r.c.o.MaxWindow)
	if perr != nil {
		return s, false, perr
	}
	capErr := ApplyCap(&s, r.c.o.MaxReplicas)
	if s.Enabled {
		perr = CheckName(k.Name)
	}
	if perr == nil && s.Enabled && r.c.o.MetricMeant != nil {
		// A misspelt vLLM name was provisioned as a gauge to forward,
		// and every answer of its trigger was then refused.
		if meant := r.c.o.MetricMeant(s.Parsed.Metric); meant != "" {
			perr = &AnnotationError{AnnotationMetric, fmt.Sprintf("no agent forwards %q, and it is within a typo of %s: did you mean %s? (a gauge forwarded with the agents' --extra-metric under that name is taken; checked again at the workload's next change or within the resync)", s.Parsed.Metric, meant, meant)}
		}
	}
	if perr != nil {
		return s, false, perr
	}
	return s, capErr != nil, capErr
}

// reconcile brings one workload's ScaledObject to what its annotations say.
func (r *run) reconcile(ctx context.Context, k key) error {
	m, gv, err := r.live(k)
	if m == nil || err != nil {
		return err
	}
	ref := &corev1.ObjectReference{APIVersion: gv.String(), Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, UID: m.GetUID()}
	s, capped, perr := r.settings(k, m)
	existing, err := r.scaledObject(k.Namespace, k.Name)
	if err != nil {
		return err
	}
	if perr == nil && !s.Enabled {
		return r.disable(ctx, k, ref, existing)
	}
	soName := k.Namespace + "/" + k.Name
	if existing != nil && existing.GetDeletionTimestamp() != nil && perr == nil {
		// Neither to update nor to create over: once it is gone, its
		// delete event brings the workload back here. It read as
		// provisioned (for as long as KEDA's operator was down).
		r.report(k, ref, StateError, soName, fmt.Sprintf("ScaledObject %s is being deleted (its finalizers, KEDA's while it restores the workload's scale): provisioned again once it is gone", soName))
		return nil
	}
	if perr != nil {
		r.c.m.errors.WithLabelValues("invalid_annotation").Inc()
		if capped {
			return r.holdAtCap(ctx, k, m, ref, gv.String(), existing, s, perr)
		}
		r.report(k, ref, StateInvalid, soName, perr.Error()+"; the ScaledObject is left as it was")
		return nil
	}
	if msg := r.conflict(k, m, existing); msg != "" {
		r.c.m.errors.WithLabelValues("conflict").Inc()
		r.report(k, ref, StateConflict, soName, msg)
		return nil
	}
	desired := Desired(Owner{APIVersion: gv.String(), Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, UID: m.GetUID()}, s, r.c.o.Target)
	client := r.c.o.Dynamic.Resource(ScaledObjects).Namespace(k.Namespace)
	// What the state says, Events too: a Workspace's note (it scales
	// 0 <-> 1 only) and the keda-kaito-scaler annotations not read were in
	// the debug endpoint alone, which listens on the pod's loopback.
	summary := provisionedSummary(k, s)
	if !r.differs(k, existing, desired) {
		r.report(k, ref, StateProvisioned, soName, summary)
		return nil
	}
	verb := map[bool]string{true: "create", false: "update"}[existing == nil]
	write := writeOf(desired)
	if n, ok := r.mayWrite(k, write); !ok {
		r.c.m.errors.WithLabelValues("conflict").Inc()
		r.report(k, ref, StateConflict, soName, fmt.Sprintf("pulse %sd ScaledObject %s as it was %d times within %s: something else keeps %s it "+
			"(a provisioner of another release, a GitOps tool's self-heal, a clean-up policy); pulse backs off for the rest of the minute, then writes it again",
			verb, soName, n, rewriteWindow, map[bool]string{true: "deleting", false: "changing"}[existing == nil]))
		return errBackOff
	}
	if existing == nil {
		wrote := specHash(desired.Object["spec"])
		made, err := client.Create(ctx, desired, metav1.CreateOptions{FieldManager: "pulse-aggregator"})
		if err != nil {
			return fmt.Errorf("create ScaledObject %s: %w", soName, err)
		}
		r.keep(k, wrote, made)
		r.eventf(ref, corev1.EventTypeNormal, "ScaledObjectCreated", "created ScaledObject %s: %s", k.Name, summary)
	} else {
		did, err := r.update(ctx, k, m, ref, existing, desired, summary)
		switch {
		case err != nil:
			return err
		case did == asDesired:
			r.report(k, ref, StateProvisioned, soName, summary)
			return nil
		case did != wrote:
			return nil
		}
	}
	r.didWrite(k, write)
	r.c.m.changes.WithLabelValues(verb).Inc()
	r.report(k, ref, StateProvisioned, soName, summary)
	return nil
}

// holdAtCap answers a workload whose annotations ask for more replicas
// than the cluster's cap (perr, from ApplyCap): invalid, and pulse's
// ScaledObject for it, where there is one, is written as the annotations
// say with its bounds held at the cap. Left as it was, one written before
// the cap was set or lowered (or by a leader without it, in a rollout)
// kept its bounds past the cap for as long as the tenant left the
// annotation alone: the operator's cap bounded nothing already written.
// With none, none is made.
func (r *run) holdAtCap(ctx context.Context, k key, m metav1.Object, ref *corev1.ObjectReference, apiVersion string,
	existing *unstructured.Unstructured, s Settings, perr error) error {
	soName := k.Namespace + "/" + k.Name
	if existing == nil || existing.GetDeletionTimestamp() != nil || r.conflict(k, m, existing) != "" {
		r.report(k, ref, StateInvalid, soName, perr.Error()+"; the ScaledObject is left as it was")
		return nil
	}
	limit := r.c.o.MaxReplicas
	s.MinReplicas, s.MaxReplicas = min(s.MinReplicas, limit), min(s.MaxReplicas, limit)
	desired := Desired(Owner{APIVersion: apiVersion, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, UID: m.GetUID()}, s, r.c.o.Target)
	if r.differs(k, existing, desired) {
		write := writeOf(desired)
		if _, ok := r.mayWrite(k, write); !ok {
			return errBackOff
		}
		did, err := r.update(ctx, k, m, ref, existing, desired, provisionedSummary(k, s))
		switch {
		case err != nil:
			return err
		case did == conflicted || did == goneSince:
			return nil // nothing held: a conflict said so, a delete comes back here
		case did == wrote:
			r.didWrite(k, write)
			r.c.m.changes.WithLabelValues("update").Inc()
		}
	}
	r.report(k, ref, StateInvalid, soName, fmt.Sprintf("%v; the ScaledObject's replica bounds are held at the cap (%d)", perr, limit))
	return nil
}

// outcome is what update did with a ScaledObject.
type outcome int

const (
	wrote      outcome = iota + 1 // written, with an Event (0: none, with an error)
	asDesired                     // already as desired, or kept by the server as it was
	conflicted                    // another's (reported)
	goneSince                     // deleted since the cache saw it
)

// update writes desired over the ScaledObject existing (the cache's copy
// of it) as the API server has it, and says what it did; of the
// workload's state it reports a conflict alone, which it finds: the rest
// is its caller's (holdAtCap's workload is invalid whatever it did; until
// 2026-12-06 update reported it provisioned on the way).
func (r *run) update(ctx context.Context, k key, m metav1.Object, ref *corev1.ObjectReference, existing, desired *unstructured.Unstructured, summary string) (outcome, error) {
	soName := k.Namespace + "/" + k.Name
	client := r.c.o.Dynamic.Resource(ScaledObjects).Namespace(k.Namespace)
	// The cache holds a projection (trimScaledObject): the update is of
	// the object as the API server has it, others' labels, annotations,
	// finalizers and owners kept.
	live, err := client.Get(ctx, k.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Deleted since the cache saw it: its delete event brings the
		// workload back here, to create it (it was reported an error of
		// the API server's, with a warning Event).
		return goneSince, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read ScaledObject %s: %w", soName, err)
	}
	if live.GetUID() != existing.GetUID() {
		return 0, apierrors.NewConflict(ScaledObjects.GroupResource(), k.Name, errors.New("replaced since it was cached"))
	}
	// Judged again as the API server has it: a tenant that took it over
	// (pulse's label taken off, as a conflict's message says) a moment
	// before had it labelled again and overwritten, the cache not yet
	// told.
	if msg := r.conflict(k, m, live); msg != "" {
		r.c.m.errors.WithLabelValues("conflict").Inc()
		r.report(k, ref, StateConflict, soName, msg)
		return conflicted, nil
	}
	out, changed := Apply(live, desired)
	if !changed {
		return asDesired, nil
	}
	out.SetManagedFields(nil) // the server keeps those an update leaves out
	hash := specHash(desired.Object["spec"])
	updated, err := client.Update(ctx, out, metav1.UpdateOptions{FieldManager: "pulse-aggregator"})
	if err != nil {
		return 0, fmt.Errorf("update ScaledObject %s: %w", soName, err)
	}
	r.keep(k, hash, updated)
	if keptAsItWas(live, updated) {
		// The server kept it as it was: what pulse wrote differs only in
		// what its KEDA CRD prunes (tolerance before 2.18), which a new
		// term, not knowing what the server kept, wrote once again. No
		// change: no Event, nothing counted.
		return asDesired, nil
	}
	r.eventf(ref, corev1.EventTypeNormal, "ScaledObjectUpdated", "updated ScaledObject %s: %s", k.Name, summary)
	return wrote, nil
}

// keptAsItWas says the API server's answer to an update, updated, is the
// object it had, live, in all an update of pulse's changes: the spec (as
// canonical reads it), the labels and the owners.
func keptAsItWas(live, updated *unstructured.Unstructured) bool {
	return equalJSON(canonical(live.Object["spec"]), canonical(updated.Object["spec"])) &&
		maps.Equal(live.GetLabels(), updated.GetLabels()) &&
		equality.Semantic.DeepEqual(live.GetOwnerReferences(), updated.GetOwnerReferences())
}

// provisionedSummary is what a provisioned workload's state says.
func provisionedSummary(k key, s Settings) string {
	summary := Summary(s)
	if len(s.Ignored) > 0 {
		summary += fmt.Sprintf("; not read (keda-kaito-scaler's, which pulse does not take): %v", s.Ignored)
	}
	for _, u := range s.Unused {
		summary += "; " + u
	}
	if k.Kind == "Workspace" {
		summary += "; " + workspaceNote
	}
	return summary
}

// writeOf identifies a write of desired (deleted: a delete), to tell a
// write back of what pulse wrote before from one the workload asked for.
func writeOf(desired *unstructured.Unstructured) [sha256.Size]byte {
	if desired == nil {
		return [sha256.Size]byte{}
	}
	b, _ := json.Marshal(desired.Object) // maps are written in key order
	return sha256.Sum256(b)
}

// mayWrite says whether the worker may write w for k now: it may, unless
// w is what it wrote last (something undid it) and it already wrote back
// rewriteLimit times within rewriteWindow; n is that count.
func (r *run) mayWrite(k key, w [sha256.Size]byte) (n int, ok bool) {
	if last, had := r.wrote[k]; !had || last != w {
		return 0, true
	}
	n = r.rewritten(k, time.Now())
	return n, n < rewriteLimit
}

// didWrite records a write of w for k: a write back when it was the last
// one too.
func (r *run) didWrite(k key, w [sha256.Size]byte) {
	if last, had := r.wrote[k]; had && last == w {
		r.rewrites[k] = append(r.rewrites[k], time.Now())
	}
	r.wrote[k] = w
}

// rewritten is how many times the worker wrote k's ScaledObject back
// within rewriteWindow before now (older writes forgotten).
func (r *run) rewritten(k key, now time.Time) int {
	times := r.rewrites[k]
	i := 0
	for i < len(times) && now.Sub(times[i]) > rewriteWindow {
		i++
	}
	if times = times[i:]; len(times) == 0 {
		delete(r.rewrites, k)
		return 0
	}
	r.rewrites[k] = times
	return len(times)
}

// differs says whether existing, as the cache holds it, is not desired:
// none, or its spec, pulse's label or its controller not desired's.
func (r *run) differs(k key, existing, desired *unstructured.Unstructured) bool {
	if existing == nil {
		return true
	}
	return !r.keptAsWritten(k, existing, desired) || !Managed(existing) ||
		!ownedAs(existing, desired.GetOwnerReferences()[0])
}

// keptAsWritten reports whether existing's spec is desired's, or what the
// API server kept of it when pulse last wrote it: a field its KEDA CRD
// does not have is pruned, and the spec never equalled what pulse wrote
// (an update and an Event at every resync, for ever).
func (r *run) keptAsWritten(k key, existing, desired *unstructured.Unstructured) bool {
	have, want := existing.Object[specHashKey], specHash(desired.Object["spec"])
	if have == want {
		return true
	}
	kp, ok := r.kept[k]
	return ok && kp.wrote == want && have == kp.got
}

// keep records what the server kept, got, of the spec written (its
// specHash, taken before the write); the first spec pruned is warned of.
func (r *run) keep(k key, wrote string, got *unstructured.Unstructured) {
	kp := keptSpec{wrote: wrote, got: specHash(got.Object["spec"])}
	r.kept[k] = kp
	if kp.wrote != kp.got && !r.warnedPruned {
		r.warnedPruned = true
		r.c.o.Log.Warn("the API server keeps a ScaledObject without some of what pulse wrote (its KEDA CRD prunes fields it does not have: behavior tolerance before KEDA 2.18); taken as provisioned as kept",
			logging.KeyWorkload, k.String())
	}
}

// disable deletes the ScaledObject pulse made for a workload whose
// annotation is gone or "false": the workload's own, or one it would adopt
// (an orphan of its predecessor of the same name), which otherwise kept
// scaling it with its predecessor's settings.
func (r *run) disable(ctx context.Context, k key, ref *corev1.ObjectReference, existing *unstructured.Unstructured) error {
	mine := func(so *unstructured.Unstructured) bool {
		// One being deleted is gone: deleted again, it counted as a write
		// back, and toggling the annotation read as another writer's fight.
		return so != nil && so.GetDeletionTimestamp() == nil && Managed(so) && (OwnedBy(so, ref.UID) || adopts(k, so))
	}
	if mine(existing) {
		// Judged again as the API server has it, and deleted only as read
		// (its resourceVersion a precondition), as update does: a tenant
		// that took it over (pulse's label taken off, as a conflict's
		// message says) a moment before the workload was turned off had it
		// deleted, the cache not yet told.
		client := r.c.o.Dynamic.Resource(ScaledObjects).Namespace(k.Namespace)
		live, err := client.Get(ctx, k.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			r.c.forget(k)
			return nil
		}
		if err != nil {
			return fmt.Errorf("read ScaledObject %s/%s: %w", k.Namespace, k.Name, err)
		}
		if live.GetUID() != existing.GetUID() {
			return apierrors.NewConflict(ScaledObjects.GroupResource(), k.Name, errors.New("replaced since it was cached"))
		}
		if !mine(live) {
			r.c.forget(k)
			return nil
		}
		// A delete again counts as a write back: a writer that makes it
		// again (a GitOps tool's self-heal of an exported copy) is not
		// fought at the API server's pace either.
		if n, ok := r.mayWrite(k, writeOf(nil)); !ok {
			r.c.m.errors.WithLabelValues("conflict").Inc()
			r.report(k, ref, StateConflict, k.Namespace+"/"+k.Name, fmt.Sprintf("pulse deleted ScaledObject %s/%s again %d times within %s: something else keeps making it again "+
				"(a GitOps tool's self-heal); pulse backs off for the rest of the minute, then deletes it again (remove its label %s=%s to hand it over)",
				k.Namespace, k.Name, n, rewriteWindow, LabelManagedBy, ManagedBy))
			return errBackOff
		}
		uid, version := live.GetUID(), live.GetResourceVersion()
		err = client.Delete(ctx, k.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &version}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ScaledObject %s/%s: %w", k.Namespace, k.Name, err)
		}
		r.didWrite(k, writeOf(nil))
		r.c.m.changes.WithLabelValues("delete").Inc()
		r.eventf(ref, corev1.EventTypeNormal, "ScaledObjectDeleted",
			"deleted ScaledObject %s: %s is no longer \"true\"", k.Name, AnnotationAutoscale)
	} else {
		r.rewritten(k, time.Now()) // kept for the window: the copy may come back
	}
	r.c.forget(k)
	return nil
}

// conflict says why pulse must leave the workload's ScaledObject alone: one
// of its name that is not pulse's, or is pulse's for another workload, or
// another ScaledObject that already scales the workload (KEDA allows one).
func (r *run) conflict(k key, w metav1.Object, existing *unstructured.Unstructured) string {
	if existing != nil {
		if !Managed(existing) {
			return fmt.Sprintf("ScaledObject %s/%s exists and is not pulse's (no label %s=%s): left alone; delete it or rename it for pulse to provision one",
				k.Namespace, k.Name, LabelManagedBy, ManagedBy)
		}
		if !OwnedBy(existing, w.GetUID()) && !adopts(k, existing) {
			owner := "another workload"
			if ref := metav1.GetControllerOf(existing); ref != nil {
				owner = ref.Kind + " " + ref.Name
			}
			return fmt.Sprintf("ScaledObject %s/%s is pulse's for %s: left alone", k.Namespace, k.Name, owner)
		}
	}
	// ByIndex fails only for an index not registered; Run registers it.
	others, _ := r.sos.GetIndexer().ByIndex(byTarget, k.Namespace+"/"+k.Kind+"/"+k.Name)
	for _, o := range others {
		if so, ok := o.(metav1.Object); ok && so.GetName() != k.Name {
			return fmt.Sprintf("ScaledObject %s/%s already scales %s %s (KEDA allows one per workload): left alone",
				k.Namespace, so.GetName(), k.Kind, k.Name)
		}
	}
	return ""
}

// adopts says whether the workload k takes pulse's ScaledObject so, owned
// by another uid or by none, as its own (both once stayed in conflict for
// ever):
//   - with no owner left (the garbage collector takes the owner reference
//     off a dependent when its owner is deleted with --cascade=orphan): the
//     workload it scales by name;
//   - owned by a workload of this kind and name whose uid is gone
//     (re-created with --cascade=orphan): this workload is its successor
//     (one name names one object at a time).
func adopts(k key, so *unstructured.Unstructured) bool {
	if ref := metav1.GetControllerOf(so); ref != nil {
		return ref.Kind == k.Kind && ref.Name == k.Name
	}
	kind, name := targetOf(so)
	return kind == k.Kind && name == k.Name
}

// byTarget indexes ScaledObjects by namespace/kind/name of their
// scaleTargetRef, so that finding the ones that scale a workload is a
// lookup, not a scan of every ScaledObject.
const byTarget = "scaleTarget"

func targetIndex(o any) ([]string, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	kind, name := targetOf(u)
	return []string{u.GetNamespace() + "/" + kind + "/" + name}, nil
}

// targetOf is a ScaledObject's scaleTargetRef kind (KEDA's default,
// Deployment, when unset) and name.
func targetOf(u *unstructured.Unstructured) (kind, name string) {
	kind, _, _ = unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "kind")
	name, _, _ = unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "name")
	if kind == "" {
		kind = "Deployment"
	}
	return kind, name
}

// statusOnly: an update that changed neither the spec (generation), the
// labels nor the owners — KEDA writes a ScaledObject's status on every
// poll — concerns no workload. A resync (same resourceVersion) does.
func statusOnly(old, o any) bool {
	a, okA := old.(metav1.Object)
	b, okB := o.(metav1.Object)
	return okA && okB && a.GetResourceVersion() != b.GetResourceVersion() && a.GetGeneration() == b.GetGeneration() &&
		maps.Equal(a.GetLabels(), b.GetLabels()) && equality.Semantic.DeepEqual(a.GetOwnerReferences(), b.GetOwnerReferences())
}

func (r *run) scaledObject(ns, name string) (*unstructured.Unstructured, error) {
	o, exists, err := r.sos.GetIndexer().GetByKey(ns + "/" + name)
	if err != nil || !exists {
		return nil, err
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("ScaledObject %s/%s: unexpected %T", ns, name, o)
	}
	return u, nil
}

// report records a workload's state; a change of state or message is also
// an Event on the workload (a warning unless provisioned) and a log line.
func (r *run) report(k key, ref *corev1.ObjectReference, state, so, msg string) {
	c := r.c
	c.mu.Lock()
	old, had := c.status[k]
	same := had && old.State == state && old.Message == msg
	if !same {
		c.status[k] = Status{Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, State: state, ScaledObject: so, Message: msg, Since: time.Now()}
		if had {
			c.counts[old.State]--
		}
		c.counts[state]++
		c.m.set(c.counts)
	}
	c.mu.Unlock()
	if same {
		return
	}
	log := c.o.Log.With(logging.KeyWorkload, k.String())
	switch state {
	case StateProvisioned:
		log.Info("ScaledObject provisioned", logging.KeyMessage, msg)
	case StateInvalid:
		r.eventf(ref, corev1.EventTypeWarning, "InvalidAnnotation", "%s", msg)
		log.Warn("invalid annotation", logging.KeyMessage, msg)
	case StateConflict:
		r.eventf(ref, corev1.EventTypeWarning, "ScaledObjectConflict", "%s", msg)
		log.Warn("ScaledObject conflict", logging.KeyMessage, msg)
	case StateError:
		r.eventf(ref, corev1.EventTypeWarning, "ProvisioningFailed", "%s", msg)
		log.Warn("provisioning failed; retrying", logging.KeyMessage, msg)
	}
}

// eventf records an Event on ref, within its namespace's bucket
// (eventQPS); past it the Event is counted as dropped.
func (r *run) eventf(ref *corev1.ObjectReference, typ, reason, format string, args ...any) {
	if !r.events.allow(ref.Namespace, time.Now()) {
		r.c.m.eventsDropped.Inc()
		return
	}
	r.recorder.Eventf(ref, typ, reason, format, args...)
}

// failed reports a workload whose ScaledObject the API server refused or
// failed to write (KEDA's webhook refusing a second scaler of the
// workload, a ResourceQuota, an outage): its status, an Event and the log
// say so, not only the aggregator's log; it is retried.
func (r *run) failed(k key, err error) {
	r.mu.Lock()
	w := r.workloads[k.Kind]
	r.mu.Unlock()
	if w == nil {
		return
	}
	obj, exists, _ := w.informer.GetIndexer().GetByKey(k.Namespace + "/" + k.Name)
	m, ok := obj.(metav1.Object)
	if !exists || !ok {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: w.gv.String(), Kind: k.Kind, Namespace: k.Namespace, Name: k.Name, UID: m.GetUID()}
	r.report(k, ref, StateError, k.Namespace+"/"+k.Name, wire.CleanText(err.Error(), 1024)+"; retrying")
}

func (c *Controller) forget(k key) {
	c.mu.Lock()
	if old, had := c.status[k]; had {
		delete(c.status, k)
		c.counts[old.State]--
		c.m.set(c.counts)
	}
	c.mu.Unlock()
}

// clearStatus forgets every workload's state: a replica that stops
// leading shows none (the leader's are the ones that hold), and one that
// starts leading learns them again.
func (c *Controller) clearStatus() {
	c.mu.Lock()
	clear(c.status)
	clear(c.counts)
	c.m.set(c.counts)
	c.mu.Unlock()
}

// workspaceNote: Kaito declares the Workspace's /scale without a label
// selector, and the HPA refuses a target without one; KEDA itself scales
// it between 0 and 1.
const workspaceNote = "a Workspace's /scale has no selector, so the HPA cannot take it past 1 replica: KEDA scales it 0 <-> 1 with pulse.io/min-replicas \"0\"; scale an InferenceSet for 1 -> N"

// Summary says what a provisioned ScaledObject scales on, for Events and
// the debug endpoint.
func Summary(s Settings) string {
	t := s.Parsed
	if s.Planner {
		slo := t.SLOTTFT
		if slo == 0 {
			slo = planner.DefaultTTFT
		}
		ttft, itl := "", ""
		if t.SLOPercentile > 0 {
			ttft = fmt.Sprintf("p%g ", t.SLOPercentile)
		}
		if t.SLOITL > 0 {
			itl = fmt.Sprintf(" and an ITL SLO of %s", t.SLOITL)
		}
		return fmt.Sprintf("the planner (metric replicas) for a %sTTFT SLO of %s%s, %d-%d replicas, its plan let through the HPA", ttft, slo, itl, s.MinReplicas, s.MaxReplicas)
	}
	return fmt.Sprintf("%s, threshold %g per replica over %s, %d-%d replicas, up %d pods/min, down 1 pod per %s after %s lower",
		t.Metric, t.Threshold, t.Window, s.MinReplicas, s.MaxReplicas, s.ScaleUpPodsPerMinute, s.ScaleDownInterval, s.ScaleDownDelay)
}

// Provisioning is the debug endpoint's view.
type Provisioning struct {
	Identity  string   `json:"identity"`
	Leading   bool     `json:"leading"`
	Leader    string   `json:"leader"`
	Workloads []Status `json:"workloads"`
}

// Provisioning returns the controller's state.
func (c *Controller) Provisioning() Provisioning { return c.ProvisioningOf("") }

// ProvisioningOf is Provisioning of namespace ns's workloads alone ("":
// every namespace's). One namespace's debug page copied and sorted every
// namespace's workloads, under the lock the reconciles take, to keep its
// own.
func (c *Controller) ProvisioningOf(ns string) Provisioning {
	c.mu.Lock()
	p := Provisioning{Identity: c.identity, Leading: c.leading, Leader: c.holder}
	for _, s := range c.status {
		if ns == "" || s.Namespace == ns {
			p.Workloads = append(p.Workloads, s)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(p.Workloads, func(a, b Status) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Kind, b.Kind))
	})
	return p
}
