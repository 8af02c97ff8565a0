// Package store holds the aggregator's state: per pod, a short series of raw
// samples (counters made monotonic across resets); per workload, the set of
// its pods. Canonical values are derived on read, over any window up to the
// retention, so every reader (debug endpoint, every KEDA trigger with its own
// window) sees one consistent state.
package store

import (
	"errors"
	"iter"
	"maps"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pulse-io/pulse/pkg/metric"
)

// Workload kinds as they appear in keys, the debug endpoint and metadata.
const (
	KindWorkspace       = "Workspace"
	KindInferenceSet    = "InferenceSet"
	KindDeployment      = "Deployment"
	KindStatefulSet     = "StatefulSet"
	KindLeaderWorkerSet = "LeaderWorkerSet"
	KindWorkload        = "Workload" // a pulse.io/workload override or a static target's workload
)

// Key names a workload.
type Key struct{ Namespace, Kind, Name string }

// String is the one way pulse writes a workload, in tables, logs, errors
// and metric labels alike: "Workspace demo/llama".
func (k Key) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

// PodInfo is a catalogue entry as the aggregator keeps it.
type PodInfo struct {
	UID, Namespace, Name string
	Workloads            []Key
	// Ready: the pod's Ready condition is true; a pod that is not ready is
	// starting (loading its model).
	Ready bool
	// Terminating: the pod is being deleted.
	Terminating bool
	// Demand: a demand source's entry (a router's requests for the
	// workload), not a replica: left out of Query, read by Demand.
	Demand bool
	// CreatedMs: the pod's creationTimestamp; ReadySinceMs: while it is
	// Ready, its Ready condition's lastTransitionTime (Unix ms, as the
	// wire carries them; 0 when unknown; not held: markStart keeps what
	// they give). A pod's startup is from the first to the second (the
	// first of each listed); without them, from its first listing not
	// ready to its first listing ready, as the store sees them.
	CreatedMs, ReadySinceMs int64
	// UnreadySinceMs: while it is not Ready, and was since its containers
	// last started (it served, and lost its readiness), its Ready
	// condition's lastTransitionTime (Unix ms; 0 when not so, or unknown).
	// A pod this store never saw ready is taken as one that lost its
	// readiness then, not as one starting: an aggregator restarted while
	// a replica failed its probe took it as capacity coming, and its age
	// as a startup under way.
	UnreadySinceMs int64
}

// demandSep joins a demand source's pod uid and the workload of one of its
// entries: POD_UID/demand/WORKLOAD.
const demandSep = "/demand/"

// DemandUID is the uid of a demand source's entry for workload.
func DemandUID(podUID, workload string) string { return podUID + demandSep + workload }

// DemandPodUID is the router pod's uid in a demand entry's uid; ok is false
// for a uid not of that form. The workload's name holds no "/", the pod's
// uid may (a static target's is static/NAMESPACE/POD, and a namespace may
// be named demand): it is cut at the last separator.
func DemandPodUID(uid string) (string, bool) {
	i := strings.LastIndex(uid, demandSep)
	if i < 0 {
		return uid, false
	}
	pod, workload := uid[:i], uid[i+len(demandSep):]
	return pod, pod != "" && workload != ""
}

// Source is the agent stream that lists pods: its node, its process
// instance (a new one means its counters start a new series), the names
// of the extra gauges it forwards, and the stream (OpenSource; none when
// zero: the pods it lists are held until removed or their node expires).
type Source struct {
	Node, Instance string
	ExtraNames     []string
	Stream         Stream
}

// Stream is one open agent stream of a node (OpenSource). A node's listing
// is kept per stream: the pods that only its ended streams listed, and no
// open one lists again, go Expiry after the last of those ended, though
// the node has another stream open (a node that reconnected with a delta
// and stayed connected had kept every pod its earlier streams listed,
// another tenant's deleted pods among them, holding that namespace's
// room). The zero Stream is none: what it lists is held until removed.
type Stream uint8

// maxStreams is the most streams one node may hold open in a store (the
// bits of a listing's mask, less the zero Stream's); ingest bounds a
// token's streams far below it.
const maxStreams = 63

// ErrStreams: a node holds maxStreams streams open.
var ErrStreams = errors.New("the node holds 63 agent streams open in the store, the most it may")

// ErrSuperseded: a stream of the node opened later has listed the node's
// pods in full, so what this one lists or reports is older than what the
// store holds (UpsertStream, RemoveStream, AddStream); nothing of it is
// taken, and the stream should end (its agent, if it still runs,
// reconnects and lists the node again).
var ErrSuperseded = errors.New("a newer stream of the node has listed its pods in full")

// Sample is one report of a pod: its values, or why it has none.
type Sample struct {
	TimeMs int64
	Values metric.Values
	Extra  []float64 // aligned with the reporting stream's extra names; NaN absent
	// Hist: the pod's histograms, when its agent forwards them; a histogram
	// absent from a sample is unchanged since the pod's last one (the wire
	// does not resend it), and is kept.
	Hist    *metric.Histograms
	Missing string // empty when the scrape succeeded; else the reason
	Error   string
	// Rejected names the values of a successful sample that were refused
	// and left out (e.g. "negative waiting"); empty when none was.
	Rejected string
}

// Options bound the store.
type Options struct {
	// Retention is the longest window a reader may ask for.
	Retention time.Duration
	// MaxSamples caps the samples kept per pod.
	MaxSamples int
	// MaxPods caps the pods held. Past it a new pod is refused (Upsert
	// returns it, and it is counted) until there is room: no pod held is
	// ever evicted for it. A pod is dropped only when its agent removes it,
	// or Expiry after its agent's streams closed. Workloads exist only
	// through their pods.
	MaxPods int
	// MaxPodsPerNamespace caps the pods of one namespace (0: MaxPods), so
	// that one tenant's pods (a router's demand entries, say) cannot take
	// the room every other tenant's new replicas need. Past it a new pod
	// of that namespace is refused as past MaxPods; and so is one of a
	// namespace holding a share of the room while one below a share waits
	// for room (roomIn).
	MaxPodsPerNamespace int
	// Expiry: pods of an agent whose streams have all been closed this long
	// are dropped. Pods of a connected agent stay until it removes them.
	Expiry time.Duration
	// Exists says whether the API still has a pod (namespace, name, uid;
	// not being deleted, not finished) as a replica of workload k (its
	// labels, annotations or owners give k). A replica dropped because its
	// agent's streams expired, not removed by its agent, is then a ready
	// replica with no sample (Snapshot, PodLoad.Unseen; Query) for as long
	// as the API has it so, its agent does not list its node in full
	// again, and at most a day: its agent lost, it may serve on. Nil: such
	// a replica is gone (no API to ask).
	Exists func(namespace, name, uid string, k Key) bool
	// Replicas lists the API's replicas of workload k (each one Exists
	// says true of) with their nodes, on the nodes on says true of (no
	// agent streams from them: a replica elsewhere costs nothing). At each
	// sweep, those of a workload
	// some agent lists a replica of that run on a node no agent streams
	// from (none has since the store started, or its streams expired) are
	// unseen replicas too, as if dropped with a lost agent: an aggregator
	// started while a node's agent was lost never hears of that node's
	// replicas, which serve on; and those unseen on such a node that it no
	// longer gives are forgotten. ok false: it cannot say now (the pod
	// cache not synced, the warm-up). Nil (or Exists nil): none.
	Replicas func(k Key, on func(node string) bool) (pods []APIPod, ok bool)
	// Now is the clock (time.Now when nil); tests set it.
	Now func() time.Time
}

// APIPod is a replica of a workload as the API has it (Options.Replicas).
type APIPod struct {
	Namespace, Name, UID, Node string
	Ready                      bool
	CreatedMs                  int64 // its creationTimestamp, Unix milliseconds
}

// Store is safe for concurrent use.
type Store struct {
	opts Options

	mu        sync.RWMutex
	pods      map[string]*pod    // by uid
	workloads map[Key][]*pod     // each sorted by uid: readers see a stable order
	sources   map[string]*source // by node
	// listed: each node's pods, by uid (a pod is under every node whose
	// agent lists it), and which of its streams list each: a full
	// catalogue touches its node's pods, not all.
	listed    map[string]map[string]listing
	lastSweep time.Time
	refused   int
	now       func() time.Time
	// epoch is what pods' seen is counted from: the clock's first reading,
	// monotonic with time.Now (a step of the wall clock moves no pod's
	// age), and any clock within the 292 years of a Duration of it.
	epoch time.Time
	// lost: workloads whose replicas were dropped without their agent
	// removing them (its streams expired), and when; cleared when one of
	// its replicas is listed again.
	lost map[Key]Lost
	// unseen: each workload's replicas dropped with their agent, or that
	// the API has on a node no agent streams from, until listed again or
	// lostFor (unseen.go).
	unseen map[Key][]unseenPod
	// unseenKeys: the workloads whose unseen list holds each uid.
	unseenKeys map[string][]Key
	// unseenOn: how many unseen entries each node's lost agent left.
	unseenOn map[string]int
	// nsPods: pods held per namespace. refusedAt: workloads a new pod of
	// which was refused for room, and when last, by the pod's uid (for
	// refusedFor; a uid admitted since is deleted): a workload with none
	// held then is not one without replicas.
	nsPods    map[string]int
	refusedAt map[Key]map[string]time.Time
	// nsWaiting: namespaces whose new pods were refused for room (not for
	// their own cap), by the pod's uid, and when last (roomIn); a pod
	// admitted since is deleted (admitted), and the rest swept past
	// refusedFor.
	nsWaiting map[string]map[string]time.Time

	// changed is told of every workload that changes (OnChange); nil
	// until set.
	changed atomic.Pointer[func(Key)]
}

// source is one node's agent as the store knows it.
type source struct {
	open     uint64    // its open streams, a bit each (bit 0 is never one)
	closedAt time.Time // when the last one closed
	heard    bool      // a batch has arrived from it since the store started
	// orphans: its pods no open stream lists (those that listed them
	// ended), and when the last of those ended; nil when none.
	orphans map[string]time.Time
	// opened: its open streams, each with the order it opened in (gens
	// counts the node's streams opened so far); fullGen: the newest of
	// those whose full listing the store took. A stream older than
	// fullGen is superseded: a stream cut while its catalogue waited on a
	// slow pod lookup, taken after its agent's next stream had listed the
	// node, put back what that one no longer listed and the older agent's
	// instance, restarting every pod's series.
	opened        []openStream
	gens, fullGen uint64
	// instance: the agent process that listed its pods last (nil: none
	// yet), for the pods to share (intern).
	instance *string
}

// intern is instance as a pointer the pods of src share: src's, or a
// new one when src is nil or its agent process changed.
func (src *source) intern(instance string) *string {
	if src != nil && src.instance != nil && *src.instance == instance {
		return src.instance
	}
	v := &instance
	if src != nil {
		src.instance = v
	}
	return v
}

// openStream is one open stream of a node and the order it opened in.
type openStream struct {
	st  Stream
	gen uint64
}

// superseded: st, of src, opened before a stream whose full listing the
// store took. The zero Stream never is.
func (src *source) superseded(st Stream) bool {
	return st != 0 && src != nil && src.fullGen > src.gen(st)
}

// gen is the order st opened in (0 when it is not open).
func (src *source) gen(st Stream) uint64 {
	for _, o := range src.opened {
		if o.st == st {
			return o.gen
		}
	}
	return 0
}

// listing is one pod under one node: the pod, and the node's streams that
// list it (bit 0: the zero Stream, never closed).
type listing struct {
	p  *pod
	by uint64
}

// pod is one pod as the store holds it: its listing (PodInfo) less its
// times, which markStart and markUnready take in at each listing, its
// namespace and workloads a group the replicas of a workload share
// (Store.group). 320 bytes, a size class below 384: the whole PodInfo took
// 104 of those 384.
type pod struct {
	UID, Name string
	*podGroup
	// source: the node whose agent lists it, while sourced; rare's
	// moreSources: any others (almost never: a pod runs on one node). A
	// slice of them all took 8 bytes more a pod and an array of 16.
	source string
	// instance: the agent process whose counters the series carries (nil:
	// none yet), shared by the pods its node's source lists (a string
	// each took a pod past its size class).
	instance *string

	series series // oldest first; counters monotonic
	mono   metric.Monotonic
	// seen: when the last successful sample came, on the aggregator's
	// clock (stamp; 0: none). A time.Time took 16 bytes more a pod.
	seen int64
	// rare: what few pods have, nil until one is set.
	rare *podRare
	// startNs is when the pod started: its creation when its agent lists
	// it, else when it was first listed not ready (0 when neither is
	// known: it was ready at its first listing, with no creation time);
	// readyNs is when it became ready: its Ready condition's transition
	// when listed, else when it was first listed ready. Their difference
	// is its startup (Snapshot). Each is the first known, and kept (Unix
	// ns: two time.Time took 32 bytes more a pod, past its size class);
	// readyNs is -1 when the pod's ready time is not known.
	startNs, readyNs int64
	// behind: the last sample was more than stepBack behind the series
	// (dropped); a second in a row restarts it.
	behind bool
	// readyUnseen: the pod was ready at its first listing, so readyNs is
	// its Ready condition's latest transition, which a readiness flap
	// since its start moved later (PodLoad.StartupUnseen).
	readyUnseen bool
	// Ready, Terminating and Demand are its listing's (PodInfo), and
	// sourced whether a node lists it (source), here beside the two above
	// so that the six take one word.
	Ready, Terminating, Demand bool
	sourced                    bool
}

// podGroup is a pod's namespace and workloads: one among the replicas of
// a workload (Store.group), never written once held.
type podGroup struct {
	Namespace string
	Workloads []Key
}

// info is p's listing as the store holds it, its times the ones the store
// kept from its listings (markStart, markUnready): its start as CreatedMs,
// when it became ready as ReadySinceMs while it is ready, when it lost its
// readiness as UnreadySinceMs while it is not (each 0 when not known). An
// entry kept as last listed (ListedOn) and listed again re-creates a pod
// the store dropped meanwhile with the start and ready times it had, not
// with the store's clock.
func (p *pod) info() PodInfo {
	in := PodInfo{UID: p.UID, Namespace: p.Namespace, Name: p.Name, Workloads: p.Workloads,
		Ready: p.Ready, Terminating: p.Terminating, Demand: p.Demand}
	ms := func(ns int64) int64 { return time.Unix(0, ns).UnixMilli() }
	if p.startNs > 0 {
		in.CreatedMs = ms(p.startNs)
	}
	switch u := p.get().unreadyNs; {
	case p.Ready && p.readyNs > 0:
		in.ReadySinceMs = ms(p.readyNs)
	case !p.Ready && u > 0:
		in.UnreadySinceMs = ms(u)
	}
	return in
}

// take holds info as p's listing, its namespace and workloads as g.
func (p *pod) take(info PodInfo, g *podGroup) {
	p.UID, p.Name, p.podGroup = info.UID, info.Name, g
	p.Ready, p.Terminating, p.Demand = info.Ready, info.Terminating, info.Demand
}

// podRare is the part of a pod's state that few pods have: apart, so that
// the many without it do not each carry its room (a store holds tens of
// thousands of pods).
type podRare struct {
	// extraNames: the extra gauges its agent forwards (--extra-metric);
	// extras: their values, parallel to the series, nil until the pod
	// forwards any.
	extraNames []string
	extras     [][]float64
	// missing and errText: why its last report had no sample.
	missing, errText string
	// rejected: the values refused from the pod's last sample (empty when
	// none was); shown, so that a pod whose samples are refused does not
	// look well with its older values.
	rejected string
	// capCutMs is the time of the newest sample dropped because MaxSamples
	// was reached (not because it aged out): a window reaching back past it
	// is cut short.
	capCutMs int64
	// unreadyNs: when the pod, ready before, was first listed not ready
	// (its readiness lost: PodLoad.UnreadyFor); 0 while it is ready.
	unreadyNs int64
	// heldHist: the histograms of a sample dropped as out of order, for
	// the next sample taken (holdHist); nil when none.
	heldHist *metric.Histograms
	// moreSources: the nodes that list the pod besides its source.
	moreSources []string
}

// stamp is now as a pod's seen: nanoseconds since the store's epoch, plus
// one, so that a sample at the epoch is not 0, which is none (0 is a clock
// 1 ns before the epoch, taken as none).
func (s *Store) stamp(now time.Time) int64 { return int64(now.Sub(s.epoch)) + 1 }

// age is how long before at (a stamp) p's last successful sample came
// (p.seen is not 0).
func (p *pod) age(at int64) time.Duration { return time.Duration(at - p.seen) }

// noRare is what a pod without rare state reads (never written).
var noRare podRare

// get is p's rare state to read (never nil).
func (p *pod) get() *podRare {
	if p.rare == nil {
		return &noRare
	}
	return p.rare
}

// set is p's rare state to write (allocated at the first write).
func (p *pod) set() *podRare {
	if p.rare == nil {
		p.rare = new(podRare)
	}
	return p.rare
}

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Retention <= 0 {
		opts.Retention = time.Minute
	}
	if opts.MaxSamples <= 0 {
		opts.MaxSamples = 128
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxPods <= 0 {
		opts.MaxPods = 10000
	}
	if opts.Expiry <= 0 {
		opts.Expiry = 10 * time.Minute
	}
	if opts.MaxPodsPerNamespace <= 0 || opts.MaxPodsPerNamespace > opts.MaxPods {
		opts.MaxPodsPerNamespace = opts.MaxPods
	}
	return &Store{
		opts:       opts,
		pods:       make(map[string]*pod),
		workloads:  make(map[Key][]*pod),
		sources:    make(map[string]*source),
		listed:     make(map[string]map[string]listing),
		lost:       make(map[Key]Lost),
		unseen:     make(map[Key][]unseenPod),
		unseenKeys: make(map[string][]Key),
		unseenOn:   make(map[string]int),
		nsPods:     make(map[string]int),
		refusedAt:  make(map[Key]map[string]time.Time),
		nsWaiting:  make(map[string]map[string]time.Time),
		now:        opts.Now,
		epoch:      opts.Now(),
	}
}

// drop removes a pod, unlinks it from its workloads and tells of their
// change; lostOn: the node whose agent did not remove it (its streams
// expired), "" when its agent removed it. mu must be held for writing.
func (s *Store) drop(uid string, p *pod, lostOn string) {
	delete(s.pods, uid)
	s.countIn(p.Namespace, -1)
	s.notify(p)
	s.unlink(p)
	if lostOn != "" && countsLost(p) {
		s.markLost(p, 1)
		s.markUnseen(p, lostOn, s.now())
	}
}

// countsLost is whether p, gone with its agent, is a replica lost: not a
// router's demand entry, nor a pod being deleted. A terminating pod was
// leaving: a workload scaling to zero whose last replica's agent went
// with it was held lost for a day, every answer Unavailable and its
// routers' demand unread, so it never scaled from zero again.
func countsLost(p *pod) bool { return !p.Demand && !p.Terminating }

// countIn adds d to the pods held in namespace ns; mu must be held for
// writing.
func (s *Store) countIn(ns string, d int) {
	if s.nsPods[ns] += d; s.nsPods[ns] <= 0 {
		delete(s.nsPods, ns)
	}
}

// OpenSource records an agent stream of node opening, and returns it (the
// Source of what it lists, and CloseSource's); ErrStreams when the node
// holds maxStreams open.
func (s *Store) OpenSource(node string) (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src := s.sources[node]
	if src == nil {
		src = &source{}
		s.sources[node] = src
	}
	free := ^src.open &^ 1 // bit 0 is the zero Stream's
	if free == 0 {
		return 0, ErrStreams
	}
	st := Stream(bits.TrailingZeros64(free))
	src.open |= 1 << st
	src.gens++
	src.opened = append(src.opened, openStream{st: st, gen: src.gens})
	return st, nil
}

// CloseSource records node's stream st closing. The pods it listed stay
// (and go stale) until a stream of the node lists them again or Expiry
// passes, though the node has another stream open.
func (s *Store) CloseSource(node string, st Stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src := s.sources[node]
	bit := uint64(1) << st
	if src == nil || st == 0 || src.open&bit == 0 {
		return
	}
	now := s.now()
	if src.open &^= bit; src.open == 0 {
		src.closedAt = now
	}
	src.opened = slices.DeleteFunc(src.opened, func(o openStream) bool { return o.st == st })
	m := s.listed[node]
	for uid, l := range m {
		if l.by&bit == 0 {
			continue
		}
		if l.by &^= bit; l.by == 0 {
			src.orphan(uid, now)
		}
		m[uid] = l
	}
}

// MarkHeard records that a batch has arrived from node's agent.
func (s *Store) MarkHeard(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if src := s.sources[node]; src != nil {
		src.heard = true
	}
}

// HeardSources is the number of agents a batch has arrived from since the
// store started (connected now or not).
func (s *Store) HeardSources() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, src := range s.sources {
		if src.heard {
			n++
		}
	}
	return n
}

// Sweep drops the pods of nodes disconnected for longer than Expiry. Readers
// already leave such pods out; Sweep frees them. The aggregator calls it on
// a timer; Upsert calls it too, at most every few seconds.
func (s *Store) Sweep() {
	s.mu.Lock()
	now := s.now()
	s.sweep(now, true)
	s.mu.Unlock()
	s.adoptUnheard(now)
}

// sweep is Sweep with mu held for writing; unless forced it runs at most
// every few seconds.
func (s *Store) sweep(now time.Time, force bool) {
	if !force && now.Sub(s.lastSweep) < 5*time.Second {
		return
	}
	s.lastSweep = now
	for k, l := range s.lost {
		if now.Sub(l.At) > lostFor {
			delete(s.lost, k)
		}
	}
	for ns, uids := range s.nsWaiting {
		for uid, at := range uids {
			if now.Sub(at) > refusedFor {
				delete(uids, uid)
			}
		}
		if len(uids) == 0 {
			delete(s.nsWaiting, ns)
		}
	}
	for k, uids := range s.refusedAt {
		for uid, at := range uids {
			if now.Sub(at) > refusedFor {
				delete(uids, uid)
			}
		}
		if len(uids) == 0 {
			delete(s.refusedAt, k)
		}
	}
	expired := map[string]bool{}
	for node, src := range s.sources {
		if s.expiredSource(src, now) {
			expired[node] = true
			delete(s.sources, node)
			continue
		}
		for uid, at := range src.orphans {
			if l, ok := s.listed[node][uid]; !ok {
				s.unorphan(src, uid)
			} else if s.orphanExpired(at, now) {
				s.unlist(uid, l.p, node, true)
			}
		}
	}
	for node := range expired {
		for uid, l := range s.listed[node] {
			p := l.p
			p.dropSource(node)
			if p.sources() == 0 && s.pods[uid] == p {
				s.drop(uid, p, node)
			}
		}
		delete(s.listed, node)
	}
	s.sweepUnseen(now) // last: what this sweep dropped too
}

// orphanExpired: a pod orphaned at has been so longer than Expiry.
func (s *Store) orphanExpired(at, now time.Time) bool {
	return now.Sub(at) > s.opts.Expiry
}

// orphan records that no open stream of src lists its pod uid, from now
// (kept if it was so already).
func (src *source) orphan(uid string, now time.Time) {
	if _, ok := src.orphans[uid]; ok {
		return
	}
	if src.orphans == nil {
		src.orphans = make(map[string]time.Time)
	}
	src.orphans[uid] = now
}

// refusedFor: how long a workload a new pod of which was refused for room
// (MaxPods, MaxPodsPerNamespace, a share: roomIn) is remembered: its agent lists a refused
// pod again at each batch, each refusal renewing it.
const refusedFor = time.Minute

// refusedRecently is when a new pod of k was last refused for room, within
// refusedFor; zero if not. mu must be held.
func (s *Store) refusedRecently(k Key, now time.Time) time.Time {
	var last time.Time
	for _, at := range s.refusedAt[k] {
		if now.Sub(at) <= refusedFor && at.After(last) {
			last = at
		}
	}
	return last
}

// admitted forgets info's refusals for room (refusedRecently): a pod
// admitted since, its workload's refusal said it held no replicas for a
// minute more, every trigger and plan of it failing meanwhile. mu must
// be held.
func (s *Store) admitted(info PodInfo) {
	// It waits no more: room freed is not kept for it, under whichever
	// namespace it was refused (an agent not checked may list a uid
	// under another), nor its refusal under any workload.
	s.forgetRefusedLocked(info.UID, false)
}

// Lost is what a workload lost without its agent removing it: replicas
// that were reporting, dropped because their agent's streams expired.
type Lost struct {
	At   time.Time
	Pods int
}

// lostFor is how long a lost workload is remembered (then it is as if it
// never had replicas).
const lostFor = 24 * time.Hour

// markLost records that p's workloads lost it now; mu must be held.
func (s *Store) markLost(p *pod, n int) {
	for _, k := range p.Workloads {
		l := s.lost[k]
		l.At, l.Pods = s.now(), l.Pods+n
		s.lost[k] = l
	}
}

// LostReplicas reports whether workload k has no replica listed but had
// replicas that were dropped without their agent removing them (or that
// are held only for an agent disconnected past Expiry): such an absence is
// not a workload with no load.
func (s *Store) LostReplicas(k Key) (Lost, bool) {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lostReplicas(k, now)
}

// lostReplicas is LostReplicas with mu held.
func (s *Store) lostReplicas(k Key, now time.Time) (Lost, bool) {
	l, ok := s.lost[k]
	for _, p := range s.workloads[k] {
		if p.Demand {
			continue
		}
		if !s.expired(p, now) {
			return Lost{}, false // a replica is listed
		}
		if !countsLost(p) {
			continue
		}
		l.Pods++
		if l.At.IsZero() {
			l.At = now
		}
		ok = true
	}
	if !ok {
		// None listed, none dropped here, and the API has replicas of k on
		// nodes whose agents are lost (unseen: an aggregator started while
		// they were): a workload serving unseen, not one with no load.
		for _, u := range s.stillThere(k, nil, now) {
			l.Pods++
			if l.At.IsZero() || u.at.Before(l.At) {
				l.At = u.at
			}
			ok = true
		}
	}
	return l, ok
}

func (s *Store) expiredSource(src *source, now time.Time) bool {
	return src.open == 0 && now.Sub(src.closedAt) > s.opts.Expiry
}

// expired reports whether, under every node that lists p, the streams that
// listed it have all been closed for longer than Expiry (the node's, or
// those that listed it while the node has others open); mu must be held.
func (s *Store) expired(p *pod, now time.Time) bool {
	for node := range p.nodes() {
		src := s.sources[node]
		if src == nil {
			return false
		}
		if s.expiredSource(src, now) {
			continue
		}
		if at, ok := src.orphans[p.UID]; !ok || !s.orphanExpired(at, now) {
			return false
		}
	}
	return p.sources() > 0
}

// sources is the number of nodes that list p.
func (p *pod) sources() int {
	if !p.sourced {
		return 0
	}
	return 1 + len(p.get().moreSources)
}

// nodes yields the nodes that list p: its source first.
func (p *pod) nodes() iter.Seq[string] {
	return func(yield func(string) bool) {
		if !p.sourced || !yield(p.source) {
			return
		}
		for _, n := range p.get().moreSources {
			if !yield(n) {
				return
			}
		}
	}
}

// addSource records that node lists p (once).
func (p *pod) addSource(node string) {
	switch {
	case !p.sourced:
		p.source, p.sourced = node, true
	case p.source != node && !slices.Contains(p.get().moreSources, node):
		rr := p.set()
		rr.moreSources = append(rr.moreSources, node)
	}
}

// dropSource records that node no longer lists p.
func (p *pod) dropSource(node string) {
	if !p.sourced {
		return
	}
	if p.source != node {
		if rr := p.rare; rr != nil {
			rr.moreSources = without(rr.moreSources, node)
		}
		return
	}
	if rr := p.rare; rr != nil && len(rr.moreSources) > 0 {
		p.source, rr.moreSources = rr.moreSources[0], rr.moreSources[1:]
		if len(rr.moreSources) == 0 {
			rr.moreSources = nil
		}
		return
	}
	p.source, p.sourced = "", false
}

func without(list []string, v string) []string {
	for i, x := range list {
		if x == v {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}

// Refused is the number of times a new pod was refused for room: MaxPods
// or its namespace's MaxPodsPerNamespace reached, or its namespace's share
// while another below a share waits (roomIn).
func (s *Store) Refused() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.refused
}

// OnChange has fn called with each workload that changes (a sample of one
// of its pods, or a pod joining, leaving or changing), as the change is
// stored. fn runs under the store's write lock: it must return at once and
// must not call the store. Calling OnChange again replaces fn.
func (s *Store) OnChange(fn func(Key)) { s.changed.Store(&fn) }

// notify tells OnChange's function of p's workloads; mu must be held for
// writing.
func (s *Store) notify(p *pod) {
	fn := s.changed.Load()
	if fn == nil {
		return
	}
	for _, k := range p.Workloads {
		(*fn)(k)
	}
}

// Upsert adds or updates pods listed by src. With full set, src no longer
// lists the pods it does not name; a pod no agent lists is removed. It
// returns the uids of the new pods it refused for room (see
// Options.MaxPods, Options.MaxPodsPerNamespace): a refused pod is not
// held; listing it again adds it once there is room.
func (s *Store) Upsert(src Source, pods []PodInfo, full bool) (refused []string) {
	refused, _ = s.UpsertStream(src, pods, full)
	return refused
}

// UpsertStream is Upsert, but for a src.Stream superseded (a stream of
// the node opened after it has listed the node in full): ErrSuperseded,
// and nothing is taken. A full listing makes the streams of the node
// opened before src.Stream superseded.
func (s *Store) UpsertStream(src Source, pods []PodInfo, full bool) (refused []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from := s.sources[src.Node]; from.superseded(src.Stream) {
		return nil, ErrSuperseded
	} else if full && src.Stream != 0 && from != nil {
		from.fullGen = max(from.fullGen, from.gen(src.Stream))
	}
	s.sweep(s.now(), false) // first: the room of pods expired is free
	listed := make(map[string]bool, len(pods))
	for _, info := range pods {
		listed[info.UID] = true
	}
	if full {
		// Before the new pods are admitted: the room of those the node no
		// longer runs is theirs (a node's pods replaced, its first full
		// listing after a reconnect was refused the room it frees, and
		// its workloads were answered as waiting for room for a minute).
		for uid, l := range s.listed[src.Node] {
			if !listed[uid] {
				s.unlist(uid, l.p, src.Node, false)
			}
		}
	}
	for _, info := range pods {
		if !s.upsertOne(src, info) {
			refused = append(refused, info.UID)
		}
	}
	if full {
		// The node's agent says in full what runs there: what it lost
		// and does not list now is gone from the node.
		s.forgetUnseenOn(src.Node)
	}
	return refused, nil
}

// roomIn says whether namespace ns may hold one pod more (a new one, or
// one that moves in, which takes no new room): fewer than
// MaxPodsPerNamespace; and a new pod, room under MaxPods, and, once ns
// holds a share of it (MaxPods over one more than the namespaces holding
// pods), none of the others below a share waiting for room: room freed
// goes first to the namespaces holding least that wait for it. Two
// namespaces at their caps (half the room each, by default) took it all,
// and every other tenant's new replicas waited for as long as those were
// held; now they wait for the first room freed (no pod held is evicted
// for them). A pod (uid) refused for room, not for its namespace's cap,
// is recorded as waiting (nsWaiting) until it is admitted, for refusedFor
// at most. mu must be held.
func (s *Store) roomIn(ns, uid string, isNew bool) bool {
	have := s.nsPods[ns]
	switch {
	case have >= s.opts.MaxPodsPerNamespace:
		return false
	case !isNew:
		return true
	case len(s.pods) >= s.opts.MaxPods:
		if s.nsWaiting[ns] == nil {
			s.nsWaiting[ns] = map[string]time.Time{}
		}
		s.nsWaiting[ns][uid] = s.now()
		return false
	}
	share := s.opts.MaxPods / (len(s.nsPods) + 1)
	if have < share {
		return true
	}
	now := s.now()
	for w, uids := range s.nsWaiting {
		if w == ns || s.nsPods[w] >= share {
			continue
		}
		for _, at := range uids {
			if now.Sub(at) <= refusedFor {
				return false
			}
		}
	}
	return true
}

// upsertOne lists info's pod under src (UpsertStream); false when it is
// new and there is no room for it.
func (s *Store) upsertOne(src Source, info PodInfo) bool {
	info.Workloads = distinct(info.Workloads)
	p, ok := s.pods[info.UID]
	// A uid listed under another namespace (only an agent that is not
	// checked can) takes room there as a new pod would: it moved past
	// the namespace's cap.
	moves := ok && p.Namespace != info.Namespace
	if (!ok || moves) && !s.roomIn(info.Namespace, info.UID, !ok) {
		s.refused++
		for _, k := range info.Workloads {
			if s.refusedAt[k] == nil {
				s.refusedAt[k] = map[string]time.Time{}
			}
			s.refusedAt[k][info.UID] = s.now()
		}
		return false
	}
	s.admitted(info)
	g := s.group(p, info)
	if !ok {
		p = &pod{}
		s.pods[info.UID] = p
		s.countIn(info.Namespace, 1)
	} else {
		s.notify(p)
		s.unlink(p)
		if moves {
			s.countIn(p.Namespace, -1)
			s.countIn(info.Namespace, 1)
		}
	}
	p.take(info, g)
	if !ok {
		s.resumeUnseen(p)
	}
	p.markStart(info, !ok, s.now())
	p.markUnready(info, s.now())
	p.addSource(src.Node)
	s.list(src.Node, src.Stream, p)
	p.fromInstance(s.sources[src.Node].intern(src.Instance))
	if len(src.ExtraNames) > 0 || p.rare != nil {
		rr := p.set()
		switch {
		case len(src.ExtraNames) == 0:
			// Its agent forwards none now: none is kept (a nil a sample
			// was appended for ever).
			rr.extras = nil
		case !slices.Equal(rr.extraNames, src.ExtraNames):
			// The values held came by position, under the old names
			// (an agent rolled out with another --extra-metric list):
			// none is read under a new one.
			for i := range rr.extras {
				rr.extras[i] = nil
			}
		}
		rr.extraNames = src.ExtraNames
	}
	s.link(p)
	s.notify(p)
	return true
}

// group is the namespace and workloads of info (its workloads distinct)
// as p will hold them (p nil for a new pod): p's own group when they are
// unchanged, else the group of the first replica of its first workload
// when it is the same, else a new one whose namespace is the string of its
// first workload's key when the two are equal. The replicas of a workload
// hold one group among them, where each held its own namespace and list
// (a catalogue's entries are decoded into strings and lists of their own:
// tens of bytes a pod, in a store of tens of thousands). Call it before p
// is unlinked: p may be that first replica.
func (s *Store) group(p *pod, info PodInfo) *podGroup {
	same := func(g *podGroup) bool {
		return g != nil && g.Namespace == info.Namespace && slices.Equal(g.Workloads, info.Workloads)
	}
	if p != nil && same(p.podGroup) {
		return p.podGroup
	}
	ks := info.Workloads
	if len(ks) == 0 {
		return &podGroup{Namespace: info.Namespace}
	}
	if list := s.workloads[ks[0]]; len(list) > 0 && same(list[0].podGroup) {
		return list[0].podGroup
	}
	ns := info.Namespace
	if ks[0].Namespace == ns {
		ns = ks[0].Namespace
	}
	return &podGroup{Namespace: ns, Workloads: ks}
}

// distinct is ks with each key once, in its first place (ks itself when
// none is twice): a pod that named a workload twice (an agent not to be
// trusted) was, once its agent was lost, as many unseen replicas of it.
func distinct(ks []Key) []Key {
	for i := 1; i < len(ks); i++ {
		if slices.Contains(ks[:i], ks[i]) {
			out := slices.Clone(ks[:i])
			for _, k := range ks[i+1:] {
				if !slices.Contains(out, k) {
					out = append(out, k)
				}
			}
			return out
		}
	}
	return ks
}

// markStart records when a pod started (its creation, else its first
// listing not ready) and when it became ready (its Ready condition's
// transition, else its first listing ready): the first known of each.
func (p *pod) markStart(info PodInfo, first bool, now time.Time) {
	if p.Demand || p.Terminating {
		return
	}
	if p.startNs == 0 {
		switch {
		case info.CreatedMs > 0:
			p.startNs = time.UnixMilli(info.CreatedMs).UnixNano()
		case first && !p.Ready:
			p.startNs = now.UnixNano()
		}
	}
	if !p.Ready && p.readyNs == 0 && info.UnreadySinceMs > 0 {
		p.readyNs = -1 // ready before, at a time not told
	}
	if p.Ready && p.readyNs == 0 {
		switch {
		case info.ReadySinceMs > 0:
			p.readyNs = time.UnixMilli(info.ReadySinceMs).UnixNano()
			p.readyUnseen = first
		case first && info.CreatedMs > 0:
			// Ready at its first listing, created at a time the listing
			// gives but ready at one it does not: its startup is not
			// this store's clock less its creation.
			p.readyNs = -1
		default:
			p.readyNs = now.UnixNano()
		}
	}
}

// markUnready keeps when a pod ready before was first listed not ready,
// and forgets it once the pod is ready again.
func (p *pod) markUnready(info PodInfo, now time.Time) {
	switch {
	case p.Ready || p.Terminating || p.readyNs == 0:
		if p.rare != nil {
			p.rare.unreadyNs = 0
		}
	case p.get().unreadyNs == 0 && info.UnreadySinceMs > 0:
		p.set().unreadyNs = time.UnixMilli(info.UnreadySinceMs).UnixNano()
	case p.get().unreadyNs == 0:
		p.set().unreadyNs = now.UnixNano()
	}
}

// ListedOn is what the store holds of pod uid as node's agent listed it
// (false when node's agent does not list it), its times the store's own
// (pod.info: a listing's times are not held, what they gave is).
func (s *Store) ListedOn(node, uid string) (PodInfo, bool) {
	s.mu.RLock() // a read: each entry of a reconnecting node's catalogue asks
	defer s.mu.RUnlock()
	l, ok := s.listed[node][uid]
	if !ok {
		return PodInfo{}, false
	}
	info := l.p.info()
	info.Workloads = slices.Clone(info.Workloads)
	return info, true
}

// Remove records that node's agent no longer lists the pods uids; a pod that
// no agent lists any more is removed.
func (s *Store) Remove(node string, uids ...string) {
	_ = s.RemoveStream(node, 0, uids...)
}

// Gone records that the API no longer has pod uid of node as a pod that
// runs (deleted, or finished): it and its demand entries (a router's) are
// unlisted from every node that lists them, as when their agents remove
// them, and samples a stream still sends for them are dropped (no pod of
// theirs is held). A stream that listed it held it until it ended, with
// what it sent.
func (s *Store) Gone(node, uid string) {
	// Asked of every pod that ends in the cluster (a Job's too): the write
	// lock only for one the store holds.
	s.mu.RLock()
	held := len(s.goneLocked(node, uid)) > 0
	waits := s.refusedLocked(uid, true)
	s.mu.RUnlock()
	if !held && !waits {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetRefusedLocked(uid, true)
	for _, u := range s.goneLocked(node, uid) {
		p := s.pods[u]
		for _, n := range slices.Collect(p.nodes()) {
			s.unlist(u, p, n, false)
		}
	}
}

// goneLocked is the uids of what the store holds of pod uid of node: the
// pod, and its demand entries; mu must be held.
func (s *Store) goneLocked(node, uid string) []string {
	var gone []string
	if _, ok := s.pods[uid]; ok {
		gone = append(gone, uid)
	}
	for u := range s.listed[node] {
		if pod, ok := DemandPodUID(u); ok && pod == uid && s.pods[u] != nil {
			gone = append(gone, u)
		}
	}
	return gone
}

// RemoveStream is Remove from node's stream st: ErrSuperseded, and nothing
// removed, when st is superseded (UpsertStream).
func (s *Store) RemoveStream(node string, st Stream, uids ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sources[node].superseded(st) {
		return ErrSuperseded
	}
	for _, uid := range uids {
		if p, ok := s.pods[uid]; ok {
			s.unlist(uid, p, node, false)
		} else {
			s.forgetRefusedLocked(uid, false) // refused for room: it waits no more
		}
	}
	return nil
}

// refusedLocked says whether pod uid, refused for room, is recorded as
// waiting for it or as its workload's refusal (with routers, also any
// demand entry of a router pod of that uid); mu must be held. Both are
// empty while the store has room.
func (s *Store) refusedLocked(uid string, routers bool) bool {
	refused := func(uids map[string]time.Time) bool {
		for u := range uids {
			if refusedAs(u, uid, routers) {
				return true
			}
		}
		return false
	}
	for _, uids := range s.nsWaiting {
		if refused(uids) {
			return true
		}
	}
	for _, uids := range s.refusedAt {
		if refused(uids) {
			return true
		}
	}
	return false
}

// refusedAs says whether a refusal of entry u is one of pod uid's: the
// pod's, or with routers a demand entry of a router pod of that uid.
func refusedAs(u, uid string, routers bool) bool {
	if u == uid {
		return true
	}
	pod, demand := DemandPodUID(u)
	return routers && demand && pod == uid
}

// forgetRefusedLocked forgets pod uid's refusals for room (with routers, a
// router pod's demand entries' too): deleted (Gone) or unlisted by its
// agent, it waits no more. Kept, it was counted as waiting for refusedFor
// (a minute): room freed meanwhile was refused to every namespace at its
// share, whose workloads read RefusedAt (every trigger Unavailable),
// though no pod waited for it. mu must be held for writing.
func (s *Store) forgetRefusedLocked(uid string, routers bool) {
	// The pod's own refusal is one key of each map; only a router's
	// demand entries need each map walked.
	forget := func(uids map[string]time.Time) {
		if routers {
			maps.DeleteFunc(uids, func(u string, _ time.Time) bool { return refusedAs(u, uid, true) })
		} else {
			delete(uids, uid)
		}
	}
	for ns, uids := range s.nsWaiting {
		if forget(uids); len(uids) == 0 {
			delete(s.nsWaiting, ns)
		}
	}
	for k, uids := range s.refusedAt {
		if forget(uids); len(uids) == 0 {
			delete(s.refusedAt, k)
		}
	}
}

// list records that node's stream st lists p; mu must be held for
// writing. A stream already closed (its token expired while it listed)
// lists nothing: the pod is held as its closed streams' are.
func (s *Store) list(node string, st Stream, p *pod) {
	m := s.listed[node]
	if m == nil {
		m = make(map[string]listing)
		s.listed[node] = m
	}
	src := s.sources[node]
	l := listing{p: p, by: m[p.UID].by}
	if st == 0 || src != nil && src.open&(1<<st) != 0 {
		l.by |= 1 << st
	}
	m[p.UID] = l
	switch {
	case src == nil:
	case l.by == 0:
		src.orphan(p.UID, s.now())
	case src.orphans != nil:
		s.unorphan(src, p.UID)
	}
}

// unorphan: src's pod uid is listed again, or no longer; mu must be held
// for writing.
func (s *Store) unorphan(src *source, uid string) {
	if delete(src.orphans, uid); len(src.orphans) == 0 {
		src.orphans = nil
	}
}

// unlist takes node off p's list; lost: its node's streams that listed it
// expired. mu must be held for writing.
func (s *Store) unlist(uid string, p *pod, node string, lost bool) {
	p.dropSource(node)
	if m := s.listed[node]; m != nil {
		delete(m, uid)
		if len(m) == 0 {
			delete(s.listed, node)
		}
	}
	if src := s.sources[node]; src != nil && src.orphans != nil {
		s.unorphan(src, uid)
	}
	if p.sources() == 0 {
		lostOn := ""
		if lost {
			lostOn = node
		}
		s.drop(uid, p, lostOn)
	}
}

func (s *Store) link(p *pod) {
	if !p.Demand {
		s.seenAgain(p)
	}
	for _, k := range p.Workloads {
		if !p.Demand {
			delete(s.lost, k) // a replica is listed again
		}
		list := s.workloads[k]
		i, found := slices.BinarySearchFunc(list, p.UID, func(x *pod, uid string) int { return strings.Compare(x.UID, uid) })
		if found {
			list[i] = p
			continue
		}
		s.workloads[k] = slices.Insert(list, i, p)
	}
}

func (s *Store) unlink(p *pod) {
	for _, k := range p.Workloads {
		list := s.workloads[k]
		i, found := slices.BinarySearchFunc(list, p.UID, func(x *pod, uid string) int { return strings.Compare(x.UID, uid) })
		if !found {
			continue
		}
		if list = slices.Delete(list, i, i+1); len(list) == 0 {
			delete(s.workloads, k)
		} else {
			s.workloads[k] = list
		}
	}
}

// Report is one pod's sample, by uid.
type Report struct {
	UID string
	Sample
}

// Add records samples; samples of pods not in the catalogue are dropped and
// counted in the return value.
func (s *Store) Add(reports []Report) (dropped int) {
	dropped, _ = s.AddStream("", 0, reports)
	return dropped
}

// AddStream is Add from node's stream st: ErrSuperseded, and nothing
// taken, when st is superseded (UpsertStream): its samples are older than
// the newer stream's, and of the agent process the pods no longer
// continue.
func (s *Store) AddStream(node string, st Stream, reports []Report) (dropped int, err error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st != 0 && s.sources[node].superseded(st) {
		return 0, ErrSuperseded
	}
	for i := range reports {
		r := &reports[i]
		p, ok := s.pods[r.UID]
		if !ok {
			dropped++
			continue
		}
		if r.Missing != "" {
			p.set().missing, p.set().errText = r.Missing, r.Error
			s.notify(p)
			continue
		}
		// The histograms the newest sample has: its agent left out of
		// this one those unchanged since it sent them.
		var carried *metric.Histograms
		if p.series.len() > 0 {
			carried = p.series.lastHist()
		}
		if p.series.len() > 0 && r.TimeMs <= p.series.lastMs() {
			if far := p.series.lastMs()-r.TimeMs > stepBack.Milliseconds(); !far || !p.behind {
				// Out of order or repeated: dropped, keeping the series
				// monotonic in time. Far behind, it is remembered: one
				// sample is not a clock step (two agents listing the pod
				// with clocks apart alternate).
				p.behind = far
				p.holdHist(r.Hist, node)
				continue
			}
			// A second sample in a row far behind: its agent's clock
			// stepped back (chrony, a VM resumed), and every sample would
			// be held out until the clock passed the last one again, the
			// pod stale meanwhile. Its series starts again (no window
			// reaches across the step; no increase is counted across it).
			// The histograms are carried over: the same agent's encoder
			// does not send again those it sent before the step, and a
			// pod whose histograms did not change had none after it
			// (its workload's quantile triggers Unavailable, as with no
			// agent forwarding them) until they did.
			p.restart()
		}
		p.behind = false
		smp := metric.Sample{TimeMs: r.TimeMs, Values: r.Values}
		if r.Hist != nil {
			h := *r.Hist // adjusted below: the reporter's copy is left as it was
			smp.Hist = &h
		}
		p.unholdHist(&smp)
		p.mono.AdjustSample(&smp)
		if carried != nil {
			smp.Hist = metric.Complete(smp.Hist, carried)
		}
		p.series.add(smp)
		if r.Extra != nil || p.get().extras != nil {
			// extras stays nil until a pod forwards any; then it runs
			// parallel to series.
			rr := p.set()
			for len(rr.extras) < p.series.len()-1 {
				rr.extras = append(rr.extras, nil)
			}
			rr.extras = append(rr.extras, r.Extra)
		}
		p.trim(s.opts)
		p.seen = s.stamp(now)
		if r.Rejected != "" || p.rare != nil {
			rr := p.set()
			rr.missing, rr.errText, rr.rejected = "", "", r.Rejected
		}
		s.notify(p)
	}
	return dropped, nil
}

// holdHist keeps the histograms of a sample dropped as out of order, when
// the pod's one agent (node's) sent it: that agent sends a histogram only
// when it changed, so one dropped here is not sent again, and the store
// carried the pod's older histogram on (a clock step's first sample
// behind is dropped, and its changes were lost) until it changed again.
// The pod's next sample taken carries them (unholdHist). A pod two agents
// list is left as it was: one's sample behind may be older than the
// other's, and its counts lower.
func (p *pod) holdHist(h *metric.Histograms, node string) {
	if !h.Any() || p.sources() != 1 || p.source != node {
		return
	}
	c := *h       // the reporter's copy is left as it was
	rr := p.set() // before p.rare is read: Go leaves the order of the two open
	rr.heldHist = metric.Complete(&c, rr.heldHist)
}

// unholdHist completes smp, the pod's next sample taken, with the
// histograms held for it (holdHist) that it lacks.
func (p *pod) unholdHist(smp *metric.Sample) {
	if rr := p.rare; rr != nil && rr.heldHist != nil {
		smp.Hist = metric.Complete(smp.Hist, rr.heldHist)
		rr.heldHist = nil
	}
}

// fromInstance records that the agent process instance lists p. Another
// process than the one before: its cumulative values do not continue the
// series, which starts again at its first sample. Rebased alone (no
// increase counted across the change), a rate still divided by the time
// across it: 50 tokens/s read 10/s for a window after an agent down 8 s,
// and 0 past a window. Until its first sample the pod has none (not fresh
// with no data: a router read as holding nothing, a replica as no work).
func (p *pod) fromInstance(instance *string) {
	if p.instance != nil && *p.instance != "" && *p.instance != *instance {
		p.restart()
		p.seen = 0
		if p.rare != nil {
			p.rare.heldHist = nil // the old process's
		}
	}
	p.instance = instance
}

// stepBack is how far behind a pod's last sample a sample may be and still
// be taken as out of order (dropped): two in a row further behind, its
// agent's clock stepped back, and the pod's series starts again.
const stepBack = 5 * time.Second

// restart empties p's series, as at its first sample; mu must be held for
// writing.
func (p *pod) restart() {
	p.series = series{}
	p.mono.Rebase()
	if rr := p.rare; rr != nil {
		rr.extras, rr.capCutMs = nil, 0
	}
}

// trim drops samples older than the retention (keeping one before it, so a
// rate over the full retention has its start) and beyond MaxSamples, once
// two have expired: a series holds its retention and one or two samples
// more. (It waited for an eighth of it, at least 4 samples, and held that
// much more: a sixth of the store's series at a 10 s window. Each append
// dropping the one that expired cost the append 40 % more.) Readers pick
// their window from the end. Whether two have expired reads the three
// oldest samples' times alone.
func (p *pod) trim(o Options) {
	n := p.series.len()
	from := p.series.lastMs() - o.Retention.Milliseconds()
	size, limit := p.series.size(), podBytes*o.MaxSamples
	big := size > limit
	if n <= o.MaxSamples && !big && !p.series.expired(from, 2) {
		return
	}
	sc := getScratch()
	defer putScratch(sc)
	all := sc.samples(p, 0)
	cut := sort.Search(n, func(i int) bool { return all[i].TimeMs > from })
	if cut > 0 {
		cut-- // keep the sample just before the retention
	}
	if over := n - o.MaxSamples; over > cut {
		p.set().capCutMs = all[over-1].TimeMs
		cut = over
	}
	if big {
		// A page whose values and histogram bounds change at every sample
		// costs ten times an honest one's: the pod keeps the newest
		// samples that fit three quarters of its bound (its windows
		// shorter, not marked: an honest page never comes near it, and
		// its own workload's answers go on over what is kept rather than
		// fail), so that one tenant's pages cannot grow the store every
		// tenant shares past its sizing.
		keep := max(2, int(int64(n)*int64(limit)*3/4/int64(size)))
		cut = max(cut, n-keep)
	}
	if cut == 0 {
		return
	}
	p.series.drop(cut)
	if rr := p.rare; rr != nil && len(rr.extras) >= cut {
		// Moved down, the tail cleared (it held the dropped samples'
		// values), and given back where most of its room is unused, as
		// the series' buffer is: kept at its peak, a pod's extras held
		// thousands of old slices after its window shrank.
		n := copy(rr.extras, rr.extras[cut:])
		clear(rr.extras[n:])
		rr.extras = rr.extras[:n]
		if cap(rr.extras) > 2*n+16 {
			rr.extras = slices.Clone(rr.extras)
		}
	}
}

// podBytes × MaxSamples bounds one pod's series (48 KiB at the default
// --max-samples-per-pod): several times the most an honest page's sample
// takes with histograms (docs/performance.md, "The store's memory").
const podBytes = 384

// window returns the samples of the last d on the pod's own clock (d == 0:
// all), with the metrics in want decoded, into sc. For rates and ratios it includes the sample just
// before the window, so that the increase covers the whole window.
func (p *pod) window(sc *scratch, d time.Duration, rule metric.Rule, want uint64) []metric.Sample {
	all := sc.samples(p, want)
	if d <= 0 || len(all) == 0 {
		return all
	}
	from := all[len(all)-1].TimeMs - d.Milliseconds()
	i := sort.Search(len(all), func(i int) bool { return all[i].TimeMs > from })
	if i > 0 && !rule.Gauge() {
		i--
	}
	return all[i:]
}

// SetRetention sets the longest window a reader may ask for: each pod's
// samples older than that (but the one just before) go at its next
// samples. A longer retention keeps more from then on; what was dropped
// is not recovered.
func (s *Store) SetRetention(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Retention = d
}

// Retention is the longest window a reader may ask for now.
func (s *Store) Retention() time.Duration {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.opts.Retention
}

// Pods returns the number of pods held.
func (s *Store) Pods() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.pods)
}

// ExtraNames returns the raw names of the gauges the agents forward
// (--extra-metric) for the pods held, sorted, and the number of pods held.
func (s *Store) ExtraNames() (names []string, pods int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	seen := map[string]bool{}
	for _, p := range s.pods {
		for _, n := range p.get().extraNames {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	return names, len(s.pods)
}
