package discovery

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// NodePods lists and watches the pods of one node that have not finished
// (NodePodsSelector) through a REST client for core/v1 alone. client-go's typed
// clientset would do the same, but links and initializes every API group
// the API server has: about 20 MB more resident memory for an agent that
// reads one kind. The client asks for protobuf, JSON second.
func NodePods(cfg *rest.Config, node string) (cache.ListerWatcher, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("core/v1 scheme: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	c.ContentType = runtime.ContentTypeProtobuf
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("pods client: %w", err)
	}
	return cache.NewListWatchFromClient(rc, "pods", metav1.NamespaceAll, NodePodsSelector(node)), nil
}

// NodePodsSelector selects the pods of node that have not finished (phase
// neither Succeeded nor Failed): a pod that finishes leaves the watch as
// deleted, and is no replica (TargetOf lists none to scrape). The node's
// finished pods were listed too, each whole until the informer's transform
// slimmed it: a tenant's pods pinned to the node to fail (a nodeSelector the
// node lacks) or Jobs that end, which no quota counts and the pod GC keeps
// by the thousand, each with 256 KiB of annotations, were held at once by a
// relist (an API server without streaming lists: before 1.34), past the
// agent's memory limit at every restart.
func NodePodsSelector(node string) fields.Selector {
	return fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)))
}
