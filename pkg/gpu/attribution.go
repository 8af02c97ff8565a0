package gpu

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources socket. The agent
// mounts its directory, so a kubelet restart (a new socket) is survived.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// PodResources lists which devices the kubelet gave to which pod.
type PodResources struct {
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

// DialPodResources connects to the kubelet's socket. gRPC redials it, with
// a backoff of at most a second, when the kubelet restarts.
func DialPodResources(socket string) (*PodResources, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// List answers every container of every pod on the node: past
		// gRPC's 4 MiB (a tenant's pods of thousands of containers, a big
		// node with the static CPU manager) it failed at every interval,
		// and every pod of the node lost its GPU values. 16 MiB is what
		// the kubelet allows its own runtime's answers.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxPodResources)),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}))
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", socket, err)
	}
	return &PodResources{conn: conn, client: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// maxPodResources bounds a List's answer.
const maxPodResources = 16 << 20

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }

// IsGPUResource reports whether a device plugin resource is an NVIDIA GPU or
// MIG device: nvidia.com/gpu, nvidia.com/mig-<profile>, and the same with
// ".shared", as the NVIDIA device plugin names a time-sliced or MPS one
// with renameByDefault (whose pods had no GPU values).
func IsGPUResource(name string) bool {
	name = strings.TrimSuffix(name, ".shared")
	return name == "nvidia.com/gpu" || strings.HasPrefix(name, "nvidia.com/mig-")
}

// isGPUDevice reports whether a device plugin's devices are NVIDIA GPUs or
// MIG devices: a resource IsGPUResource names, or one of nvidia.com's
// whose every device ID is a GPU's or a MIG device's UUID (GPU-…, MIG-…,
// a replica's ::N after it), as the NVIDIA device plugin names a resource
// its config renames (resources.gpus[].name, sharing's rename: say
// nvidia.com/a100 or nvidia.com/gpu-ts), whose pods had no GPU value.
// nvidia.com's other devices (the network operator's RDMA and SR-IOV ones)
// have other IDs.
func isGPUDevice(name string, ids []string) bool {
	if IsGPUResource(name) {
		return true
	}
	if !strings.HasPrefix(name, "nvidia.com/") || len(ids) == 0 {
		return false
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, "GPU-") && !strings.HasPrefix(id, "MIG-") {
			return false
		}
	}
	return true
}

// List returns each pod's GPU device IDs, by "namespace/name", and apart
// the pods the kubelet listed twice under one name, with every device of
// both: the pod-resources API names a pod, not its uid, and a pod
// recreated under its name (a StatefulSet's) can be listed beside the one
// it replaces while that one ends. Their devices were merged, and the new
// pod read the old one's GPUs as its own; a pod so named now has no GPU
// value until one of the two is gone, but its devices still count as its
// namespace's (Attribute: a GPU another tenant shares is nobody's).
func (p *PodResources) List(ctx context.Context) (pods, ambiguous map[string][]string, err error) {
	resp, err := p.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list pod resources: %w", err)
	}
	pods, ambiguous = map[string][]string{}, map[string][]string{}
	seen := map[string]bool{}
	for _, pr := range resp.GetPodResources() {
		key := pr.GetNamespace() + "/" + pr.GetName()
		if seen[key] {
			ambiguous[key] = append(ambiguous[key], pods[key]...)
			delete(pods, key)
		}
		seen[key] = true
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDevices() {
				if !isGPUDevice(d.GetResourceName(), d.GetDeviceIds()) {
					continue
				}
				if _, twice := ambiguous[key]; twice {
					ambiguous[key] = append(ambiguous[key], d.GetDeviceIds()...)
				} else {
					pods[key] = append(pods[key], d.GetDeviceIds()...)
				}
			}
		}
	}
	return pods, ambiguous, nil
}

// PodGPU is what a pod's GPUs did.
type PodGPU struct {
	// Utilization: mean over the pod's devices that report one (0..1).
	Utilization    float64
	HasUtilization bool
	// Memory: mean over the pod's devices of used/total (0..1).
	Memory    float64
	HasMemory bool
}

// physicalID is the GPU a device plugin's device ID names, as dcgm-exporter's
// pod mapper reads them (internal/pkg/transformation/kubernetes.go): the
// NVIDIA device plugin names the replicas of a time-sliced or MPS-shared GPU
// "<GPU UUID or index>::<replica>", GKE's plugin names shared GPUs
// "nvidia<minor>/vgpu<n>" and plain ones "nvidia<minor>" (after the
// /dev/nvidiaN file: minor says the number is a minor number, not NVML's
// index).
func physicalID(id string) (phys string, minor bool) {
	if before, _, ok := strings.Cut(id, "::"); ok {
		id = before
	}
	if before, _, ok := strings.Cut(id, "/vgpu"); ok {
		id = before
	}
	if n, ok := strings.CutPrefix(id, "nvidia"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		return n, true
	}
	return id, false
}

// uuidOf is the UUID of the device a device ID names ("" when none read).
func (devs Devices) uuidOf(raw string) string {
	id, minor := physicalID(raw)
	if _, ok := devs.ByUUID[id]; ok && !minor {
		return id
	}
	if minor {
		return devs.ByMinor[id]
	}
	return devs.ByIndex[id]
}

// Attribute maps each pod's device IDs (GPU UUIDs, MIG UUIDs, indices, or
// the shared forms physicalID reads) to the devices read, and returns the
// pods' GPU values and the IDs it could not map. NVML reports a device's
// utilization, not a share of it: pods of one namespace sharing a GPU each
// get that GPU's values, but a GPU shared with a pod of another namespace
// is left out of every pod's values (one tenant would read another's load,
// and scale on it). others hold devices and get no value (List's pods
// listed twice): their devices count toward who shares a GPU.
func Attribute(devs Devices, pods, others map[string][]string) (out map[string]PodGPU, unknown []string) {
	out = make(map[string]PodGPU, len(pods))
	namespaces := map[string]map[string]bool{} // device UUID → the namespaces of the pods holding it
	for _, holders := range []map[string][]string{pods, others} {
		for pod, ids := range holders {
			ns, _, _ := strings.Cut(pod, "/")
			for _, raw := range ids {
				if uuid := devs.uuidOf(raw); uuid != "" {
					if namespaces[uuid] == nil {
						namespaces[uuid] = map[string]bool{}
					}
					namespaces[uuid][ns] = true
				}
			}
		}
	}
	for pod, ids := range pods {
		var g PodGPU
		var util, mem float64
		nu, nm := 0, 0
		// A GPU of the pod that was not read (its handle or UUID failed:
		// a GPU lost, an Xid), or whose utilization or memory was not,
		// leaves the pod with no such value: the mean of the others was
		// sent as the whole pod's, and could drive a scale-down.
		utilOK, memOK := true, true
		seen := map[string]bool{}
		for _, raw := range ids {
			uuid := devs.uuidOf(raw)
			if uuid == "" {
				unknown = append(unknown, raw)
				utilOK, memOK = false, false
				continue
			}
			if seen[uuid] || len(namespaces[uuid]) > 1 {
				continue // a replica of a GPU counted already, or one another tenant shares
			}
			seen[uuid] = true
			d := devs.ByUUID[uuid]
			if d.HasUtilization {
				util += d.Utilization
				nu++
			} else {
				utilOK = false
			}
			if d.MemTotal > 0 {
				mem += float64(d.MemUsed) / float64(d.MemTotal)
				nm++
			} else {
				memOK = false
			}
		}
		if nu > 0 && utilOK {
			g.Utilization, g.HasUtilization = util/float64(nu), true
		}
		if nm > 0 && memOK {
			g.Memory, g.HasMemory = mem/float64(nm), true
		}
		if nu > 0 || nm > 0 {
			out[pod] = g
		}
	}
	return out, unknown
}
