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

// NodePods lists and watches the pods of one node (a spec.nodeName field
// selector) through a REST client for core/v1 alone. client-go's typed
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
	return cache.NewListWatchFromClient(rc, "pods", metav1.NamespaceAll, fields.OneTermEqualSelector("spec.nodeName", node)), nil
}
