// Package app is what pulse's daemons (the agent, the aggregator and the
// relay) share around their components: flags, the logger, validation,
// signals and the exit code.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	runtimedebug "runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/version"
)

// Options is a binary's option set.
type Options interface {
	AddFlags(fs *flag.FlagSet)
	Validate() error
	// LogOptions returns the --log-format and --log-level values.
	LogOptions() logging.Options
}

// Runner is a wired component.
type Runner interface {
	Run(ctx context.Context) error
}

// Main parses the flags into o, validates them, builds the logger, wires
// with build and runs until SIGINT or SIGTERM. A bad flag exits 2, any other
// error 1, each said in one line (a multi-error, one line per problem).
func Main(name string, o Options, build func(*slog.Logger) (Runner, error)) {
	if code, done := Parse(name, os.Args[1:], os.Stdout, os.Stderr, o); done {
		os.Exit(code)
	}
	if err := run(o, build); err != nil {
		Report(os.Stderr, name, err)
		os.Exit(1)
	}
}

// Parse parses args into o's flags. done is true when the program should
// exit with code: after --help (the flags, on stdout, 0), --version (the
// name and version, on stdout, 0) or a bad flag (the
// error and a pointer at --help, on stderr, 2) rather than the whole usage.
func Parse(name string, args []string, stdout, stderr io.Writer, o Options) (code int, done bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the flag package prints the whole usage on any error
	fs.Usage = func() {}
	o.AddFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case err == nil && *showVersion:
		fmt.Fprintf(stdout, "%s %s\n", name, version.Version)
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stdout, "Usage of %s:\n", name)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for its flags.\n", name, err, name)
		return 2, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q (flags only)\nRun '%s --help' for its flags.\n", name, fs.Arg(0), name)
		return 2, true
	}
	return 0, false
}

// Report writes err as the program's last words: name, the error, a newline.
func Report(w io.Writer, name string, err error) {
	fmt.Fprintf(w, "%s: %v\n", name, err)
}

func run(o Options, build func(*slog.Logger) (Runner, error)) error {
	if err := o.Validate(); err != nil {
		return err
	}
	lo := o.LogOptions()
	log, err := lo.Logger(os.Stderr)
	if err != nil {
		return err
	}
	// client-go's own lines (leader election, watches) in the same format.
	klog.SetSlogLogger(log.With(logging.KeyComponent, "client-go"))
	// gRPC's, before any gRPC call (SetLoggerV2 is not safe beside one).
	grpclog.SetLoggerV2(logging.GRPC(log.With(logging.KeyComponent, "grpc")))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := SetMemoryLimit(ctx, memlimit.FromCgroup, log); err != nil {
		return err
	}
	r, err := build(log)
	if err != nil {
		return err
	}
	// The first signal starts the graceful stop; a second one ends the
	// process at once (the default action, restored once the first came).
	go func() { <-ctx.Done(); stop() }()
	return r.Run(ctx)
}

// MemoryLimitRatio is the share of the container's memory limit (its
// cgroup's) that Go's soft memory limit is set to: the garbage collector
// works harder as the heap nears it, and the rest is headroom for what the
// runtime does not count (cgo's memory: NVML in the agent), as
// automemlimit's default.
const MemoryLimitRatio = 0.9

// SetMemoryLimit sets Go's soft memory limit (GOMEMLIMIT) to
// MemoryLimitRatio of the limit provider reads (the cgroup's), and again
// each minute until ctx ends (a pod resized in place). GOMEMLIMIT in the
// environment is kept as it is; AUTOMEMLIMIT=off leaves the limit unset,
// AUTOMEMLIMIT=R takes the ratio R in (0, 1]; any other value of it is an
// error. No limit to read (no cgroup, or none set) leaves it unset.
func SetMemoryLimit(ctx context.Context, provider memlimit.Provider, log *slog.Logger) error {
	if v, ok := os.LookupEnv("AUTOMEMLIMIT"); ok && v != "off" {
		if r, err := strconv.ParseFloat(v, 64); err != nil || !(r > 0 && r <= 1) {
			return fmt.Errorf("AUTOMEMLIMIT=%q: want off or a ratio of the container's memory limit in (0, 1]", v)
		}
	}
	opts := []memlimit.Option{memlimit.WithProvider(provider), memlimit.WithRatio(MemoryLimitRatio),
		memlimit.WithRefreshInterval(ctx, time.Minute)}
	if _, err := provider(); err == nil {
		// A limit read now: the library's own log says a re-read that
		// fails later (each minute). With none to read it would log an
		// error every minute for a host with no cgroup: said once below.
		opts = append(opts, memlimit.WithLogger(log))
	}
	_, err := memlimit.Set(opts...)
	switch limit := runtimedebug.SetMemoryLimit(-1); {
	case errors.Is(err, memlimit.ErrCgroupsNotSupported):
		log.Debug("no cgroup to read a memory limit from: Go's soft memory limit is GOMEMLIMIT's", logging.KeyErr, err)
	case err != nil:
		log.Warn("the container's memory limit could not be read: Go's soft memory limit is GOMEMLIMIT's", logging.KeyErr, err)
	case limit != math.MaxInt64:
		log.Info("Go's soft memory limit (GOMEMLIMIT, else AUTOMEMLIMIT or 90% of the container's limit)", logging.KeyLimitBytes, limit)
	}
	return nil
}

// SetGCPercent sets Go's GC percent (GOGC: how far past the live heap and
// the goroutines' stacks the heap may grow before the next collection) to
// percent, unless GOGC is in the environment, which the runtime read at
// start and which is kept; 0 keeps Go's default of 100. It returns the
// percent in effect. A lower percent keeps less garbage between
// collections for more collections: Prometheus sets 50 by default since
// v2.53 for the same trade.
func SetGCPercent(percent int, log *slog.Logger) int {
	if v := os.Getenv("GOGC"); v != "" {
		log.Info("Go's GC percent is GOGC's", logging.KeyPercent, v)
		return GCPercent()
	}
	if percent <= 0 {
		return 100
	}
	runtimedebug.SetGCPercent(percent)
	log.Debug("Go's GC percent", logging.KeyPercent, percent)
	return percent
}

// GCPercent is Go's GC percent in effect (-1: off).
func GCPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(int64(s[0].Value.Uint64())) // off is -1
}

// Bounds of /metrics: at most MetricsInFlight gatherings at once, each
// within MetricsTimeout, and at most MetricsWriting answers under way (each
// a whole page in memory until its client has read it); past either, 503
// at once.
const (
	MetricsInFlight = 4
	MetricsTimeout  = 30 * time.Second
	MetricsWriting  = 16
)

// Bounds of the HTTP servers (/metrics, the debug endpoints, the health
// checks), so that a slow or idle client holds nothing for long: headers
// within 5 s, a request within 10 s, an answer written within a minute (a
// CPU profile takes 30 s), an idle keep-alive closed after 2 minutes;
// headers of at most MaxHeaderBytes; /metrics as app.MetricsHandler
// bounds it.

// MaxBearerToken is the longest bearer token pulse reviews
// (--metrics-auth=kubernetes): one longer is refused unreviewed (a
// projected ServiceAccount token is about 1 KB, an OIDC user's with many
// groups a few; the header could carry 1 MiB to the API server at each
// review). pulsectl refuses to send one longer.
const MaxBearerToken = 16 << 10

// MaxHeaderBytes bounds a request's headers on pulse's HTTP ports: twice
// the longest bearer token reviewed (MaxBearerToken). At Go's default, 1 MiB,
// one request of 1 MiB of empty header lines held about 17 MB of parsed
// header map until the header timeout, and one pod's 64 connections
// (the http port is open to every pod by default) about 1.1 GB against
// the aggregator's 512 MiB.
const MaxHeaderBytes = 32 << 10

// NewHTTPServer is an HTTP server of handler with those bounds: every
// pulse process's (the aggregator's, the agent's, the relay's).
func NewHTTPServer(handler http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: MaxHeaderBytes,
		// The server's own lines (a TLS handshake a port scan or a wrong CA
		// failed, one a connection) at debug, in the process's format.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// StringList is a repeatable, comma-separated flag (flag.Var): each
// non-empty, trimmed part is appended.
type StringList []string

func (s *StringList) String() string { return strings.Join(*s, ",") }

// Set appends v's parts.
func (s *StringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

// MetricsHandler serves g's metrics with opts, bounded. promhttp's timeout
// gathers the page into a buffer and writes it after, its bound on
// gatherings (MaxRequestsInFlight) released before the write: a client
// that does not read its answer held a whole page until the server's write
// timeout, and clients that kept asking held as many pages as the
// gatherings could make in that time. The bound on answers under way is
// taken before any gathering.
func MetricsHandler(g prometheus.Gatherer, opts promhttp.HandlerOpts) http.Handler {
	opts.MaxRequestsInFlight, opts.Timeout = MetricsInFlight, MetricsTimeout
	h := promhttp.HandlerFor(g, opts)
	answers := make(chan struct{}, MetricsWriting)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case answers <- struct{}{}:
			defer func() { <-answers }()
			h.ServeHTTP(w, r)
		default:
			http.Error(w, fmt.Sprintf("%d answers of /metrics are under way (a client not reading its own holds one): try again", MetricsWriting), http.StatusServiceUnavailable)
		}
	})
}

// ListenAddr checks a listening address: host:port, the host possibly
// empty (every interface), the port a number (0: one the kernel picks).
// "host:" passed net.SplitHostPort alone, and listened on a port nobody
// configured (a chart value rendered empty).
func ListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want a number from 0 to 65535", port)
	}
	return nil
}

// DialAddr checks an address to connect to: host:port, both given, the
// port from 1 to 65535. ":9090" passed net.SplitHostPort alone, and was
// dialled on the dialler's own loopback.
func DialAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return nil
}
