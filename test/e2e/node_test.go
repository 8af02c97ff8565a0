//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/pulse-io/pulse/pkg/debug"
)

// The real node's name, and the GPUs the stub NVML library and the fake
// device plugin agree on (test/e2e/node/nvml/nvml_stub.c).
const (
	nodeName   = "pulse-node"
	gpuUUID0   = "GPU-5ca1ab1e-0000-4000-8000-000000000000"
	gpuUUID1   = "GPU-5ca1ab1e-0000-4000-8000-000000000001"
	vllmPort   = 8000
	aggRelease = "pulse-aggregator"
	agtRelease = "pulse-agent"
)

var ctaGVR = schema.GroupVersionResource{Group: "keda.sh", Version: "v1alpha1", Resource: "clustertriggerauthentications"}

// stubUtilization is the stub's utilization of each GPU, as pulse reports
// it (0..1).
var stubUtilization = map[string]float64{gpuUUID0: 0.37, gpuUUID1: 0.81}

// realNode is one real Kubernetes node on this machine: containerd, the
// kubelet, kube-proxy, the scheduler and CoreDNS beside the test's control
// plane. test/e2e/node/run.sh prepares the host and cleans it up.
type realNode struct {
	*env
	state, bridge, gateway, podCIDR, serviceCIDR, cgroup string
	images                                               string // the image tarballs' directory
	refs                                                 map[string]string
	sock                                                 string // containerd's
	binDir                                               string // binaries the test builds
	loadTime                                             time.Duration
	kubeletStart                                         time.Time
	plugin                                               *devicePlugin
	procs                                                []*proc
	// aggClient reads an aggregator's http port, which speaks TLS with
	// the managed certificate (the chart's default): it trusts the CA the
	// aggregator publishes and checks the Service's name.
	aggClient *http.Client
	// relayOn: the relay subtest enabled the charts' relay (whose
	// certificate Secret the aggregator made) and has not yet seen it
	// turned off and that Secret removed.
	relayOn bool
}

func TestNode(t *testing.T) {
	state := os.Getenv("PULSE_E2E_NODE_STATE")
	if state == "" {
		t.Skip("the real-node e2e runs as root through test/e2e/node/run.sh: make e2e-node")
	}
	tools, bins, images := os.Getenv("PULSE_E2E_TOOLS"), os.Getenv("PULSE_E2E_BIN"), os.Getenv("PULSE_E2E_IMAGES")
	if tools == "" || bins == "" || images == "" {
		t.Fatal("PULSE_E2E_TOOLS, PULSE_E2E_BIN and PULSE_E2E_IMAGES must be set: run make e2e-node")
	}
	e := &env{t: t, dir: os.Getenv("PULSE_E2E_LOGS"), tools: tools, bins: bins, ctx: context.Background()}
	must(t, os.MkdirAll(e.dir, 0o755))
	n := &realNode{env: e, state: state, images: images, refs: map[string]string{},
		bridge: os.Getenv("PULSE_E2E_NODE_BRIDGE"), gateway: os.Getenv("PULSE_E2E_NODE_GATEWAY"),
		podCIDR: os.Getenv("PULSE_E2E_NODE_POD_CIDR"), serviceCIDR: os.Getenv("PULSE_E2E_NODE_SERVICE_CIDR"),
		cgroup: os.Getenv("PULSE_E2E_NODE_CGROUP"), binDir: filepath.Join(state, "bin"), loadTime: 20 * time.Second}
	if s := os.Getenv("PULSE_E2E_NODE_LOAD_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		must(t, err)
		n.loadTime = d
	}
	t.Logf("logs in %s, state in %s", e.dir, state)
	must(t, os.MkdirAll(n.binDir, 0o755))

	_, svcNet, err := net.ParseCIDR(n.serviceCIDR)
	must(t, err)
	apiSvcIP := slices.Clone(svcNet.IP.To4())
	apiSvcIP[3]++
	e.cp = startControlPlane(t, tools, e.dir, cpOptions{addr: n.gateway, serviceCIDR: n.serviceCIDR, serviceIP: apiSvcIP.String(),
		controllers: "endpoint,endpointslice,root-ca-cert-publisher,disruption,nodelifecycle"})
	e.connect()
	defer func() {
		if t.Failed() {
			procs := append(append(append(e.cp.procs, n.procs...), e.keda, e.kedaAdapter), e.extra...)
			dumpLogs(t, procs...)
			summary(t, e.scaledObjectConditions(), procs...)
		}
	}()

	n.buildNodeParts()
	n.startScheduler()
	n.startCoreDNS()
	n.startContainerd()
	n.importImages()
	n.startKubelet()
	n.startKubeProxy()
	n.startDevicePlugin()
	n.waitNodeReady()

	// KEDA resolves the chart's Service names as a pod would: through
	// CoreDNS, in a mount namespace of its own whose /etc/resolv.conf names
	// it.
	resolv := filepath.Join(state, "keda-resolv.conf")
	must(t, os.WriteFile(resolv, []byte("nameserver "+n.gateway+"\nsearch keda.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"), 0o644))
	e.kedaWrap = func(bin string, args []string) (string, []string) {
		return "unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$0" /etc/resolv.conf && exec "$@"`, resolv, bin}, args...)
	}
	e.startKEDA()
	e.installKaitoCRDs()
	e.createNamespace(appNS)

	t.Run("helm install: the charts' pods run", n.chartsRun)
	t.Run("vLLM pods: real pods at their own IPs, scraped once they have loaded", n.vllmPods)
	t.Run("a GPU's utilization is its pod's", n.gpuAttributed)
	t.Run("KEDA scales a Deployment 1 to 3 while the new pods load, then back", n.scaleDeployment)
	t.Run("relay.enabled: the agent's streams go through pulse-relay, over TLS with the certificate the aggregator issued it", n.relayCarries)
	t.Run("helm uninstall removes what the charts made", n.uninstall)
}

// buildNodeParts builds the stub NVML library (against go-nvml's own
// nvml.h) and the NVIDIA runtime stand-in.
func (n *realNode) buildNodeParts() {
	t := n.t
	root := repoRoot(t)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	must(t, err)
	nvmlDir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	run := func(name string, args ...string) {
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
		}
	}
	must(t, os.MkdirAll(filepath.Join(n.binDir, "nvml"), 0o755))
	run("gcc", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I"+nvmlDir, "-o",
		filepath.Join(n.binDir, "nvml", "libnvidia-ml.so.1"), "test/e2e/node/nvml/nvml_stub.c")
	run("go", "build", "-o", filepath.Join(n.binDir, "nvidia-runtime"), "./test/e2e/node/nvidia-runtime")
}

func (n *realNode) start(name string, env []string, bin string, args ...string) *proc {
	p := start(n.t, n.dir, name, env, bin, args...)
	n.procs = append(n.procs, p)
	return p
}

func (n *realNode) startScheduler() {
	n.start("kube-scheduler", nil, filepath.Join(n.tools, "kube-scheduler"),
		"--kubeconfig="+n.cp.kubeconfig, "--leader-elect=false", "--secure-port=0", "--v=1")
}

// startCoreDNS serves cluster.local on the bridge's address: the kubelet's
// clusterDNS.
func (n *realNode) startCoreDNS() {
	t := n.t
	health, ready := freePort(t), freePort(t)
	corefile := filepath.Join(n.state, "Corefile")
	must(t, os.WriteFile(corefile, fmt.Appendf(nil, `.:53 {
    bind %s
    errors
    health 127.0.0.1:%d
    ready 127.0.0.1:%d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s e2e
        pods insecure
    }
}
`, n.gateway, health, ready, n.cp.kubeconfig), 0o644))
	p := n.start("coredns", nil, filepath.Join(n.tools, "coredns"), "-conf", corefile)
	waitFor(t, 60*time.Second, "CoreDNS ready", func() error {
		if p.cmd.ProcessState != nil {
			t.Fatalf("coredns exited:\n%s", p.tail(30))
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", ready))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/ready: %s", resp.Status)
		}
		return nil
	})
}

// startContainerd runs containerd with every directory under the state
// directory, the test's pause image as the sandbox image, the CNI bridge on
// the test's bridge and subnet (no masquerade), cgroupfs, and the NVIDIA
// runtime stand-in as runc's binary.
func (n *realNode) startContainerd() {
	t := n.t
	d := filepath.Join(n.state, "containerd")
	for _, sub := range []string{"root", "state", "opt", "net.d", "ipam"} {
		must(t, os.MkdirAll(filepath.Join(d, sub), 0o755))
	}
	n.sock = filepath.Join(d, "containerd.sock")
	n.refs["pause"] = n.imageRef("pause")
	cni := map[string]any{
		"cniVersion": "0.4.0", "name": "pulse-e2e",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": n.bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(d, "ipam"),
					"ranges": []any{[]any{map[string]any{"subnet": n.podCIDR, "gateway": n.gateway}}},
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}}}},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	b, _ := json.MarshalIndent(cni, "", "  ")
	must(t, os.WriteFile(filepath.Join(d, "net.d", "10-pulse-e2e.conflist"), b, 0o644))
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %[6]q
        Root = %[8]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.sock, filepath.Join(d, "opt"), n.refs["pause"],
		filepath.Join(n.binDir, "nvidia-runtime"), filepath.Join(d, "net.d"), filepath.Join(d, "runc"))
	conf := filepath.Join(d, "config.toml")
	must(t, os.WriteFile(conf, []byte(cfg), 0o644))
	p := n.start("containerd", []string{"PULSE_NVML_STUB=" + filepath.Join(n.binDir, "nvml", "libnvidia-ml.so.1")},
		"containerd", "--config", conf, "--log-level", "info")
	waitFor(t, 60*time.Second, "containerd serves", func() error {
		if p.cmd.ProcessState != nil {
			t.Fatalf("containerd exited:\n%s", p.tail(30))
		}
		_, err := n.ctr("version")
		return err
	})
}

func (n *realNode) ctr(args ...string) (string, error) {
	out, err := exec.Command("ctr", append([]string{"--address", n.sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// imageRef reads an image tarball's reference: its index's
// io.containerd.image.name annotation, which ctr import names it by.
func (n *realNode) imageRef(name string) string {
	t := n.t
	f, err := os.Open(filepath.Join(n.images, name+".tar"))
	if err != nil {
		t.Fatalf("image %s: %v (make images builds it)", name, err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("image %s: no index.json: %v", name, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		must(t, json.NewDecoder(tr).Decode(&idx))
		if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] == "" {
			t.Fatalf("image %s: want one manifest named by io.containerd.image.name, got %+v", name, idx.Manifests)
		}
		return idx.Manifests[0].Annotations["io.containerd.image.name"]
	}
}

func (n *realNode) importImages() {
	t := n.t
	for _, name := range []string{"pause", "pulse-agent", "pulse-aggregator", "pulse-relay", "vllm-sim"} {
		n.refs[name] = n.imageRef(name)
		if out, err := n.ctr("images", "import", filepath.Join(n.images, name+".tar")); err != nil {
			t.Fatal(err)
		} else {
			t.Logf("imported %s: %s", n.refs[name], strings.TrimSpace(out))
		}
	}
}

// startKubelet runs the kubelet with the cgroupfs driver under the test's
// cgroup root, the container runtime above, CoreDNS as the cluster's DNS and
// no resolv.conf of the host's, and the label GPU nodes carry.
func (n *realNode) startKubelet() {
	t := n.t
	d := filepath.Join(n.state, "kubelet")
	must(t, os.MkdirAll(d, 0o755))
	crt, key := n.cp.pki.issue(t, "kubelet", "system:node:"+nodeName, []string{"system:nodes", "system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth)
	kc := filepath.Join(d, "kubeconfig")
	n.cp.writeKubeconfig(t, kc, &clientcmdapi.AuthInfo{ClientCertificate: crt, ClientKey: key})
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"address": n.gateway, "port": freePort(t), "readOnlyPort": 0, "healthzPort": 0,
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": false}, "webhook": map[string]any{"enabled": true},
			"x509": map[string]any{"clientCAFile": filepath.Join(n.cp.pki.dir, "ca.crt")}},
		"authorization":               map[string]any{"mode": "Webhook"},
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  "/" + n.cgroup,
		"clusterDNS":                  []string{n.gateway},
		"clusterDomain":               "cluster.local",
		"resolvConf":                  "",
		"containerRuntimeEndpoint":    "unix://" + n.sock,
		"failSwapOn":                  false,
		"makeIPTablesUtilChains":      false,
		"imageGCHighThresholdPercent": 100,
		"evictionHard":                map[string]string{"memory.available": "100Mi"},
		"serializeImagePulls":         false,
		"syncFrequency":               "5s",
		"fileCheckFrequency":          "5s",
	}
	b, err := yaml.Marshal(cfg)
	must(t, err)
	conf := filepath.Join(d, "config.yaml")
	must(t, os.WriteFile(conf, b, 0o644))
	n.kubeletStart = time.Now()
	n.start("kubelet", nil, filepath.Join(n.tools, "kubelet"), "--config="+conf, "--kubeconfig="+kc,
		"--hostname-override="+nodeName, "--node-ip="+n.gateway, "--node-labels=nvidia.com/gpu.present=true", "--v=1")
}

func (n *realNode) startKubeProxy() {
	t := n.t
	cfg := map[string]any{
		"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": n.cp.kubeconfig},
		"mode":               "iptables",
		"clusterCIDR":        n.podCIDR,
		"hostnameOverride":   nodeName,
		"bindAddress":        n.gateway,
		"healthzBindAddress": fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"metricsBindAddress": fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		"nodePortAddresses":  []string{n.gateway + "/32"},
		// 0: leave the host's conntrack settings as they are.
		"conntrack": map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
		"iptables":  map[string]any{"localhostNodePorts": false, "masqueradeAll": false},
	}
	b, err := yaml.Marshal(cfg)
	must(t, err)
	conf := filepath.Join(n.state, "kube-proxy.yaml")
	must(t, os.WriteFile(conf, b, 0o644))
	n.start("kube-proxy", nil, filepath.Join(n.tools, "kube-proxy"), "--config="+conf, "--v=1")
}

// devicePlugin advertises the stub's two GPUs as nvidia.com/gpu, as
// NVIDIA's device plugin does (device IDs are the GPUs' UUIDs, and an
// allocation sets NVIDIA_VISIBLE_DEVICES), and records what it allocated.
type devicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	mu        sync.Mutex
	allocated []string
}

func (p *devicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *devicePlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{
		{ID: gpuUUID0, Health: pluginapi.Healthy}, {ID: gpuUUID1, Health: pluginapi.Healthy}}})
	if err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *devicePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range req.ContainerRequests {
		p.allocated = append(p.allocated, c.DevicesIds...)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}})
	}
	return resp, nil
}

func (p *devicePlugin) devices() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocated)
}

func (n *realNode) startDevicePlugin() {
	t := n.t
	waitFor(t, 60*time.Second, "the kubelet's device plugin socket", func() error {
		_, err := os.Stat(pluginapi.KubeletSocket)
		return err
	})
	sock := filepath.Join(pluginapi.DevicePluginPath, "pulse-e2e-gpu.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	must(t, err)
	n.plugin = &devicePlugin{}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, n.plugin)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(n.ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: "nvidia.com/gpu"})
	must(t, err)
}

func (n *realNode) waitNodeReady() {
	t := n.t
	waitFor(t, 120*time.Second, "the node is Ready with 2 nvidia.com/gpu allocatable", func() error {
		nd, err := n.kube.CoreV1().Nodes().Get(n.ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		gpus := nd.Status.Allocatable["nvidia.com/gpu"]
		if !ready || gpus.Value() != 2 {
			return fmt.Errorf("ready %v, nvidia.com/gpu %s, conditions %v", ready, gpus.String(), nd.Status.Conditions)
		}
		return nil
	})
	t.Logf("node Ready with 2 GPUs %s after the kubelet started", time.Since(n.kubeletStart).Round(100*time.Millisecond))
}

// dumpPods prints every pod's phase, conditions and container states, for a
// failed run.
func (n *realNode) dumpPods() {
	pods, err := n.kube.CoreV1().Pods("").List(n.ctx, metav1.ListOptions{})
	if err != nil {
		n.t.Logf("list pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		n.t.Logf("pod %s/%s on %q: %s ip %s conditions %v containers %v", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase,
			p.Status.PodIP, p.Status.Conditions, p.Status.ContainerStatuses)
	}
	ev, err := n.kube.CoreV1().Events("").List(n.ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range ev.Items {
			if e.Type == corev1.EventTypeWarning {
				n.t.Logf("event %s %s/%s: %s %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
}

func (n *realNode) dumpPodsOnFailure(t *testing.T) {
	if t.Failed() {
		n.dumpPods()
	}
}

func splitRef(ref string) (string, string) {
	i := strings.LastIndex(ref, ":")
	return ref[:i], ref[i+1:]
}

// chartsRun installs both charts with their defaults but the images (and
// the debug endpoints on the pod's address, where the test reads them; by
// default they are on its loopback only), and checks their pods run as the
// charts say: the agent streams over TLS, trusting the CA the aggregator
// publishes, with its ServiceAccount token.
func (n *realNode) chartsRun(t *testing.T) {
	defer n.dumpPodsOnFailure(t)
	root := repoRoot(t)
	repo, tag := splitRef(n.refs["pulse-aggregator"])
	out := n.helm("install", aggRelease, filepath.Join(root, "deploy", "aggregator"), "--namespace", ns, "--create-namespace",
		"--set", "image.repository="+repo+",debug.localhostOnly=false", "--set-string", "image.tag="+tag)
	t.Logf("helm install %s:\n%s", aggRelease, out)
	repo, tag = splitRef(n.refs["pulse-agent"])
	n.helm("install", agtRelease, filepath.Join(root, "deploy", "daemonset"), "--namespace", ns,
		"--set", "image.repository="+repo, "--set-string", "image.tag="+tag)

	start := time.Now()
	var agent corev1.Pod
	waitFor(t, 180*time.Second, "the agent's pod and both aggregator replicas run and are Ready", func() error {
		pods, err := n.kube.CoreV1().Pods(ns).List(n.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var agents, aggs int
		for _, p := range pods.Items {
			if !podReady(&p) {
				continue
			}
			switch p.Labels["app.kubernetes.io/instance"] {
			case agtRelease:
				agents++
				agent = p
			case aggRelease:
				aggs++
			}
		}
		if agents != 1 || aggs != 2 {
			return fmt.Errorf("%d agent and %d aggregator pods Ready, want 1 and 2", agents, aggs)
		}
		return nil
	})
	t.Logf("charts' pods Ready %s after helm install", time.Since(start).Round(100*time.Millisecond))

	checkAgentPod(t, &agent)
	// Probes passed: every container Ready and none restarted.
	pods, err := n.kube.CoreV1().Pods(ns).List(n.ctx, metav1.ListOptions{})
	must(t, err)
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount != 0 {
				t.Errorf("%s/%s restarted %d times", p.Name, cs.Name, cs.RestartCount)
			}
		}
	}
	// The agent is connected to the aggregator (its readiness says so) and
	// NVML was loaded through the stub.
	waitFor(t, 30*time.Second, "the agent loaded NVML from the stub library", func() error {
		logs, err := n.kube.CoreV1().Pods(ns).GetLogs(agent.Name, &corev1.PodLogOptions{}).DoRaw(n.ctx)
		if err != nil {
			return err
		}
		if !bytes.Contains(logs, []byte("NVML initialized")) || !bytes.Contains(logs, []byte("stub-550.0")) {
			return fmt.Errorf("agent log has no NVML initialized with the stub's driver version:\n%s", logs)
		}
		return nil
	})
	n.aggHTTP = n.aggregatorHTTP(t)
}

// checkAgentPod: the agent's pod as the chart made it: on this node, root
// with every capability dropped and a read-only root, the pod-resources
// directory mounted from the host, NODE_NAME from the downward API.
func checkAgentPod(t *testing.T, agent *corev1.Pod) {
	t.Helper()
	if agent.Spec.NodeName != nodeName {
		t.Errorf("agent pod on %q", agent.Spec.NodeName)
	}
	c := agent.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("agent security context: %+v", sc)
	}
	hostPath := ""
	for _, v := range agent.Spec.Volumes {
		if v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if hostPath != "/var/lib/kubelet/pod-resources" {
		t.Errorf("agent hostPath volume %q, want /var/lib/kubelet/pod-resources", hostPath)
	}
	nodeEnv := false
	for _, ev := range c.Env {
		if ev.Name == "NODE_NAME" && ev.ValueFrom != nil && ev.ValueFrom.FieldRef != nil && ev.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeEnv = true
		}
	}
	if !nodeEnv {
		t.Errorf("agent has no NODE_NAME from spec.nodeName: %+v", c.Env)
	}
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// aggregatorHTTP is one aggregator replica's HTTP address, at its pod IP.
func (n *realNode) aggregatorHTTP(t *testing.T) string {
	pods, err := n.kube.CoreV1().Pods(ns).List(n.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=pulse-aggregator,app.kubernetes.io/instance=" + aggRelease})
	must(t, err)
	for _, p := range pods.Items {
		if podReady(&p) {
			cm, err := n.kube.CoreV1().ConfigMaps(ns).Get(n.ctx, "pulse-aggregator-ca", metav1.GetOptions{})
			must(t, err)
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(cm.Data["ca.crt"])) {
				t.Fatalf("ConfigMap pulse-aggregator-ca holds no CA certificate: %v", cm.Data)
			}
			tr := &http.Transport{TLSClientConfig: &tls.Config{
				RootCAs: pool, ServerName: aggRelease + "." + ns + ".svc", MinVersion: tls.VersionTLS12}}
			addr := net.JoinHostPort(p.Status.PodIP, "8080")
			// The debug endpoints on the http port are behind the token
			// review (metricsAuth=kubernetes): nothing without a token.
			resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: tr}).Get("https://" + addr + "/debug/workloads")
			must(t, err)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("/debug/workloads on the http port without a token: %s, want 401", resp.Status)
			}
			n.aggClient = &http.Client{Timeout: 10 * time.Second, Transport: bearerTransport{token: n.debugReaderToken(t), next: tr}}
			return addr
		}
	}
	t.Fatal("no aggregator pod Ready")
	return ""
}

// debugReaderToken is a token of a ServiceAccount bound to the chart's
// ClusterRole <release>-debug-reader, as README says to read the debug
// endpoints on the http port.
func (n *realNode) debugReaderToken(t *testing.T) string {
	const sa = "pulse-debug-reader"
	_, err := n.kube.CoreV1().ServiceAccounts(appNS).Create(n.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = n.kube.RbacV1().ClusterRoleBindings().Create(n.ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pulse-e2e-debug-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: aggRelease + "-debug-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: appNS}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := n.kube.CoreV1().ServiceAccounts(appNS).CreateToken(n.ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	must(t, err)
	return tr.Status.Token
}

// bearerTransport sends a bearer token.
type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// vllmContainer is a simulated vLLM server that loads its model for the
// node's load time, with vLLM's readiness probe on /health.
func (n *realNode) vllmContainer() corev1.Container {
	return corev1.Container{
		Name: "vllm", Image: n.refs["vllm-sim"], ImagePullPolicy: corev1.PullNever,
		Args:  []string{fmt.Sprintf("--addr=:%d", vllmPort), "--load-time=" + n.loadTime.String()},
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: vllmPort}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(vllmPort)}},
			PeriodSeconds: 1, FailureThreshold: 1},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}},
	}
}

// createVLLMPod creates a pod of a Kaito workload (its labels as Kaito's).
func (n *realNode) createVLLMPod(name string, labels map[string]string, gpus int64) {
	c := n.vllmContainer()
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		c.Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": q}
	}
	_, err := n.kube.CoreV1().Pods(appNS).Create(n.ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS, Labels: labels,
			Annotations: map[string]string{"pulse.io/port": fmt.Sprint(vllmPort)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptr(int64(1)),
			Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}},
	}, metav1.CreateOptions{})
	must(n.t, err)
}

func (n *realNode) createDeployment(name string, replicas int32) {
	labels := map[string]string{"app": name}
	_, err := n.kube.AppsV1().Deployments(appNS).Create(n.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: appNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					"pulse.io/scrape": "true", "pulse.io/port": fmt.Sprint(vllmPort)}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{n.vllmContainer()}, TerminationGracePeriodSeconds: ptr(int64(1))},
			},
		},
	}, metav1.CreateOptions{})
	must(n.t, err)
}

// workloadPods reads one workload's pods from an aggregator's debug
// endpoint.
func (n *realNode) workloadPods(workload string) (map[string]debug.Pod, error) {
	resp, err := n.aggClient.Get("https://" + n.aggHTTP + "/debug/workloads/" + appNS + "/" + workload)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var doc debug.Document
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	out := map[string]debug.Pod{}
	for _, w := range doc.Workloads {
		for _, p := range w.Pods {
			out[p.Name] = p
		}
	}
	return out, nil
}

// setWaiting sets a simulated vLLM pod's queue, at its pod IP.
func (n *realNode) setWaiting(t *testing.T, pod string, waiting float64) {
	p, err := n.kube.CoreV1().Pods(appNS).Get(n.ctx, pod, metav1.GetOptions{})
	must(t, err)
	body := fmt.Sprintf(`{"waiting": %g, "running": 1, "kvCacheUsage": 0.5}`, waiting)
	resp, err := http.Post("http://"+net.JoinHostPort(p.Status.PodIP, fmt.Sprint(vllmPort))+"/load", "application/json", strings.NewReader(body))
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("set %s's load: %s", pod, resp.Status)
	}
}

// vllmPods: a Kaito Workspace's pod (with a GPU), an InferenceSet's and a
// Deployment's, each a real pod on the bridge, not Ready for its model load,
// then scraped by the agent at its own IP.
func (n *realNode) vllmPods(t *testing.T) {
	if n.aggHTTP == "" {
		t.Skip("the charts' pods did not run")
	}
	defer n.dumpPodsOnFailure(t)
	n.createWorkload(workspaceGVR, "llama", map[string]any{"inference": map[string]any{"replicas": int64(1)}})
	n.createWorkload(infSetGVR, "mixtral", map[string]any{"replicas": int64(1)})
	n.createVLLMPod("llama-0", map[string]string{"kaito.sh/workspace": "llama"}, 1)
	n.createVLLMPod("mixtral-0-0", map[string]string{"kaito.sh/workspace": "mixtral-0", "inferenceset.kaito.sh/created-by": "mixtral"}, 0)
	n.createDeployment("phi", 1)
	created := time.Now()

	// Running with an IP of the bridge's subnet but not Ready while the
	// model loads; meanwhile the aggregator has nothing fresh from them.
	_, podNet, err := net.ParseCIDR(n.podCIDR)
	must(t, err)
	loading := map[string]bool{}
	waitFor(t, 90*time.Second, "the three vLLM pods run at their own IPs", func() error {
		pods, err := n.kube.CoreV1().Pods(appNS).List(n.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ips := map[string]string{}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			if !podNet.Contains(net.ParseIP(p.Status.PodIP)) {
				t.Fatalf("%s has IP %s, outside %s", p.Name, p.Status.PodIP, n.podCIDR)
			}
			if other, ok := ips[p.Status.PodIP]; ok {
				t.Fatalf("%s and %s share IP %s", p.Name, other, p.Status.PodIP)
			}
			ips[p.Status.PodIP] = p.Name
			if !podReady(&p) {
				loading[workloadOf(&p)] = true
			}
		}
		if len(ips) != 3 {
			return fmt.Errorf("%d pods running with an IP: %v", len(ips), ips)
		}
		return nil
	})
	for _, w := range []string{"llama", "mixtral", "phi"} {
		if !loading[w] {
			t.Errorf("%s's pod was never seen Running and not Ready during its %s model load", w, n.loadTime)
		}
	}
	n.notFreshWhileLoading(t, created)
	waitFor(t, n.loadTime+60*time.Second, "every vLLM pod Ready", func() error {
		pods, err := n.kube.CoreV1().Pods(appNS).List(n.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if !podReady(&p) {
				return fmt.Errorf("%s not Ready", p.Name)
			}
		}
		return nil
	})
	if el := time.Since(created); el < n.loadTime {
		t.Errorf("pods Ready %s after creation, before their %s model load ended", el, n.loadTime)
	}
	n.queuesReported(t)
}

// notFreshWhileLoading: while the pods load, the aggregator has nothing
// fresh of them: the workload is unknown to it (404) or its pods are not
// fresh.
func (n *realNode) notFreshWhileLoading(t *testing.T, created time.Time) {
	t.Helper()
	if time.Since(created) < n.loadTime {
		for _, w := range []string{"llama", "mixtral", "phi"} {
			pods, err := n.workloadPods(w)
			if err != nil && !strings.Contains(err.Error(), "404") {
				t.Fatalf("%s while loading: %v", w, err)
			}
			for name, p := range pods {
				if p.Fresh {
					t.Errorf("%s reported fresh while its model loads: %+v", name, p)
				}
			}
		}
		if time.Since(created) >= n.loadTime {
			t.Fatalf("the load ended while the aggregator was asked: raise PULSE_E2E_NODE_LOAD_TIME")
		}
	} else {
		t.Fatalf("the pods ran only %s after creation, after their %s load: raise PULSE_E2E_NODE_LOAD_TIME", time.Since(created), n.loadTime)
	}
}

// queuesReported: each pod's queue, set at its IP, is what the aggregator
// reports.
func (n *realNode) queuesReported(t *testing.T) {
	t.Helper()
	phi0 := n.deploymentPods(t, "phi")[0]
	for pod, w := range map[string]float64{"llama-0": 3, "mixtral-0-0": 5, phi0: 7} {
		n.setWaiting(t, pod, w)
	}
	for workload, want := range map[string]struct {
		pod     string
		waiting float64
	}{"llama": {"llama-0", 3}, "mixtral": {"mixtral-0-0", 5}, "phi": {phi0, 7}} {
		waitFor(t, 30*time.Second, workload+"'s pod reports its queue", func() error {
			pods, err := n.workloadPods(workload)
			if err != nil {
				return err
			}
			p, ok := pods[want.pod]
			if !ok || !p.Fresh || p.Values["waiting"] != want.waiting {
				return fmt.Errorf("%s: %+v", want.pod, pods)
			}
			return nil
		})
	}
}

// workloadOf names the workload a test pod belongs to.
func workloadOf(p *corev1.Pod) string {
	switch {
	case p.Labels["app"] != "":
		return p.Labels["app"]
	case p.Labels["inferenceset.kaito.sh/created-by"] != "":
		return p.Labels["inferenceset.kaito.sh/created-by"]
	}
	return p.Labels["kaito.sh/workspace"]
}

// deploymentPods lists a Deployment's pods that are not terminating.
func (n *realNode) deploymentPods(t *testing.T, name string) []string {
	pods, err := n.kube.CoreV1().Pods(appNS).List(n.ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	must(t, err)
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// gpuAttributed: the pod that got a GPU from the device plugin carries that
// GPU's utilization (the stub's value for its UUID, read through the
// agent's NVML and the kubelet's pod-resources API); the others carry none.
func (n *realNode) gpuAttributed(t *testing.T) {
	if n.aggHTTP == "" {
		t.Skip("the charts' pods did not run")
	}
	defer n.dumpPodsOnFailure(t)
	devs := n.plugin.devices()
	if len(devs) != 1 {
		t.Fatalf("the device plugin allocated %v, want one GPU (llama-0's)", devs)
	}
	want := stubUtilization[devs[0]]
	waitFor(t, 30*time.Second, "llama-0 carries its GPU's utilization", func() error {
		pods, err := n.workloadPods("llama")
		if err != nil {
			return err
		}
		p := pods["llama-0"]
		if got, ok := p.Values["gpuUtilization"]; !ok || got != want {
			return fmt.Errorf("llama-0 (GPU %s): gpuUtilization %v (present %v), want %v: %+v", devs[0], got, ok, want, p)
		}
		return nil
	})
	for _, w := range []string{"mixtral", "phi"} {
		pods, err := n.workloadPods(w)
		must(t, err)
		for name, p := range pods {
			if v, ok := p.Values["gpuUtilization"]; ok {
				t.Errorf("%s has no GPU but reports gpuUtilization %v", name, v)
			}
		}
	}
}

// scaleDeployment: KEDA, through pulse, scales Deployment phi from 1 to 3 on
// its queue (threshold 10, 25 waiting); while the two new pods load, the
// first pod's queue drains to 9 and the HPA's desired count and the
// Deployment's replicas stay at most 3; once they report, the scale-down
// stabilization (45 s) holds 3 until the queue's total calls for fewer, and
// the Deployment goes back to 1.
func (n *realNode) scaleDeployment(t *testing.T) {
	if n.aggHTTP == "" {
		t.Skip("the charts' pods did not run")
	}
	defer n.dumpPodsOnFailure(t)
	n.createScaledObjectSpec("phi-so", map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": "phi"},
		"minReplicaCount": int64(1), "maxReplicaCount": int64(10), "pollingInterval": int64(5),
		"triggers": []any{map[string]any{"type": "external-push",
			"metadata": map[string]any{"scalerAddress": "pulse-aggregator.pulse-system.svc.cluster.local:9090",
				"deployment": "phi", "threshold": "10", "window": "2s"},
			"authenticationRef": map[string]any{"name": "pulse-creds", "kind": "ClusterTriggerAuthentication"}}},
		"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
			"scaleUp": map[string]any{"stabilizationWindowSeconds": int64(0),
				"policies": []any{map[string]any{"type": "Pods", "value": int64(10), "periodSeconds": int64(15)}}},
			// Held for a while once the new pods report (their empty
			// queues bring the total under one replica's), then down.
			"scaleDown": map[string]any{"stabilizationWindowSeconds": int64(45),
				"policies": []any{map[string]any{"type": "Percent", "value": int64(100), "periodSeconds": int64(15)}}}}}},
	})
	defer func() {
		_ = n.dyn.Resource(soGVR).Namespace(appNS).Delete(n.ctx, "phi-so", metav1.DeleteOptions{})
	}()
	deployReplicas := func() int32 {
		d, err := n.kube.AppsV1().Deployments(appNS).Get(n.ctx, "phi", metav1.GetOptions{})
		must(t, err)
		return *d.Spec.Replicas
	}
	first := n.deploymentPods(t, "phi")[0]
	waitFor(t, 60*time.Second, "KEDA's HPA for phi reads pulse's value", func() error {
		d, err := n.hpaDesired("phi-so")
		if err != nil || d != 1 {
			return fmt.Errorf("desired %d: %v", d, err)
		}
		return nil
	})
	n.setWaiting(t, first, 25)
	start := time.Now()
	waitFor(t, 90*time.Second, "the HPA asks for 3 and the Deployment has 3", func() error {
		d, err := n.hpaDesired("phi-so")
		if r := deployReplicas(); err != nil || d != 3 || r != 3 {
			return fmt.Errorf("HPA desired %d (%v), Deployment %d", d, err, r)
		}
		return nil
	})
	t.Logf("1 → 3 %s after the queue rose", time.Since(start).Round(100*time.Millisecond))
	n.setWaiting(t, first, 9)
	n.newPodsLoadAtThree(t, first, deployReplicas)
	n.freshPodsReport(t, "phi", 3)
	if d, err := n.hpaDesired("phi-so"); err != nil || d > 3 {
		t.Fatalf("HPA desired %d (%v) once the new pods report", d, err)
	}
	// The queue empties: back to one replica.
	n.setWaiting(t, first, 0)
	downStart := time.Now()
	waitFor(t, 150*time.Second, "phi back to 1 replica", func() error {
		if r, p := deployReplicas(), len(n.deploymentPods(t, "phi")); r != 1 || p != 1 {
			return fmt.Errorf("Deployment %d replicas, %d pods", r, p)
		}
		return nil
	})
	t.Logf("3 → 1 %s after the queue emptied", time.Since(downStart).Round(100*time.Millisecond))
}

// newPodsLoadAtThree: the new pods of phi (beside first) really start and
// stay not Ready while they load; the count does not run past 3 meanwhile.
func (n *realNode) newPodsLoadAtThree(t *testing.T, first string, deployReplicas func() int32) {
	t.Helper()
	loadStart := time.Now()
	sawLoading := map[string]bool{}
	for time.Since(loadStart) < n.loadTime+30*time.Second {
		d, err := n.hpaDesired("phi-so")
		must(t, err)
		if r := deployReplicas(); d > 3 || r > 3 {
			t.Fatalf("%s into the new pods' load: HPA desired %d, Deployment %d; want at most 3", time.Since(loadStart).Round(time.Second), d, r)
		}
		pods, err := n.kube.CoreV1().Pods(appNS).List(n.ctx, metav1.ListOptions{LabelSelector: "app=phi"})
		must(t, err)
		ready := 0
		for _, p := range pods.Items {
			if p.Name == first {
				continue
			}
			if p.Status.Phase == corev1.PodRunning && !podReady(&p) {
				sawLoading[p.Name] = true
			}
			if podReady(&p) {
				ready++
			}
		}
		if ready == 2 {
			break
		}
		time.Sleep(time.Second)
	}
	if len(sawLoading) != 2 {
		t.Fatalf("the two new pods were not both seen running and loading: %v", sawLoading)
	}
}

// freshPodsReport waits for want fresh pods of workload at the aggregator.
func (n *realNode) freshPodsReport(t *testing.T, workload string, want int) {
	t.Helper()
	waitFor(t, 60*time.Second, "the new pods report", func() error {
		pods, err := n.workloadPods(workload)
		if err != nil {
			return err
		}
		fresh := 0
		for _, p := range pods {
			if p.Fresh {
				fresh++
			}
		}
		if fresh != want {
			return fmt.Errorf("%d fresh: %+v", fresh, pods)
		}
		return nil
	})
}

// madeObj is an object a release rendered.
type madeObj struct{ apiVersion, kind, namespace, name string }

// releasesMade lists what both releases rendered, from their manifests.
func (n *realNode) releasesMade(t *testing.T) []madeObj {
	t.Helper()
	var made []madeObj
	for _, rel := range []string{aggRelease, agtRelease} {
		manifest := n.helm("get", "manifest", rel, "--namespace", ns)
		for _, doc := range strings.Split(manifest, "\n---") {
			var m struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil || m.Kind == "" {
				continue
			}
			made = append(made, madeObj{m.APIVersion, m.Kind, m.Metadata.Namespace, m.Metadata.Name})
		}
	}
	if len(made) == 0 {
		t.Fatal("the releases' manifests list nothing")
	}
	return made
}

// runtimeMade: what the aggregator made at run time, owned by the chart's
// ClusterRole (its certificates, the CA published for the agents, KEDA's
// credentials and ClusterTriggerAuthentication, the provisioner's Lease),
// each a Get.
func (n *realNode) runtimeMade() map[string]func() error {
	made := n.certsMade()
	if n.relayOn {
		made["Secret pulse-system/pulse-aggregator-relay-tls"] = func() error {
			_, err := n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-relay-tls", metav1.GetOptions{})
			return err
		}
	}
	return made
}

// certsMade: runtimeMade but the relay's certificate.
func (n *realNode) certsMade() map[string]func() error {
	return map[string]func() error{
		"ConfigMap pulse-system/pulse-aggregator-ca": func() error {
			_, err := n.kube.CoreV1().ConfigMaps(ns).Get(n.ctx, "pulse-aggregator-ca", metav1.GetOptions{})
			return err
		},
		"Secret pulse-system/pulse-aggregator-certs": func() error {
			_, err := n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-certs", metav1.GetOptions{})
			return err
		},
		"Secret keda/pulse-creds": func() error {
			_, err := n.kube.CoreV1().Secrets("keda").Get(n.ctx, "pulse-creds", metav1.GetOptions{})
			return err
		},
		"ClusterTriggerAuthentication pulse-creds": func() error {
			_, err := n.dyn.Resource(ctaGVR).Get(n.ctx, "pulse-creds", metav1.GetOptions{})
			return err
		},
		"Lease pulse-system/pulse-aggregator-provisioner": func() error {
			_, err := n.kube.CoordinationV1().Leases(ns).Get(n.ctx, "pulse-aggregator-provisioner", metav1.GetOptions{})
			return err
		},
	}
}

// uninstall: after helm uninstall, nothing either chart rendered is left,
// nor any pod of either release, nor what the aggregator made at run time
// (owned by the chart's ClusterRole, deleted by the garbage collector).
func (n *realNode) uninstall(t *testing.T) {
	made := n.releasesMade(t)
	runtimeMade := n.runtimeMade()
	for what, get := range runtimeMade {
		if err := get(); err != nil {
			t.Fatalf("before helm uninstall, %s: %v", what, err)
		}
	}
	n.helm("uninstall", agtRelease, "--namespace", ns, "--wait", "--timeout", "2m")
	n.helm("uninstall", aggRelease, "--namespace", ns, "--wait", "--timeout", "2m")
	disc := n.kube.Discovery()
	waitFor(t, 90*time.Second, "everything the charts made is gone", func() error {
		var left []string
		for _, o := range made {
			gv, err := schema.ParseGroupVersion(o.apiVersion)
			if err != nil {
				return err
			}
			res, err := disc.ServerResourcesForGroupVersion(o.apiVersion)
			if err != nil {
				return err
			}
			plural := ""
			namespaced := false
			for _, r := range res.APIResources {
				if r.Kind == o.kind && !strings.Contains(r.Name, "/") {
					plural, namespaced = r.Name, r.Namespaced
				}
			}
			gvr := gv.WithResource(plural)
			var err2 error
			if namespaced {
				namespace := o.namespace
				if namespace == "" {
					namespace = ns
				}
				_, err2 = n.dyn.Resource(gvr).Namespace(namespace).Get(n.ctx, o.name, metav1.GetOptions{})
			} else {
				_, err2 = n.dyn.Resource(gvr).Get(n.ctx, o.name, metav1.GetOptions{})
			}
			if !apierrors.IsNotFound(err2) {
				left = append(left, fmt.Sprintf("%s %s (%v)", o.kind, o.name, err2))
			}
		}
		pods, err := n.kube.CoreV1().Pods(ns).List(n.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			left = append(left, "pod "+p.Name)
		}
		for what, get := range runtimeMade {
			if err := get(); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%s (%v)", what, err))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}
		return nil
	})
	t.Logf("helm uninstall removed all %d objects the two releases made, their pods, and the %d objects the aggregator made", len(made), len(runtimeMade))
}

// relayCarries: helm upgrade with the aggregator chart's relay.enabled and
// the daemonset chart's relay: the relay serves the agent the certificate
// the aggregator issued it (the agent checks it against the CA it already
// trusts, for the relay Service's name), carries its stream to each
// aggregator replica with its token, and the replicas' values stay fresh.
func (n *realNode) relayCarries(t *testing.T) {
	if n.aggHTTP == "" {
		t.Skip("the charts' pods did not run")
	}
	defer n.dumpPodsOnFailure(t)
	root := repoRoot(t)
	repo, tag := splitRef(n.refs["pulse-relay"])
	start := time.Now()
	n.helm("upgrade", aggRelease, filepath.Join(root, "deploy", "aggregator"), "--namespace", ns, "--reuse-values",
		"--set", "relay.enabled=true,relay.replicaCount=1,relay.image.repository="+repo,
		// A tag of digits (a short commit hash) stays a string: --set makes
		// it a number, which --reuse-values writes back as 5.187467e+06.
		"--set-string", "relay.image.tag="+tag)
	n.helm("upgrade", agtRelease, filepath.Join(root, "deploy", "daemonset"), "--namespace", ns, "--reuse-values",
		"--set", "relay=pulse-aggregator-relay."+ns+".svc.cluster.local:9091")
	var relayIP string
	waitFor(t, 240*time.Second, "the relay, both aggregator replicas and the agent run their new revisions, Ready", func() error {
		var err error
		relayIP, err = n.rolledOut(true)
		return err
	})
	t.Logf("rolled out %s after the upgrades", time.Since(start).Round(100*time.Millisecond))
	sec, err := n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-relay-tls", metav1.GetOptions{})
	must(t, err)
	n.relayOn = true // uninstall checks it goes
	if sec.Type != corev1.SecretTypeTLS || sec.Data["ca.key"] != nil || bytes.Contains(sec.Data["ca.crt"], []byte("PRIVATE KEY")) {
		t.Errorf("relay secret of type %s with keys %v: want kubernetes.io/tls without a CA key", sec.Type, slices.Sorted(maps.Keys(sec.Data)))
	}
	// One stream to each replica, and the agent's batches through them.
	waitFor(t, 60*time.Second, "the relay forwards the agent's stream to both replicas", func() error {
		m, err := relayMetrics(relayIP)
		if err != nil {
			return err
		}
		if m["pulse_relay_streams"] != 2 || m[`pulse_relay_messages_total{direction="to_aggregator"}`] == 0 {
			return fmt.Errorf("relay streams %v, messages to the aggregators %v", m["pulse_relay_streams"], m[`pulse_relay_messages_total{direction="to_aggregator"}`])
		}
		return nil
	})
	n.aggHTTP = n.aggregatorHTTP(t) // the replicas are new
	n.freshPodsReport(t, "llama", 1)

	// A hand edit of the relays' Secret is put right by the aggregator's
	// watch on it (RBAC lets it list and watch that one name), not at its
	// hourly check.
	sec, err = n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-relay-tls", metav1.GetOptions{})
	must(t, err)
	sec.Data["tls.key"] = []byte("garbled")
	_, err = n.kube.CoreV1().Secrets(ns).Update(n.ctx, sec, metav1.UpdateOptions{})
	must(t, err)
	waitFor(t, 60*time.Second, "the relays' garbled key put right", func() error {
		s, err := n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-relay-tls", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
		return err
	})

	// The relay turned off again: the agent dials the replicas, and the
	// aggregator removes the relays' Secret it made (its key stayed valid
	// until the release was uninstalled).
	start = time.Now()
	n.helm("upgrade", agtRelease, filepath.Join(root, "deploy", "daemonset"), "--namespace", ns, "--reuse-values", "--set", "relay=")
	n.helm("upgrade", aggRelease, filepath.Join(root, "deploy", "aggregator"), "--namespace", ns, "--reuse-values", "--set", "relay.enabled=false")
	waitFor(t, 240*time.Second, "both aggregator replicas and the agent run their new revisions, Ready, and the relays' Secret removed", func() error {
		if _, err := n.rolledOut(false); err != nil {
			return err
		}
		if _, err := n.kube.CoreV1().Secrets(ns).Get(n.ctx, "pulse-aggregator-relay-tls", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the relays' Secret: %v, want it gone", err)
		}
		return nil
	})
	n.relayOn = false // gone already; uninstall no longer looks for it
	t.Logf("relay off: rolled out and its Secret removed %s after the upgrades", time.Since(start).Round(100*time.Millisecond))
	n.aggHTTP = n.aggregatorHTTP(t)
	n.freshPodsReport(t, "llama", 1)
}

// rolledOut returns the relay pod's IP (with relay; "" without) once the
// relay Deployment (with relay), the aggregator's and the agent DaemonSet
// have each rolled out their newest revision with every pod Ready.
func (n *realNode) rolledOut(relay bool) (string, error) {
	names := []string{"pulse-aggregator"}
	if relay {
		names = append(names, "pulse-aggregator-relay")
	}
	for _, name := range names {
		d, err := n.kube.AppsV1().Deployments(ns).Get(n.ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		st := d.Status
		if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != *d.Spec.Replicas || st.Replicas != *d.Spec.Replicas || st.ReadyReplicas != *d.Spec.Replicas {
			return "", fmt.Errorf("deployment %s: %d updated, %d in all, %d ready of %d", name, st.UpdatedReplicas, st.Replicas, st.ReadyReplicas, *d.Spec.Replicas)
		}
	}
	ds, err := n.kube.AppsV1().DaemonSets(ns).Get(n.ctx, agtRelease, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if st := ds.Status; st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != 1 || st.NumberReady != 1 || st.NumberAvailable != 1 {
		return "", fmt.Errorf("agent daemonset: %d updated, %d ready", st.UpdatedNumberScheduled, st.NumberReady)
	}
	if !relay {
		return "", nil
	}
	pods, err := n.kube.CoreV1().Pods(ns).List(n.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=pulse-relay"})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		if podReady(&p) {
			return p.Status.PodIP, nil
		}
	}
	return "", errors.New("no relay pod Ready")
}

// relayMetrics reads a relay's /metrics (plaintext, its http port) as
// series (name and labels as exposed) to values.
func relayMetrics(ip string) (map[string]float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + net.JoinHostPort(ip, "8080") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("relay /metrics: %s %v", resp.Status, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if strings.HasPrefix(line, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}
