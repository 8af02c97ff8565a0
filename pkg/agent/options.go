// Package agent is pulse's node agent: it scrapes the vLLM pods of its node
// every interval and streams their values to every aggregator replica.
package agent

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/gpu"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/vllm"
	"github.com/pulse-io/pulse/pkg/wire"
)

// Options are the agent's flags.
type Options struct {
	StaticTargets      string
	KubeConfig         string
	PodSelector        string
	InsecureSkipVerify bool
	NVML               string
	PodResourcesSocket string
	ResolveInterval    time.Duration
	Aggregators        app.StringList
	AggregatorCAFile   string
	// Relay, when set, carries every aggregator stream (pulse-relay).
	Relay string
	// Transport is how the agent's streams reach the aggregators:
	// TransportAuto, TransportGRPC or TransportFramed.
	Transport           string
	TokenFile           string
	NodeName            string
	ScrapeInterval      time.Duration
	ScrapeTimeout       time.Duration
	MaxConcurrent       int
	MaxListed           int
	MaxPageBytes        int64
	ExtraMetrics        app.StringList
	ForwardHistograms   bool
	BatchDelay          time.Duration
	ReconnectMaxBackoff time.Duration
	HTTPAddr            string
	HealthAddr          string
	Log                 logging.Options
}

// The transports of --transport.
const (
	// TransportAuto: framed, and gRPC to an aggregator that does not speak
	// it (one of a version before it), each stream trying framed first;
	// through --relay, gRPC.
	TransportAuto   = "auto"
	TransportGRPC   = "grpc"
	TransportFramed = "framed"
)

// MaxProcs is the agent's GOMAXPROCS unless the environment sets one.
const MaxProcs = 2

// NewOptions returns the defaults. NODE_NAME (downward API) names the node.
func NewOptions() *Options {
	node := os.Getenv("NODE_NAME")
	if node == "" {
		node, _ = os.Hostname()
	}
	return &Options{
		PodSelector:         discovery.DefaultSelector,
		Transport:           TransportAuto,
		NVML:                gpu.ModeAuto,
		PodResourcesSocket:  gpu.DefaultPodResourcesSocket,
		ResolveInterval:     10 * time.Second,
		NodeName:            node,
		ScrapeInterval:      time.Second,
		MaxConcurrent:       64,
		MaxListed:           1024,
		MaxPageBytes:        1 << 20,
		BatchDelay:          20 * time.Millisecond,
		ReconnectMaxBackoff: 5 * time.Second,
		HTTPAddr:            ":8081",
		Log:                 logging.DefaultOptions(),
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.StaticTargets, "static-targets", o.StaticTargets, "YAML file listing the pods to scrape (static mode, no Kubernetes)")
	fs.StringVar(&o.KubeConfig, "kubeconfig", o.KubeConfig, "kubeconfig file (default: the in-cluster config)")
	fs.StringVar(&o.PodSelector, "pod-selector", o.PodSelector, "label selector of the pods to scrape (pods annotated pulse.io/scrape=true are added, =false left out)")
	fs.BoolVar(&o.InsecureSkipVerify, "https-insecure-skip-verify", o.InsecureSkipVerify, "do not verify the certificates of pods scraped over https")
	fs.StringVar(&o.NVML, "nvml", o.NVML, "GPU utilization from NVML: auto (when a driver is there), on (required) or off")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", o.PodResourcesSocket, "the kubelet's pod-resources socket, to attribute GPUs to pods")
	fs.DurationVar(&o.ResolveInterval, "resolve-interval", o.ResolveInterval, "how often aggregator names are resolved again (a headless Service gives every replica)")
	fs.StringVar(&o.AggregatorCAFile, "aggregator-ca-file", o.AggregatorCAFile, "connect to aggregators over TLS, trusting this CA (plaintext when empty)")
	fs.StringVar(&o.TokenFile, "token-file", o.TokenFile, "projected ServiceAccount token sent to aggregators (re-read on every connect; needs --aggregator-ca-file)")
	fs.StringVar(&o.Relay, "relay", o.Relay, "reach the aggregator replicas through this pulse-relay, host:port: each replica's stream goes to it, naming the replica (still resolved from --aggregator); TLS and the token as to an aggregator, the relay's certificate checked for this host; empty: directly")
	fs.StringVar(&o.Transport, "transport", o.Transport, "how streams reach the aggregators' ingest port: framed (one TCP connection a stream, read in place by the aggregator: 9 KB less heap an agent there, one goroutine instead of four; docs/protocol.md), grpc, or auto: framed, and gRPC to an aggregator older than the framed transport (each stream tries framed first) and through --relay")
	fs.Var(&o.Aggregators, "aggregator", "aggregator ingest address host:port (a headless Service name reaches every replica); repeatable or comma-separated")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "this node's name: $NODE_NAME, else the hostname")
	fs.DurationVar(&o.ScrapeInterval, "scrape-interval", o.ScrapeInterval, "how often every pod is scraped (all the node's pods together, at the node's fixed phase of the interval)")
	fs.DurationVar(&o.ScrapeTimeout, "scrape-timeout", o.ScrapeTimeout, "per-scrape timeout (0: 80% of --scrape-interval)")
	fs.IntVar(&o.MaxConcurrent, "max-concurrent-scrapes", o.MaxConcurrent, "scrapes in flight at once")
	fs.IntVar(&o.MaxListed, "max-pods", o.MaxListed, "catalogue entries (pods, and routers' demand entries) the agent lists, shared fairly among namespaces; past it the rest are left out, said and counted: keep it at most the aggregator's --max-pods-per-agent")
	fs.Int64Var(&o.MaxPageBytes, "max-page-bytes", o.MaxPageBytes, "a page larger than this is an error (too_large); a page over 256 KiB waits for one of 4 large reads at once (one a namespace; while another waits, each read held at most 250 ms, and its wait for a parse at most 250 ms more)")
	fs.Var(&o.ExtraMetrics, "extra-metric", "forward a gauge by its raw name, NAME[:sum|mean|max] (default sum over series); repeatable")
	fs.BoolVar(&o.ForwardHistograms, "forward-histograms", o.ForwardHistograms, "forward the TTFT and inter-token latency histograms' buckets (metrics ttftP50/P90/P99Seconds, itlP50/P90/P99Seconds); about 80 more bytes per busy pod per scrape")
	fs.DurationVar(&o.BatchDelay, "batch-delay", o.BatchDelay, "how long samples are gathered into one batch before it is sent")
	fs.DurationVar(&o.ReconnectMaxBackoff, "reconnect-max-backoff", o.ReconnectMaxBackoff, "longest wait between reconnects to an aggregator")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "address of /metrics, /livez and /readyz")
	fs.StringVar(&o.HealthAddr, "health-addr", o.HealthAddr, "serve /livez and /readyz on this address too, alone, for the kubelet's probes (the chart's: 127.0.0.1:8082, probed with pulse-agent probe): the http port is reachable from any pod, and its connection bounds could leave a probe no room; empty: off")
	o.Log.AddFlags(fs)
}

// Validate reports every problem of the options.
func (o *Options) Validate() error {
	var errs []error
	if _, err := discovery.ParseSelector(o.PodSelector); err != nil {
		errs = append(errs, err)
	}
	if o.NVML != gpu.ModeAuto && o.NVML != gpu.ModeOn && o.NVML != gpu.ModeOff {
		errs = append(errs, fmt.Errorf("--nvml %q: want auto, on or off", o.NVML))
	}
	if o.TokenFile != "" && o.AggregatorCAFile == "" {
		errs = append(errs, errors.New("--token-file needs --aggregator-ca-file: a token is never sent in plaintext"))
	}
	if o.ResolveInterval < 100*time.Millisecond {
		errs = append(errs, errors.New("--resolve-interval must be at least 100ms"))
	}
	if o.ReconnectMaxBackoff < 100*time.Millisecond {
		// The reconnect's jitter draws from it: 0 panicked at the first
		// failed reconnect.
		errs = append(errs, fmt.Errorf("--reconnect-max-backoff %s: want at least 100ms", o.ReconnectMaxBackoff))
	}
	for _, a := range o.Aggregators {
		if err := app.DialAddr(a); err != nil {
			errs = append(errs, fmt.Errorf("--aggregator %q: want host:port: %w", a, err))
		}
	}
	if o.Relay != "" {
		if err := app.DialAddr(o.Relay); err != nil {
			errs = append(errs, fmt.Errorf("--relay %q: want host:port: %w", o.Relay, err))
		}
	}
	switch {
	case o.Transport != TransportAuto && o.Transport != TransportGRPC && o.Transport != TransportFramed:
		errs = append(errs, fmt.Errorf("--transport %q: want auto, grpc or framed", o.Transport))
	case o.Transport == TransportFramed && o.Relay != "":
		errs = append(errs, errors.New("--transport=framed reaches the aggregators directly: with --relay, use grpc"))
	}
	if len(o.Aggregators) == 0 {
		errs = append(errs, errors.New("--aggregator is required"))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name is empty and $NODE_NAME is not set"))
	}
	if o.ScrapeInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("--scrape-interval %s is below 100ms", o.ScrapeInterval))
	}
	if o.ScrapeTimeout < 0 || o.ScrapeTimeout > o.ScrapeInterval {
		errs = append(errs, fmt.Errorf("--scrape-timeout %s must be between 0 and --scrape-interval %s (0: 80%% of it)", o.ScrapeTimeout, o.ScrapeInterval))
	}
	if o.MaxConcurrent < 1 {
		errs = append(errs, errors.New("--max-concurrent-scrapes must be at least 1"))
	}
	if o.MaxListed < 1 {
		errs = append(errs, errors.New("--max-pods must be at least 1"))
	}
	if o.MaxPageBytes < 1024 {
		errs = append(errs, errors.New("--max-page-bytes must be at least 1024"))
	}
	if o.BatchDelay < 0 || o.BatchDelay >= o.ScrapeInterval {
		errs = append(errs, errors.New("--batch-delay must be between 0 and --scrape-interval"))
	}
	for _, e := range o.ExtraMetrics {
		if _, err := vllm.ParseExtraMetric(e); err != nil {
			errs = append(errs, err)
		}
	}
	if len(o.ExtraMetrics) > wire.MaxExtraMetrics {
		errs = append(errs, fmt.Errorf("--extra-metric is given %d times; at most %d (the aggregator refuses a stream that forwards more)", len(o.ExtraMetrics), wire.MaxExtraMetrics))
	}
	errs = append(errs, o.Log.Validate())
	return errors.Join(errs...)
}

// timeout is the effective per-scrape timeout.
// A timeout of the whole interval is taken as 90% of it: a pod that
// never answered was still in flight at its next tick, skipped, scraped
// every other one (refusing it would crash-loop agents upgraded with it).
func (o *Options) timeout() time.Duration {
	switch {
	case o.ScrapeTimeout >= o.ScrapeInterval:
		return o.ScrapeInterval * 9 / 10
	case o.ScrapeTimeout > 0:
		return o.ScrapeTimeout
	}
	return o.ScrapeInterval * 8 / 10
}

// LogOptions returns the logger's options.
func (o *Options) LogOptions() logging.Options { return o.Log }
