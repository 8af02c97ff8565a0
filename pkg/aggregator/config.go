package aggregator

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"regexp"
	runtimedebug "runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/certs"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/framed"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/netbound"
	"github.com/pulse-io/pulse/pkg/provision"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
)

// Deps are the aggregator's clients, built once. Complete builds the ones
// left nil that a feature needs, from one rest.Config; tests pass fakes.
type Deps struct {
	Kube     kubernetes.Interface
	Dynamic  dynamic.Interface
	Metadata metadata.Interface
}

// Config is the validated options, ready to be completed into an
// aggregator.
type Config struct{ opts *Options }

// Config validates the options.
func (o *Options) Config() (*Config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Config{opts: o}, nil
}

// restConfig loads the API's client configuration (--kubeconfig, or the
// in-cluster one).
func (c *Config) restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.opts.Kube.KubeConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (--kubeconfig, or the in-cluster config): %w", err)
	}
	cfg.UserAgent = "pulse-aggregator/" + version.Version
	// Above client-go's 5 QPS: a restart re-ensures certificates, syncs
	// caches and reviews every agent's token at once.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// New wires an aggregator from options, building its clients.
func New(o *Options, log *slog.Logger) (*Aggregator, error) { return NewWithDeps(o, log, Deps{}) }

// NewWithDeps wires an aggregator with the given clients.
func NewWithDeps(o *Options, log *slog.Logger, deps Deps) (*Aggregator, error) {
	c, err := o.Config()
	if err != nil {
		return nil, err
	}
	return c.Complete(log, deps)
}

// Complete builds the clients the features need (one rest.Config, one
// client of each kind), opens the listeners (so that addresses such as
// 127.0.0.1:0 are bound before Run) and wires the servers.
func (c *Config) Complete(log *slog.Logger, deps Deps) (*Aggregator, error) {
	if err := c.clients(&deps); err != nil {
		return nil, err
	}
	a := &Aggregator{opts: c.opts, log: log, deps: deps, health: newHealth(housekeepEvery)}
	if c.opts.Kube.OwnerClusterRole != "" {
		// Filled in by Run (resolveOwner) before what reads it runs.
		a.owner = &metav1.OwnerReference{}
	}
	if err := a.listen(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.refused, a.scalerConns.evicted)
	// go_gc_heap_live_bytes (the heap the last GC found live),
	// go_gc_scan_stack_bytes (the goroutines' stacks it scanned) and
	// go_gc_gogc_percent (GOGC, --gc-percent's) beside the default set:
	// heap in use also holds what the next GC will free, and the GC's goal
	// is the live heap and GOGC% of the two.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/((heap/live|scan/stack):bytes|gogc:percent)$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	steps := []func(prometheus.Registerer) error{a.buildStore, a.buildIngest, a.buildScaler, a.buildProvision}
	for _, step := range steps {
		if err := step(reg); err != nil {
			a.close()
			return nil, err
		}
	}
	a.buildHTTP(reg)
	return a, nil
}

// clients fills the clients deps lacks that a feature needs, all from
// one rest.Config.
func (c *Config) clients(deps *Deps) error {
	o := c.opts
	prov := o.Provision.Enabled
	needKube := o.Certs.Enabled || o.AgentAuth.Mode == "tokenreview" || o.Warmup.AgentDaemonSet != "" || prov || o.Kube.OwnerClusterRole != "" ||
		o.Serving.MetricsAuth == "kubernetes"
	needDyn := o.Certs.Enabled || o.Kube.ResolveTargets || prov
	needMeta := prov
	if (!needKube || deps.Kube != nil) && (!needDyn || deps.Dynamic != nil) && (!needMeta || deps.Metadata != nil) {
		return nil
	}
	cfg, err := c.restConfig()
	if err != nil {
		return err
	}
	if needKube && deps.Kube == nil {
		if deps.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	}
	if needDyn && deps.Dynamic == nil {
		if deps.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes dynamic client: %w", err)
		}
	}
	if needMeta && deps.Metadata == nil {
		if deps.Metadata, err = metadata.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes metadata client: %w", err)
		}
	}
	return nil
}

// listen opens every listener.
func (a *Aggregator) listen() error {
	s := a.opts.Serving
	for _, l := range []struct {
		ln   *net.Listener
		addr string
		what string
	}{{&a.ingestLn, s.IngestAddr, "ingest"}, {&a.scalerLn, s.ScalerAddr, "scaler"}, {&a.httpLn, s.HTTPAddr, "http"}, {&a.debugLn, s.DebugAddr, "debug"},
		{&a.healthLn, s.HealthAddr, "health"}} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			a.close()
			return fmt.Errorf("listen on %s address %s: %w", l.what, l.addr, err)
		}
		*l.ln = ln
	}
	a.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pulse_aggregator_connections_refused_total",
		Help: "Connections closed at once past a port's bounds (port: ingest, scaler, http, health, debug): its connections from one address (--max-ingest-connections-per-address, --max-scaler-connections-per-address), or, on the scaler and HTTP ports, in all.",
	}, []string{"port"})
	// Every ingest connection is a TLS handshake, HTTP/2 buffers and, with
	// agent authentication, a token review: at most so many at once.
	ingest := newLimitListener(a.ingestLn, s.MaxIngestConnections, s.MaxIngestConnectionsPerAddress)
	ingest.byIP.OnRefuse = a.refusal("ingest", "--max-ingest-connections-per-address")
	// gRPC's keepalive timeout as the socket's TCP_USER_TIMEOUT, which
	// gRPC sets on a bare TCP connection only (netbound's, for framed
	// connections too).
	ingest.byIP.UserTimeout = ServerKeepalive.Timeout
	a.ingestLn = ingest
	// The scaler port held every connection, unbounded (KEDA's operator
	// keeps one a scaler address and TLS configuration).
	most := cmp.Or(s.maxScalerConns, maxScalerConns)
	scalerLn := netbound.New(a.scalerLn, most, s.MaxScalerConnectionsPerAddress)
	scalerLn.OnRefuse = a.refusal("scaler", "--max-scaler-connections-per-address")
	scalerLn.UserTimeout = ServerKeepalive.Timeout
	// Full in all, a new connection takes the place of one of the
	// namespace holding the most (scalerConns).
	evicted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pulse_aggregator_scaler_connections_evicted_total",
		Help: "The scaler port's connections closed, the port full, for a new one: one whose calls named no namespace, or whose namespaces all hold more than their share of the port (its bound over the namespaces charged and the new connection's).",
	})
	a.scalerConns = newScalerConns(most, cmp.Or(s.scalerSettle, scalerSettle), cmp.Or(s.scalerSettle, handshakeTimeout), evicted, a.log)
	scalerLn.Evict = a.scalerConns.evict
	a.scalerLn = scalerListener{Listener: scalerLn, conns: a.scalerConns}
	// The HTTP ports held every connection for up to their IdleTimeout,
	// 10 to 19 KiB each, unbounded: the http port is open to other pods by
	// default; one pod opening 30,000 took every replica past its memory
	// limit.
	for _, l := range []struct {
		ln   *net.Listener
		port string
	}{{&a.httpLn, "http"}, {&a.healthLn, "health"}, {&a.debugLn, "debug"}} {
		if *l.ln != nil {
			b := netbound.New(*l.ln, maxHTTPConns, maxHTTPConnsPerIP)
			b.OnRefuse = a.refusal(l.port, "")
			*l.ln = b
		}
	}
	return nil
}

// refusal counts a connection closed past port's bounds, and logs it at
// most once a minute a port, naming the flag that raises the bound.
func (a *Aggregator) refusal(port, flag string) func(ip string, all bool) {
	c := a.refused.WithLabelValues(port)
	var mu sync.Mutex
	var logged time.Time
	return func(ip string, all bool) {
		c.Inc()
		mu.Lock()
		due := time.Since(logged) >= time.Minute
		if due {
			logged = time.Now()
		}
		mu.Unlock()
		if !due {
			return
		}
		msg := "connection closed at once: its address holds its share of the port's connections (counted in pulse_aggregator_connections_refused_total; logged at most once a minute a port)"
		switch {
		case all:
			msg = "connection closed at once: the port holds all the connections it may, from every address (counted in pulse_aggregator_connections_refused_total; logged at most once a minute a port)"
		case flag != "":
			msg += "; clients that share one address (a sidecar's, a translated one) need " + flag + " raised"
		}
		a.log.Warn(msg, logging.KeyPort, port, logging.KeyAddr, ip)
	}
}

// maxHTTPConns bounds the connections each HTTP port holds at once (past
// it a new one is closed), maxHTTPConnsPerIP those of one address: a flood
// from one pod leaves room for the kubelet's probes and Prometheus.
const (
	maxHTTPConns      = 1024
	maxHTTPConnsPerIP = 64
)

// maxScalerConns bounds the connections the scaler port holds at once
// (--max-scaler-connections-per-address those of one address: KEDA's
// operator keeps one a scaler address and TLS configuration).
const maxScalerConns = 1024

// scalerSettle: a scaler port's connection is charged this long (KEDA's
// polling interval, by default) before it may be closed for room: after a
// restart the shared connection's first calls may be one tenant's alone.
const scalerSettle = 30 * time.Second

// verifiedUnbound is the scaler port's mutual TLS: a connection whose
// client presented a certificate the port verified (KEDA's) is taken out
// of --max-scaler-connections-per-address (netbound.Conn.Exempt), within
// the port's bound in all. KEDA's operator keeps a connection for each
// scaler address and TLS setting its triggers write, and a tenant writes
// its own triggers: one tenant's 16 spellings of the aggregator's address
// (case, the IP, a dns:/// prefix) took every place KEDA's address had,
// and the connection every other tenant's triggers share was closed at
// once at its next connect. The bound by address still holds connections
// whose handshake has not verified (a pod's flood).
type verifiedUnbound struct {
	credentials.TransportCredentials
}

// ServerHandshake is the TLS handshake, and the exemption after it.
func (v verifiedUnbound) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := v.TransportCredentials.ServerHandshake(raw)
	if tlsInfo, ok := info.(credentials.TLSInfo); err == nil && ok && len(tlsInfo.State.VerifiedChains) > 0 {
		if b, ok := raw.(exempter); ok {
			b.Exempt()
		}
	}
	return c, info, err
}

// Clone is a copy with the exemption.
func (v verifiedUnbound) Clone() credentials.TransportCredentials {
	return verifiedUnbound{v.TransportCredentials.Clone()}
}

// maxScalerRequest bounds a request KEDA sends the scaler port: a trigger's
// metadata of at most 64 keys of 1 KiB and their values (scaler.metadata)
// is under 136 KiB with its names. At gRPC's default, 4 MiB, a tenant's
// ScaledObject of 130,000 empty keys (1.36 MB, which the API server
// takes) was decoded whole before its keys were counted, 26 MB allocated
// at each of KEDA's polls; past this bound it is refused unread
// (ResourceExhausted).
const maxScalerRequest = 256 << 10

// handshakeTimeout bounds a new connection's handshake (TLS, HTTP/2) on
// the ingest and scaler ports: gRPC's own, 120 s, let a client that
// connects and sends nothing hold a place for two minutes.
const handshakeTimeout = 10 * time.Second

// close releases the listeners of an aggregator that will not run.
func (a *Aggregator) close() {
	for _, ln := range []net.Listener{a.ingestLn, a.scalerLn, a.httpLn, a.debugLn, a.healthLn} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// ServerKeepalive accepts KEDA's and the agents' keepalive pings.
var (
	ServerKeepalive = keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	ServerPolicy    = keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}
)

func grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.KeepaliveParams(ServerKeepalive), grpc.KeepaliveEnforcementPolicy(ServerPolicy)}
}

// streamOptions size an agent stream's connection for what it carries: a
// batch a second of a few hundred bytes, an ack back. gRPC's defaults
// (32 KiB read and write buffers per connection, the write buffer held for
// the connection's life, and a window that grows by pinging) are sized for
// bulk transfers; one aggregator holds thousands of these connections.
//   - In plaintext, 4 KiB read buffers, which gRPC takes from a pool only
//     while a read is under way (limit.go): a batch is read in one call, a
//     large catalogue in several. With TLS (tls), none: crypto/tls reads a
//     whole record into a buffer of its own and hands it out from there,
//     and gRPC cannot pool a buffer over a TLS connection, so a 4 KiB one
//     on top was a second copy, held for the connection's life (4 KiB of
//     heap an agent: docs/performance.md, "The ingest port with TLS").
//   - 4 KiB write buffers (gRPC shares them: a connection takes one only
//     while it writes, and returns it after the flush).
//   - Fixed 64 KiB windows (gRPC's least): no bandwidth-estimation pings,
//     so a batch wakes no extra writer, and a connection can hold at most
//     64 KiB that its handler has not read (the estimate grows it to 16 MiB).
//   - A header table of 0 (grpc.HeaderTableSize): an agent opens one
//     stream a connection, so HPACK's dynamic table would only keep that
//     stream's headers, its token among them, for the connection's life
//     (1.5 MB at 2,000 agents in a heap profile); the agents' gRPC sees
//     the setting and indexes nothing.
//   - At most --max-ingest-streams-per-connection streams a connection
//     (4: an agent opens one; a pulse-relay many): gRPC allows 2^32 - 1,
//     each a handler and, with agent authentication, a token review.
//   - A connection lives at most ingestConnectionAge (then a GOAWAY, and
//     ingestConnectionGrace later it is closed; the agent reconnects with
//     its current token and lists its pods in full). A stream ends at its
//     token's expiry only when a message comes: a node's idle stream (its
//     token copied) had held what it listed for ever, another tenant's
//     deleted pods among them; it now outlives its token by at most this.
func streamOptions(tls bool, streams int) []grpc.ServerOption {
	read := 4 << 10
	if tls {
		read = 0
	}
	ka := ServerKeepalive
	ka.MaxConnectionAge, ka.MaxConnectionAgeGrace = ingestConnectionAge, ingestConnectionGrace
	// An agent's connection always has its stream open: one with none for
	// ingestConnectionIdle is not an agent's (no stream, no token
	// reviewed), and gives its place back.
	ka.MaxConnectionIdle = ingestConnectionIdle
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.ReadBufferSize(read), grpc.WriteBufferSize(4 << 10),
		grpc.InitialWindowSize(64 << 10), grpc.InitialConnWindowSize(64 << 10),
		grpc.MaxConcurrentStreams(uint32(streams)), grpc.KeepaliveParams(ka), grpc.HeaderTableSize(0),
		grpc.MaxHeaderListSize(maxIngestHeaders),
	}
}

// maxIngestHeaders bounds a stream's headers (HTTP/2's header list, as
// gRPC counts it; its default is 16 MiB, held for the stream's life): an
// agent's are its token (about 1 KB; the framed transport's is at most
// 16 KiB) and a relay's name of the replica. Past it the stream is reset,
// and the agent's gRPC, told the bound in the settings, fails it saying so.
const maxIngestHeaders = 32 << 10

// ingestConnectionAge and ingestConnectionGrace bound an agent connection's
// life (streamOptions): the agents' token lives an hour (the chart's
// auth.expirationSeconds).
var (
	ingestConnectionAge   = time.Hour
	ingestConnectionGrace = 30 * time.Second
	ingestConnectionIdle  = 30 * time.Second
)

func (a *Aggregator) buildStore(reg prometheus.Registerer) error {
	o := a.opts.Store
	so := store.Options{Retention: o.MaxWindow, MaxSamples: o.MaxSamplesPerPod, MaxPods: o.MaxPods,
		MaxPodsPerNamespace: o.PodsPerNamespace(), Expiry: o.PodExpiry}
	if a.opts.AgentAuth.Mode == "tokenreview" {
		so.Exists, so.Replicas = a.podExists, a.apiReplicas
	}
	a.store = store.New(so)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pulse_aggregator_pods", Help: "Pods held in the store."}, func() float64 { return float64(a.store.Pods()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pulse_aggregator_retention_seconds", Help: "What the store keeps of each pod: the longest window a live trigger asks for, rounded up to whole seconds to 64s and by under a 32nd of it past that (at least 10s, at most --max-window)."},
			func() float64 { return a.store.Retention().Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pulse_aggregator_pods_refused_total", Help: "Refusals of a new pod because --max-pods, or its namespace's --max-pods-per-namespace, was reached, or its namespace held a share of the room while one holding less waited (a waiting pod is listed again at each batch of its agent, and counted each time)."}, func() float64 { return float64(a.store.Refused()) }))
	a.warnIfPodsOutgrowMemory(false)
	a.warmup = newWarmup(a.store, a.opts.Warmup.Duration, a.opts.Warmup.ExpectedAgents, time.Now, a.log)
	a.warmup.sweep = a.store.Sweep
	a.health.addCheck("warm-up", a.warmup.check)
	return nil
}

// Memory a pod held costs at most, about (docs/performance.md, "A fleet on
// one box"; the aggregator chart's maxPods): the heap in use just before a
// GC, twice the live heap as measured with GOGC=100 (its share of its
// agent's connection included, at two pods a node or more), without and
// with latency histograms.
// Measured at a 60 s window (about 60 samples a pod at the agents' 1 s);
// each sample past podSamples costs about sampleBytes more in use (the
// store's 40 bytes live, 130 with histograms: BenchmarkStoreHeapPerPod,
// twice that before a GC). An agent's stream costs about streamBytes of
// its own, whatever pods it lists (docs/performance.md, "An agent's stream
// apart from its pods": 14–21 KB of RSS measured), which a pod alone on its
// node carries alone.
const (
	podBytes        = 16 << 10
	podHistBytes    = 27 << 10
	podSamples      = 64
	sampleBytes     = 80
	sampleHistBytes = 260
	streamBytes     = 20 << 10
)

// memoryNeed is what --max-pods pods may cost (podBytes or podHistBytes
// each, and the samples they may keep), and what is said of it.
func (a *Aggregator) memoryNeed(histograms bool) (need int64, what string) {
	per, sample, what := int64(podBytes), int64(sampleBytes), "without latency histograms"
	if histograms {
		per, sample, what = podHistBytes, sampleHistBytes, "with latency histograms (an agent runs --forward-histograms)"
	}
	// One tenant's trigger asking for --max-window makes every pod keep
	// that long (at most --max-samples-per-pod samples).
	samples := min(int64(a.opts.Store.MaxSamplesPerPod), int64(a.opts.Store.MaxWindow/time.Second))
	per += max(samples-podSamples, 0) * sample
	return int64(a.opts.Store.MaxPods) * per, what
}

// warnIfPodsOutgrowMemory logs a warning when --max-pods pods would not fit
// in 80 % of the memory limit (GOMEMLIMIT, which pkg/app sets from the
// container's limit): a store that fills up would be OOM-killed. It is
// called at the start, and again when the first histograms arrive; no
// agent streams then, and warnIfStreamsOutgrowMemory counts them once they
// do.
func (a *Aggregator) warnIfPodsOutgrowMemory(histograms bool) {
	limit := runtimedebug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		return // no limit set
	}
	if need, what := a.memoryNeed(histograms); need > limit/10*8 {
		a.log.Warn("--max-pods pods may not fit the memory limit: lower --max-pods (chart maxPods) or raise the limit (chart resources.limits.memory)",
			logging.KeyMaxPods, a.opts.Store.MaxPods, logging.KeyNeedBytes, need, logging.KeyLimitBytes, limit, logging.KeyWhat, what)
	}
}

// warnIfStreamsOutgrowMemory logs a warning when --max-pods pods and the
// agent streams open now would not fit in 80 % of the memory limit, where
// the pods alone would: on nodes of one pod each, a node's stream costs
// more than its pod. Once, until they fit again (housekeep calls it each
// minute; the streams are the nodes, which come and go). It says whether
// they fit.
func (a *Aggregator) warnIfStreamsOutgrowMemory(streams int, histograms bool) bool {
	limit := runtimedebug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		return true
	}
	pods, what := a.memoryNeed(histograms)
	need := pods + int64(streams)*streamBytes
	switch {
	case pods > limit/10*8:
		a.streamsWarned = false
		return false // the pods alone do not fit: the start's warning said so
	case need <= limit/10*8:
		a.streamsWarned = false
		return true
	}
	if !a.streamsWarned {
		a.streamsWarned = true
		a.log.Warn("--max-pods pods and the agents' streams open now may not fit the memory limit (each stream costs about 20 KB, more than its pod where a node runs one): lower --max-pods (chart maxPods) or raise the limit (chart resources.limits.memory)",
			logging.KeyMaxPods, a.opts.Store.MaxPods, logging.KeyStreams, streams, logging.KeyNeedBytes, need, logging.KeyLimitBytes, limit, logging.KeyWhat, what)
	}
	return false
}

// podExists is the store's Options.Exists with agent authentication: its
// pod cache says whether a replica whose agent is lost is still in the API
// (buildIngest sets a.reviewer after buildStore, before Run). Without it
// there is no cache: the store has no Exists, and such a replica is gone.
func (a *Aggregator) podExists(namespace, name, uid string, k store.Key) bool {
	return a.reviewer != nil && a.reviewer.PodExists(namespace, name, uid, k)
}

// apiReplicas is the store's Options.Replicas with agent authentication,
// from the same pod cache as podExists; none during the warm-up, while the
// agents of a restarted aggregator connect again (each node's replicas
// would be adopted as unseen, and each agent's first catalogue forget
// them).
func (a *Aggregator) apiReplicas(k store.Key, on func(node string) bool) ([]store.APIPod, bool) {
	if a.reviewer == nil || !a.warmup.over.Load() { // set by check as the warm-up ends
		return nil, false
	}
	return a.reviewer.Replicas(k, on)
}

// buildIngest: the agents' stream server, with TLS and authentication.
func (a *Aggregator) buildIngest(reg prometheus.Registerer) error {
	o := a.opts
	opts := append(grpcOptions(), grpc.MaxRecvMsgSize(maxIngestMessage))
	opts = append(opts, streamOptions(o.IngestTLS.CertFile != "" || o.IngestTLS.Managed, o.Serving.MaxIngestStreamsPerConnection)...)
	switch {
	case o.IngestTLS.CertFile != "":
		files, err := certs.NewFiles(o.IngestTLS.CertFile, o.IngestTLS.KeyFile, "")
		if err != nil {
			return fmt.Errorf("ingest TLS: %w", err)
		}
		a.ingestTLS = files.ServerConfig()
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.ingestTLS)))
	case o.IngestTLS.Managed:
		a.ingestTLS = a.managedCerts(reg).ServerOnlyConfig()
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.ingestTLS)))
		a.log.Info("ingest port serves TLS with managed certificates", logging.KeyName, o.Certs.Namespace+"/"+o.Certs.CAConfigMap)
	}
	var auth ingest.Authenticator
	if o.AgentAuth.Mode == "tokenreview" {
		tr, err := ingest.NewTokenReviewer(a.deps.Kube, o.AgentAuth.Audience, o.AgentAuth.Accounts)
		if err != nil {
			return fmt.Errorf("--agent-auth=tokenreview: %w", err)
		}
		tr.OnGone(a.store.Gone)
		a.warmup.ready = tr.Ready // its closing sweep adopts from this pod cache
		a.reviewer, auth = tr, tr
		a.health.addCheck("pod cache", tr.Ready)
	}
	if auth != nil {
		a.log.Info("agents authenticate with ServiceAccount tokens", logging.KeyAudience, o.AgentAuth.Audience, logging.KeyAccounts, o.AgentAuth.Accounts)
	} else {
		a.log.Info("agent streams are not authenticated (--agent-auth=none): use it on loopback or a trusted network only")
	}
	// The ingest codec decodes agents' batches into pooled messages, and
	// refuses a message past the limits before it decodes it.
	limits := ingest.Limits{MaxPodsPerStream: o.Store.MaxPodsPerAgent}
	a.ingestSrv = grpc.NewServer(append(opts, grpc.ForceServerCodecV2(ingest.CodecFor(limits)))...)
	a.ingest = ingest.New(a.store, ingest.Options{Log: a.log, Version: version.Version, Registerer: reg, Auth: auth,
		OnHistograms: func() { a.warnIfPodsOutgrowMemory(true) },
		Limits:       limits})
	pulsev1.RegisterIngestServer(a.ingestSrv, a.ingest)
	healthpb.RegisterHealthServer(a.ingestSrv, a.health)
	// The same port serves the framed transport (--transport=framed on the
	// agents: pkg/framed), with the same handler, TLS and bounds.
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pulse_aggregator_ingest_connections_total",
		Help: "Connections the ingest port served, by transport (grpc, framed: the agents' --transport).",
	}, []string{"transport"})
	reg.MustRegister(conns)
	fs := framed.NewServer(a.ingest.Report, framed.ServerOptions{TLS: a.ingestTLS, Codec: ingest.CodecFor(limits), MaxMessage: maxIngestMessage,
		Handshake: handshakeTimeout, Idle: framedIdle, MaxAge: ingestConnectionAge, WriteTimeout: handshakeTimeout, Log: a.log})
	a.ingestMux = newIngestMux(a.ingestLn, fs, conns)
	return nil
}

// maxIngestMessage is the largest message an agent may send, on either
// transport.
const maxIngestMessage = 4 << 20

// framedIdle: a framed connection that sends nothing for this long is
// ended (an agent sends a batch or a heartbeat at least every 10 s), as
// gRPC's keepalive (30 s, then 10 s for the answer) ends a connection
// whose peer is gone.
const framedIdle = time.Minute

// buildScaler: KEDA's scaler server, with its TLS (managed or files) and
// the ScaledObject resolver.
func (a *Aggregator) buildScaler(reg prometheus.Registerer) error {
	o := a.opts
	opts := grpcOptions()
	switch {
	case o.Certs.Enabled:
		opts = append(opts, grpc.Creds(verifiedUnbound{credentials.NewTLS(a.managedCerts(reg).ServerConfig())}))
		a.log.Info("scaler port serves mutual TLS with managed certificates", logging.KeySecret, o.Certs.Namespace+"/"+o.Certs.Secret,
			logging.KeyTriggerAuth, o.Certs.TriggerAuthName)
	case o.ScalerTLS.CertFile != "":
		files, err := certs.NewFiles(o.ScalerTLS.CertFile, o.ScalerTLS.KeyFile, o.ScalerTLS.ClientCAFile)
		if err != nil {
			return fmt.Errorf("scaler TLS: %w", err)
		}
		files.ClientName = o.ScalerTLS.ClientName
		opts = append(opts, grpc.Creds(verifiedUnbound{credentials.NewTLS(files.ServerConfig())}))
		a.log.Info("scaler port serves mutual TLS", logging.KeyCert, o.ScalerTLS.CertFile, logging.KeyClientCA, o.ScalerTLS.ClientCAFile)
	}
	var resolver scaler.TargetResolver
	if o.Kube.ResolveTargets {
		a.resolver = scaler.NewInformerResolver(a.deps.Dynamic)
		resolver = a.resolver
		a.health.addCheck("ScaledObject cache", a.resolver.Ready)
	}
	// KEDA's calls (and health checks) as the aggregator answers them:
	// grpc_server_handled_total by method and code, and
	// grpc_server_handling_seconds, the handler's time from the decoded
	// request to its answer (not the reading, the writing or a wait to
	// run; a stream's is its life). An answer from the store takes a
	// fraction of a millisecond: the buckets are fine below 10 ms.
	calls := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(
		[]float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1})))
	reg.MustRegister(calls)
	opts = append(opts, grpc.ChainUnaryInterceptor(calls.UnaryServerInterceptor(), a.scalerConns.chargeUnary),
		grpc.ChainStreamInterceptor(calls.StreamServerInterceptor(), a.scalerConns.chargeStream),
		grpc.StatsHandler(tagger{a.scalerConns}), grpc.ConnectionTimeout(handshakeTimeout), grpc.MaxRecvMsgSize(maxScalerRequest))
	a.scalerSrv = grpc.NewServer(opts...)
	a.scaler = scaler.New(a.store, scaler.Options{MaxWindow: o.Store.MaxWindow, Resolver: resolver, Gate: a.warmup.check,
		AllowCrossNamespace: o.Kube.AllowCrossNamespace, Logger: a.log, FollowWindows: true,
		MaxStreams: o.Serving.MaxScalerStreams, MaxStreamsPerNamespace: o.Serving.ScalerStreamsPerNamespace(),
		MaxTriggerSeries: o.Serving.MaxTriggerSeries})
	reg.MustRegister(a.scaler.Collector())
	externalscaler.RegisterExternalScalerServer(a.scalerSrv, a.scaler)
	healthpb.RegisterHealthServer(a.scalerSrv, a.health)
	calls.InitializeMetrics(a.scalerSrv) // every method's series from the start, at 0
	return nil
}

// managedCerts returns the managed certificates (--manage-certs), made at
// the first call: the scaler and ingest ports share them.
func (a *Aggregator) managedCerts(reg prometheus.Registerer) *certs.Managed {
	if a.managed != nil {
		return a.managed
	}
	o := a.opts
	var ips []net.IP
	for _, ip := range o.Certs.IPs {
		ips = append(ips, net.ParseIP(ip))
	}
	a.managed = certs.NewManaged(certs.ManagedOptions{Client: a.deps.Kube, Dynamic: a.deps.Dynamic, Namespace: o.Certs.Namespace,
		SecretName: o.Certs.Secret, DNSNames: o.Certs.DNSNames, IPs: ips, Validity: o.Certs.Validity,
		KEDANamespace: o.Certs.KEDANamespace, TriggerAuthName: o.Certs.TriggerAuthName, CAConfigMap: o.Certs.CAConfigMap,
		RelaySecretName: o.Certs.RelaySecret, RelayDNSNames: o.Certs.RelayDNSNames, RetiredRelaySecretName: o.Certs.RetiredRelaySecret,
		Owner: a.owner, Log: a.log})
	a.health.addCheck("certificates", a.managed.Ready)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pulse_aggregator_certificate_expiry_timestamp_seconds",
		Help: "When the managed server certificate served expires (Unix seconds; 0 before one is loaded). Renewed two thirds through its life: alert when it is less than a sixth of --cert-validity away."},
		func() float64 {
			if t := a.managed.NotAfter(); !t.IsZero() {
				return float64(t.Unix())
			}
			return 0
		}))
	return a.managed
}

// buildProvision: the controller that keeps ScaledObjects for annotated
// workloads, run while this replica holds the Lease.
func (a *Aggregator) buildProvision(reg prometheus.Registerer) error {
	o := a.opts
	if !o.Provision.Enabled {
		return nil
	}
	auth := o.Provision.TriggerAuth
	if auth == "" && o.Certs.Enabled {
		auth = o.Certs.TriggerAuthName
	}
	a.provisioner = provision.New(provision.Options{Metadata: a.deps.Metadata, Dynamic: a.deps.Dynamic, Discovery: a.deps.Kube.Discovery(),
		Events: a.deps.Kube.CoreV1(), Target: provision.Target{ScalerAddress: o.Provision.ScalerAddress, TriggerAuth: auth},
		MaxWindow: o.Store.MaxWindow, MaxReplicas: o.Provision.MaxReplicas, MetricMeant: a.scaler.MetricMeant, Log: a.log.With(logging.KeyComponent, "provisioner")}, reg)
	a.election = provision.Election{Enabled: o.Provision.LeaderElect, Namespace: o.Provision.leaseNamespace(o), Name: o.Provision.LeaseName,
		LeaseDuration: o.Provision.LeaseDuration, RenewDeadline: o.Provision.RenewDeadline, RetryPeriod: o.Provision.RetryPeriod,
		Leases: a.deps.Kube.CoordinationV1()}
	if a.owner != nil {
		a.election.Owner = a.ownerNow
	}
	a.log.Info("provisioning ScaledObjects for annotated workloads", logging.KeyScaler, o.Provision.ScalerAddress, logging.KeyTriggerAuth, auth,
		logging.KeyLease, a.election.Namespace+"/"+a.election.Name)
	return nil
}

// reviewRouted serves mux's endpoints behind auth's review (none with a
// nil auth). A path mux does not route is answered by mux (404, 405)
// without a review: only the endpoints' paths are sent to the API server.
// A path no object can have (reviewable) is a 404, reviewed or not: a
// namespace that is no DNS label (a namespace "team-a%2F1" routed as its
// own, past the one answer a namespace may have under way, and was
// reviewed as team-a's path), a workload's name with a slash or a control
// character or past wire.MaxName bytes, or a path past maxReviewedPath.
// Without a review they were served (an empty list for "Team-A", a name of
// a megabyte echoed in the 404).
func reviewRouted(mux *http.ServeMux, auth *metricsAuthorizer) http.Handler {
	guarded := http.Handler(mux)
	if auth != nil {
		guarded = auth.wrap(mux)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern == "" {
			mux.ServeHTTP(w, r)
			return
		}
		if !reviewable(r.URL) {
			http.Error(w, "no such namespace or name", http.StatusNotFound)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// loopbackAddr reports whether addr is a loopback address (a TCP one).
func loopbackAddr(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// maxReviewedPath bounds a path sent to the API server for review.
const maxReviewedPath = 512

// namespacedPages are the debug endpoints whose path a namespace and a
// name follow (/debug/<page>/<namespace>/<name>).
var namespacedPages = []string{"workloads", "triggers", "provisioning"}

// reviewable says whether u's path is one an object can have: at most
// maxReviewedPath bytes; under a namespaced page a DNS label (a
// namespace) and a workload's name (printable, at most 253 bytes, no
// slash: pulse.io/workload takes more than a DNS name). Its segments are
// read unescaped, as the mux routes them: a page's word escaped
// (/debug/%77orkloads/...) was no page's prefix here, and the mux served
// it as the page all the same, each such path reviewed.
func reviewable(u *url.URL) bool {
	p := u.EscapedPath()
	if len(p) > maxReviewedPath {
		return false
	}
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		d, err := url.PathUnescape(seg)
		if err != nil {
			return false
		}
		segs[i] = d
	}
	if len(segs) < 4 || segs[0] != "" || segs[1] != "debug" || !slices.Contains(namespacedPages, segs[2]) {
		return true
	}
	if len(validation.IsDNS1123Label(segs[3])) > 0 {
		return false
	}
	if len(segs) == 4 {
		return true
	}
	name := strings.Join(segs[4:], "/")
	return name != "" && len(name) <= wire.MaxName && !strings.Contains(name, "/") && wire.IsName(name)
}

// metricsHandler serves reg's metrics (bounded as app.MetricsHandler
// says). A series that fails to collect (the second with the same labels,
// say) is left out, and every other is served: one tenant's records never
// empty the page of all. Each failure is counted
// (promhttp_metric_handler_errors_total{cause="gathering"}) and logged, at
// most once a minute.
func metricsHandler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return app.MetricsHandler(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Registry: reg,
		ErrorLog: &metricsErrorLog{log: log}})
}

// metricsErrorLog is promhttp's error log on the aggregator's, at most once
// a minute.
type metricsErrorLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	last time.Time
}

func (l *metricsErrorLog) Println(v ...any) {
	l.mu.Lock()
	now := time.Now()
	logIt := now.Sub(l.last) >= time.Minute
	if logIt {
		l.last = now
	}
	l.mu.Unlock()
	if logIt {
		l.log.Warn("metrics left out of /metrics (logged once a minute; counted in promhttp_metric_handler_errors_total)",
			logging.KeyErr, strings.TrimSuffix(fmt.Sprintln(v...), "\n"))
	}
}

// buildHTTP: /metrics, /livez, /readyz and the debug endpoints (on their
// own listener with --debug-addr).
func (a *Aggregator) buildHTTP(reg *prometheus.Registry) {
	mux := http.NewServeMux()
	dbg := &debug.Handler{Store: a.store, FreshFor: a.opts.Store.FreshFor, MaxWindow: a.opts.Store.MaxWindow, Triggers: a.scaler}
	if a.provisioner != nil {
		dbg.Provisioning = a.provisioner
	}
	dmux := http.NewServeMux()
	dbg.Register(dmux)
	if a.opts.Serving.Profiling {
		dmux.HandleFunc("GET /debug/pprof/", pprof.Index)
		dmux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		dmux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		dmux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	metrics := metricsHandler(reg, a.log)
	var auth *metricsAuthorizer
	if a.opts.Serving.MetricsAuth == "kubernetes" {
		auth = newMetricsAuthorizer(a.deps.Kube, a.log)
		metrics = auth.wrap(metrics)
		if !a.opts.Serving.HTTPTLS {
			a.log.Warn("/metrics reviews bearer tokens sent in plaintext: serve the http port with --http-tls")
		}
	}
	if a.debugLn != nil {
		// On their own address (the chart's: the pod's loopback).
		a.debugSrv = app.NewHTTPServer(reviewRouted(dmux, nil), a.log)
	} else {
		// On the http port, beside /metrics and behind the same review
		// (of the request's path): they name every tenant's workloads.
		mux.Handle("/debug/", reviewRouted(dmux, auth))
		if auth == nil && !loopbackAddr(a.httpLn.Addr()) {
			a.log.Warn("the debug endpoints are served on --http-addr to anyone who reaches it (--metrics-auth=none): they name every tenant's workloads and their load; serve them on --debug-addr (a loopback address), or set --metrics-auth=kubernetes")
		}
	}
	if a.opts.Serving.HTTPTLS {
		// The ingest port's certificate (no client certificate asked): the
		// kubelet's HTTPS probes and Prometheus present none.
		a.httpLn = tls.NewListener(a.httpLn, a.ingestTLS.Clone())
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /livez", a.health.serveHTTP(a.health.live))
	mux.HandleFunc("GET /readyz", a.health.serveHTTP(a.health.ready))
	a.httpSrv = app.NewHTTPServer(mux, a.log)
	if a.healthLn != nil {
		// The probes alone, in plaintext: a kubelet's probe of a TLS port
		// fails while the certificate is not there yet, and liveness would
		// then restart a replica waiting for the API.
		hmux := http.NewServeMux()
		hmux.HandleFunc("GET /livez", a.health.serveHTTP(a.health.live))
		hmux.HandleFunc("GET /readyz", a.health.serveHTTP(a.health.ready))
		a.healthSrv = app.NewHTTPServer(hmux, a.log)
	}
}
