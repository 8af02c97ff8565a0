// Package fakenode fakes what a GPU node has at its hardware and OS
// boundaries: the kubelet's pod-resources API on a unix socket, and NVML.
package fakenode

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet answers List with the pods it is given.
type Kubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods []*podresourcesv1.PodResources
}

// SetPods replaces what List answers.
func (k *Kubelet) SetPods(pods ...*podresourcesv1.PodResources) {
	k.mu.Lock()
	k.pods = pods
	k.mu.Unlock()
}

// List implements the pod-resources API.
func (k *Kubelet) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return &podresourcesv1.ListPodResourcesResponse{PodResources: k.pods}, nil
}

// Serve listens on socket (replacing a stale one) until stop is called or
// the test ends.
func (k *Kubelet) Serve(t testing.TB, socket string) (stop func()) {
	t.Helper()
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(s, k)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return s.Stop
}

// Pod is a pod whose first container holds devices of resource.
func Pod(namespace, name, resource string, ids ...string) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: namespace, Name: name, Containers: []*podresourcesv1.ContainerResources{
		{Name: "vllm", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: ids}}},
		{Name: "sidecar"},
	}}
}
