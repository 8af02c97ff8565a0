// Package aggregator wires pulse's aggregator: the agents' ingest stream
// server, the store, the KEDA external-push scaler and the HTTP endpoints.
package aggregator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pulse-io/pulse/pkg/certs"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/version"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Options are the aggregator's flags.
type Options struct {
	IngestAddr       string
	ScalerAddr       string
	HTTPAddr         string
	MaxWindow        time.Duration
	FreshFor         time.Duration
	MaxPodsPerAgent  int
	ShutdownTimeout  time.Duration
	LogFormat        string
	LogLevel         string
	MaxSamplesPerPod int
	MaxPods          int
	PodExpiry        time.Duration
	ResolveTargets   bool
	KubeConfig       string
	TLSCertFile      string
	TLSKeyFile       string
	TLSClientCAFile  string
	IngestTLSCert    string
	IngestTLSKey     string
	AgentAuth        string
	AgentAudience    string
	AgentAccounts    []string
	agentAccountsSet bool
	DebugAddr        string
	ManageCerts      bool
	Namespace        string
	CertSecret       string
	CertDNSNames     []string
	CertIPs          []string
	CertValidity     time.Duration
	KEDANamespace    string
	TriggerAuthName  string
	Warmup           time.Duration
	ExpectedAgents   int
	AgentDaemonSet   string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		IngestAddr: ":9091", ScalerAddr: ":9090", HTTPAddr: ":8080",
		MaxWindow: time.Minute, FreshFor: 5 * time.Second, MaxPodsPerAgent: 1024,
		ShutdownTimeout: 5 * time.Second, LogFormat: "json", LogLevel: "info", MaxSamplesPerPod: 128,
		MaxPods: 10000, PodExpiry: 10 * time.Minute,
		AgentAuth: "none", AgentAudience: "pulse", AgentAccounts: []string{"pulse-system/pulse-agent"},
		Namespace: os.Getenv("POD_NAMESPACE"), CertSecret: "pulse-aggregator-certs", CertValidity: 90 * 24 * time.Hour,
		KEDANamespace: "keda", TriggerAuthName: "pulse-creds",
		// The agents re-resolve the headless Service every 10s (their
		// --resolve-interval), then report within their 1s interval; the
		// default staleAfter (5s) bounds the rest.
		Warmup: 15 * time.Second,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.IngestAddr, "ingest-addr", o.IngestAddr, "address of the agents' gRPC ingest stream")
	fs.StringVar(&o.ScalerAddr, "scaler-addr", o.ScalerAddr, "address of the KEDA external-push scaler (gRPC, with gRPC health)")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "address of /debug/workloads, /metrics, /livez and /readyz")
	fs.StringVar(&o.DebugAddr, "debug-addr", o.DebugAddr, "serve /debug/workloads on this address alone (e.g. 127.0.0.1:8082, reachable only from the pod) instead of on --http-addr")
	fs.DurationVar(&o.MaxWindow, "max-window", o.MaxWindow, "samples kept per pod, and the longest trigger window allowed")
	fs.IntVar(&o.MaxSamplesPerPod, "max-samples-per-pod", o.MaxSamplesPerPod, "cap on samples kept per pod")
	fs.DurationVar(&o.FreshFor, "fresh-for", o.FreshFor, "how recent a pod's last sample must be to count as fresh in the debug endpoint")
	fs.IntVar(&o.MaxPodsPerAgent, "max-pods-per-agent", o.MaxPodsPerAgent, "pods one agent stream may list")
	fs.IntVar(&o.MaxPods, "max-pods", o.MaxPods, "pods held in all; past it the pod listed least recently is evicted")
	fs.DurationVar(&o.PodExpiry, "pod-expiry", o.PodExpiry, "pods of an agent disconnected this long are dropped")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long a graceful stop may take before streams are cut")
	fs.BoolVar(&o.ResolveTargets, "resolve-scale-targets", o.ResolveTargets, "when a trigger names no workload, find it from its ScaledObject's scaleTargetRef (watches ScaledObjects)")
	fs.StringVar(&o.KubeConfig, "kubeconfig", o.KubeConfig, "kubeconfig for --resolve-scale-targets (default: the in-cluster config)")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "scaler port: serve TLS with this certificate (re-read when it changes)")
	fs.StringVar(&o.TLSKeyFile, "tls-key-file", o.TLSKeyFile, "scaler port: the certificate's key")
	fs.StringVar(&o.TLSClientCAFile, "tls-client-ca-file", o.TLSClientCAFile, "scaler port: require client certificates signed by this CA (KEDA's tlsClientCert)")
	fs.StringVar(&o.IngestTLSCert, "ingest-tls-cert-file", o.IngestTLSCert, "ingest port: serve TLS with this certificate (re-read when it changes)")
	fs.StringVar(&o.IngestTLSKey, "ingest-tls-key-file", o.IngestTLSKey, "ingest port: the certificate's key")
	fs.StringVar(&o.AgentAuth, "agent-auth", o.AgentAuth, "agent authentication: none, or tokenreview (ServiceAccount token bound to a pod; the stream may speak only for that pod's node)")
	fs.StringVar(&o.AgentAudience, "agent-audience", o.AgentAudience, "audience agent tokens must carry")
	fs.Func("agent-service-account", "namespace/name of the agents' ServiceAccount; repeatable (default pulse-system/pulse-agent)", func(v string) error {
		if !o.agentAccountsSet {
			o.AgentAccounts, o.agentAccountsSet = nil, true
		}
		o.AgentAccounts = append(o.AgentAccounts, v)
		return nil
	})
	fs.BoolVar(&o.ManageCerts, "manage-certs", o.ManageCerts, "scaler port: make, renew and serve a CA, server and client certificates (a Secret), and KEDA's ClusterTriggerAuthentication")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "the aggregator's namespace, for --manage-certs (default $POD_NAMESPACE)")
	fs.StringVar(&o.CertSecret, "cert-secret", o.CertSecret, "--manage-certs: the Secret holding the certificates")
	fs.Func("cert-dns-name", "--manage-certs: a DNS name of the scaler Service for the server certificate; repeatable", func(v string) error {
		o.CertDNSNames = append(o.CertDNSNames, v)
		return nil
	})
	fs.Func("cert-ip", "--manage-certs: an IP for the server certificate; repeatable", func(v string) error {
		if net.ParseIP(v) == nil {
			return fmt.Errorf("%q is not an IP", v)
		}
		o.CertIPs = append(o.CertIPs, v)
		return nil
	})
	fs.DurationVar(&o.CertValidity, "cert-validity", o.CertValidity, "--manage-certs: validity of the certificates (renewed two thirds through)")
	fs.StringVar(&o.KEDANamespace, "keda-namespace", o.KEDANamespace, "--manage-certs: KEDA's namespace, where its client credentials Secret goes")
	fs.StringVar(&o.TriggerAuthName, "trigger-auth-name", o.TriggerAuthName, "--manage-certs: name of the ClusterTriggerAuthentication (and of KEDA's Secret)")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "after start, answer KEDA Unavailable (and stay unready) until the expected agents have reported or this long has passed, so that no answer is a partial total; about the agents' --resolve-interval plus staleAfter (0: none)")
	fs.IntVar(&o.ExpectedAgents, "expected-agents", o.ExpectedAgents, "end the warm-up once this many agents have reported (0: unknown, unless --agent-daemonset gives it)")
	fs.StringVar(&o.AgentDaemonSet, "agent-daemonset", o.AgentDaemonSet, "namespace/name of the agent DaemonSet: its desiredNumberScheduled is the number of agents the warm-up waits for")
	fs.StringVar(&o.LogFormat, "log-format", o.LogFormat, "log format: json or text")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "log level: debug, info, warn or error")
}

// Validate reports every problem of the options.
func (o *Options) Validate() error {
	var errs []error
	if o.MaxWindow < time.Second {
		errs = append(errs, errors.New("--max-window must be at least 1s"))
	}
	if o.FreshFor <= 0 {
		errs = append(errs, errors.New("--fresh-for must be above 0"))
	}
	if o.MaxPodsPerAgent < 1 || o.MaxSamplesPerPod < 2 || o.MaxPods < 1 {
		errs = append(errs, errors.New("--max-pods-per-agent and --max-pods must be at least 1 and --max-samples-per-pod at least 2"))
	}
	if o.ManageCerts {
		if o.TLSCertFile != "" {
			errs = append(errs, errors.New("--manage-certs and --tls-cert-file exclude each other"))
		}
		if o.Namespace == "" {
			errs = append(errs, errors.New("--manage-certs needs --namespace (or $POD_NAMESPACE)"))
		}
		if len(o.CertDNSNames)+len(o.CertIPs) == 0 {
			errs = append(errs, errors.New("--manage-certs needs a --cert-dns-name or --cert-ip for the scaler Service"))
		}
		if o.CertValidity < time.Hour {
			errs = append(errs, errors.New("--cert-validity must be at least 1h"))
		}
	}
	if n := countSet(o.IngestTLSCert, o.IngestTLSKey); n == 1 {
		errs = append(errs, errors.New("--ingest-tls-cert-file and --ingest-tls-key-file go together"))
	}
	if o.AgentAuth != "none" && o.AgentAuth != "tokenreview" {
		errs = append(errs, fmt.Errorf("--agent-auth %q: want none or tokenreview", o.AgentAuth))
	}
	if n := countSet(o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile); n != 0 && n != 3 {
		errs = append(errs, errors.New("--tls-cert-file, --tls-key-file and --tls-client-ca-file go together"))
	}
	if o.Warmup < 0 || o.ExpectedAgents < 0 {
		errs = append(errs, errors.New("--warmup and --expected-agents must not be negative"))
	}
	if o.AgentDaemonSet != "" {
		if ns, name, ok := strings.Cut(o.AgentDaemonSet, "/"); !ok || ns == "" || name == "" {
			errs = append(errs, fmt.Errorf("--agent-daemonset %q: want namespace/name", o.AgentDaemonSet))
		}
	}
	if o.PodExpiry <= 0 {
		errs = append(errs, errors.New("--pod-expiry must be above 0"))
	}
	if o.LogFormat != "json" && o.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("--log-format %q: want json or text", o.LogFormat))
	}
	return errors.Join(errs...)
}

// ServerKeepalive accepts KEDA's and the agents' keepalive pings.
var (
	ServerKeepalive = keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	ServerPolicy    = keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}
)

// Aggregator is a wired aggregator whose listeners are open.
type Aggregator struct {
	opts                       *Options
	log                        *slog.Logger
	store                      *store.Store
	scaler                     *scaler.Server
	ingestSrv, scalerSrv       *grpc.Server
	httpSrv                    *http.Server
	ingestLn, scalerLn, httpLn net.Listener
	resolver                   *scaler.InformerResolver // nil unless --resolve-scale-targets
	ingest                     *ingest.Server
	managed                    *certs.Managed // nil unless --manage-certs
	debugLn                    net.Listener   // nil unless --debug-addr
	debugSrv                   *http.Server
	health                     *health
	warmup                     *warmup
	kube                       kubernetes.Interface  // nil unless a feature needs the API
	reviewer                   *ingest.TokenReviewer // nil unless --agent-auth=tokenreview
}

// housekeepEvery is the period of the housekeeping loop (sweeping expired
// pods); /livez fails when a tick is 1.5 periods late.
const housekeepEvery = 2 * time.Second

// New wires an aggregator and opens its listeners, so that addresses such
// as 127.0.0.1:0 are bound (see the Addr methods) before Run.
func New(o *Options, log *slog.Logger) (*Aggregator, error) {
	a := &Aggregator{opts: o, log: log}
	var err error
	if a.ingestLn, err = net.Listen("tcp", o.IngestAddr); err != nil {
		return nil, fmt.Errorf("listen on ingest address %s: %w", o.IngestAddr, err)
	}
	if a.scalerLn, err = net.Listen("tcp", o.ScalerAddr); err != nil {
		a.ingestLn.Close()
		return nil, fmt.Errorf("listen on scaler address %s: %w", o.ScalerAddr, err)
	}
	if a.httpLn, err = net.Listen("tcp", o.HTTPAddr); err != nil {
		a.ingestLn.Close()
		a.scalerLn.Close()
		return nil, fmt.Errorf("listen on http address %s: %w", o.HTTPAddr, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.store = store.New(store.Options{Retention: o.MaxWindow, MaxSamples: o.MaxSamplesPerPod, MaxPods: o.MaxPods, Expiry: o.PodExpiry})
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pulse_aggregator_pods", Help: "Pods held in the store."}, func() float64 { return float64(a.store.Pods()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pulse_aggregator_pods_evicted_total", Help: "Pods evicted because --max-pods was reached."}, func() float64 { return float64(a.store.Evicted()) }))

	grpcOpts := []grpc.ServerOption{grpc.KeepaliveParams(ServerKeepalive), grpc.KeepaliveEnforcementPolicy(ServerPolicy)}
	ingestOpts := append(grpcOpts[:len(grpcOpts):len(grpcOpts)], grpc.MaxRecvMsgSize(4<<20))
	if o.IngestTLSCert != "" {
		files, err := certs.NewFiles(o.IngestTLSCert, o.IngestTLSKey, "")
		if err != nil {
			a.close()
			return nil, fmt.Errorf("ingest TLS: %w", err)
		}
		ingestOpts = append(ingestOpts, grpc.Creds(credentials.NewTLS(files.ServerConfig())))
	}
	a.ingestSrv = grpc.NewServer(ingestOpts...)
	a.ingest = ingest.New(a.store, log, version.Version, ingest.Limits{MaxPodsPerStream: o.MaxPodsPerAgent}, reg)
	pulsev1.RegisterIngestServer(a.ingestSrv, a.ingest)
	scalerOpts := grpcOpts
	if o.ManageCerts {
		kube, err := kubeClient(o)
		var dyn dynamic.Interface
		if err == nil {
			dyn, err = dynamicClient(o)
		}
		if err != nil {
			a.close()
			return nil, fmt.Errorf("--manage-certs: %w", err)
		}
		var ips []net.IP
		for _, ip := range o.CertIPs {
			ips = append(ips, net.ParseIP(ip))
		}
		a.managed = certs.NewManaged(certs.ManagedOptions{Client: kube, Dynamic: dyn, Namespace: o.Namespace, SecretName: o.CertSecret,
			DNSNames: o.CertDNSNames, IPs: ips, Validity: o.CertValidity, KEDANamespace: o.KEDANamespace,
			TriggerAuthName: o.TriggerAuthName, Log: log})
		scalerOpts = append(scalerOpts[:len(scalerOpts):len(scalerOpts)], grpc.Creds(credentials.NewTLS(a.managed.ServerConfig())))
		log.Info("scaler port serves mutual TLS with managed certificates", "secret", o.Namespace+"/"+o.CertSecret,
			"triggerAuthentication", o.TriggerAuthName)
	}
	if o.TLSCertFile != "" {
		files, err := certs.NewFiles(o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile)
		if err != nil {
			a.close()
			return nil, fmt.Errorf("scaler TLS: %w", err)
		}
		scalerOpts = append(scalerOpts[:len(scalerOpts):len(scalerOpts)], grpc.Creds(credentials.NewTLS(files.ServerConfig())))
		log.Info("scaler port serves mutual TLS", "cert", o.TLSCertFile, "clientCA", o.TLSClientCAFile)
	}
	a.scalerSrv = grpc.NewServer(scalerOpts...)
	var resolver scaler.TargetResolver
	if o.ResolveTargets {
		dyn, err := dynamicClient(o)
		if err != nil {
			a.close()
			return nil, fmt.Errorf("--resolve-scale-targets: %w", err)
		}
		a.resolver = scaler.NewInformerResolver(dyn)
		resolver = a.resolver
	}
	if o.AgentAuth == "tokenreview" {
		kube, err := kubeClient(o)
		if err == nil {
			if a.reviewer, err = ingest.NewTokenReviewer(kube, o.AgentAudience, o.AgentAccounts); err == nil {
				a.ingest.SetAuthenticator(a.reviewer)
			}
		}
		if err != nil {
			a.close()
			return nil, fmt.Errorf("--agent-auth=tokenreview: %w", err)
		}
		log.Info("agents authenticate with ServiceAccount tokens", "audience", o.AgentAudience, "serviceAccounts", o.AgentAccounts)
	} else {
		log.Info("agent streams are not authenticated (--agent-auth=none): use it on loopback or a trusted network only")
	}
	a.health = newHealth(housekeepEvery)
	a.warmup = newWarmup(a.store, o.Warmup, o.ExpectedAgents, time.Now, log)
	a.health.addCheck("warm-up", a.warmup.check)
	if a.managed != nil {
		a.health.addCheck("certificates", a.managed.Ready)
	}
	if a.resolver != nil {
		a.health.addCheck("ScaledObject cache", a.resolver.Ready)
	}
	if a.reviewer != nil {
		a.health.addCheck("pod cache", a.reviewer.Ready)
	}
	if o.AgentDaemonSet != "" && a.kube == nil {
		if a.kube, err = kubeClient(o); err != nil {
			a.close()
			return nil, fmt.Errorf("--agent-daemonset: %w", err)
		}
	}
	a.scaler = scaler.New(a.store, scaler.Options{MaxWindow: o.MaxWindow, Resolver: resolver, Gate: a.warmup.check})
	reg.MustRegister(a.scaler.Collector())
	externalscaler.RegisterExternalScalerServer(a.scalerSrv, a.scaler)
	healthpb.RegisterHealthServer(a.scalerSrv, a.health)
	healthpb.RegisterHealthServer(a.ingestSrv, a.health)

	mux := http.NewServeMux()
	dbg := &debug.Handler{Store: a.store, FreshFor: o.FreshFor, MaxWindow: o.MaxWindow, Triggers: a.scaler}
	if o.DebugAddr == "" {
		dbg.Register(mux)
	} else {
		if a.debugLn, err = net.Listen("tcp", o.DebugAddr); err != nil {
			a.close()
			return nil, fmt.Errorf("listen on debug address %s: %w", o.DebugAddr, err)
		}
		dmux := http.NewServeMux()
		dbg.Register(dmux)
		a.debugSrv = &http.Server{Handler: dmux, ReadHeaderTimeout: 5 * time.Second}
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", a.health.serveHTTP(a.health.live))
	mux.HandleFunc("GET /readyz", a.health.serveHTTP(a.health.ready))
	a.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return a, nil
}

// SetAgentAuthenticator replaces how agent streams authenticate (tests
// pass one over a fake API); call it before Run.
func (a *Aggregator) SetAgentAuthenticator(auth ingest.Authenticator) {
	a.ingest.SetAuthenticator(auth)
}

// close releases the listeners of an aggregator that will not run.
func (a *Aggregator) close() {
	a.ingestLn.Close()
	a.scalerLn.Close()
	a.httpLn.Close()
	if a.debugLn != nil {
		a.debugLn.Close()
	}
}

// IngestAddr is the bound ingest address.
func (a *Aggregator) IngestAddr() string { return a.ingestLn.Addr().String() }

// ScalerAddr is the bound scaler address.
func (a *Aggregator) ScalerAddr() string { return a.scalerLn.Addr().String() }

// DebugAddr is the bound --debug-addr, or the HTTP address.
func (a *Aggregator) DebugAddr() string {
	if a.debugLn != nil {
		return a.debugLn.Addr().String()
	}
	return a.HTTPAddr()
}

// HTTPAddr is the bound HTTP address.
func (a *Aggregator) HTTPAddr() string { return a.httpLn.Addr().String() }

// Run serves until ctx ends, then stops gracefully.
func (a *Aggregator) Run(ctx context.Context) error {
	a.log.Info("aggregator listening", "ingest", a.IngestAddr(), "scaler", a.ScalerAddr(),
		"http", a.HTTPAddr(), "version", version.Version)
	g, gctx := errgroup.WithContext(ctx)
	if a.resolver != nil {
		g.Go(func() error { a.resolver.Run(gctx); return nil })
	}
	if a.managed != nil {
		g.Go(func() error { return a.managed.Run(gctx) })
	}
	if a.reviewer != nil {
		g.Go(func() error { a.reviewer.Run(gctx); return nil })
	}
	if a.debugSrv != nil {
		g.Go(func() error {
			if err := a.debugSrv.Serve(a.debugLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serve debug: %w", err)
			}
			return nil
		})
	}
	if a.opts.AgentDaemonSet != "" {
		ns, name, _ := strings.Cut(a.opts.AgentDaemonSet, "/")
		g.Go(func() error { a.warmup.followDaemonSet(gctx, a.kube, ns, name); return nil })
	}
	g.Go(func() error { a.housekeep(gctx); return nil })
	g.Go(func() error { return serveGRPC(a.ingestSrv, a.ingestLn, "ingest") })
	g.Go(func() error { return serveGRPC(a.scalerSrv, a.scalerLn, "scaler") })
	g.Go(func() error {
		if err := a.httpSrv.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		a.health.stopping.Store(true)
		// KEDA's streams end with EOF first, so KEDA reconnects in 2s.
		a.scaler.Shutdown()
		stopGracefully(a.scalerSrv, a.opts.ShutdownTimeout)
		// Agent streams never end by themselves and carry cumulative values,
		// so cutting them loses nothing; agents reconnect to another replica.
		a.ingestSrv.Stop()
		sctx, cancel := context.WithTimeout(context.Background(), a.opts.ShutdownTimeout)
		defer cancel()
		if a.debugSrv != nil {
			_ = a.debugSrv.Shutdown(sctx)
		}
		return a.httpSrv.Shutdown(sctx)
	})
	err := g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

// housekeep sweeps the pods of agents gone longer than --pod-expiry (so
// that a dead node's pods go even when no other catalogue changes) and
// proves the process live, every housekeepEvery.
func (a *Aggregator) housekeep(ctx context.Context) {
	t := time.NewTicker(housekeepEvery)
	defer t.Stop()
	for {
		a.store.Sweep()
		_ = a.warmup.check() // logs the end of the warm-up when it comes
		a.health.tick()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func serveGRPC(s *grpc.Server, ln net.Listener, what string) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", what, err)
	}
	return nil
}

// stopGracefully waits up to timeout for RPCs to end, then cuts them.
func stopGracefully(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		s.Stop()
		<-done
	}
}

// Logging returns the log format and level.
func (o *Options) Logging() (format, level string) { return o.LogFormat, o.LogLevel }

// restConfig is the in-cluster config, or --kubeconfig's.
func restConfig(o *Options) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.KubeConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = "pulse-aggregator/" + version.Version
	// Above client-go's 5 QPS: a restart re-ensures certificates, syncs
	// caches and reviews every agent's token at once.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

func dynamicClient(o *Options) (dynamic.Interface, error) {
	cfg, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	return dynamic.NewForConfig(cfg)
}

func kubeClient(o *Options) (kubernetes.Interface, error) {
	cfg, err := restConfig(o)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func countSet(vs ...string) int {
	n := 0
	for _, v := range vs {
		if v != "" {
			n++
		}
	}
	return n
}
