//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// freePort returns a port free on 127.0.0.1 now, below the kernel's
// ephemeral range where it can: a port the kernel gave (":0") is one it
// also gives to the connections every process here opens (the API
// server's to etcd, KEDA's, the kubelet's), and one such connection took
// the aggregator's --http-addr between this pick and the aggregator's
// bind ("address already in use"). Ports below the range are given to no
// connection; the picks among them are random, each checked free.
func freePort(t testing.TB) int {
	t.Helper()
	if low := ephemeralLow(); low > 12000 {
		for range 100 {
			port := 10000 + mrand.IntN(low-10000)
			if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				_ = ln.Close()
				return port
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// ephemeralLow is the lowest port of the kernel's ephemeral range (0 when
// it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	low, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return 0
	}
	return low
}

// proc is a child process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
}

// start runs a child that dies with the test process (Pdeathsig) and is
// stopped when the test ends.
func start(t testing.TB, dir, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	recordPID(t, cmd.Process.Pid, name)
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = f.Close(); close(p.done) }() // its exit is read from cmd.ProcessState
	t.Cleanup(func() { p.stop() })
	return p
}

// recordPID appends a started process to $PULSE_E2E_NODE_STATE/pids (PID,
// start time, name), from which test/e2e/node/run.sh stops whatever is left
// when the test is interrupted.
func recordPID(t testing.TB, pid int, name string) {
	state := os.Getenv("PULSE_E2E_NODE_STATE")
	if state == "" {
		return
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return // already gone
	}
	// Field 22, counted after the command's closing parenthesis.
	rest := string(stat[bytes.LastIndexByte(stat, ')')+2:])
	f := strings.Fields(rest)
	f2, err := os.OpenFile(filepath.Join(state, "pids"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("record %s's PID: %v", name, err)
	}
	defer f2.Close()
	if _, err := fmt.Fprintf(f2, "%d %s %s\n", pid, f[19], name); err != nil {
		t.Fatalf("record %s's PID: %v", name, err)
	}
}

// stop ends the process (SIGTERM, then SIGKILL after 10s) and waits for it.
func (p *proc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// kill ends the process at once (SIGKILL), as a node failure would.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls check until it passes or d elapses.
func waitFor(t testing.TB, d time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	failedWaits.add(fmt.Sprintf("%s: %s: %v", t.Name(), what, err))
	t.Fatalf("%s: %v", what, err)
}

// failedWaits are the waits that timed out, in order. A failed run repeats
// them at its very end (summary), where a CI log's tail shows them.
var failedWaits waits

type waits struct {
	mu   sync.Mutex
	list []string
}

func (w *waits) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, clip(s, 300))
}

func (w *waits) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.list)
}

// clip shortens s to at most n bytes, on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// pki is the control plane's certificates.
type pki struct {
	dir                 string
	caCert              *x509.Certificate
	caKey               *ecdsa.PrivateKey
	caPEM               []byte
	serverCert, serverK string // apiserver
	adminCert, adminKey string
	saPub, saKey        string
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newPKI makes the CA and the control plane's certificates; the API server's
// names 127.0.0.1 and apiIPs.
func newPKI(t testing.TB, dir string, apiIPs ...net.IP) *pki {
	t.Helper()
	p := &pki{dir: dir}
	var err error
	p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pulse-e2e-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
	p.serverCert, p.serverK = p.issue(t, "apiserver", "kube-apiserver", nil, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		append([]net.IP{net.ParseIP("127.0.0.1")}, apiIPs...), x509.ExtKeyUsageServerAuth)
	p.adminCert, p.adminKey = p.issue(t, "admin", "pulse-e2e-admin", []string{"system:masters"}, nil, nil, x509.ExtKeyUsageClientAuth)
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p.saKey, p.saPub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	writePEM(t, p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa))
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	writePEM(t, p.saPub, "PUBLIC KEY", pub)
	return p
}

// issue signs a certificate and returns the paths of it and its key.
func (p *pki) issue(t testing.TB, name, cn string, orgs, dns []string, ips []net.IP, usage x509.ExtKeyUsage) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: dns, IPAddresses: ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	crt, keyPath := filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	writePEM(t, crt, "CERTIFICATE", der)
	kb, _ := x509.MarshalECPrivateKey(key)
	writePEM(t, keyPath, "EC PRIVATE KEY", kb)
	return crt, keyPath
}

// controlPlane is etcd, kube-apiserver and kube-controller-manager, or an
// existing cluster's API server.
type controlPlane struct {
	url        string
	caPEM      []byte // the API server's CA
	pki        *pki   // certificates this test issues (KEDA's, and the local control plane's)
	admin      *rest.Config
	kubeconfig string // the admin's
	procs      []*proc
}

// cpOptions change the control plane for a real node; the zero value is the
// kubelet-less control plane on loopback.
type cpOptions struct {
	addr        string // the API server's bind and advertised address (default 127.0.0.1)
	serviceCIDR string // default 10.0.0.0/24
	serviceIP   string // the kubernetes Service's ClusterIP, named in the API server's certificate
	controllers string // more kube-controller-manager controllers, comma-separated
}

func startControlPlane(t *testing.T, tools, dir string, o cpOptions) *controlPlane {
	t.Helper()
	if o.addr == "" {
		o.addr = "127.0.0.1"
	}
	if o.serviceCIDR == "" {
		o.serviceCIDR = "10.0.0.0/24"
	}
	var ips []net.IP
	for _, a := range []string{o.addr, o.serviceIP} {
		if a != "" {
			ips = append(ips, net.ParseIP(a))
		}
	}
	p := newPKI(t, dir, ips...)
	etcdPort, peerPort, apiPort := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	etcd := start(t, dir, "etcd", nil, filepath.Join(tools, "etcd"),
		"--data-dir="+filepath.Join(dir, "etcd-data"), "--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peerPort),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", peerPort),
		"--unsafe-no-fsync", "--log-level=warn")
	issuer := "https://kubernetes.default.svc.cluster.local"
	// The aggregation layer, for KEDA's metrics adapter (the HPA's External
	// metrics): the API server authenticates to it as front-proxy-client and
	// reaches it at its endpoint's address.
	proxyCrt, proxyKey := p.issue(t, "front-proxy-client", "front-proxy-client", nil, nil, nil, x509.ExtKeyUsageClientAuth)
	api := start(t, dir, "kube-apiserver", nil, filepath.Join(tools, "kube-apiserver"),
		"--etcd-servers="+etcdURL, fmt.Sprintf("--secure-port=%d", apiPort), "--bind-address="+o.addr,
		"--advertise-address="+o.addr, "--tls-cert-file="+p.serverCert, "--tls-private-key-file="+p.serverK,
		"--client-ca-file="+filepath.Join(dir, "ca.crt"), "--service-account-issuer="+issuer,
		"--service-account-key-file="+p.saPub, "--service-account-signing-key-file="+p.saKey, "--api-audiences="+issuer,
		"--authorization-mode=RBAC", "--service-cluster-ip-range="+o.serviceCIDR, "--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--requestheader-client-ca-file="+filepath.Join(dir, "ca.crt"), "--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-", "--proxy-client-cert-file="+proxyCrt,
		"--proxy-client-key-file="+proxyKey, "--enable-aggregator-routing=true",
		// To a kubelet (a real node's: logs), as the admin.
		"--kubelet-client-certificate="+p.adminCert, "--kubelet-client-key="+p.adminKey,
		"--kubelet-preferred-address-types=InternalIP,Hostname", "--v=1")
	cp := &controlPlane{url: fmt.Sprintf("https://%s", net.JoinHostPort(o.addr, fmt.Sprint(apiPort))), caPEM: p.caPEM, pki: p, procs: []*proc{etcd, api}}
	cp.admin = &rest.Config{Host: cp.url, TLSClientConfig: rest.TLSClientConfig{
		CAData: p.caPEM, CertFile: p.adminCert, KeyFile: p.adminKey}, QPS: 100, Burst: 200}
	cp.kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	cp.writeKubeconfig(t, cp.kubeconfig, &clientcmdapi.AuthInfo{ClientCertificate: p.adminCert, ClientKey: p.adminKey})
	waitFor(t, 90*time.Second, "kube-apiserver ready", func() error {
		if api.cmd.ProcessState != nil {
			t.Fatalf("kube-apiserver exited:\n%s", api.tail(30))
		}
		c, err := kubernetes.NewForConfig(cp.admin)
		if err != nil {
			return err
		}
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	})
	controllers := "serviceaccount,serviceaccount-token,namespace,garbagecollector,deployment,replicaset,daemonset,horizontalpodautoscaling," +
		"validatingadmissionpolicy-status-controller"
	if o.controllers != "" {
		controllers += "," + o.controllers
	}
	kcm := start(t, dir, "kube-controller-manager", nil, filepath.Join(tools, "kube-controller-manager"),
		"--kubeconfig="+cp.kubeconfig, "--leader-elect=false", "--secure-port=0",
		"--controllers="+controllers,
		"--service-account-private-key-file="+p.saKey, "--root-ca-file="+filepath.Join(dir, "ca.crt"),
		"--use-service-account-credentials=false", "--v=1")
	cp.procs = append(cp.procs, kcm)
	return cp
}

// useCluster uses an existing cluster's API server (PULSE_E2E_KUBECONFIG)
// with the kubeconfig's credentials as the admin's.
func useCluster(t *testing.T, kubeconfig, dir string) *controlPlane {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("PULSE_E2E_KUBECONFIG: %v", err)
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	cfg.QPS, cfg.Burst = 100, 200
	return &controlPlane{url: cfg.Host, caPEM: ca, pki: newPKI(t, dir), admin: cfg, kubeconfig: kubeconfig}
}

// local reports whether the control plane is the test's own (not
// PULSE_E2E_KUBECONFIG's): only then can its API server reach KEDA's metrics
// adapter on this machine.
func (cp *controlPlane) local() bool { return len(cp.procs) > 0 }

// writeKubeconfig writes a kubeconfig for this cluster with auth.
func (cp *controlPlane) writeKubeconfig(t testing.TB, path string, auth *clientcmdapi.AuthInfo) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cp.url, CertificateAuthorityData: cp.caPEM}
	cfg.AuthInfos["user"] = auth
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "user"}
	cfg.CurrentContext = "e2e"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// dumpLogs prints the tail of every process's log, for a failed test.
// It ends with a summary of a few lines (summary), the part of a long log
// that is read first.
func dumpLogs(t *testing.T, procs ...*proc) {
	for _, p := range procs {
		if p != nil {
			t.Logf("---- %s (last lines) ----\n%s", p.name, p.tail(25))
		}
	}
}

// summary is a failed run's diagnosis in a few lines: the waits that timed
// out (the first few), what else the caller found (extra: the
// ScaledObjects' conditions), the last error each process logged, and
// which processes had exited.
func summary(t *testing.T, extra []string, procs ...*proc) {
	var b strings.Builder
	b.WriteString("---- summary ----")
	ws := failedWaits.all()
	for i, w := range ws {
		if i == 4 {
			fmt.Fprintf(&b, "\n  and %d more waits timed out", len(ws)-i)
			break
		}
		b.WriteString("\n  timed out: " + w)
	}
	for _, x := range extra {
		b.WriteString("\n  " + clip(x, 400))
	}
	var states []string
	for _, p := range procs {
		if p == nil {
			continue
		}
		state := "running"
		select {
		case <-p.done:
			state = "EXITED (" + p.cmd.ProcessState.String() + ")"
		default:
		}
		states = append(states, p.name+" "+state)
		if e := p.lastError(); e != "" {
			b.WriteString("\n  " + p.name + "'s last error: " + clip(e, 300))
		}
	}
	b.WriteString("\n  processes: " + strings.Join(states, ", "))
	t.Log(b.String())
}

// errorLine matches a log line at error level: slog's text (pulse),
// zap's JSON (KEDA), klog's E lines (Kubernetes), etcd's and Prometheus'
// JSON or logfmt, and a panic.
var errorLine = regexp.MustCompile(`level=(ERROR|error)\b|"level":"error"|^E\d{4} |^panic:`)

// lastError is the last line of the process's log that reports an error.
func (p *proc) lastError() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if errorLine.MatchString(l) {
			return l
		}
	}
	return ""
}

// scanMetric finds the value of the first sample of name whose labels
// contain every want pair, in a Prometheus text page.
func scanMetric(page []byte, name string, want map[string]string) (float64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for k, v := range want {
			if !strings.Contains(line, k+`="`+v+`"`) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
			return v, true
		}
	}
	return 0, false
}

// TestErrorLine: the summary's last error is a line at error level, not
// one that only names an error.
func TestErrorLine(t *testing.T) {
	for line, want := range map[string]bool{
		`time=2026-11-26T08:39:18Z level=ERROR msg="evaluate" err=stale`:                                      true,
		`{"level":"error","ts":"2026-11-26T07:20:55Z","logger":"scale_handler","msg":"error getting metric"}`: true,
		`E1126 08:39:16.341094 25015 remote_available_controller.go:448] "Unhandled Error"`:                   true,
		`E0302 01:02:03.000000 1 controller.go:1] failed`:                                                     true,
		`panic: runtime error: index out of range`:                                                            true,
		`time=2026-11-26T08:39:18Z level=INFO msg="NVML unavailable" err="init: ERROR_LIBRARY_NOT_FOUND"`:     false,
		`{"level":"warn","ts":"2026-11-26T07:20:55Z","msg":"slow fdatasync"}`:                                 false,
		`I1126 08:39:16.341094 25015 controller.go:1] "error syncing" is only logged at info here`:            false,
	} {
		if got := errorLine.MatchString(line); got != want {
			t.Errorf("%q: %v, want %v", line, got, want)
		}
	}
}
