package relay

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/certs"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/netbound"
	"github.com/pulse-io/pulse/pkg/version"
)

// Options are pulse-relay's flags.
// agentKeepalive is the agents' port's: a connection with no stream for
// 30 s is closed (an agent's always has one).
var agentKeepalive = keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: 30 * time.Second}

type Options struct {
	Listen, HTTPAddr string
	// HealthAddr, when set, serves /livez and /readyz alone, for the
	// kubelet's probes (the chart's: the pod's loopback).
	HealthAddr           string
	Aggregators          app.StringList
	ResolveInterval      time.Duration
	StreamsPerConnection int
	// MaxConnections bounds the agents' connections held at once, and
	// MaxConnectionsPerAddress those of one remote address.
	MaxConnections, MaxConnectionsPerAddress int
	// TLSCertFile and TLSKeyFile: serve the agents TLS; AggregatorCAFile:
	// reach the aggregators over TLS, trusting this CA.
	TLSCertFile, TLSKeyFile, AggregatorCAFile string
	ShutdownTimeout                           time.Duration
	// ShutdownDelay: at a stop, how long the relay goes on forwarding,
	// answering not ready, before it closes its ports.
	ShutdownDelay time.Duration
	Log           logging.Options
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{Listen: ":9091", HTTPAddr: ":8080", ResolveInterval: 10 * time.Second, StreamsPerConnection: 256,
		MaxConnections: 20000, MaxConnectionsPerAddress: 8, ShutdownTimeout: 5 * time.Second, Log: logging.DefaultOptions()}
}

// LogOptions returns the logger's options.
func (o *Options) LogOptions() logging.Options { return o.Log }

// AddFlags registers the flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Listen, "listen", o.Listen, "address of the agents' gRPC streams (the agents' --relay)")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "address of /metrics, /livez and /readyz")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "serve /livez and /readyz on this address too, alone, for the kubelet's probes (the chart's: 127.0.0.1:8081, probed by an exec of pulse-relay probe URL): the http port is open to other pods, whose connections can fill its bounds; empty: off")
	fs.Var(&o.Aggregators, "aggregator", "aggregator ingest address host:port (a headless Service name reaches every replica): the only replicas streams are forwarded to; repeatable or comma-separated")
	fs.DurationVar(&o.ResolveInterval, "resolve-interval", o.ResolveInterval, "how often aggregator names are resolved again (a replica an agent names that is not known yet is looked up at once, at most once a second)")
	fs.IntVar(&o.StreamsPerConnection, "streams-per-connection", o.StreamsPerConnection, "agent streams one connection to an aggregator replica carries (keep it at most the aggregator's --max-ingest-streams-per-connection); past it another connection is opened")
	fs.IntVar(&o.MaxConnections, "max-connections", o.MaxConnections, "agents' connections held open at once: past it a new one is closed at once")
	fs.IntVar(&o.MaxConnectionsPerAddress, "max-connections-per-address", o.MaxConnectionsPerAddress, "connections held open at once from one remote address: past it a new one from that address is closed at once")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "serve the agents TLS with this certificate (re-read when it changes); plaintext when empty")
	fs.StringVar(&o.TLSKeyFile, "tls-key-file", o.TLSKeyFile, "the certificate's key")
	fs.StringVar(&o.AggregatorCAFile, "aggregator-ca-file", o.AggregatorCAFile, "reach the aggregators over TLS, trusting this CA (read at each handshake); plaintext when empty, and then a stream that carries a token is refused")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "how long /metrics and the probes are given to finish on SIGTERM, after --shutdown-delay (then the streams end at once: their agents reconnect through another relay)")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", o.ShutdownDelay, "at a stop, how long the relay goes on forwarding every stream, answering not ready, before it closes its ports (0 to 1m), so that the Service's endpoints drop it first and its agents reconnect through another relay")
	o.Log.AddFlags(fs)
}

// Validate checks the flags.
func (o *Options) Validate() error {
	var errs []error
	for _, a := range []struct{ flag, addr string }{{"--listen", o.Listen}, {"--http-addr", o.HTTPAddr}} {
		if err := app.ListenAddr(a.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", a.flag, a.addr, err))
		}
	}
	if o.HealthAddr != "" {
		if err := app.ListenAddr(o.HealthAddr); err != nil {
			errs = append(errs, fmt.Errorf("--health-addr %q: %w", o.HealthAddr, err))
		}
	}
	if len(o.Aggregators) == 0 {
		errs = append(errs, errors.New("--aggregator is required"))
	}
	for _, a := range o.Aggregators {
		if err := app.DialAddr(a); err != nil {
			errs = append(errs, fmt.Errorf("--aggregator %q: want host:port: %w", a, err))
		}
	}
	if o.ResolveInterval < 100*time.Millisecond {
		errs = append(errs, errors.New("--resolve-interval must be at least 100ms"))
	}
	if o.StreamsPerConnection < 1 {
		errs = append(errs, errors.New("--streams-per-connection must be at least 1"))
	}
	if o.MaxConnections < 1 || o.MaxConnectionsPerAddress < 1 {
		errs = append(errs, errors.New("--max-connections and --max-connections-per-address must be at least 1"))
	}
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file go together"))
	}
	if o.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("--shutdown-timeout must not be negative"))
	}
	if o.ShutdownDelay < 0 || o.ShutdownDelay > time.Minute {
		errs = append(errs, fmt.Errorf("--shutdown-delay %s: from 0 to 1m", o.ShutdownDelay))
	}
	errs = append(errs, o.Log.Validate())
	return errors.Join(errs...)
}

// MaxStreamsPerConnection bounds the streams an agent's connection holds
// at once: it opens one an aggregator replica (the chart refuses more
// than half as many replicas, for a rollout's surge).
const MaxStreamsPerConnection = 32

// MaxHeaderList bounds a stream's headers (HTTP/2's header list, as gRPC
// counts it): an agent's are its token (about 1 KB; a framed connection's
// is at most 16 KiB) and the replica it names. gRPC's default is 16 MiB,
// held for the stream's life.
const MaxHeaderList = 32 << 10

// The http port's bounds (the aggregator's too): connections held at once,
// in all and from one remote address; past either a new one is closed.
const (
	maxHTTPConns           = 1024
	maxHTTPConnsPerAddress = 64
)

// Server is a relay and its listeners.
type Server struct {
	o     *Options
	log   *slog.Logger
	relay *Relay
	grpc  *grpc.Server
	reg   *prometheus.Registry
	// agents is the agents' port's listener once Run has it (a test reads
	// its pooled reads).
	agents atomic.Pointer[netbound.Pooled]
	// healthAddr: --health-addr's bound address once Run has it.
	healthAddr atomic.Value
	// stopping: a stop has begun (/readyz fails); wait waits out
	// --shutdown-delay (time.Sleep; a test's own).
	stopping atomic.Bool
	wait     func(time.Duration)
}

// NewServer wires a relay from o.
func NewServer(o *Options, log *slog.Logger) (*Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	transport := func(string) credentials.TransportCredentials { return insecure.NewCredentials() }
	if o.AggregatorCAFile != "" {
		transport = func(name string) credentials.TransportCredentials {
			ca := &certs.CAFile{Path: o.AggregatorCAFile, Flag: "--aggregator-ca-file", Name: name}
			return credentials.NewTLS(ca.ClientConfig(name))
		}
	}
	r := New(Config{Aggregators: []string(o.Aggregators), ResolveInterval: o.ResolveInterval, StreamsPerConnection: o.StreamsPerConnection,
		Transport: transport, Secure: o.AggregatorCAFile != "", Log: log, Registerer: reg})
	// The agents' port, bounded as the aggregator's ingest port is
	// (pkg/aggregator's streamOptions): a handshake within 10 s, a
	// connection with no stream for 30 s closed (an agent's always has
	// one), no HPACK table (it would keep each agent's token), small
	// buffers (none for reading over TLS, which has its own).
	read := 4 << 10
	if o.TLSCertFile != "" {
		read = 0
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(4 << 20),
		grpc.ConnectionTimeout(10 * time.Second),
		grpc.KeepaliveParams(agentKeepalive),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// An agent opens one stream a replica, on its one connection.
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
		grpc.ReadBufferSize(read), grpc.WriteBufferSize(4 << 10), grpc.HeaderTableSize(0),
		// Windows fixed at 64 KiB, as the aggregator's: gRPC's sizing by
		// the bandwidth and delay let a client grow a stream's to 16 MiB.
		grpc.InitialWindowSize(64 << 10), grpc.InitialConnWindowSize(64 << 10),
		// A stream's headers are its token and the replica it names.
		grpc.MaxHeaderListSize(MaxHeaderList),
	}
	opts = append(opts, r.ServerOptions()...)
	if o.TLSCertFile != "" {
		files, err := certs.NewFiles(o.TLSCertFile, o.TLSKeyFile, "")
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(files.ServerConfig())))
	}
	return &Server{o: o, log: log, relay: r, grpc: grpc.NewServer(opts...), reg: reg, wait: time.Sleep}, nil
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	ln, hln, healthLn, err := s.listen(ctx)
	if err != nil {
		return err
	}
	bounded := netbound.New(ln, s.o.MaxConnections, s.o.MaxConnectionsPerAddress)
	bounded.UserTimeout = agentKeepalive.Timeout // gRPC's, which it sets on a bare TCP connection only
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "pulse_relay_connections_refused_total",
		Help: "Agents' connections closed at once past --max-connections or --max-connections-per-address."})
	bounded.OnRefuse = s.refusals(refused)
	// gRPC reads the agents' TCP connections into pooled buffers: an
	// agent's 4 KiB read buffer is held only while its bytes are read.
	pooled := netbound.NewPooled(bounded)
	s.agents.Store(pooled)
	s.reg.MustRegister(refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pulse_relay_connections",
		Help: "Agents' connections held open now."}, func() float64 { return float64(bounded.Held()) }))
	mux := http.NewServeMux()
	mux.Handle("/metrics", app.MetricsHandler(s.reg, promhttp.HandlerOpts{}))
	s.healthHandlers(mux)
	// Bounded as the aggregator's http port: a slow or idle client holds
	// nothing for long, and one address's connections cannot take them all.
	hs := app.NewHTTPServer(mux, s.log)
	hbounded := netbound.New(hln, maxHTTPConns, maxHTTPConnsPerAddress)
	// The streams go on through --shutdown-delay, past ctx's end.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); s.relay.Run(rctx) }()
	errc := make(chan error, 3)
	go func() { errc <- s.grpc.Serve(s.relay.Track(pooled)) }()
	go func() { errc <- hs.Serve(hbounded) }()
	var health *http.Server
	if healthLn != nil {
		hmux := http.NewServeMux()
		s.healthHandlers(hmux)
		health = app.NewHTTPServer(hmux, s.log)
		go func() { errc <- health.Serve(healthLn) }()
	}
	s.log.Info("relay serving", logging.KeyAddr, ln.Addr().String(), logging.KeyVersion, version.Version,
		"aggregators", strings.Join(s.o.Aggregators, ","))
	select {
	case <-ctx.Done():
		err = nil
		// Not ready, and every port still open and forwarding, for
		// --shutdown-delay: the relays' Service drops this pod first,
		// and the agents' new connections go to the others.
		s.stopping.Store(true)
		s.wait(s.o.ShutdownDelay)
	case err = <-errc:
	}
	// An agent's stream never ends by itself, so none is waited for: the
	// connections to the replicas close (every stream ends, Unavailable,
	// and its agent reconnects, through another relay), then the agents'.
	cancel()
	<-done
	s.grpc.Stop()
	sctx, scancel := context.WithTimeout(context.Background(), s.o.ShutdownTimeout)
	defer scancel()
	_ = hs.Shutdown(sctx)
	if health != nil {
		_ = health.Shutdown(sctx)
	}
	return err
}

// listen opens the agents' port, the http port and, with --health-addr,
// the probes' (nil without).
func (s *Server) listen(ctx context.Context) (ln, hln, healthLn net.Listener, err error) {
	var lc net.ListenConfig
	if ln, err = lc.Listen(ctx, "tcp", s.o.Listen); err != nil {
		return nil, nil, nil, fmt.Errorf("--listen: %w", err)
	}
	if hln, err = lc.Listen(ctx, "tcp", s.o.HTTPAddr); err != nil {
		_ = ln.Close()
		return nil, nil, nil, fmt.Errorf("--http-addr: %w", err)
	}
	if s.o.HealthAddr != "" {
		if healthLn, err = lc.Listen(ctx, "tcp", s.o.HealthAddr); err != nil {
			_, _ = ln.Close(), hln.Close()
			return nil, nil, nil, fmt.Errorf("--health-addr: %w", err)
		}
		s.healthAddr.Store(healthLn.Addr().String())
	}
	return ln, hln, healthLn, nil
}

// healthHandlers registers /livez and /readyz on mux.
func (s *Server) healthHandlers(mux *http.ServeMux) {
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.stopping.Load() {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		if !s.relay.Ready() {
			http.Error(w, "the aggregators are not resolved yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}

// HealthAddr is the bound address of --health-addr once Run listens on it.
func (s *Server) HealthAddr() string {
	a, _ := s.healthAddr.Load().(string)
	return a
}

// refusals counts each agent's connection closed past a bound in refused,
// and logs one a minute, naming the bound.
func (s *Server) refusals(refused prometheus.Counter) func(ip string, all bool) {
	var last atomic.Int64
	return func(ip string, all bool) {
		refused.Inc()
		if now := time.Now().Unix(); now-last.Load() >= 60 {
			last.Store(now)
			bound := "--max-connections-per-address (the address's share)"
			if all {
				bound = "--max-connections (the relay's in all)"
			}
			s.log.Warn("connection closed at once: past "+bound+" (counted in pulse_relay_connections_refused_total; logged at most once a minute)", "ip", ip)
		}
	}
}
