// Command fleet drives a real pulse-aggregator process as a fleet of GPU
// nodes and a KEDA installation would, all on loopback, measures it, and
// injects faults: `make fleet FLEET_ARGS='...'` (docs/performance.md,
// docs/reliability.md).
//
// The agents are N gRPC connections, each one Ingest stream as the
// DaemonSet's agent holds it (same keepalive, same reconnect backoff, the
// same hello and catalogue), reporting M pods at the scrape interval in
// batches encoded with pkg/wire's Encoder, the agent's own. The ScaledObjects
// are K clients of KEDA's generated externalscaler API, each holding a
// StreamIsActive and a StreamMetricSpec stream (KEDA v2.21 opens both per
// external-push trigger and retries them as KEDA does: 2 s, doubling to a
// minute, reset after EOF) and polling GetMetricSpec → GetMetrics → IsActive
// every 30 s (KEDA's default pollingInterval) and GetMetrics every 15 s (the
// HPA's sync period), each at its own offset in the period.
//
// The last line of output is one JSON object (see result).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/pulse-io/pulse/pkg/agent"
)

func main() {
	if serveEchoIfAsked() || runPollersIfAsked() {
		return
	}
	o := defaultOptions()
	o.addFlags(flag.CommandLine)
	flag.Parse()
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o, os.Stderr)
	if res != nil {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// options are the harness's flags.
type options struct {
	bin, workdir, aggregatorArgs string
	// memoryLimit: the aggregator's GOMEMLIMIT in bytes (--memory-limit),
	// 0 for none.
	memoryLimit int64
	// relays: pulse-relay processes the agents reach the aggregator through (0: directly).
	relays int
	// transport: how the agents reach the aggregator, as the agent's
	// --transport (auto, grpc or framed).
	transport                  string
	tls                        bool
	agents, podsPerAgent       int
	podsPerWorkload            int
	scaledObjects, probes      int
	kedaConns                  int
	harnessGOGC                int
	echoEvery                  time.Duration
	interval, settle, duration time.Duration
	churn                      float64
	loadTime                   time.Duration
	podExpiry                  time.Duration
	soakEvery                  time.Duration
	faults                     []string
	partitionAgents            int
	maxPodsFlag                int
	pin                        string
	verbose                    bool
	pollsApart                 bool
}

// maxPods is the aggregator's --max-pods: --max-pods when set; else, with
// the eviction scenario, the fleet's pods and a little room for churn (the
// scenario fills the rest); else room for the fleet four times over.
func (o *options) maxPods() int {
	pods := o.agents * o.podsPerAgent
	switch {
	case o.maxPodsFlag > 0:
		return o.maxPodsFlag
	case contains(o.faults, "eviction"):
		return pods + 64 + int(math.Ceil(10*o.churn*o.loadTime.Seconds()))
	default:
		return 4*pods + 1024
	}
}

func defaultOptions() options {
	return options{bin: "bin", agents: 100, podsPerAgent: 8, podsPerWorkload: 4, scaledObjects: 50, probes: 20, kedaConns: 1,
		interval: time.Second, settle: 20 * time.Second, duration: 60 * time.Second, loadTime: 3 * time.Second,
		podExpiry: 10 * time.Minute, partitionAgents: 4, pin: "auto", harnessGOGC: 400, echoEvery: 10 * time.Millisecond, pollsApart: true,
		transport: agent.TransportAuto}
}

// faultNames are the scenarios --faults runs, in this order.
var faultNames = []string{"malformed-batch", "pages", "agent-kill", "partition", "aggregator-kill", "node-silencing", "eviction"}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.bin, "bin", o.bin, "directory holding pulse-aggregator, pulse-agent and vllm-sim (make build)")
	fs.StringVar(&o.workdir, "workdir", "", "where logs go (default: a temporary directory, removed unless the run fails)")
	fs.IntVar(&o.agents, "agents", o.agents, "agent streams (nodes), each its own gRPC connection")
	fs.IntVar(&o.podsPerAgent, "pods-per-agent", o.podsPerAgent, "pods each agent reports")
	fs.IntVar(&o.podsPerWorkload, "pods-per-workload", o.podsPerWorkload, "pods per workload; a workload's pods are on consecutive agents")
	fs.IntVar(&o.scaledObjects, "scaledobjects", o.scaledObjects, "ScaledObjects (one external-push trigger each, on distinct workloads spread over the fleet)")
	fs.IntVar(&o.probes, "probes", o.probes, "of the ScaledObjects, how many watch a workload whose queue rises and falls every 15 s (push latency)")
	fs.IntVar(&o.kedaConns, "keda-conns", o.kedaConns, "gRPC connections the ScaledObjects share (KEDA keeps one per scalerAddress)")
	fs.DurationVar(&o.interval, "interval", o.interval, "agents' scrape interval")
	fs.DurationVar(&o.settle, "settle", o.settle, "time after every agent and stream is up before measuring")
	fs.DurationVar(&o.duration, "duration", o.duration, "time measured (a soak: 30m with --soak-every 30s)")
	fs.Float64Var(&o.churn, "churn", o.churn, "pod events per second across the fleet: a pod restarts (new uid), moves to another agent, or goes not-Ready for --load-time")
	fs.DurationVar(&o.loadTime, "load-time", o.loadTime, "how long a new or flapping pod stays not-Ready (its model load)")
	fs.DurationVar(&o.podExpiry, "pod-expiry", o.podExpiry, "the aggregator's --pod-expiry")
	fs.DurationVar(&o.soakEvery, "soak-every", o.soakEvery, "sample the aggregator's heap, goroutines and open files this often and report their slopes (0: off)")
	fs.Func("faults", "comma-separated fault scenarios run after the measurement, or \"all\": "+strings.Join(faultNames, ", "), func(s string) error {
		if s == "all" {
			o.faults = faultNames
			return nil
		}
		for _, f := range strings.Split(s, ",") {
			if !contains(faultNames, f) {
				return fmt.Errorf("unknown fault %q; one of %s", f, strings.Join(faultNames, ", "))
			}
			o.faults = append(o.faults, f)
		}
		return nil
	})
	fs.IntVar(&o.partitionAgents, "partition-agents", o.partitionAgents, "agents that reach the aggregator through the black-hole proxy (the partition scenario)")
	fs.IntVar(&o.relays, "relays", o.relays, "agents reach the aggregator through this many pulse-relay processes (from --bin), agent i through relay i mod N, on the harness's CPUs; the aggregator then takes --max-ingest-streams-per-connection 1024 (the relays' --streams-per-connection is 256) and --max-ingest-connections-per-address 1024 (every relay connects from 127.0.0.1); 0: each agent its own connection to the aggregator")
	fs.StringVar(&o.aggregatorArgs, "aggregator-args", "", "extra flags for pulse-aggregator, space-separated")
	fs.Func("memory-limit", "the aggregator container's resources.limits.memory, a Kubernetes quantity (e.g. 1G or 1Gi): its GOMEMLIMIT is set to 90 % of it in bytes, as the aggregator sets it in a container of that limit; unset: the environment's GOMEMLIMIT, if any", func(v string) error {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return err
		}
		if q.Value() <= 0 {
			return fmt.Errorf("%s: want a positive size", v)
		}
		o.memoryLimit = q.Value()
		return nil
	})
	fs.StringVar(&o.transport, "transport", o.transport, "how the agents reach the aggregator, as pulse-agent's --transport: auto (its default: framed, gRPC to an aggregator that does not speak it and through --relays), grpc (a gRPC connection each), or framed (a framed TCP connection each, read in place by the aggregator: pkg/framed; not with --relays)")
	fs.BoolVar(&o.tls, "tls", o.tls, "the ingest port serves TLS, as the aggregator chart has it by default (ingest.tls.managed): the harness makes a CA and a certificate for 127.0.0.1 (ECDSA P-256) in its work directory, and the agents trust the CA; off: plaintext")
	fs.IntVar(&o.maxPodsFlag, "max-pods", 0, "the aggregator's --max-pods (0: the fleet's pods four times over and 1,024; with the eviction scenario, the fleet's pods and 64)")
	fs.StringVar(&o.pin, "pin", o.pin, "auto: with 2 or more CPUs, the aggregator runs on the upper half of them and the harness on the rest, so that each one's CPU is its own (the summary names them); off: both share every CPU")
	fs.IntVar(&o.harnessGOGC, "harness-gogc", o.harnessGOGC, "the harness's own GC percent (not the aggregator's): its GC's marks on its CPU delay the round trips it times, so it collects less often than Go's default 100")
	fs.DurationVar(&o.echoEvery, "echo-every", o.echoEvery, "time a 32-byte TCP round trip to an echo process on the aggregator's CPUs this often (the machine's floor under the same load: echoP99Seconds); 0: off")
	fs.BoolVar(&o.pollsApart, "polls-apart", o.pollsApart, "through the measurement, make and time the ScaledObjects' polls (and the echo) in a process of their own, as KEDA's are, not in the harness that drives the agents; false: in the harness, as before 2026-11-28")
	fs.BoolVar(&o.verbose, "v", false, "log progress")
}

func (o *options) validate() error {
	var errs []string
	if o.agents < 1 || o.podsPerAgent < 1 || o.podsPerWorkload < 1 {
		errs = append(errs, "--agents, --pods-per-agent and --pods-per-workload must be at least 1")
	}
	if o.scaledObjects < 0 || o.probes < 0 || o.probes > o.scaledObjects {
		errs = append(errs, "--scaledobjects must be at least 0 and --probes at most --scaledobjects")
	}
	if o.scaledObjects > o.workloads() {
		errs = append(errs, fmt.Sprintf("--scaledobjects %d: the fleet has only %d workloads", o.scaledObjects, o.workloads()))
	}
	if o.kedaConns < 1 || o.interval <= 0 || o.duration <= 0 || o.churn < 0 || o.podExpiry <= 0 || o.soakEvery < 0 {
		errs = append(errs, "--keda-conns, --interval, --duration and --pod-expiry must be above 0, --churn and --soak-every at least 0")
	}
	if o.echoEvery < 0 || o.echoEvery > 0 && o.echoEvery < time.Millisecond {
		errs = append(errs, "--echo-every must be 0 (off) or at least 1ms")
	}
	if o.pin != "auto" && o.pin != "off" {
		errs = append(errs, fmt.Sprintf("--pin %q: auto or off", o.pin))
	}
	if o.partitionAgents < 1 || o.partitionAgents >= o.agents && contains(o.faults, "partition") {
		errs = append(errs, "--partition-agents must be at least 1 and, for the partition scenario, fewer than --agents")
	}
	if o.transport != agent.TransportAuto && o.transport != agent.TransportGRPC && o.transport != agent.TransportFramed || o.transport == agent.TransportFramed && o.relays > 0 {
		errs = append(errs, fmt.Sprintf("--transport %q: auto, grpc, or framed without --relays", o.transport))
	}
	if o.relays < 0 || o.relays > 0 && len(o.faults) > 0 {
		errs = append(errs, "--relays must be at least 0, and 0 with --faults (the fault scenarios reach the aggregator directly)")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// workloads is the number of workloads the fleet's pods form.
func (o *options) workloads() int {
	return (o.agents*o.podsPerAgent + o.podsPerWorkload - 1) / o.podsPerWorkload
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
