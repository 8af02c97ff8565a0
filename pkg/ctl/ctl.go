// Package ctl is pulsectl: check, query and top.
package ctl

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/provision"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/version"
	"github.com/pulse-io/pulse/pkg/wire"
)

const usage = `usage: pulsectl COMMAND [flags]
commands:
  check FILE...                 validate ScaledObjects' pulse triggers and workloads' pulse.io annotations offline,
                                with the aggregator's parser and limits: exit 0 when all are valid, 1 with each problem
  query --scaler ADDR -f FILE   ask a running scaler what KEDA would (GetMetricSpec, GetMetrics, IsActive) for each
                                pulse trigger of the ScaledObjects in FILE, and print the answer and the desired replicas
  top --debug URL               a live table of the aggregator's triggers and decisions (/debug/triggers), refreshed
  version                       print pulsectl's version
pulsectl COMMAND --help for each command's flags`

// Main runs pulsectl with args and returns its exit status: 0 done (or
// valid), 1 problems found or an answer failed, 2 bad usage.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	switch args[0] {
	case "check":
		return check(args[1:], stdout, stderr)
	case "query":
		return query(args[1:], stdout, stderr)
	case "top":
		return top(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "pulsectl", version.Version)
		return 0
	case "help", "-h", "--help", "-help":
		fmt.Fprintln(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "pulsectl: unknown command %q\n%s\n", args[0], usage)
	return 2
}

// object is one YAML document: a ScaledObject or a workload; or a List of
// them (kubectl get -o yaml), whose Items are read in its place.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount  *int32 `json:"minReplicaCount"`
		MaxReplicaCount  *int32 `json:"maxReplicaCount"`
		IdleReplicaCount *int32 `json:"idleReplicaCount"`
		Triggers         []struct {
			Type       string            `json:"type"`
			Name       string            `json:"name"`
			MetricType string            `json:"metricType"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
	Items []object `json:"items,omitempty"`
}

// helpOr2 is a subcommand's exit status for a flag error: 0 for --help
// (asked for; 2 broke scripts under set -e), else 2 (bad usage).
func helpOr2(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// readObjects reads a file of YAML documents, as kubectl splits them (a
// line that starts with --- and has nothing after it but a comment). A
// document that does not parse is one of bad, naming it, and the others
// are read: the first ended the file, and every other document's problems
// went unsaid until it was mended. err is the file's: not read.
func readObjects(path string) (objs []object, bad []error, err error) {
	raw, err := os.ReadFile(path) //nolint:gosec // G304: the file the user names on the command line
	if err != nil {
		return nil, nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, bad, nil
		}
		if err != nil {
			return objs, bad, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			bad = append(bad, fmt.Errorf("%s: document %d: %w", path, i, err))
			continue
		}
		if err := notString(doc); err != nil {
			bad = append(bad, fmt.Errorf("%s: document %d: %w", path, i, err))
			continue
		}
		objs = append(objs, listed(o)...)
	}
}

// notString is the first value of a trigger's metadata or an object's
// annotations that doc writes as no string (threshold: 10, enableTLS:
// true): kubectl sends it as a number or a boolean, which the API server
// refuses (each is a map of strings), where yaml.Unmarshal read it into
// the string "10" and check called it valid.
func notString(doc []byte) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	var v any
	if err := json.Unmarshal(j, &v); err != nil {
		return err
	}
	return notStringIn(v, "")
}

func notStringIn(v any, at string) error {
	m, _ := v.(map[string]any)
	if md, ok := m["metadata"].(map[string]any); ok {
		if err := stringsOnly(md["annotations"], at+"metadata.annotations"); err != nil {
			return err
		}
	}
	if spec, ok := m["spec"].(map[string]any); ok {
		ts, _ := spec["triggers"].([]any)
		for i, t := range ts {
			tm, _ := t.(map[string]any)
			if err := stringsOnly(tm["metadata"], fmt.Sprintf("%sspec.triggers[%d].metadata", at, i)); err != nil {
				return err
			}
		}
	}
	items, _ := m["items"].([]any)
	for i, it := range items {
		if err := notStringIn(it, fmt.Sprintf("%sitems[%d].", at, i)); err != nil {
			return err
		}
	}
	return nil
}

func stringsOnly(v any, at string) error {
	m, _ := v.(map[string]any)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch x := m[k].(type) {
		case string, nil:
		default:
			return fmt.Errorf("%s.%s: %v is not a string, which the API server refuses: quote it", at, k, x)
		}
	}
	return nil
}

// listed is o, or the objects of a List or typed list (kubectl get -o
// yaml; a List within one too), each read as a document. The API server
// leaves a built-in kind's items without their kind (a DeploymentList's
// are Deployments): such an item takes its list's.
func listed(o object) []object {
	if o.Kind != "List" && (!strings.HasSuffix(o.Kind, "List") || o.Items == nil) {
		return []object{o}
	}
	var out []object
	for _, it := range o.Items {
		if it.Kind == "" && o.Kind != "List" {
			it.Kind = strings.TrimSuffix(o.Kind, "List")
		}
		out = append(out, listed(it)...)
	}
	return out
}

// targetResolver answers a trigger's scaleTargetRef from the file.
type targetResolver struct{ kind, name string }

// A kind left out is KEDA's default, Deployment, as the aggregator reads
// it (a valid ScaledObject was reported as a problem).
func (r targetResolver) Resolve(_, _ string) (string, string, error) {
	if r.name == "" {
		return "", "", errors.New("the ScaledObject has no scaleTargetRef name")
	}
	if r.kind == "" {
		return "Deployment", r.name, nil
	}
	return r.kind, r.name, nil
}

// workloadKinds are the kinds whose pulse.io annotations check reads, as
// the provisioner's store kinds.
var workloadKinds = map[string]string{
	"Workspace": store.KindWorkspace, "InferenceSet": store.KindInferenceSet, "Deployment": store.KindDeployment,
	"StatefulSet": store.KindStatefulSet, "LeaderWorkerSet": store.KindLeaderWorkerSet,
}

// pulseTriggers are the ScaledObject's external-push triggers (pulse's), as
// KEDA sends them: the trigger's metadata and the ScaledObject's name. A
// `type: external` trigger is another scaler's (README.md): read as
// pulse's, one of another scaler was said valid, and queried of pulse.
func (o *object) pulseTriggers() []pulseTrigger {
	var out []pulseTrigger
	for i, t := range o.Spec.Triggers {
		if t.Type != "external-push" {
			continue
		}
		out = append(out, pulseTrigger{pos: i + 1, metricType: t.MetricType,
			ref: &externalscaler.ScaledObjectRef{Name: o.Metadata.Name, Namespace: o.Metadata.Namespace, ScalerMetadata: t.Metadata}})
	}
	return out
}

// pulseTrigger is one of pulseTriggers: its place among the ScaledObject's
// triggers (from 1: "trigger 2" named the second pulse trigger, whatever
// came before it), its metricType and the ref KEDA sends.
type pulseTrigger struct {
	pos        int
	metricType string
	ref        *externalscaler.ScaledObjectRef
}

// hpaValue reports whether the HPA reads the trigger's value as metricType
// Value (it multiplies by its ready replicas) rather than AverageValue,
// KEDA's default.
func (p pulseTrigger) hpaValue() bool { return p.metricType == "Value" }

// metricTypeProblem says why the trigger's metricType does not fit its
// valueType: the HPA divides an average (AverageValue) or multiplies a
// total (Value) by its replicas ("" when it fits).
func (p pulseTrigger) metricTypeProblem() string {
	average := p.ref.ScalerMetadata["valueType"] == "average"
	switch {
	case average && !p.hpaValue():
		return `valueType average needs metricType: Value (the HPA would read the average as a total to share among its replicas: 10 replicas at a p90 of 1.85 s against 1 s were asked for 2)`
	case !average && p.hpaValue():
		return "metricType Value is for valueType average: the HPA would multiply this total by its ready replicas"
	}
	return ""
}

// kedaProblem is why KEDA refuses the trigger before the aggregator sees
// it ("" when it does not): a metricType but AverageValue (its default) or
// Value (Utilization it refuses for an external-push trigger, and another
// it writes into the HPA, which the API server refuses), or no
// scalerAddress (required by its external-push scaler).
func (p pulseTrigger) kedaProblem() string {
	switch p.metricType {
	case "", "AverageValue", "Value":
	case "Utilization":
		return "metricType Utilization: KEDA refuses it for an external-push trigger (cpu and memory alone take it); AverageValue (the default) or Value"
	default:
		return fmt.Sprintf("metricType %s: the HPA takes AverageValue (KEDA's default) or Value", p.metricType)
	}
	if strings.TrimSpace(p.ref.ScalerMetadata["scalerAddress"]) == "" {
		return "no scalerAddress: KEDA's external-push trigger requires it (the aggregator's scaler address, host:port)"
	}
	return ""
}

func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pulsectl check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	maxWindow := fs.Duration("max-window", scaler.DefaultMaxWindow, "the aggregator's --max-window: the longest trigger window it accepts")
	maxReplicas := fs.Int64("provision-max-replicas", 0, "the aggregator's --provision-max-replicas: the most replicas an annotation may ask for (0: no cap but 10,000)")
	crossNS := fs.Bool("allow-cross-namespace-triggers", false, "the aggregator's --allow-cross-namespace-triggers: a trigger may read another namespace")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: pulsectl check [flags] FILE...\nValidates every ScaledObject's external-push triggers and every workload's pulse.io annotations.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return helpOr2(err)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if *maxReplicas < 0 || *maxReplicas > 10000 {
		fmt.Fprintf(stderr, "pulsectl check: --provision-max-replicas %d: want 0 (no cap but 10,000) to 10,000\n", *maxReplicas)
		return 2
	}
	if least := max(scaler.DefaultWindow, scaler.DefaultPlanWindow); *maxWindow < least {
		// The aggregator refuses to start below it; every trigger was
		// reported as a problem instead.
		fmt.Fprintf(stderr, "pulsectl check: --max-window %s: want at least %s, as the aggregator's\n", *maxWindow, least)
		return 2
	}
	problems, checked := 0, 0
	for _, path := range fs.Args() {
		objs, bad, err := readObjects(path)
		if err != nil {
			bad = append(bad, err)
		}
		for _, err := range bad {
			fmt.Fprintf(stdout, "%s\n", wire.OneLine(err.Error()))
			problems++
		}
		for _, o := range objs {
			id := fmt.Sprintf("%s: %s %s/%s", path, o.Kind, o.Metadata.Namespace, o.Metadata.Name)
			for _, f := range checkObject(&o, *maxWindow, *crossNS, *maxReplicas) {
				checked++
				if f.problem {
					problems++
				}
				// Names and values are the tenant's: a control sequence
				// in one (an OSC 52 clipboard write, a terminal reset)
				// reached the operator's terminal, and a newline forged a
				// line.
				fmt.Fprintf(stdout, "%s: %s\n", wire.OneLine(id), wire.OneLine(f.text))
			}
		}
	}
	if checked == 0 && problems == 0 {
		fmt.Fprintln(stdout, "no pulse trigger and no pulse.io annotation found")
		return 1
	}
	if problems > 0 {
		fmt.Fprintf(stdout, "%d problems\n", problems)
		return 1
	}
	return 0
}

// boundsProblem is why KEDA refuses the ScaledObject's replica bounds
// ("" when it does not), as its CheckReplicaCountBoundsAreValid (and its
// CRD's rule) reads them: the HPA's minimum (minReplicaCount, at least 1,
// when set; else 0) above maxReplicaCount (100 when left out), or an
// idleReplicaCount not below that minimum.
func (o *object) boundsProblem() string {
	lo, hi := int32(0), int32(100)
	if m := o.Spec.MinReplicaCount; m != nil {
		lo = max(*m, 1)
	}
	if m := o.Spec.MaxReplicaCount; m != nil {
		hi = *m
	}
	if lo > hi {
		return fmt.Sprintf("the HPA's minimum %d (minReplicaCount, at least 1) above maxReplicaCount %d (100 left out): KEDA refuses the ScaledObject", lo, hi)
	}
	if idle := o.Spec.IdleReplicaCount; idle != nil && *idle >= lo {
		return fmt.Sprintf("idleReplicaCount %d not below the HPA's minimum %d (minReplicaCount, at least 1; 0 left out): KEDA refuses the ScaledObject", *idle, lo)
	}
	return ""
}

// checkObject checks one document: "" for each valid trigger or annotated
// workload, else the problem.
func checkObject(o *object, maxWindow time.Duration, crossNS bool, maxReplicas int64) []finding {
	if o.Kind == "ScaledObject" {
		return checkScaledObject(o, maxWindow, crossNS)
	}
	kind, ok := workloadKinds[o.Kind]
	if !ok || !hasPulseAnnotation(o.Metadata.Annotations) {
		return nil
	}
	s, err := provision.Parse(provision.Workload{Kind: kind, Namespace: cmp.Or(o.Metadata.Namespace, appliedIn), Name: o.Metadata.Name}, o.Metadata.Annotations, maxWindow)
	if err == nil {
		err = provision.ApplyCap(&s, maxReplicas)
	}
	if err == nil && s.Enabled {
		err = provision.CheckName(o.Metadata.Name)
	}
	if err != nil {
		return []finding{{text: err.Error(), problem: true}}
	}
	return []finding{{text: "valid"}}
}

// checkScaledObject checks a ScaledObject's replica bounds, when it has
// a pulse trigger, and each pulse trigger.
func checkScaledObject(o *object, maxWindow time.Duration, crossNS bool) []finding {
	var out []finding
	res := targetResolver{kind: o.Spec.ScaleTargetRef.Kind, name: o.Spec.ScaleTargetRef.Name}
	pts := o.pulseTriggers()
	bounds := ""
	if len(pts) > 0 {
		bounds = o.boundsProblem()
	}
	if bounds != "" {
		out = append(out, finding{text: bounds, problem: true})
	}
	for _, pt := range pts {
		msg, valid := checkTrigger(pt, maxWindow, crossNS, res)
		switch {
		case msg != "":
			out = append(out, finding{text: msg, problem: true})
		case len(pts) > 1 || bounds != "":
			// Beside another trigger's problem (or the bounds'), a bare
			// "valid" read as the whole ScaledObject's.
			out = append(out, finding{text: fmt.Sprintf("trigger %d: %s", pt.pos, valid)})
		default:
			out = append(out, finding{text: valid})
		}
	}
	return out
}

// checkTrigger is pt's problem ("" for none) and what "valid" says of it.
func checkTrigger(pt pulseTrigger, maxWindow time.Duration, crossNS bool, res targetResolver) (msg, valid string) {
	ref, i := pt.ref, pt.pos
	// Parsed as the aggregator gets it: in the namespace it is applied in
	// (KEDA sends it), each key from the environment left out (KEDA sends
	// its value, which the file does not hold).
	env := scaler.FromEnvKeys(ref.ScalerMetadata)
	md := maps.Clone(ref.ScalerMetadata)
	for _, k := range env {
		delete(md, k+"FromEnv")
	}
	// The metric's last: it is inferred from the other keys, their
	// stand-ins too.
	last := slices.Clone(env)
	slices.SortStableFunc(last, func(a, b string) int { return cmp.Compare(isMetricKey(a), isMetricKey(b)) })
	for _, k := range last {
		if v := standIn(md, k); v != "" {
			md[k] = v
		}
	}
	t, err := scaler.ParseTrigger(&externalscaler.ScaledObjectRef{Name: ref.Name, Namespace: cmp.Or(ref.Namespace, appliedIn), ScalerMetadata: md}, maxWindow, res)
	problem := ""
	if !slices.Contains(env, "valueType") {
		problem = pt.metricTypeProblem()
	}
	switch {
	case err != nil:
		msg = fmt.Sprintf("trigger %d: %v", i, err)
	case pt.kedaProblem() != "":
		msg = fmt.Sprintf("trigger %d: %s", i, pt.kedaProblem())
	case !crossNS && ref.Namespace != "" && t.Workload.Namespace != ref.Namespace:
		msg = fmt.Sprintf("trigger %d: namespace %s: a ScaledObject may read only its own namespace (%s) unless the aggregator runs with --allow-cross-namespace-triggers", i, t.Workload.Namespace, ref.Namespace)
	case !crossNS && ref.Namespace == "" && cmp.Or(md["namespace"], md["workspaceNamespace"]) != "":
		// Most manifests name no namespace (applied with -n), and KEDA
		// sends the one they are applied in: such a trigger was called
		// valid, and refused wherever else it went.
		msg = fmt.Sprintf("trigger %d: namespace %s: the ScaledObject names no namespace, and may read only the one it is applied in unless the aggregator runs with --allow-cross-namespace-triggers; set its metadata.namespace to check it", i, wire.Printable(t.Workload.Namespace))
	case problem != "":
		msg = fmt.Sprintf("trigger %d: %s", i, problem)
	}
	valid = "valid"
	if len(env) > 0 {
		valid += fmt.Sprintf(" (%sFromEnv read from the scale target's environment by KEDA: not checked)", strings.Join(env, "FromEnv, "))
	}
	return msg, valid
}

// unaskable is why query cannot ask the scaler as KEDA would of ref: ""
// when it can.
func unaskable(ref *externalscaler.ScaledObjectRef) string {
	if ref.Namespace == "" {
		// KEDA sends the namespace the ScaledObject is applied in; the
		// scaler refuses a call without one.
		return "the ScaledObject names no namespace: set its metadata.namespace to the one it is applied in"
	}
	if env := scaler.FromEnvKeys(ref.ScalerMetadata); len(env) > 0 {
		// KEDA sends the variable's value; the file holds its name, which
		// the scaler refuses as the value.
		return fmt.Sprintf("%sFromEnv: KEDA sends the value of the scale target's variable, which the file does not hold: set %s in the file to ask",
			strings.Join(env, "FromEnv, "), strings.Join(env, ", "))
	}
	return ""
}

// standIn is the value check parses key, set from the environment, as: one
// valid whatever the value KEDA sends, for a key that left out can be an
// error (ParseTrigger stops at its first error, and the keys after it went
// unchecked), or that the file's other keys depend on; "" to leave it out.
func standIn(md map[string]string, key string) string {
	if keys := scaler.WorkloadKeys(); slices.Contains(keys, key) {
		// The workload the file names, if it names one (another kind's is
		// refused, whatever the value); else one: scaleTargetRef's kind
		// may be one pulse does not know.
		for _, w := range keys {
			if md[w] != "" {
				return md[w]
			}
		}
		return "the-workload-from-env"
	}
	switch key {
	case "threshold":
		return "1" // within bounds, in thousandths, and a replicas trigger's
	case "kvCacheTarget", "waitingTarget", "runningTarget":
		return "1" // saturation's alone: on another metric refused, whatever the value
	case "sloTtft", "sloItl":
		return "1s" // the planner's alone
	case "sloPercentile":
		return "90"
	case "aggregation":
		return "avg" // refused on a replicas trigger, whatever the value
	case "missingPods":
		return scaler.MissingHold
	case "metric", "metricName":
		if md["metric"] != "" || md["metricName"] != "" {
			return ""
		}
		switch {
		case md["kvCacheTarget"] != "" || md["waitingTarget"] != "" || md["runningTarget"] != "":
			return "saturation" // the metric those keys are for
		case md["sloTtft"] != "" || md["sloItl"] != "" || md["sloPercentile"] != "":
			return scaler.MetricReplicas
		}
	}
	return ""
}

// isMetricKey is 1 for a key that names the metric, 0 for another.
func isMetricKey(k string) int {
	if k == "metric" || k == "metricName" {
		return 1
	}
	return 0
}

// appliedIn stands for the namespace a manifest that names none is
// applied in (kubectl -n): KEDA sends it with every call, and the
// provisioner reads a workload in it.
const appliedIn = "the-namespace-applied-in"

// finding is what check says of a trigger or a workload's annotations:
// valid, or a problem.
type finding struct {
	text    string
	problem bool
}

func hasPulseAnnotation(a map[string]string) bool {
	for k := range a {
		if strings.HasPrefix(k, "pulse.io/") || strings.HasPrefix(k, "scaledobject.kaito.sh/") {
			return true
		}
	}
	return false
}

// tlsFlags are KEDA's TriggerAuthentication parameters for the scaler's
// mutual TLS, as files.
type tlsFlags struct {
	caCert, clientCert, clientKey, serverName string
	enableTLS, unsafeSsl                      bool
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enableTLS, "enable-tls", false, "connect with TLS (KEDA's enableTLS); implied by the other TLS flags")
	fs.StringVar(&f.caCert, "ca-cert", "", "PEM file of the CA that signed the scaler's certificate (KEDA's caCert)")
	fs.StringVar(&f.clientCert, "tls-client-cert", "", "PEM file of the client certificate (KEDA's tlsClientCert)")
	fs.StringVar(&f.clientKey, "tls-client-key", "", "PEM file of the client key (KEDA's tlsClientKey)")
	fs.StringVar(&f.serverName, "server-name", "", "the name to verify the scaler's certificate against (default: the address's host)")
	fs.BoolVar(&f.unsafeSsl, "unsafe-ssl", false, "skip verifying the scaler's certificate (KEDA's unsafeSsl)")
}

func (f *tlsFlags) credentials() (credentials.TransportCredentials, error) {
	if !f.enableTLS && f.caCert == "" && f.clientCert == "" && f.clientKey == "" && f.serverName == "" && !f.unsafeSsl {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.serverName, InsecureSkipVerify: f.unsafeSsl} //nolint:gosec // KEDA's unsafeSsl, asked for by name
	if f.caCert != "" {
		pool, err := caPool(f.caCert)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (f.clientCert == "") != (f.clientKey == "") {
		return nil, errors.New("--tls-client-cert and --tls-client-key go together: give both, or neither")
	}
	if f.clientCert != "" {
		c, err := tls.LoadX509KeyPair(f.clientCert, f.clientKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-cert, --tls-client-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return credentials.NewTLS(cfg), nil
}

// caPool is the CA certificates of file (--ca-cert), of query and top.
func caPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file) //nolint:gosec // a file the user names by flag
	if err != nil {
		return nil, fmt.Errorf("--ca-cert: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-cert %s: no PEM certificate", file)
	}
	return pool, nil
}

func query(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pulsectl query", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("scaler", "", "the aggregator's scaler address, host:port (the trigger's scalerAddress)")
	file := fs.String("f", "", "a file of ScaledObjects whose pulse triggers to ask about")
	timeout := fs.Duration("timeout", 10*time.Second, "how long each call may take")
	var tf tlsFlags
	tf.register(fs)
	if err := fs.Parse(args); err != nil {
		return helpOr2(err)
	}
	if *addr == "" || *file == "" {
		fmt.Fprintln(stderr, "pulsectl query: --scaler and -f are required")
		fs.Usage()
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "pulsectl query: --timeout %s: want a duration above 0\n", *timeout)
		return 2
	}
	objs, bad, err := readObjects(*file)
	if err != nil && len(objs) == 0 {
		fmt.Fprintln(stderr, wire.OneLine(err.Error())) // not read: nothing to ask about
		return 1
	}
	if err != nil {
		bad = append(bad, err)
	}
	for _, err := range bad {
		// The others are asked about all the same.
		fmt.Fprintln(stderr, wire.OneLine(err.Error()))
	}
	creds, err := tf.credentials()
	if err != nil {
		fmt.Fprintln(stderr, "pulsectl query:", err)
		return 2
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintln(stderr, "pulsectl query:", err)
		return 1
	}
	defer func() { _ = conn.Close() }()
	client := externalscaler.NewExternalScalerClient(conn)
	failed, asked := 0, 0
	for _, o := range objs {
		if o.Kind != "ScaledObject" {
			continue
		}
		for _, pt := range o.pulseTriggers() {
			ref := pt.ref
			asked++
			fmt.Fprintf(stdout, "ScaledObject %s/%s trigger %d:\n", wire.OneLine(o.Metadata.Namespace), wire.OneLine(o.Metadata.Name), pt.pos)
			if why := unaskable(ref); why != "" {
				fmt.Fprintf(stdout, "  %s\n", why)
				failed++
				continue
			}
			if err := ask(client, pt, *timeout, stdout); err != nil {
				fmt.Fprintf(stdout, "  %s\n", wire.Printable(err.Error()))
				failed++
			}
		}
	}
	if asked == 0 {
		fmt.Fprintf(stderr, "pulsectl query: %s has no ScaledObject with an external-push trigger\n", *file)
		return 1
	}
	if failed > 0 || len(bad) > 0 {
		return 1
	}
	return 0
}

// ask makes KEDA's three calls for one trigger, each within timeout, and
// prints the answers and the desired replica count the HPA derives, by the
// trigger's metricType (AverageValue, KEDA's default: ceil(value /
// target); Value: the ratio the HPA multiplies by its ready replicas),
// and a valueType that does not fit it.
func ask(c externalscaler.ExternalScalerClient, pt pulseTrigger, timeout time.Duration, w io.Writer) error {
	ref := pt.ref
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), timeout)
	}
	ctx, cancel := call()
	defer cancel()
	spec, err := c.GetMetricSpec(ctx, ref)
	if err != nil {
		return fmt.Errorf("GetMetricSpec: %w", err)
	}
	if len(spec.MetricSpecs) == 0 {
		return errors.New("GetMetricSpec: no metric spec")
	}
	ms := spec.MetricSpecs[0]
	fmt.Fprintf(w, "  GetMetricSpec: metric %s, target %g per replica\n", wire.Printable(ms.MetricName), ms.TargetSizeFloat)
	ctx, cancel = call()
	defer cancel()
	m, err := c.GetMetrics(ctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: ref, MetricName: ms.MetricName})
	if err != nil {
		return fmt.Errorf("GetMetrics: %w", err)
	}
	if len(m.MetricValues) == 0 {
		return errors.New("GetMetrics: no value")
	}
	v := m.MetricValues[0].MetricValueFloat
	fmt.Fprintf(w, "  GetMetrics: %g\n", v)
	ctx, cancel = call()
	defer cancel()
	active, err := c.IsActive(ctx, ref)
	if err != nil {
		return fmt.Errorf("IsActive: %w", err)
	}
	fmt.Fprintf(w, "  IsActive: %v\n", active.Result)
	switch {
	case ms.TargetSizeFloat <= 0:
	case pt.hpaValue():
		// The HPA multiplies by the replicas it counts ready, which
		// KEDA's calls do not say (/debug/triggers does).
		fmt.Fprintf(w, "  desired replicas (metricType Value: ceil(ready replicas × value / target), before the HPA's tolerance, behaviour and min/max): ceil(ready replicas × %.4g)\n",
			scaler.HPARatio(v, ms.TargetSizeFloat))
	default:
		fmt.Fprintf(w, "  desired replicas (metricType AverageValue: ceil(value / target), before the HPA's tolerance, behaviour and min/max): %d\n",
			int(min(math.Ceil(scaler.HPARatio(v, ms.TargetSizeFloat)), math.MaxInt32)))
	}
	if msg := pt.metricTypeProblem(); msg != "" {
		fmt.Fprintf(w, "  warning: %s\n", msg)
	}
	return nil
}

func top(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pulsectl top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	base := fs.String("debug", "", "the aggregator's debug address, e.g. http://127.0.0.1:8082 (kubectl port-forward deploy/pulse-aggregator 8082; the chart serves it on the pod's loopback)")
	every := fs.Duration("interval", 2*time.Second, "refresh interval")
	count := fs.Int("n", 0, "refresh this many times and exit (0: until interrupted)")
	caCert := fs.String("ca-cert", "", "PEM file of the CA that signed the aggregator's certificate, for an https:// --debug (the ConfigMap pulse-aggregator-ca's ca.crt)")
	serverName := fs.String("server-name", "", "the name to verify the aggregator's certificate against (default: the address's host), e.g. pulse-aggregator.pulse-system.svc through a port-forward")
	tokenFile := fs.String("token-file", "", "a file holding the bearer token to send (re-read at each refresh), of at most 16 KiB as the aggregator reviews: the debug endpoints on the http port with metricsAuth=kubernetes")
	namespace := fs.String("namespace", "", "show this namespace's ScaledObjects alone (/debug/triggers/NAMESPACE: the path to grant a tenant its own)")
	if err := fs.Parse(args); err != nil {
		return helpOr2(err)
	}
	if *base == "" {
		fmt.Fprintln(stderr, "pulsectl top: --debug is required")
		fs.Usage()
		return 2
	}
	if *every <= 0 || *count < 0 {
		fmt.Fprintf(stderr, "pulsectl top: --interval %s, -n %d: want an interval above 0 and a count of 0 (until interrupted) or more\n", *every, *count)
		return 2
	}
	path := "/debug/triggers"
	if *namespace != "" {
		// A namespace is a DNS label: "." was the path /debug/triggers/.,
		// which the server redirects to every namespace's page, shown
		// under the one asked for.
		if errs := validation.IsDNS1123Label(*namespace); len(errs) > 0 {
			fmt.Fprintf(stderr, "pulsectl top: --namespace %q is no namespace: %s\n", *namespace, strings.Join(errs, "; "))
			return 2
		}
		path += "/" + *namespace
	}
	url := strings.TrimRight(*base, "/") + path + "?format=table"
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	client, err := debugClient(url, *caCert, *serverName, *tokenFile)
	if err != nil {
		fmt.Fprintln(stderr, "pulsectl top:", err)
		return 2
	}
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			time.Sleep(*every)
		}
		body, cut, err := fetch(client, url)
		if errors.Is(err, errBusy) && (*count == 0 || i < *count-1) {
			// The aggregator answers a few debug pages at once: the next
			// refresh tries again.
			fmt.Fprintln(stderr, "pulsectl top:", wire.Printable(err.Error()), "(trying again at the next refresh)")
			continue
		}
		if err != nil {
			fmt.Fprintln(stderr, "pulsectl top:", wire.Printable(err.Error()))
			return 1
		}
		if *count != 1 {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear the terminal
		}
		fmt.Fprintf(stdout, "%s  %s\n\n%s", time.Now().Format(time.TimeOnly), wire.Printable(redacted(url)), wire.Printable(body))
		switch {
		case cut && body == "":
			fmt.Fprintf(stderr, "pulsectl top: the answer is past %d MiB, with no whole line within it: nothing of it is shown (--namespace NS shows one namespace's)\n", maxAnswer>>20)
		case cut:
			fmt.Fprintf(stderr, "pulsectl top: the answer is past %d MiB: the rest is not shown (--namespace NS shows one namespace's)\n", maxAnswer>>20)
		}
	}
	return 0
}

// debugClient reads url: over TLS trusting caCert (the system's roots
// without it) and verifying serverName, sending the token in tokenFile. A
// token is never sent in plaintext but to a loopback address (a
// port-forward's).
func debugClient(url, caCert, serverName, tokenFile string) (*http.Client, error) {
	u, err := neturl.Parse(url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--debug %s: want http://HOST:PORT or https://HOST:PORT", wire.Printable(redacted(url)))
	}
	tlsOnly := caCert != "" || serverName != ""
	if tlsOnly && u.Scheme != "https" {
		return nil, errors.New("--ca-cert and --server-name are for an https:// --debug")
	}
	if tokenFile != "" && u.Scheme != "https" {
		if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("--token-file with --debug %s: a token is sent in plaintext only to a loopback address; use https://", wire.Printable(redacted(url)))
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caCert != "" {
		if cfg.RootCAs, err = caPool(caCert); err != nil {
			return nil, err
		}
	}
	var rt http.RoundTripper = &http.Transport{TLSClientConfig: cfg, Proxy: http.ProxyFromEnvironment}
	if tokenFile != "" {
		if _, err := readToken(tokenFile); err != nil {
			return nil, err
		}
		rt = bearer{file: tokenFile, scheme: u.Scheme, host: u.Host, next: rt}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: rt}, nil
}

// bearer sends the token in file, read at each request (a projected
// token is rotated in place), to --debug's scheme and host alone: a
// RoundTripper's header outlives the client's redirect rules, and a
// redirect to another host, or to plaintext, got the token.
type bearer struct {
	file, scheme, host string
	next               http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != b.scheme || r.URL.Host != b.host {
		return b.next.RoundTrip(r)
	}
	token, err := readToken(b.file)
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+token)
	return b.next.RoundTrip(r)
}

// readToken is the token in file: one line, not empty, of at most
// app.MaxBearerToken bytes. The aggregator refuses a longer one unreviewed,
// and one past its headers' bound (app.MaxHeaderBytes) got a bare "431
// Request Header Fields Too Large".
func readToken(file string) (string, error) {
	f, err := os.Open(file) //nolint:gosec // a file the user names by flag
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	token := strings.TrimSpace(string(b))
	switch {
	case err != nil:
		return "", fmt.Errorf("--token-file %s: %w", file, err)
	case len(b) > 64<<10:
		return "", fmt.Errorf("--token-file %s: larger than 64 KiB", file)
	case token == "" || strings.ContainsAny(token, "\r\n"):
		return "", fmt.Errorf("--token-file %s: want one token on one line", file)
	case len(token) > app.MaxBearerToken:
		return "", fmt.Errorf("--token-file %s: a token of %d bytes; the aggregator reviews one of at most %d bytes (a ServiceAccount's is about 1 KB)", file, len(token), app.MaxBearerToken)
	}
	return token, nil
}

// redacted is url as it is shown: a password in it as xxxxx
// (--debug http://user:pass@host).
func redacted(url string) string {
	if u, err := neturl.Parse(url); err == nil && (u.User != nil || !strings.Contains(url, "@")) && !atPastAuthority(url) {
		return u.Redacted()
	}
	// Not parsed (a password's % not an escape, its / or #), or parsed
	// with an @ past the host (a password of digits, then /, ? or #: the
	// host:port before it parses): what comes before the last @ may be a
	// password.
	if at := strings.LastIndexByte(url, '@'); at >= 0 {
		start := 0
		if i := strings.Index(url, "://"); i >= 0 && i+3 <= at {
			start = i + 3
		}
		return url[:start] + "xxxxx" + url[at:]
	}
	return url
}

// atPastAuthority reports whether url has an @ past its authority (its
// first /, ? or # after the scheme): a user name with an @ (alice@corp)
// and a password of digits then /, ? or # parse with a user set, the
// password's rest as a path, query or fragment.
func atPastAuthority(url string) bool {
	rest := url
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	end := strings.IndexAny(rest, "/?#")
	return end >= 0 && strings.Contains(rest[end:], "@")
}

// maxAnswer bounds what top reads of an answer.
const maxAnswer = 16 << 20

// fetch is url's answer; cut: it was past maxAnswer, and is cut at its last
// whole line within it.
func fetch(c *http.Client, url string) (body string, cut bool, err error) {
	resp, err := c.Get(url)
	if err != nil {
		// net/http hides a password it parsed, not one of redacted's
		// other forms.
		if ue := (*neturl.Error)(nil); errors.As(err, &ue) {
			ue.URL = redacted(ue.URL) // a redirect's, if it failed
		}
		return "", false, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return "", false, err
	}
	if cut = len(b) > maxAnswer; cut {
		b = b[:bytes.LastIndexByte(b[:maxAnswer], '\n')+1]
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("%s: %s: %s", redacted(url), resp.Status, strings.TrimSpace(wire.Printable(string(b[:min(len(b), 4096)]))))
		if resp.StatusCode == http.StatusServiceUnavailable {
			err = fmt.Errorf("%w: %w", errBusy, err)
		}
		return "", false, err
	}
	return string(b), cut, nil
}

// errBusy: the server answered 503 (the aggregator's debug answers under
// way are bounded).
var errBusy = errors.New("busy")
