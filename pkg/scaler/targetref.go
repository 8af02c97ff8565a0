package scaler

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/store"
)

// TargetResolver finds the workload a ScaledObject scales, for triggers whose
// metadata names none.
type TargetResolver interface {
	// Resolve returns the kind and name of the ScaledObject's
	// spec.scaleTargetRef.
	Resolve(namespace, name string) (kind, target string, err error)
}

// ScaledObjects is KEDA's ScaledObject resource.
var ScaledObjects = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "scaledobjects"}

// InformerResolver answers from an informer's cache of ScaledObjects, so a
// KEDA call never waits on the API server.
type InformerResolver struct {
	informer cache.SharedIndexInformer
	lister   cache.GenericLister
}

var _ TargetResolver = (*InformerResolver)(nil)

// NewInformerResolver watches ScaledObjects in every namespace.
func NewInformerResolver(client dynamic.Interface) *InformerResolver {
	f := dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
	gi := f.ForResource(ScaledObjects)
	return &InformerResolver{informer: gi.Informer(), lister: gi.Lister()}
}

// Run runs the informer until ctx ends.
func (r *InformerResolver) Run(ctx context.Context) { r.informer.Run(ctx.Done()) }

// Ready returns nil once the cache has synced.
func (r *InformerResolver) Ready() error {
	if !r.informer.HasSynced() {
		return errNotSynced
	}
	return nil
}

// errNotSynced: the cache is still filling; errNotCached: it has not seen
// the ScaledObject yet. Both pass (Unavailable: KEDA retries), neither is
// the tenant's error.
var (
	errNotSynced = errors.New("the ScaledObject cache is not synced yet")
	errNotCached = errors.New("not in the aggregator's ScaledObject cache yet (made a moment ago?)")
)

// Resolve reads spec.scaleTargetRef from the cache.
func (r *InformerResolver) Resolve(namespace, name string) (string, string, error) {
	if !r.informer.HasSynced() {
		return "", "", errNotSynced
	}
	obj, err := r.lister.ByNamespace(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		// KEDA asks about a ScaledObject it has read: the cache has not
		// seen it yet (made a moment ago). KEDA retries.
		return "", "", fmt.Errorf("ScaledObject %s/%s: %w", namespace, name, errNotCached)
	}
	if err != nil {
		return "", "", err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", "", fmt.Errorf("ScaledObject %s/%s: unexpected %T", namespace, name, obj)
	}
	kind, _, _ := unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "kind")
	target, _, _ := unstructured.NestedString(u.Object, "spec", "scaleTargetRef", "name")
	if kind == "" {
		kind = "Deployment" // KEDA's default scaleTargetRef kind
	}
	if target == "" {
		return "", "", fmt.Errorf("ScaledObject %s/%s has no spec.scaleTargetRef.name", namespace, name)
	}
	return kind, target, nil
}

// workloadKinds maps scaleTargetRef kinds to the store's.
var workloadKinds = map[string]string{
	"Workspace":       store.KindWorkspace,
	"InferenceSet":    store.KindInferenceSet,
	"Deployment":      store.KindDeployment,
	"StatefulSet":     store.KindStatefulSet,
	"LeaderWorkerSet": store.KindLeaderWorkerSet,
}
