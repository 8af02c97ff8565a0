package ingest

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/store"
)

// NodeClaim is where a pod-bound ServiceAccount token's TokenReview says
// which node the pod runs on, and PodClaim which pod it is bound to.
const (
	NodeClaim   = "authentication.kubernetes.io/node-name"
	PodClaim    = "authentication.kubernetes.io/pod-name"
	PodUIDClaim = "authentication.kubernetes.io/pod-uid"
)

// Bounds of the token reviews: at most maxReviews in flight (a stream
// waits reviewWait for a turn, then is refused Unavailable, and its agent
// retries), and maxCachedTokens answers kept. Every stream opening with a
// token not cached costs a TokenReview on the aggregator's one API client,
// whose rate limit its Lease renewals and pod lookups share: made-up
// tokens once queued there without bound.
const (
	maxReviews      = 8
	reviewWait      = 2 * time.Second
	maxCachedTokens = 16384
	tokenCacheFor   = time.Minute
)

// ErrBusy: too many token reviews are in flight; the agent retries.
var ErrBusy = errors.New("too many agent token reviews in flight: try again")

// Agent is what a reviewed token says of its holder: the node its pod runs
// on, and the pod: its uid ("" where the review names none; AgentGone reads
// it), and, for what is said of it, its namespace (its service account's)
// and name.
type Agent struct {
	Node, PodUID, PodNamespace, PodName string
}

// Pod is the agent's pod as namespace/name.
func (a Agent) Pod() string { return a.PodNamespace + "/" + a.PodName }

// Authenticator decides which node an agent stream may speak for.
type Authenticator interface {
	// Authenticate returns the node and pod the bearer token is bound to.
	Authenticate(ctx context.Context, token string) (Agent, error)
	// PodNode returns the node the API says an entry's pod runs on, or
	// ErrClaim when the pod does not allow the entry's uid and workloads.
	PodNode(ctx context.Context, e Entry) (string, error)
}

// TokenReviewer authenticates agents by their projected ServiceAccount
// token: TokenReview with the pulse audience, one of the allowed service
// accounts, and the node of the pod the token is bound to.
type TokenReviewer struct {
	client   kubernetes.Interface
	audience string
	allowed  []string // system:serviceaccount:NS:NAME

	mu     sync.Mutex
	tokens map[[32]byte]review // by token hash, for a minute at most
	turns  chan struct{}       // a token review's turn (maxReviews)
	wait   time.Duration       // how long a stream waits for a turn
	pods   *lru.Cache[string, podIdentity]
	misses *rate.Limiter // GETs of pods the pod cache does not hold
	// nodeMisses: each node's share of misses (nodeRate, nodeBurst), so
	// that one node listing made-up pods cannot take every node's GETs.
	nodeMisses *lru.Cache[string, *rate.Limiter]
	nodeRate   rate.Limit
	nodeBurst  int
	sync       time.Duration // how long a lookup waits for the pod cache
	// reviewFor bounds a token review (reviewTimeout): one of the
	// maxReviews turns held by a hung API connection was held past the
	// agent's giving up, each new stream of every node waiting for it.
	reviewFor time.Duration
	// podInformer caches every scheduled pod's node, so that an
	// aggregator's restart with thousands of catalogued pods costs one
	// LIST, not a GET per pod at the client's rate limit.
	podInformer cache.SharedIndexInformer
	// gone: OnGone's function (nil: none); goneUIDs: the uids of the
	// pods it was told of, newest kept (Gone).
	gone     atomic.Pointer[func(node, uid string)]
	goneUIDs *lru.Cache[string, struct{}]
	// goneAgents: the uids of the agents' pods (of an allowed service
	// account) the pod cache saw deleted or finished, newest kept apart
	// from goneUIDs, so that the cluster's other pods (a batch cluster's
	// Jobs) do not push them out within a token's life (AgentGone).
	goneAgents *lru.Cache[string, struct{}]
	// deleting: the agents' pods the pod cache has with a deletion
	// timestamp, by uid, until they are deleted (AgentGone; at most the
	// agents' pods, one a node).
	deletingMu sync.RWMutex
	deleting   map[string]time.Time
}

type review struct {
	agent   Agent
	err     error
	expires time.Time
}

var (
	_ Authenticator   = (*TokenReviewer)(nil)
	_ goneTeller      = (*TokenReviewer)(nil)
	_ agentGoneTeller = (*TokenReviewer)(nil)
)

// NewTokenReviewer accepts tokens for audience from the given service
// accounts ("namespace/name").
func NewTokenReviewer(client kubernetes.Interface, audience string, serviceAccounts []string) (*TokenReviewer, error) {
	t := &TokenReviewer{client: client, audience: audience, tokens: map[[32]byte]review{}, turns: make(chan struct{}, maxReviews), wait: reviewWait,
		deleting: map[string]time.Time{},
		misses:   rate.NewLimiter(missRate, missBurst), nodeRate: nodeMissRate, nodeBurst: nodeMissBurst, sync: podCacheWait,
		reviewFor: reviewTimeout}
	for _, sa := range serviceAccounts {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("agent service account %q: want namespace/name", sa)
		}
		t.allowed = append(t.allowed, "system:serviceaccount:"+ns+":"+name)
	}
	var err error
	if t.pods, err = lru.New[string, podIdentity](65536); err != nil {
		return nil, err
	}
	if t.nodeMisses, err = lru.New[string, *rate.Limiter](maxNodeLimiters); err != nil {
		return nil, err
	}
	if t.goneUIDs, err = lru.New[string, struct{}](maxGone); err != nil {
		return nil, err
	}
	if t.goneAgents, err = lru.New[string, struct{}](maxGoneAgents); err != nil {
		return nil, err
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	}))
	t.podInformer = f.Core().V1().Pods().Informer()
	// Keep only what PodNode reads, its node and what discovery.Claims
	// reads (bounded), whether it is being deleted or has finished
	// (PodExists), and its creation and Ready condition (Replicas): a pod
	// is mostly spec and status.
	if err := t.podInformer.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return t.keep(p), nil
		}
		return obj, nil
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	if err := t.podInformer.AddIndexers(cache.Indexers{byWorkload: workloadIndex, byAgentNode: agentNodeIndex}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	// A pod deleted is forgotten by uid too: what the API said of it
	// (t.pods, for a pod the cache does not hold yet) vouched for it
	// again within claimsFor of its last listing, and a new stream of its
	// node listing it was held, with its samples, for the stream's life.
	// A pod deleted or finished is told to OnGone's function: the stream
	// that listed it still held it, with the samples it sent, for its life.
	if _, err := t.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				t.noteAgent(p)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				t.pods.Remove(string(p.UID))
				t.tellGone(p)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, _ := old.(*corev1.Pod)
			if p, ok := cur.(*corev1.Pod); ok {
				t.updated(o, p)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	return t, nil
}

// updated tells OnGone's function of a pod the pod cache saw finish, and
// of one deleted and made again under its name within a watch's gap (the
// relist tells it as an update from the old uid to the new).
func (t *TokenReviewer) updated(o, p *corev1.Pod) {
	if o != nil && o.UID != p.UID {
		t.pods.Remove(string(o.UID))
		t.tellGone(o)
		o = nil
	}
	if finished(p) {
		if o == nil || !finished(o) {
			t.tellGone(p)
		}
		return // gone: no deletion to note
	}
	t.noteAgent(p)
}

// noteAgent notes, of an agent's pod, that it has finished (one finished
// when the pod cache first lists it was never seen to finish) or when it
// is to be deleted, for AgentGone.
func (t *TokenReviewer) noteAgent(p *corev1.Pod) {
	if !agentPod(p) {
		return
	}
	if finished(p) {
		t.goneAgents.Add(string(p.UID), struct{}{})
	}
	if p.DeletionTimestamp != nil {
		t.deletingMu.Lock()
		t.deleting[string(p.UID)] = p.DeletionTimestamp.Time
		t.deletingMu.Unlock()
	}
}

// OnGone sets the function told of each pod the API deletes or that
// finishes (Failed or Succeeded: evicted, or its containers done), by its
// node and uid, so that what its node's stream listed of it is dropped: a
// node's stream that listed it held it, with whatever it sent for it (a
// compromised node: made-up load on another tenant's workload), until the
// stream ended.
func (t *TokenReviewer) OnGone(f func(node, uid string)) { t.gone.Store(&f) }

func (t *TokenReviewer) tellGone(p *corev1.Pod) {
	t.goneUIDs.Add(string(p.UID), struct{}{})
	if agentPod(p) {
		t.goneAgents.Add(string(p.UID), struct{}{})
		t.deletingMu.Lock()
		delete(t.deleting, string(p.UID))
		t.deletingMu.Unlock()
	}
	if f := t.gone.Load(); f != nil && p.Spec.NodeName != "" {
		(*f)(p.Spec.NodeName, string(p.UID))
	}
}

// Gone says that the API has deleted pod uid, or that it finished, as the
// pod cache saw it (the newest maxGone so seen): a stream's entry looked
// up before, not yet held (waiting for room, or its catalogue still being
// looked up when the store let it go), is not held after.
func (t *TokenReviewer) Gone(uid string) bool { return t.goneUIDs.Contains(uid) }

// maxGone bounds the uids of pods gone that Gone remembers: a stream lists
// its entries waiting for room again at each batch (a second), and a
// catalogue is looked up within seconds, so the newest suffice, whatever
// the cluster's Jobs finish meanwhile.
const maxGone = 65536

// AgentGone says that the agent's pod a token review named (Agent) is
// gone as the API server's own review of its token would say, or more: the
// pod cache saw it deleted, or finished (Failed or Succeeded: no agent runs
// in it), or it has been past its deletion timestamp (the delete's grace
// period) for longer than the API honours its tokens after
// (deletedPodTokenGrace). A stream opened with its token ends at its next
// message, and a review of that token kept is not believed again. A token
// copied from an agent's pod (a compromised node's) kept its stream
// reporting that node's pods for as long as the token lived (an hour), and
// opened new streams within the minute its review was kept, past the
// pod's deletion. What it reads is kept by the pod cache's handlers
// (noteAgent, tellGone): every message of every stream asks, and the pod
// cache's own store is locked whole while a relist replaces it.
func (t *TokenReviewer) AgentGone(a Agent) bool {
	if a.PodUID == "" {
		return false
	}
	if t.goneAgents.Contains(a.PodUID) {
		return true
	}
	t.deletingMu.RLock()
	at, ok := t.deleting[a.PodUID]
	t.deletingMu.RUnlock()
	return ok && time.Since(at) > deletedPodTokenGrace
}

// deletedPodTokenGrace is how long past a pod's deletion timestamp the API
// server still authenticates its tokens (k8s.io/kubernetes
// pkg/serviceaccount/claims.go: go-jose's jwt.DefaultLeeway): an honest
// agent's pod is gone by then.
const deletedPodTokenGrace = time.Minute

// maxGoneAgents bounds the agents' pods gone that AgentGone remembers: a
// token lives an hour, and a cluster deletes at most a few DaemonSet
// rollouts' agents within one.
const maxGoneAgents = 65536

// finished says p has ended: Failed or Succeeded.
func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// keep is what the pod cache keeps of p: its node and what
// discovery.Claims reads (bounded; PodNode), whether it is being deleted
// or has finished (PodExists), its creation, its Ready condition and
// whether it is left out of scraping (pulse.io/scrape: "false"), and the
// service account of an agent's pod (Replicas): a pod is mostly spec and
// status.
func (t *TokenReviewer) keep(p *corev1.Pod) *corev1.Pod {
	m := discovery.ClaimsMeta(p)
	m.DeletionTimestamp, m.CreationTimestamp = p.DeletionTimestamp, p.CreationTimestamp
	if p.Annotations[discovery.AnnotationScrape] == "false" {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[discovery.AnnotationScrape] = "false"
	}
	spec := corev1.PodSpec{NodeName: p.Spec.NodeName}
	if slices.Contains(t.allowed, "system:serviceaccount:"+p.Namespace+":"+p.Spec.ServiceAccountName) {
		spec.ServiceAccountName = p.Spec.ServiceAccountName
	}
	kept := &corev1.Pod{ObjectMeta: m, Spec: spec, Status: corev1.PodStatus{Phase: p.Status.Phase}}
	// The Ready condition only of a pod that claims a workload (Replicas
	// reads no other's): a cache of every pod of the cluster.
	if ws, _ := workloadIndex(kept); len(ws) > 0 {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				kept.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			}
		}
	}
	return kept
}

// byWorkload indexes the pod cache by the workloads a model server's pod
// claims (workloadKey), and byAgentNode the agents' pods (of an allowed
// service account, the only pods keep leaves one) by their node:
// Replicas' lookups.
const (
	byWorkload  = "workload"
	byAgentNode = "agent-node"
)

// agentPod says the pod cache's p is an agent's: keep leaves a service
// account on the pods of an allowed one alone.
func agentPod(p *corev1.Pod) bool { return p.Spec.ServiceAccountName != "" }

// agentNodeIndex is byAgentNode's index function.
func agentNodeIndex(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok && agentPod(p) {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

// agentOn is whether the pod cache has an agent's pod on node, not being
// deleted nor finished: an agent that runs there, or should, and does
// not stream is lost; a node with none has no agent to lose.
func (t *TokenReviewer) agentOn(node string) bool {
	objs, _ := t.podInformer.GetIndexer().ByIndex(byAgentNode, node)
	for _, obj := range objs {
		if p, ok := obj.(*corev1.Pod); ok && p.DeletionTimestamp == nil &&
			p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			return true
		}
	}
	return false
}

// workloadIndex is byWorkload's index function: the keys of the workloads
// the pod's labels, annotations or owners give it; none for a demand
// source (a router is no replica) or a pod whose claims are not valid.
func workloadIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || discovery.IsDemandSource(p.Annotations) || p.Annotations[discovery.AnnotationScrape] == "false" {
		return nil, nil
	}
	var keys []string
	for _, w := range discovery.Claims(p)[string(p.UID)] {
		if kind, ok := kinds[w.Kind]; ok {
			keys = append(keys, workloadKey(store.Key{Namespace: p.Namespace, Kind: kind, Name: w.Name}))
		}
	}
	return keys, nil
}

// workloadKey is k's byWorkload key.
func workloadKey(k store.Key) string { return k.Namespace + "/" + k.Kind + "/" + k.Name }

// Run keeps the pod cache until ctx ends.
func (t *TokenReviewer) Run(ctx context.Context) { t.podInformer.Run(ctx.Done()) }

// PodExists reports whether the API has the pod namespace/name of that uid
// as a replica of workload k, as the pod cache last saw it: not being
// deleted, not finished (Failed or Succeeded: its ReplicaSet has replaced
// it, and the HPA does not count it), and giving k by its labels,
// annotations or owners (a pod relabelled out of k is no replica of it).
// Before the cache has synced it says true: the store asks it whether a
// replica whose agent is lost may serve on, and keeping one a moment too
// long holds a scale-down back, where dropping it scales a serving
// workload down.
func (t *TokenReviewer) PodExists(namespace, name, uid string, k store.Key) bool {
	if !t.podInformer.HasSynced() {
		return true
	}
	obj, ok, _ := t.podInformer.GetStore().GetByKey(namespace + "/" + name)
	p, isPod := obj.(*corev1.Pod)
	return ok && isPod && string(p.UID) == uid && replicaOf(p, k)
}

// replicaOf is whether the cached pod p is a replica of workload k: not
// being deleted, not finished, not left out of scraping, in k's namespace
// and claiming k.
func replicaOf(p *corev1.Pod, k store.Key) bool {
	if p.DeletionTimestamp != nil || finished(p) ||
		k.Namespace != p.Namespace || discovery.IsDemandSource(p.Annotations) || p.Annotations[discovery.AnnotationScrape] == "false" {
		return false
	}
	for _, w := range discovery.Claims(p)[string(p.UID)] {
		if kinds[w.Kind] == k.Kind && w.Name == k.Name {
			return true
		}
	}
	return false
}

// Replicas is the API's replicas of workload k as the pod cache last saw
// them (each one PodExists says true of) on the nodes on says true of that
// run an agent's pod (agentOn: a node with no agent at all is not one
// whose agent is lost), with their nodes, the oldest first; false before
// the cache has synced (the store adopts them as unseen where no agent
// reports their node, and forgets those it no longer gives: what the
// cache does not know yet is not an answer).
func (t *TokenReviewer) Replicas(k store.Key, on func(node string) bool) ([]store.APIPod, bool) {
	if !t.podInformer.HasSynced() {
		return nil, false
	}
	objs, err := t.podInformer.GetIndexer().ByIndex(byWorkload, workloadKey(k))
	if err != nil {
		return nil, false
	}
	var out []store.APIPod
	for _, obj := range objs {
		p, ok := obj.(*corev1.Pod)
		if !ok || !on(p.Spec.NodeName) || !replicaOf(p, k) || !t.agentOn(p.Spec.NodeName) {
			continue
		}
		r := store.APIPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Node: p.Spec.NodeName, Ready: discovery.Ready(p)}
		if !p.CreationTimestamp.IsZero() {
			r.CreatedMs = p.CreationTimestamp.UnixMilli()
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b store.APIPod) int {
		if c := cmp.Compare(a.CreatedMs, b.CreatedMs); c != 0 {
			return c
		}
		return strings.Compare(a.UID, b.UID)
	})
	return out, true
}

// Ready returns nil once the pod cache has synced.
func (t *TokenReviewer) Ready() error {
	if !t.podInformer.HasSynced() {
		return errors.New("the pod cache for agent authentication is not synced yet")
	}
	return nil
}

// ErrUnauthenticated: the token is not one of an allowed agent.
var ErrUnauthenticated = errors.New("not an authenticated pulse agent")

// Authenticate reviews the token. Its answer is cached by the token's hash
// for a minute, and never past the token's expiry; an error of the API
// (not an answer) is not cached, so that one blip does not refuse an agent
// for a minute.
func (t *TokenReviewer) Authenticate(ctx context.Context, token string) (Agent, error) {
	key := sha256.Sum256([]byte(token))
	t.mu.Lock()
	r, ok := t.tokens[key]
	if ok && !time.Now().Before(r.expires) {
		ok = false
	}
	t.mu.Unlock()
	if ok {
		return t.believed(r.agent, r.err)
	}
	wait := time.NewTimer(t.wait)
	defer wait.Stop()
	select {
	case t.turns <- struct{}{}:
	case <-wait.C:
		return Agent{}, ErrBusy
	case <-ctx.Done():
		return Agent{}, ctx.Err()
	}
	agent, err := func() (Agent, error) {
		defer func() { <-t.turns }()
		return t.review(ctx, token)
	}()
	if err != nil && !errors.Is(err, ErrUnauthenticated) {
		return agent, err
	}
	expires := time.Now().Add(tokenCacheFor)
	if exp, ok := TokenExpiry(token); ok && exp.Before(expires) {
		expires = exp
	}
	t.mu.Lock()
	now := time.Now()
	for k, r := range t.tokens { // keep the cache small
		if now.After(r.expires) {
			delete(t.tokens, k)
		}
	}
	if len(t.tokens) < maxCachedTokens {
		t.tokens[key] = review{agent: agent, err: err, expires: expires}
	}
	t.mu.Unlock()
	return t.believed(agent, err)
}

// believed is a review's answer, unless the pod its token is bound to is
// gone (AgentGone): a review kept for a minute is not asked again, and the
// API server's own review honours the token of a pod that has finished.
func (t *TokenReviewer) believed(a Agent, err error) (Agent, error) {
	if err == nil && t.AgentGone(a) {
		return Agent{}, fmt.Errorf("%w: the token's pod %s (uid %s) has been deleted or has finished", ErrUnauthenticated, a.Pod(), a.PodUID)
	}
	return a, err
}

// TokenExpiry reads a JWT's exp claim, unverified: only to cache its
// review no longer than it holds.
func TokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(payload, &claims) != nil || claims.Exp <= 0 {
		return time.Time{}, false
	}
	return time.Unix(claims.Exp, 0), true
}

// reviewTimeout bounds a token review, as podLookupTimeout bounds a pod's
// lookup: an agent waits 10 s for its stream's welcome.
const reviewTimeout = 10 * time.Second

func (t *TokenReviewer) review(ctx context.Context, token string) (Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, t.reviewFor)
	defer cancel()
	tr, err := t.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{t.audience}}}, metav1.CreateOptions{})
	if err != nil {
		return Agent{}, fmt.Errorf("token review: %w", err)
	}
	st := tr.Status
	if !st.Authenticated || st.Error != "" {
		return Agent{}, fmt.Errorf("%w: %s", ErrUnauthenticated, st.Error)
	}
	// An authenticator that answers no audience did not check it (the
	// TokenReview API asks its clients to verify this).
	if !slices.Contains(st.Audiences, t.audience) {
		return Agent{}, fmt.Errorf("%w: the review did not confirm the audience %q", ErrUnauthenticated, t.audience)
	}
	if !slices.Contains(t.allowed, st.User.Username) {
		return Agent{}, fmt.Errorf("%w: %s is not an agent service account", ErrUnauthenticated, st.User.Username)
	}
	nodes, pods := st.User.Extra[NodeClaim], st.User.Extra[PodClaim]
	if len(nodes) != 1 || nodes[0] == "" || len(pods) != 1 || pods[0] == "" {
		// The node-name extra is set from Kubernetes 1.30
		// (ServiceAccountTokenPodNodeInfo): before, every agent was
		// refused with no word of why.
		if len(pods) == 1 && pods[0] != "" && len(nodes) == 0 {
			return Agent{}, fmt.Errorf("%w: the token names its pod but no node: the API server sets %s from Kubernetes 1.30 (feature gate ServiceAccountTokenPodNodeInfo); before it, use --agent-auth=none on a trusted network", ErrUnauthenticated, NodeClaim)
		}
		return Agent{}, fmt.Errorf("%w: the token is not bound to a pod on a node", ErrUnauthenticated)
	}
	a := Agent{Node: nodes[0], PodName: pods[0]}
	if u := st.User.Extra[PodUIDClaim]; len(u) == 1 {
		a.PodUID = u[0]
	}
	// system:serviceaccount:NAMESPACE:NAME, one of t.allowed: a pod's
	// service account is of its own namespace.
	if parts := strings.Split(st.User.Username, ":"); len(parts) == 4 {
		a.PodNamespace = parts[2]
	}
	return a, nil
}

// errNodeLookups: the node's share of the lookups is spent (wrapped in
// ErrLookupUnavailable): its own agent's doing, unlike the API's outage.
var errNodeLookups = errors.New("too many lookups of pods not in the pod cache from node")

// ErrLookupUnavailable: a pod's node cannot be looked up now (the pod
// cache is not synced yet, the lookups' rate is taken, the API did not
// answer); the entry is not held, and looked up again at a batch.
var ErrLookupUnavailable = errors.New("the aggregator cannot look pods up now")

// Bounds of the pod lookups. Until the pod cache has synced (one LIST) a
// lookup waits for it, at most podCacheWait: it was a GET for every
// catalogued pod of every reconnecting agent, at the API client's rate
// that the Lease renewals share. After it, a pod the cache does not hold
// (created a moment ago, or made up) is a GET, at most missRate a second
// for all streams (a burst of missBurst), and at most nodeMissRate of them
// for the entries of one node (a burst of nodeMissBurst), each waiting at
// most missWait: one node listing made-up pods took the whole rate, and
// every other node's new pods waited behind it. The nodes' shares are kept
// for the maxNodeLimiters nodes that looked up last.
const (
	podCacheWait    = 20 * time.Second
	missRate        = 20
	missBurst       = 100
	nodeMissRate    = 5
	nodeMissBurst   = 25
	maxNodeLimiters = 16384
	missWait        = 5 * time.Second
)

// waitMiss waits, at most missWait, for a GET of a pod the cache does not
// hold: first within node's share, then within the rate all share.
func (t *TokenReviewer) waitMiss(ctx context.Context, node string) error {
	if ctx.Err() != nil {
		// The caller waits no more (an earlier lookup of its catalogue
		// failed): not looked up, and no share spent. A limiter's Wait on
		// it failed at once, and that read as the node's share spent by
		// its agent, which dropped the held pods after it.
		return fmt.Errorf("%w: not looked up: the catalogue's lookups have stopped (one failed, or the stream ended)", ErrLookupUnavailable)
	}
	wctx, cancel := context.WithTimeout(ctx, missWait)
	defer cancel()
	if node != "" {
		lim, ok := t.nodeMisses.Get(node)
		if !ok {
			// Two streams of a node may get here at once: one limiter.
			lim = rate.NewLimiter(t.nodeRate, t.nodeBurst)
			if prev, had, _ := t.nodeMisses.PeekOrAdd(node, lim); had {
				lim = prev
			}
		}
		if err := lim.Wait(wctx); err != nil {
			return fmt.Errorf("%w: %w %s", ErrLookupUnavailable, errNodeLookups, node)
		}
	}
	if err := t.misses.Wait(wctx); err != nil {
		return fmt.Errorf("%w: too many lookups of pods not in the pod cache", ErrLookupUnavailable)
	}
	return nil
}

// ErrClaim: the API's pod has no catalogue entry of that uid and those
// workloads (discovery.Claims): an agent named workloads the pod's labels,
// annotations and owners do not give it.
var ErrClaim = errors.New("the pod does not belong to the workloads its entry names")

// Entry is what a catalogue entry says of a pod: its namespace, name and
// uid, the entry's uid (a demand source's entry's differs) and the
// workloads it names; Node is the node whose agent lists it (its share of
// the lookups; empty: the shared rate alone).
type Entry struct {
	Namespace, Name, PodUID, UID string
	Workloads                    []discovery.Workload
	Node                         string
}

// PodNode returns the node the API places an entry's pod on, once the pod
// is known to allow the entry (its uid and workloads; ErrClaim if not). It
// reads the pod cache (its labels and annotations current), else, for a
// pod the cache does not hold yet, what the API said of it within
// claimsFor, else the API. Where the pod cache's copy does not allow the
// entry, the API is read (it may be ahead of the cache: a pod relabelled a
// moment ago).
func (t *TokenReviewer) PodNode(ctx context.Context, e Entry) (string, error) {
	id, cached := t.pods.Get(e.PodUID)
	// A uid names one pod: the whole identity must match, or an agent
	// could list its own pod's uid under another namespace and name.
	if cached && (id.namespace != e.Namespace || id.name != e.Name) {
		return "", fmt.Errorf("pod uid %s is %s/%s, not %s/%s", e.PodUID, id.namespace, id.name, e.Namespace, e.Name)
	}
	if !t.podInformer.HasSynced() {
		wctx, cancel := context.WithTimeout(ctx, t.sync)
		synced := cache.WaitForCacheSync(wctx.Done(), t.podInformer.HasSynced)
		cancel()
		if !synced {
			return "", fmt.Errorf("%w: the pod cache has not synced", ErrLookupUnavailable)
		}
	}
	obj, ok, _ := t.podInformer.GetStore().GetByKey(e.Namespace + "/" + e.Name)
	if p, isPod := obj.(*corev1.Pod); ok && isPod && string(p.UID) == e.PodUID {
		id := identityOf(p)
		t.pods.Add(e.PodUID, id)
		if discovery.Allows(id.claims, e.UID, e.Workloads) {
			return id.node, nil
		}
	} else if cached && time.Since(id.at) < claimsFor && discovery.Allows(id.claims, e.UID, e.Workloads) {
		return id.node, nil
	}
	// A name no pod can have is refused here: client-go refused it
	// locally, and that error read as the API unavailable, the entry
	// looked up again at every batch for the stream's life, each a lookup
	// of the node's and the shared rates.
	if len(validation.IsDNS1123Label(e.Namespace)) > 0 || len(validation.IsDNS1123Subdomain(e.Name)) > 0 {
		return "", fmt.Errorf("no pod can be %s/%s: a namespace is a DNS label, a pod's name a DNS subdomain", e.Namespace, e.Name)
	}
	if err := t.waitMiss(ctx, e.Node); err != nil {
		return "", err
	}
	// Bounded: a lookup held by a hung API connection held its stream's
	// catalogue, long past the agent's giving it up.
	gctx, cancel := context.WithTimeout(ctx, podLookupTimeout)
	defer cancel()
	p, err := t.client.CoreV1().Pods(e.Namespace).Get(gctx, e.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("look up pod %s/%s: %w", e.Namespace, e.Name, err)
	case err != nil:
		// The API busy or unreachable, or the stream gone, says nothing of
		// the pod: the entry is not refused (the agent sends an entry
		// again only when it changes, so a refusal held for the stream's
		// life); it is looked up again at a batch.
		return "", fmt.Errorf("%w: look up pod %s/%s: %w", ErrLookupUnavailable, e.Namespace, e.Name, err)
	}
	if string(p.UID) != e.PodUID {
		return "", fmt.Errorf("pod %s/%s has uid %s, not %s", e.Namespace, e.Name, p.UID, e.PodUID)
	}
	id = identityOf(p)
	if id.node != "" {
		t.pods.Add(e.PodUID, id)
	}
	if !discovery.Allows(id.claims, e.UID, e.Workloads) {
		return id.node, claimError(id, e)
	}
	return id.node, nil
}

// claimError is the refusal of entry e that pod id does not allow.
func claimError(id podIdentity, e Entry) error {
	if id.out != "" {
		return fmt.Errorf("%w: pod %s/%s %s: it is no replica, and claims no workload", ErrClaim, e.Namespace, e.Name, id.out)
	}
	if id.mirror {
		return fmt.Errorf("%w: pod %s/%s is a static pod's mirror (%s), which its node may make in any namespace with any labels: it claims no workload with agent authentication", ErrClaim, e.Namespace, e.Name, corev1.MirrorPodAnnotationKey)
	}
	return fmt.Errorf("%w: pod %s/%s allows entries %s", ErrClaim, e.Namespace, e.Name, describeClaims(id.claims))
}

// podLookupTimeout bounds one pod's lookup in the API.
const podLookupTimeout = 10 * time.Second

// claimsFor: how long what the API said of a pod the pod cache does not
// hold yet is believed (labels and annotations change).
const claimsFor = time.Minute

// identityOf is what the pod cache keeps of a pod. A pod that has
// finished (Failed, Succeeded: an evicted one stays for days) or is left
// out of scraping (pulse.io/scrape: "false") claims nothing: no agent
// lists it, and it is no replica (replicaOf), yet its node's token could
// list it, and its made-up samples were held as a ready replica of its
// workload, again at every stream, for as long as the pod object stayed.
func identityOf(p *corev1.Pod) podIdentity {
	id := podIdentity{namespace: p.Namespace, name: p.Name, node: p.Spec.NodeName, claims: discovery.Claims(p), mirror: discovery.Mirror(p.Annotations), at: time.Now()}
	switch {
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		id.claims, id.out = nil, "has finished ("+string(p.Status.Phase)+")"
	case p.Annotations[discovery.AnnotationScrape] == "false":
		id.claims, id.out = nil, "is left out of scraping ("+discovery.AnnotationScrape+`: "false")`
	}
	return id
}

// describeClaims lists claims for an error, at most four entries.
func describeClaims(claims map[string][]discovery.Workload) string {
	if len(claims) == 0 {
		return "none (no workload its labels, annotations or owners give)"
	}
	var parts []string
	for uid, ws := range claims {
		if len(parts) == 4 {
			parts = append(parts, "...")
			break
		}
		names := make([]string, len(ws))
		for i, w := range ws {
			names[i] = kinds[w.Kind] + "/" + w.Name
		}
		parts = append(parts, uid+" of "+strings.Join(names, ", "))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// podIdentity is what the pod cache keeps of a pod, by uid.
type podIdentity struct {
	namespace, name, node string
	claims                map[string][]discovery.Workload // discovery.Claims
	mirror                bool                            // a static pod's mirror (discovery.Mirror): claims none
	at                    time.Time                       // when read
	// out: why it claims none though its labels may give workloads
	// (finished, or left out of scraping); empty when not so.
	out string
}
