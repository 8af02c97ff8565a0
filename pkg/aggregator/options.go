package aggregator

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Options are the aggregator's flags, in groups; each group registers its
// own flags and reports its own problems.
type Options struct {
	Serving   ServingOptions
	Store     StoreOptions
	Warmup    WarmupOptions
	Kube      KubeOptions
	ScalerTLS ScalerTLSOptions
	Certs     ManagedCertOptions
	IngestTLS IngestTLSOptions
	AgentAuth AgentAuthOptions
	Provision ProvisionOptions
	Log       logging.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		Serving: ServingOptions{IngestAddr: ":9091", ScalerAddr: ":9090", HTTPAddr: ":8080", ShutdownTimeout: 5 * time.Second, MetricsAuth: "none",
			MaxIngestConnections: 20000, MaxIngestConnectionsPerAddress: 8, MaxIngestStreamsPerConnection: 4, MaxScalerConnectionsPerAddress: 16, MaxScalerStreams: 40000, MaxTriggerSeries: 2000},
		Store: StoreOptions{MaxWindow: scaler.DefaultMaxWindow, FreshFor: 5 * time.Second, MaxPodsPerAgent: 1024, MaxSamplesPerPod: 128,
			MaxPods: 10000, PodExpiry: 10 * time.Minute, GCPercent: 50},
		// The agents re-resolve the headless Service every 10s (their
		// --resolve-interval), then report within their 1s interval; the
		// default staleAfter (5s) bounds the rest.
		Warmup: WarmupOptions{Duration: 15 * time.Second},
		Certs: ManagedCertOptions{Namespace: os.Getenv("POD_NAMESPACE"), Secret: "pulse-aggregator-certs", Validity: 90 * 24 * time.Hour,
			KEDANamespace: "keda", TriggerAuthName: "pulse-creds"},
		AgentAuth: AgentAuthOptions{Mode: "none", Audience: "pulse", Accounts: []string{"pulse-system/pulse-agent"}},
		// client-go's and kube-controller-manager's defaults.
		Provision: ProvisionOptions{LeaderElect: true, LeaseName: "pulse-aggregator-provisioner",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second},
		Log: logging.DefaultOptions(),
	}
}

// AddFlags registers every group's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	o.Serving.AddFlags(fs)
	o.Store.AddFlags(fs)
	o.Warmup.AddFlags(fs)
	o.Kube.AddFlags(fs)
	o.ScalerTLS.AddFlags(fs)
	o.Certs.AddFlags(fs)
	o.IngestTLS.AddFlags(fs)
	o.AgentAuth.AddFlags(fs)
	o.Provision.AddFlags(fs)
	o.Log.AddFlags(fs)
}

// Validate reports every problem of every group, and of their combination.
func (o *Options) Validate() error {
	errs := []error{o.Serving.Validate(), o.Store.Validate(), o.Warmup.Validate(), o.ScalerTLS.Validate(), o.Certs.Validate(),
		o.IngestTLS.Validate(), o.AgentAuth.Validate(), o.Provision.Validate(), o.Log.Validate()}
	if o.Provision.Enabled && o.Provision.LeaderElect {
		switch ns := o.Provision.leaseNamespace(o); {
		case ns == "":
			errs = append(errs, errors.New("--provision-scaledobjects with --leader-elect needs --leader-elect-namespace (or --namespace, or $POD_NAMESPACE)"))
		case o.Provision.LeaseNamespace == "" && len(validation.IsDNS1123Label(ns)) > 0:
			// The Lease's namespace taken from --namespace, not checked
			// there without --manage-certs: every replica's create of
			// the Lease failed, and nothing was provisioned.
			errs = append(errs, fmt.Errorf("--namespace %q (the Lease's, with no --leader-elect-namespace): %s", wire.CleanText(ns, 64), strings.Join(validation.IsDNS1123Label(ns), "; ")))
		}
	}
	if o.IngestTLS.Managed && !o.Certs.Enabled {
		errs = append(errs, errors.New("--ingest-managed-tls needs --manage-certs"))
	}
	if o.IngestTLS.Managed && o.Certs.Enabled && o.Certs.CAConfigMap == "" {
		// The CA was published nowhere, and every agent's handshake
		// failed for ever, with nothing said at the start.
		errs = append(errs, errors.New("--ingest-managed-tls needs --ca-configmap: the agents trust the managed CA, which rotates, only as published there"))
	}
	if o.AgentAuth.Mode == "tokenreview" && !o.IngestTLS.Managed && o.IngestTLS.CertFile == "" {
		// An agent sends its token over TLS alone, and a relay refuses to
		// forward one in plaintext: every stream was refused, for ever.
		errs = append(errs, errors.New("--agent-auth=tokenreview needs TLS on the ingest port (--ingest-tls-cert-file or --ingest-managed-tls): agents and relays never send a token in plaintext, and every stream would be refused"))
	}
	if !o.Certs.Enabled {
		// --manage-certs' own: without it nothing was made or published,
		// and nothing said so.
		for _, f := range []struct {
			flag string
			set  bool
		}{{"--relay-cert-secret", o.Certs.RelaySecret != "" || len(o.Certs.RelayDNSNames) > 0},
			{"--relay-cert-secret-retired", o.Certs.RetiredRelaySecret != ""}, {"--ca-configmap", o.Certs.CAConfigMap != ""}} {
			if f.set {
				errs = append(errs, fmt.Errorf("%s needs --manage-certs: without it nothing is made or published there", f.flag))
			}
		}
	}
	if o.Certs.Enabled && o.ScalerTLS.CertFile != "" {
		errs = append(errs, errors.New("--manage-certs and --tls-cert-file exclude each other"))
	}
	if o.Provision.Enabled && o.ScalerTLS.CertFile != "" && o.Provision.TriggerAuth == "" {
		errs = append(errs, errors.New("--provision-scaledobjects with --tls-cert-file needs --provision-trigger-auth: KEDA reaches a TLS scaler only through a ClusterTriggerAuthentication holding its CA, and every provisioned ScaledObject would fail"))
	}
	if o.Provision.Enabled && o.Certs.Enabled {
		// KEDA checks the scaler's certificate against the address's host:
		// one the managed certificate does not name failed every
		// provisioned ScaledObject.
		if host, _, err := net.SplitHostPort(o.Provision.ScalerAddress); err == nil && !certNames(host, o.Certs.DNSNames, o.Certs.IPs) {
			errs = append(errs, fmt.Errorf("--provision-scaler-address %q: its host is not among the managed certificate's --cert-dns-name or --cert-ip, and KEDA would refuse the certificate", o.Provision.ScalerAddress))
		}
	}
	if o.Serving.HTTPTLS && !o.IngestTLS.Managed && o.IngestTLS.CertFile == "" {
		errs = append(errs, errors.New("--http-tls serves the ingest port's certificate: it needs --ingest-managed-tls or --ingest-tls-cert-file"))
	}
	return errors.Join(errs...)
}

// LogOptions returns the logger's options.
func (o *Options) LogOptions() logging.Options { return o.Log }

// ServingOptions are the listeners.
type ServingOptions struct {
	IngestAddr, ScalerAddr, HTTPAddr, DebugAddr, HealthAddr string
	ShutdownTimeout, ShutdownDelay                          time.Duration
	// Profiling serves Go's profiles (net/http/pprof) beside the debug
	// endpoints, under /debug/pprof/.
	Profiling bool
	// MetricsAuth: none, or kubernetes (a bearer token reviewed by the API
	// server, whose user may get the non-resource URL /metrics).
	MetricsAuth string
	// HTTPTLS serves --http-addr with the ingest port's certificate.
	HTTPTLS bool
	// MaxIngestConnections bounds the ingest port's open connections, and
	// MaxIngestConnectionsPerAddress those of one remote address.
	MaxIngestConnections, MaxIngestConnectionsPerAddress int
	// MaxIngestStreamsPerConnection bounds the streams one ingest
	// connection carries: an agent's carries one, a pulse-relay's many.
	MaxIngestStreamsPerConnection int
	// MaxScalerConnectionsPerAddress bounds the scaler port's connections
	// from one remote address.
	MaxScalerConnectionsPerAddress int
	// maxScalerConns bounds the scaler port's connections in all (0:
	// maxScalerConns, 1,024), and scalerSettle is how long one is charged
	// before it may be closed for room (0: scalerSettle); a test's.
	maxScalerConns int
	scalerSettle   time.Duration
	// MaxScalerStreams bounds KEDA's streams open on the scaler port (two
	// for every external-push trigger), and MaxScalerStreamsPerNamespace
	// one namespace's (0: half of MaxScalerStreams, ScalerStreamsPerNamespace).
	MaxScalerStreams, MaxScalerStreamsPerNamespace int
	// MaxTriggerSeries bounds the triggers whose series /metrics carries.
	MaxTriggerSeries int
}

// ScalerStreamsPerNamespace is the streams one namespace's ScaledObjects
// may hold open: --max-scaler-streams-per-namespace, or half of
// --max-scaler-streams (at least 1) when it is 0.
func (o *ServingOptions) ScalerStreamsPerNamespace() int {
	if o.MaxScalerStreamsPerNamespace > 0 {
		return o.MaxScalerStreamsPerNamespace
	}
	return max(o.MaxScalerStreams/2, 1)
}

// AddFlags registers the group's flags.
func (o *ServingOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.IngestAddr, "ingest-addr", o.IngestAddr, "address of the agents' gRPC ingest stream")
	fs.StringVar(&o.ScalerAddr, "scaler-addr", o.ScalerAddr, "address of the KEDA external-push scaler (gRPC, with gRPC health)")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "address of /metrics, /livez, /readyz and, without --debug-addr, /debug/workloads, /debug/triggers and /debug/provisioning")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "serve /livez and /readyz on this address too, in plaintext, for the kubelet's probes (the chart's 127.0.0.1:8081, probed by an exec of pulse-aggregator probe URL): with --http-tls a probe of the http port fails until the certificate is there, and other pods' connections can fill its bounds")
	fs.StringVar(&o.DebugAddr, "debug-addr", o.DebugAddr, "serve /debug/* on this address alone, in plaintext and with no --metrics-auth (e.g. 127.0.0.1:8082, reachable only from the pod), instead of on --http-addr")
	fs.BoolVar(&o.Profiling, "profiling", o.Profiling, "serve Go's CPU, heap and goroutine profiles under /debug/pprof/ beside the debug endpoints (on --debug-addr when it is set)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long a graceful stop may take before streams are cut")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "at a stop, how long the replica stays up not ready before it closes its listeners (0 to 1m), so that the Service's endpoints drop it first and new connections go to the other replicas")
	fs.IntVar(&o.MaxIngestConnections, "max-ingest-connections", o.MaxIngestConnections, "connections the ingest port holds open at once (an agent holds one to each replica): past it a new one waits to be accepted, so that clients of the port (any, with --agent-auth=none) cannot open them without bound")
	fs.IntVar(&o.MaxIngestConnectionsPerAddress, "max-ingest-connections-per-address", o.MaxIngestConnectionsPerAddress, "connections the ingest port holds open at once from one remote address (an agent holds one to each replica, from its pod's address): past it a new one from that address is closed at once, so that the pods of one client cannot take --max-ingest-connections from every agent; raise it where agents reach the aggregator through one translated address")
	fs.IntVar(&o.MaxIngestStreamsPerConnection, "max-ingest-streams-per-connection", o.MaxIngestStreamsPerConnection, "agent streams one ingest connection carries at once: an agent opens one; a pulse-relay carries many agents' streams on each of its connections (its --streams-per-connection, which this must be at least), each stream authenticated as an agent's own")
	fs.IntVar(&o.MaxScalerConnectionsPerAddress, "max-scaler-connections-per-address", o.MaxScalerConnectionsPerAddress, "connections the scaler port holds open at once from one remote address (of 1,024 in all; KEDA's operator keeps one a scaler address and TLS configuration): past it a new one from that address is closed at once, so that one client's pods cannot take the port from KEDA")
	fs.IntVar(&o.MaxTriggerSeries, "max-trigger-series", o.MaxTriggerSeries, "triggers whose series (pulse_aggregator_trigger_*, pulse_aggregator_plan_*) /metrics carries, shared among their namespaces in turn; past it the others are left out (counted in pulse_aggregator_trigger_series_left_out; /debug/triggers has every one), so that one tenant's ScaledObjects cannot make a page of hundreds of megabytes")
	fs.IntVar(&o.MaxScalerStreams, "max-scaler-streams", o.MaxScalerStreams, "KEDA's streams the scaler port holds open at once (KEDA opens a StreamIsActive and a StreamMetricSpec for every external-push trigger): past it a new one is refused (ResourceExhausted; KEDA retries, backing off to a minute, and its GetMetrics polls are answered as before)")
	fs.IntVar(&o.MaxScalerStreamsPerNamespace, "max-scaler-streams-per-namespace", o.MaxScalerStreamsPerNamespace, "KEDA's streams of one namespace's ScaledObjects held open at once (0: half of --max-scaler-streams); past it a new one of that namespace is refused as past --max-scaler-streams, so that one tenant's ScaledObjects cannot take every other tenant's room")
	fs.BoolVar(&o.HTTPTLS, "http-tls", o.HTTPTLS, "serve --http-addr (/metrics, the probes, and the debug endpoints without --debug-addr) with TLS, with the ingest port's certificate (--ingest-managed-tls or --ingest-tls-cert-file): a bearer token for /metrics never travels in plaintext")
	fs.StringVar(&o.MetricsAuth, "metrics-auth", o.MetricsAuth, "who may read /metrics, and the debug endpoints when they are on --http-addr (no --debug-addr), which name every tenant's workloads: none (anyone who reaches --http-addr), or kubernetes (a bearer token the API server authenticates, whose user may get the request's path as a non-resource URL, /metrics or /debug/...: a TokenReview and a SubjectAccessReview, answers kept a minute per token and path)")
}

// Validate reports the group's problems.
func (o *ServingOptions) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{{"--ingest-addr", o.IngestAddr}, {"--scaler-addr", o.ScalerAddr}, {"--http-addr", o.HTTPAddr}, {"--debug-addr", o.DebugAddr}, {"--health-addr", o.HealthAddr}} {
		if a.addr == "" && (a.flag == "--debug-addr" || a.flag == "--health-addr") {
			continue
		}
		if err := app.ListenAddr(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want host:port: %w", a.flag, a.addr, err))
		}
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be above 0"))
	}
	if o.ShutdownDelay < 0 || o.ShutdownDelay > time.Minute {
		errs = append(errs, fmt.Errorf("--shutdown-delay %s: from 0 to 1m", o.ShutdownDelay))
	}
	if o.MaxIngestConnections < 1 {
		errs = append(errs, errors.New("--max-ingest-connections must be at least 1"))
	}
	if o.MaxIngestStreamsPerConnection < 1 || o.MaxIngestStreamsPerConnection > 1<<16 {
		errs = append(errs, errors.New("--max-ingest-streams-per-connection must be from 1 to 65536"))
	}
	if o.MaxIngestConnectionsPerAddress < 1 {
		errs = append(errs, errors.New("--max-ingest-connections-per-address must be at least 1"))
	}
	if o.MaxScalerConnectionsPerAddress < 1 {
		errs = append(errs, errors.New("--max-scaler-connections-per-address must be at least 1"))
	}
	if o.MaxScalerStreams < 1 {
		errs = append(errs, errors.New("--max-scaler-streams must be at least 1"))
	}
	if o.MaxTriggerSeries < 1 {
		errs = append(errs, errors.New("--max-trigger-series must be at least 1"))
	}
	if o.MaxScalerStreamsPerNamespace < 0 {
		errs = append(errs, errors.New("--max-scaler-streams-per-namespace must be 0 (half of --max-scaler-streams) or more"))
	}
	if o.MetricsAuth != "none" && o.MetricsAuth != "kubernetes" {
		errs = append(errs, fmt.Errorf("--metrics-auth %q: none or kubernetes", o.MetricsAuth))
	}
	return errors.Join(errs...)
}

// StoreOptions bound what the aggregator holds.
type StoreOptions struct {
	MaxWindow, FreshFor, PodExpiry             time.Duration
	MaxSamplesPerPod, MaxPods, MaxPodsPerAgent int
	// MaxPodsPerNamespace: 0 is half of MaxPods (PodsPerNamespace).
	MaxPodsPerNamespace int
	// GCPercent: Go's GC percent, unless GOGC is set (app.SetGCPercent).
	GCPercent int
}

// PodsPerNamespace is the pods one namespace may hold: --max-pods-per-namespace,
// or half of --max-pods (at least 1) when it is 0.
func (o *StoreOptions) PodsPerNamespace() int {
	if o.MaxPodsPerNamespace > 0 {
		return o.MaxPodsPerNamespace // the store caps it at MaxPods
	}
	return max(o.MaxPods/2, 1)
}

// AddFlags registers the group's flags.
func (o *StoreOptions) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.MaxWindow, "max-window", o.MaxWindow, "the longest trigger window allowed (the store keeps, per pod, the longest window a live trigger asks for, at least 10s)")
	fs.IntVar(&o.MaxSamplesPerPod, "max-samples-per-pod", o.MaxSamplesPerPod, "cap on samples kept per pod")
	fs.DurationVar(&o.FreshFor, "fresh-for", o.FreshFor, "how recent a pod's last sample must be to count as fresh in the debug endpoint")
	fs.IntVar(&o.MaxPodsPerAgent, "max-pods-per-agent", o.MaxPodsPerAgent, "pods one agent stream may list")
	fs.IntVar(&o.MaxPods, "max-pods", o.MaxPods, "pods held in all; past it a new pod waits (counted as store_full) until there is room: no pod held is evicted for it")
	fs.IntVar(&o.MaxPodsPerNamespace, "max-pods-per-namespace", o.MaxPodsPerNamespace, "pods of one namespace held (0: half of --max-pods); past it a new pod of that namespace waits as past --max-pods, so that one tenant's pods cannot take every other tenant's room; and room freed goes first to the namespaces below a share (--max-pods over one more than the namespaces holding pods) with a pod waiting for room")
	fs.DurationVar(&o.PodExpiry, "pod-expiry", o.PodExpiry, "pods of an agent disconnected this long are dropped")
	fs.IntVar(&o.GCPercent, "gc-percent", o.GCPercent, "Go's GC percent (GOGC): how far past the live heap and the goroutines' stacks the heap grows before the next collection; GOGC in the environment is kept instead; 0: Go's default, 100 (50 keeps the heap in use about a quarter lower, measured, for more collections: the same CPU at 2,000 agents, a longer GetMetrics tail at 10,000; as Prometheus does by default)")
}

// maxStoreCount bounds the store's counts (pods, pods an agent, samples
// a pod): 16,777,216, past any fleet or window one aggregator holds.
const maxStoreCount = 1 << 24

// Validate reports the group's problems.
func (o *StoreOptions) Validate() error {
	var errs []error
	if least := max(scaler.DefaultWindow, scaler.DefaultPlanWindow); o.MaxWindow < least {
		// Below it every trigger left at its default window is refused:
		// every workload provisioned with the planner among them.
		errs = append(errs, fmt.Errorf("--max-window must be at least %s, the longest default trigger window (metric replicas'; %s for the others)", least, scaler.DefaultWindow))
	}
	if o.FreshFor <= 0 {
		errs = append(errs, errors.New("--fresh-for must be above 0"))
	}
	if o.MaxPodsPerAgent < 1 || o.MaxSamplesPerPod < 2 || o.MaxPods < 1 {
		errs = append(errs, errors.New("--max-pods-per-agent and --max-pods must be at least 1 and --max-samples-per-pod at least 2"))
	}
	// Past these, sizes made of them overflowed: a pod's byte bound
	// (every pod cut to 2 samples at each append, its windows answered
	// over them) and a catalogue's (every catalogue refused, every
	// agent's stream ended).
	for _, f := range []struct {
		flag string
		v    int
	}{{"--max-pods-per-agent", o.MaxPodsPerAgent}, {"--max-pods", o.MaxPods}, {"--max-pods-per-namespace", o.MaxPodsPerNamespace}, {"--max-samples-per-pod", o.MaxSamplesPerPod}} {
		if f.v > maxStoreCount {
			errs = append(errs, fmt.Errorf("%s %d: at most %d", f.flag, f.v, maxStoreCount))
		}
	}
	if o.PodExpiry <= 0 {
		errs = append(errs, errors.New("--pod-expiry must be above 0"))
	}
	if o.MaxPodsPerNamespace < 0 {
		errs = append(errs, errors.New("--max-pods-per-namespace must be 0 (half of --max-pods) or more"))
	}
	if o.GCPercent < 0 || o.GCPercent > 10000 {
		errs = append(errs, errors.New("--gc-percent must be 0 (Go's default, 100) to 10000"))
	}
	return errors.Join(errs...)
}

// WarmupOptions hold a starting aggregator's answers back.
type WarmupOptions struct {
	Duration       time.Duration
	ExpectedAgents int
	AgentDaemonSet string
}

// AddFlags registers the group's flags.
func (o *WarmupOptions) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Duration, "warmup", o.Duration, "after start, answer KEDA Unavailable (and stay unready) until the expected agents have reported or this long has passed, so that no answer is a partial total; about the agents' --resolve-interval plus staleAfter (0: none)")
	fs.IntVar(&o.ExpectedAgents, "expected-agents", o.ExpectedAgents, "end the warm-up once this many agents have reported (0: unknown, unless --agent-daemonset gives it)")
	fs.StringVar(&o.AgentDaemonSet, "agent-daemonset", o.AgentDaemonSet, "namespace/name of the agent DaemonSet: its desiredNumberScheduled is the number of agents the warm-up waits for")
}

// Validate reports the group's problems.
func (o *WarmupOptions) Validate() error {
	var errs []error
	if o.Duration < 0 || o.ExpectedAgents < 0 {
		errs = append(errs, errors.New("--warmup and --expected-agents must not be negative"))
	}
	if o.AgentDaemonSet != "" {
		ns, name, ok := strings.Cut(o.AgentDaemonSet, "/")
		// Neither may be a name the API refuses: "a/b/c" waited out the
		// warm-up, reading a DaemonSet that cannot exist.
		msgs := append(validation.IsDNS1123Label(ns), validation.IsDNS1123Subdomain(name)...)
		if !ok || len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--agent-daemonset %q: want namespace/name, a namespace's and a DaemonSet's names", wire.CleanText(o.AgentDaemonSet, 64)))
		}
		if o.ExpectedAgents > 0 {
			errs = append(errs, errors.New("--expected-agents and --agent-daemonset exclude each other: the DaemonSet's count replaces the number every second"))
		}
	}
	return errors.Join(errs...)
}

// KubeOptions are how the aggregator reaches the Kubernetes API, and the
// feature that reads ScaledObjects.
type KubeOptions struct {
	KubeConfig     string
	ResolveTargets bool
	// AllowCrossNamespace lets a trigger read another namespace than its
	// ScaledObject's (its namespace or workspaceNamespace key).
	AllowCrossNamespace bool
	// OwnerClusterRole names the ClusterRole (the chart's) that owns what the
	// aggregator creates at run time, so that deleting it (helm uninstall)
	// has the garbage collector delete them too.
	OwnerClusterRole string
}

// AddFlags registers the group's flags.
func (o *KubeOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.KubeConfig, "kubeconfig", o.KubeConfig, "kubeconfig of the features that use the Kubernetes API (default: the in-cluster config)")
	fs.BoolVar(&o.ResolveTargets, "resolve-scale-targets", o.ResolveTargets, "when a trigger names no workload, find it from its ScaledObject's scaleTargetRef (watches ScaledObjects); and learn every planner trigger (metric replicas) of the ScaledObjects watched, as the replica KEDA asks does, so that a failover keeps what was learned")
	fs.BoolVar(&o.AllowCrossNamespace, "allow-cross-namespace-triggers", o.AllowCrossNamespace, "let a trigger's namespace or workspaceNamespace key name another namespace than its ScaledObject's (default: a trigger reads only its own namespace)")
	fs.StringVar(&o.OwnerClusterRole, "owner-cluster-role", o.OwnerClusterRole, "a ClusterRole that owns what the aggregator creates (--manage-certs' Secrets and ClusterTriggerAuthentication, the provisioner's Lease): deleting it deletes them (needs get on it)")
}

// ScalerTLSOptions are certificate files for the scaler port, and the name
// a client certificate must have.
type ScalerTLSOptions struct{ CertFile, KeyFile, ClientCAFile, ClientName string }

// AddFlags registers the group's flags.
func (o *ScalerTLSOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.CertFile, "tls-cert-file", o.CertFile, "scaler port: serve TLS with this certificate (re-read when it changes)")
	fs.StringVar(&o.KeyFile, "tls-key-file", o.KeyFile, "scaler port: the certificate's key")
	fs.StringVar(&o.ClientCAFile, "tls-client-ca-file", o.ClientCAFile, "scaler port: require client certificates signed by this CA (KEDA's tlsClientCert)")
	fs.StringVar(&o.ClientName, "tls-client-name", o.ClientName, "scaler port, with --tls-client-ca-file: a client certificate must also name this, as its Common Name or a DNS name (KEDA's); empty: any the CA signed, which is KEDA's alone only with a CA that signs KEDA's certificate alone (a client certificate verified is served as KEDA, any namespace's triggers, and is out of --max-scaler-connections-per-address)")
}

// Validate reports the group's problems.
func (o *ScalerTLSOptions) Validate() error {
	var errs []error
	if n := countSet(o.CertFile, o.KeyFile, o.ClientCAFile); n != 0 && n != 3 {
		errs = append(errs, errors.New("--tls-cert-file, --tls-key-file and --tls-client-ca-file go together"))
	}
	if o.ClientName != "" && o.ClientCAFile == "" {
		errs = append(errs, errors.New("--tls-client-name needs --tls-client-ca-file (it names which of the client certificates that CA signs are taken)"))
	}
	return errors.Join(errs...)
}

// ManagedCertOptions are the certificates the aggregator makes for the
// scaler port and KEDA.
type ManagedCertOptions struct {
	Enabled                        bool
	Namespace, Secret              string
	DNSNames, IPs                  []string
	Validity                       time.Duration
	KEDANamespace, TriggerAuthName string
	CAConfigMap                    string
	// RelaySecret and RelayDNSNames: pulse-relay's server pair
	// (certs.ManagedOptions.RelaySecretName).
	RelaySecret   string
	RelayDNSNames []string
	// RetiredRelaySecret: the relays' Secret to remove, the aggregator no
	// longer keeping it (certs.ManagedOptions.RetiredRelaySecretName).
	RetiredRelaySecret string
}

// AddFlags registers the group's flags.
func (o *ManagedCertOptions) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "manage-certs", o.Enabled, "scaler port: make, renew and serve a CA, server and client certificates (a Secret), and KEDA's ClusterTriggerAuthentication")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "the aggregator's namespace, for --manage-certs and the provisioner's Lease (default $POD_NAMESPACE)")
	fs.StringVar(&o.Secret, "cert-secret", o.Secret, "--manage-certs: the Secret holding the certificates")
	fs.Func("cert-dns-name", "--manage-certs: a DNS name of the scaler Service for the server certificate; repeatable", func(v string) error {
		o.DNSNames = append(o.DNSNames, v)
		return nil
	})
	fs.Func("cert-ip", "--manage-certs: an IP for the server certificate; repeatable", func(v string) error {
		if net.ParseIP(v) == nil {
			return fmt.Errorf("%q is not an IP", v)
		}
		o.IPs = append(o.IPs, v)
		return nil
	})
	fs.DurationVar(&o.Validity, "cert-validity", o.Validity, "--manage-certs: validity of the certificates (renewed two thirds through; 1h to 10 years, 87600h)")
	fs.StringVar(&o.KEDANamespace, "keda-namespace", o.KEDANamespace, "--manage-certs: KEDA's namespace, where its client credentials Secret goes")
	fs.StringVar(&o.TriggerAuthName, "trigger-auth-name", o.TriggerAuthName, "--manage-certs: name of the ClusterTriggerAuthentication (and of KEDA's Secret)")
	fs.StringVar(&o.RelaySecret, "relay-cert-secret", o.RelaySecret, "--manage-certs: a Secret (in --namespace, type kubernetes.io/tls) where a server certificate for pulse-relay (naming each --relay-cert-dns-name, signed by the managed CA) is kept with the CAs' bundle (tls.crt, tls.key, ca.crt, never a CA key); empty: none")
	fs.Func("relay-cert-dns-name", "--relay-cert-secret: a DNS name of the relays' Service (the agents' --relay host) for their certificate; repeatable", func(v string) error {
		o.RelayDNSNames = append(o.RelayDNSNames, v)
		return nil
	})
	fs.StringVar(&o.RetiredRelaySecret, "relay-cert-secret-retired", o.RetiredRelaySecret, "--manage-certs: the relays' Secret of a release that no longer has the aggregator keep it (the relay disabled): removed if the aggregator made it (labelled app.kubernetes.io/managed-by=pulse-aggregator), now and whenever it appears again; one without the label is left alone; empty: none")
	fs.StringVar(&o.CAConfigMap, "ca-configmap", o.CAConfigMap, "--manage-certs: a ConfigMap (in --namespace) where the CA's certificate is published for the agents (--ingest-managed-tls); empty: not published")
}

// certNames reports whether a certificate for names and ips is valid for
// host (a wildcard names one label, as x509 matches it).
func certNames(host string, names, ips []string) bool {
	c := &x509.Certificate{DNSNames: names}
	for _, ip := range ips {
		if p := net.ParseIP(ip); p != nil {
			c.IPAddresses = append(c.IPAddresses, p)
		}
	}
	return c.VerifyHostname(host) == nil
}

// Validate reports the group's problems.
func (o *ManagedCertOptions) Validate() error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if o.Namespace == "" {
		errs = append(errs, errors.New("--manage-certs needs --namespace (or $POD_NAMESPACE)"))
	}
	if len(o.DNSNames)+len(o.IPs) == 0 {
		errs = append(errs, errors.New("--manage-certs needs a --cert-dns-name or --cert-ip for the scaler Service"))
	}
	// The CA is made for three validities: past about 97 years that
	// overflowed a time.Duration, and the CA was born expired.
	if o.Validity < time.Hour || o.Validity > MaxCertValidity {
		errs = append(errs, fmt.Errorf("--cert-validity %s: from 1h to %s (its CA is made for three times as long)", o.Validity, MaxCertValidity))
	}
	// Names of objects the aggregator writes: empty, each write failed
	// every 10 s and the replica never became ready.
	for _, n := range []struct{ flag, value string }{{"--cert-secret", o.Secret}, {"--trigger-auth-name", o.TriggerAuthName}} {
		if msgs := validation.IsDNS1123Subdomain(n.value); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--manage-certs: %s %q: %s", n.flag, n.value, strings.Join(msgs, "; ")))
		}
	}
	// Namespaces are labels, not subdomains (keda.system passed).
	for _, n := range []struct{ flag, value string }{{"--namespace", o.Namespace}, {"--keda-namespace", o.KEDANamespace}} {
		if msgs := validation.IsDNS1123Label(n.value); len(msgs) > 0 && (n.value != "" || n.flag == "--keda-namespace") { // --namespace's absence is said above
			errs = append(errs, fmt.Errorf("--manage-certs: %s %q: %s", n.flag, n.value, strings.Join(msgs, "; ")))
		}
	}
	for _, n := range []struct{ flag, value string }{{"--ca-configmap", o.CAConfigMap}, {"--relay-cert-secret", o.RelaySecret}, {"--relay-cert-secret-retired", o.RetiredRelaySecret}} {
		if msgs := validation.IsDNS1123Subdomain(n.value); len(msgs) > 0 && n.value != "" {
			errs = append(errs, fmt.Errorf("--manage-certs: %s %q: %s", n.flag, n.value, strings.Join(msgs, "; ")))
		}
	}
	if (o.RelaySecret == "") != (len(o.RelayDNSNames) == 0) {
		errs = append(errs, errors.New("--manage-certs: --relay-cert-secret and --relay-cert-dns-name go together"))
	}
	// A copy written over the Secret it is made from (or over KEDA's) took
	// its CA key and pairs, and each check made them again, for ever.
	if o.Secret == o.TriggerAuthName && o.KEDANamespace == o.Namespace {
		errs = append(errs, fmt.Errorf("--manage-certs: --cert-secret %q is KEDA's credentials' Secret (--trigger-auth-name, in --keda-namespace, the aggregator's namespace): name another", o.Secret))
	}
	if o.RelaySecret != "" && (o.RelaySecret == o.Secret || o.RelaySecret == o.TriggerAuthName && o.KEDANamespace == o.Namespace) {
		errs = append(errs, fmt.Errorf("--manage-certs: --relay-cert-secret %q is the Secret of the managed certificates or of KEDA's credentials: name another", o.RelaySecret))
	}
	// The Secret retired is removed: never one the aggregator keeps.
	if r := o.RetiredRelaySecret; r != "" && (r == o.RelaySecret || r == o.Secret || r == o.TriggerAuthName && o.KEDANamespace == o.Namespace) {
		errs = append(errs, fmt.Errorf("--manage-certs: --relay-cert-secret-retired %q is a Secret the aggregator keeps (--relay-cert-secret, --cert-secret or KEDA's credentials): it would be removed", r))
	}
	errs = append(errs, dnsNames("--cert-dns-name", o.DNSNames)...)
	return errors.Join(append(errs, dnsNames("--relay-cert-dns-name", o.RelayDNSNames)...)...)
}

// dnsNames refuses a name no certificate can carry (not ASCII: issuing
// failed every 10 s and the replica never became ready) or none a client
// asks for (a port or a scheme in it).
func dnsNames(flag string, names []string) []error {
	var errs []error
	for _, n := range names {
		msgs := validation.IsDNS1123Subdomain(n)
		if strings.HasPrefix(n, "*.") {
			msgs = validation.IsWildcardDNS1123Subdomain(n)
		}
		if len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--manage-certs: %s %q: %s", flag, wire.CleanText(n, 64), strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// MaxCertValidity bounds --cert-validity.
const MaxCertValidity = 10 * 365 * 24 * time.Hour

// IngestTLSOptions are the ingest port's TLS: certificate files, or the
// managed certificates.
type IngestTLSOptions struct {
	CertFile, KeyFile string
	Managed           bool
}

// AddFlags registers the group's flags.
func (o *IngestTLSOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.CertFile, "ingest-tls-cert-file", o.CertFile, "ingest port: serve TLS with this certificate (re-read when it changes)")
	fs.StringVar(&o.KeyFile, "ingest-tls-key-file", o.KeyFile, "ingest port: the certificate's key")
	fs.BoolVar(&o.Managed, "ingest-managed-tls", o.Managed, "ingest port: serve TLS with the managed server certificate (--manage-certs; name the ingest Service with --cert-dns-name); agents trust the CA published in --ca-configmap")
}

// Validate reports the group's problems.
func (o *IngestTLSOptions) Validate() error {
	var errs []error
	if countSet(o.CertFile, o.KeyFile) == 1 {
		errs = append(errs, errors.New("--ingest-tls-cert-file and --ingest-tls-key-file go together"))
	}
	if o.Managed && o.CertFile != "" {
		errs = append(errs, errors.New("--ingest-managed-tls and --ingest-tls-cert-file: choose one"))
	}
	return errors.Join(errs...)
}

// AgentAuthOptions are how agents authenticate.
type AgentAuthOptions struct {
	Mode, Audience string
	Accounts       []string
	accountsSet    bool
}

// AddFlags registers the group's flags.
func (o *AgentAuthOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Mode, "agent-auth", o.Mode, "agent authentication: none, or tokenreview (ServiceAccount token bound to a pod; the stream may speak only for that pod's node)")
	fs.StringVar(&o.Audience, "agent-audience", o.Audience, "audience agent tokens must carry")
	fs.Func("agent-service-account", "namespace/name of the agents' ServiceAccount; repeatable (default pulse-system/pulse-agent)", func(v string) error {
		if !o.accountsSet {
			o.Accounts, o.accountsSet = nil, true
		}
		o.Accounts = append(o.Accounts, v)
		return nil
	})
}

// Validate reports the group's problems.
func (o *AgentAuthOptions) Validate() error {
	var errs []error
	if o.Mode != "none" && o.Mode != "tokenreview" {
		errs = append(errs, fmt.Errorf("--agent-auth %q: want none or tokenreview", o.Mode))
	}
	if o.Mode == "tokenreview" && o.Audience == "" {
		errs = append(errs, errors.New("--agent-auth=tokenreview needs --agent-audience: every agent's token would be refused"))
	}
	// Refused here with the others, not once the listeners are open.
	for _, sa := range o.Accounts {
		if ns, name, ok := strings.Cut(sa, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("--agent-service-account %q: want namespace/name", sa))
		}
	}
	return errors.Join(errs...)
}

// ProvisionOptions are the ScaledObjects the aggregator keeps for annotated
// workloads, and the Lease that picks the one replica that does.
type ProvisionOptions struct {
	Enabled                                   bool
	ScalerAddress, TriggerAuth                string
	LeaderElect                               bool
	LeaseNamespace, LeaseName                 string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	MaxReplicas                               int64
}

// AddFlags registers the group's flags.
func (o *ProvisionOptions) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "provision-scaledobjects", o.Enabled, "keep a ScaledObject for every Workspace, InferenceSet, Deployment, StatefulSet and LeaderWorkerSet annotated pulse.io/autoscale: \"true\" (or scaledobject.kaito.sh/auto-provision: \"true\"); docs/scaledobject.md")
	fs.StringVar(&o.ScalerAddress, "provision-scaler-address", o.ScalerAddress, "--provision-scaledobjects: the scalerAddress the ScaledObjects name (this aggregator's scaler Service, host:port)")
	fs.StringVar(&o.TriggerAuth, "provision-trigger-auth", o.TriggerAuth, "--provision-scaledobjects: the ClusterTriggerAuthentication the ScaledObjects use (default: --trigger-auth-name with --manage-certs, else none)")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "--provision-scaledobjects: only the replica holding a coordination.k8s.io Lease provisions (false: run one replica only)")
	fs.StringVar(&o.LeaseNamespace, "leader-elect-namespace", o.LeaseNamespace, "namespace of the Lease (default --namespace)")
	fs.StringVar(&o.LeaseName, "leader-elect-lease-name", o.LeaseName, "name of the Lease")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "how long a Lease not renewed holds: how soon another replica takes over from a dead leader")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "how long the leader tries to renew before it stops provisioning")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "how often candidates try to take the Lease")
	fs.Int64Var(&o.MaxReplicas, "provision-max-replicas", o.MaxReplicas, "--provision-scaledobjects: the most replicas a workload's pulse.io/min-replicas or max-replicas may ask for (past it the annotation is refused: a ScaledObject pulse wrote before is held at the cap, and none is made where there is none; the default max-replicas, 10, is lowered to it); 0: no cap but 10,000")
}

// Validate reports the group's problems.
func (o *ProvisionOptions) Validate() error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if o.MaxReplicas < 0 || o.MaxReplicas > 10000 {
		errs = append(errs, fmt.Errorf("--provision-max-replicas %d: want 0 (no cap but 10,000) to 10,000", o.MaxReplicas))
	}
	if err := app.DialAddr(o.ScalerAddress); err != nil {
		errs = append(errs, fmt.Errorf("--provision-scaledobjects needs --provision-scaler-address host:port (the scaler Service), not %q: %w", o.ScalerAddress, err))
	}
	if o.LeaderElect {
		// A name the API server refuses: every replica's create failed
		// for ever, none led, and nothing was provisioned.
		if msgs := validation.IsDNS1123Subdomain(o.LeaseName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--leader-elect-lease-name %q: %s", wire.CleanText(o.LeaseName, 64), strings.Join(msgs, "; ")))
		}
		if o.LeaseNamespace != "" {
			if msgs := validation.IsDNS1123Label(o.LeaseNamespace); len(msgs) > 0 {
				errs = append(errs, fmt.Errorf("--leader-elect-namespace %q: %s", wire.CleanText(o.LeaseNamespace, 64), strings.Join(msgs, "; ")))
			}
		}
		// client-go's own rules.
		if o.RetryPeriod <= 0 || float64(o.RenewDeadline) <= 1.2*float64(o.RetryPeriod) || o.LeaseDuration <= o.RenewDeadline {
			errs = append(errs, errors.New("want --leader-elect-lease-duration > --leader-elect-renew-deadline > 1.2 × --leader-elect-retry-period > 0"))
		}
	}
	return errors.Join(errs...)
}

func (o *ProvisionOptions) leaseNamespace(all *Options) string {
	if o.LeaseNamespace != "" {
		return o.LeaseNamespace
	}
	return all.Certs.Namespace
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
