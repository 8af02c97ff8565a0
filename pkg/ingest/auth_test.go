package ingest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/pulse-io/pulse/pkg/discovery"
	"github.com/pulse-io/pulse/pkg/framed"
	"github.com/pulse-io/pulse/pkg/metric"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/wire"
	pulsev1 "github.com/pulse-io/pulse/proto/pulse/v1"
	"github.com/pulse-io/pulse/test/fakenode"
)

// fakeAPI answers TokenReviews as the API server does for pod-bound tokens:
// "token-node-1" is the agent's ServiceAccount on a pod of node-1, and so on.
func fakeAPI() *fake.Clientset {
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: node}}
	}
	c := fake.NewClientset(pod("mine", "node-1"), pod("theirs", "node-2"))
	agent := "system:serviceaccount:pulse-system:pulse-agent"
	fakenode.TokenReviews(c, "pulse", map[string]fakenode.Token{
		"token-node-1": {User: agent, Node: "node-1"},
		// token-node-1-renewed: the kubelet's renewal of token-node-1,
		// bound to the same pod.
		"token-node-1-renewed": {User: agent, Node: "node-1"},
		"token-node-2":         {User: agent, Node: "node-2"},
		"token-unbound":        {User: agent},
		"token-other":          {User: "system:serviceaccount:default:default", Node: "node-1"},
		"token-pre-130":        {User: agent, PodOnly: true},
	})
	return c
}

// fakeAPIWith is fakeAPI with one more pod of llama's on node-1, name
// (uid uid-NAME).
func fakeAPIWith(t *testing.T, name string) *fake.Clientset {
	t.Helper()
	c := fakeAPI()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
		Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	if _, err := c.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

func authFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, runningReviewer(t, fakeAPI()))
}

// runningReviewer is a TokenReviewer of c's with its pod cache synced.
func runningReviewer(t testing.TB, c *fake.Clientset) *TokenReviewer {
	t.Helper()
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go tr.Run(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), tr.podInformer.HasSynced) {
		t.Fatal("the pod cache did not sync")
	}
	return tr
}

// runAs sends msgs on a stream that carries token.
func (f *fixture) runAs(t testing.TB, token string, msgs ...*pulsev1.AgentMessage) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	stream, err := f.client.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break
		}
	}
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func TestAgentTokenBindsTheStreamToItsNode(t *testing.T) {
	mine := &pulsev1.Pod{Id: 1, Uid: "uid-mine", Namespace: "ns", Name: "mine", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	theirs := &pulsev1.Pod{Id: 2, Uid: "uid-theirs", Namespace: "ns", Name: "theirs", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}

	f := authFixture(t)
	// node-1's agent lists its own pod and node-2's: only its own is taken.
	if err := f.run(t); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	// The agent samples both: the rejected pod's samples are skipped, and
	// its id, being catalogued, does not make the batch malformed.
	enc := wire.NewEncoder()
	var b pulsev1.SampleBatch
	b.Seq, b.TimeUnixMs = 1, 1000
	for _, id := range []uint32{1, 2} {
		s := wire.Sample{Pod: id}
		s.Values.Set(metric.Waiting, float64(id))
		enc.Append(&b, &s)
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(mine, theirs), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &b}}); err != nil {
		t.Fatal(err)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Hour})
	if len(v) != 1 || len(v[0].Pods) != 1 || v[0].Pods[0].Name != "mine" || v[0].Pods[0].Values["waiting"] != 1 {
		t.Fatalf("store = %+v: want only node-1's pod, with its sample", v)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("other_node")); got != 1 {
		t.Fatalf("rejected other_node = %v, want 1", got)
	}

	for name, tc := range map[string]struct {
		token string
		code  codes.Code
		says  string
	}{
		"another node's token":          {"token-node-2", codes.PermissionDenied, ""}, // hello says node-1
		"a token bound to no node":      {"token-unbound", codes.Unauthenticated, ""},
		"another service account":       {"token-other", codes.Unauthenticated, ""},
		"a token the API does not know": {"forged", codes.Unauthenticated, ""},
		// Refused with no word of why (agentAuth tokenreview is the
		// charts' default).
		"a token from before Kubernetes 1.30 (its pod, no node)": {"token-pre-130", codes.Unauthenticated, "from Kubernetes 1.30"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := f.runAs(t, tc.token, hello(), catalogue(mine)); status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
				t.Fatalf("%v, want %v saying %q", err, tc.code, tc.says)
			}
		})
	}
}

// TestPodNodeFromTheCache: after an aggregator restart every catalogued pod
// is checked; with the synced pod cache that costs no GET per pod (it cost
// one each at client-go's 5 QPS), and a pod created after the cache synced
// is still found through the API.
func TestPodNodeFromTheCache(t *testing.T) {
	c := fakeAPI()
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tr.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for tr.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the pod cache did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gets := func() int { return podGets(c) }
	for _, tc := range []struct{ name, node string }{{"mine", "node-1"}, {"theirs", "node-2"}} {
		if node, err := tr.PodNode(ctx, llama("ns", tc.name, "uid-"+tc.name)); err != nil || node != tc.node {
			t.Fatalf("PodNode(%s) = %q, %v; want %s", tc.name, node, err, tc.node)
		}
	}
	if n := gets(); n != 0 {
		t.Fatalf("%d pod GETs with a synced cache, want 0", n)
	}
	if _, err := tr.PodNode(ctx, llama("ns", "mine", "another-uid")); err == nil {
		t.Fatal("a uid that does not match the pod was accepted")
	}
	if _, err := tr.PodNode(ctx, llama("ns", "nobody", "uid-nobody")); err == nil {
		t.Fatal("an unknown pod was accepted")
	}
	// A uid cached for one pod vouches for no other namespace or name: an
	// agent holding its token could otherwise re-list its own pod's uid
	// under another tenant's namespace and workload.
	for _, other := range [][2]string{{"victim", "mine"}, {"ns", "someone-else"}} {
		if _, err := tr.PodNode(ctx, llama(other[0], other[1], "uid-mine")); err == nil || !strings.Contains(err.Error(), "is ns/mine") {
			t.Errorf("uid-mine as %s/%s: %v, want a refusal naming ns/mine", other[0], other[1], err)
		}
	}
}

// llama is an entry of pod ns/name (uid) for Workspace llama.
func llama(ns, name, uid string) Entry {
	return Entry{Namespace: ns, Name: name, PodUID: uid, UID: uid,
		Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
}

// TestTooManyPodsCostNoLookup: a catalogue over the stream's pod limit is
// refused before any of its entries is looked up in the API (2,000 entries
// once cost 2,000 pod GETs, then the refusal).
func TestTooManyPodsCostNoLookup(t *testing.T) {
	c := fakeAPI()
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, tr) // at most 3 pods a stream
	var pods []*pulsev1.Pod
	for i := range 7 { // past twice the limit: the catalogue is refused whole
		pods = append(pods, &pulsev1.Pod{Id: uint32(i + 1), Uid: fmt.Sprintf("uid-%d", i), Namespace: "ns", Name: fmt.Sprintf("p%d", i),
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}})
	}
	err = f.runAs(t, "token-node-1", hello(), catalogue(pods...))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 3 per agent") {
		t.Fatalf("%v, want InvalidArgument naming the limit", err)
	}
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
			t.Fatalf("a pod was looked up (%v) for a catalogue refused for its size", a)
		}
	}
}

// TestTokenReviewsAreBoundedAndCheckedWhole: every stream with a token not
// cached made a TokenReview, without bound, on the API client whose rate
// limit the aggregator's Lease renewals and pod lookups share; an API
// error was cached for a minute against the agent's real token; an answer
// was cached past its token's expiry; and the review's audience and pod
// binding were not checked. Now at most maxReviews are in flight (a stream
// past them is refused, to retry), an API error is not cached, an answer is
// cached no longer than its token holds, and the review must confirm the
// audience and a pod.
func TestTokenReviewsAreBoundedAndCheckedWhole(t *testing.T) {
	c := fake.NewClientset()
	agent := "system:serviceaccount:pulse-system:pulse-agent"
	expired := jwt(time.Now().Add(-time.Second))
	fakenode.TokenReviews(c, "pulse", map[string]fakenode.Token{
		"token-node-1": {User: agent, Node: "node-1"},
		"no-audience":  {User: agent, Node: "node-1", AudienceUnaware: true},
		"node-bound":   {User: agent, Node: "node-1", NotPodBound: true},
		expired:        {User: agent, Node: "node-1"},
	})
	var reviews atomic.Int64
	failOnce, block := atomic.Bool{}, make(chan struct{})
	failOnce.Store(true)
	var blocking atomic.Bool
	c.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		if blocking.Load() {
			<-block
		}
		if failOnce.CompareAndSwap(true, false) {
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		return false, nil, nil // on to the API's answer
	})
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := tr.Authenticate(ctx, "token-node-1"); err == nil || errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("API error: %v, want an error that is not a refusal", err)
	}
	if a, err := tr.Authenticate(ctx, "token-node-1"); err != nil || a.Node != "node-1" || a.PodUID != "uid-agent-on-node-1" {
		t.Fatalf("after the API came back: %+v, %v (the error was cached)", a, err)
	}
	for tok, why := range map[string]string{"no-audience": "audience", "node-bound": "bound to a pod"} {
		if _, err := tr.Authenticate(ctx, tok); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v, want refused naming %q", tok, err, why)
		}
	}
	before := reviews.Load()
	for range 2 {
		if _, err := tr.Authenticate(ctx, expired); err != nil {
			t.Fatal(err)
		}
	}
	if n := reviews.Load() - before; n != 2 {
		t.Fatalf("an expired token was reviewed %d times in two streams, want 2 (no answer cached past its expiry)", n)
	}
	// Past maxReviews in flight, a stream is refused at once it has waited.
	tr.wait = 50 * time.Millisecond
	blocking.Store(true)
	var wg sync.WaitGroup
	for i := range maxReviews {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = tr.Authenticate(ctx, fmt.Sprintf("made-up-%d", i)) }()
	}
	for len(tr.turns) < maxReviews { // every turn taken (the fake API answers one at a time)
		time.Sleep(time.Millisecond)
	}
	if _, err := tr.Authenticate(ctx, "made-up-extra"); !errors.Is(err, ErrBusy) {
		t.Fatalf("review past %d in flight: %v, want ErrBusy", maxReviews, err)
	}
	close(block)
	wg.Wait()
}

// jwt is a token shaped as a JWT whose exp claim is exp (unsigned: the
// fake API server answers by the whole token).
func jwt(exp time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"exp":%d}`, exp.Unix()))
	return "eyJhbGciOiJub25lIn0." + payload + ".sig"
}

// TestAStreamEndsWithItsToken: a token was reviewed once, when its stream
// opened, and the stream was then kept for as long as it stayed open: a
// copied token kept reporting its node's pods past its expiry and its
// pod's deletion. A message past the token's expiry now ends the stream
// (Unauthenticated), unread; the agent reconnects with the token the
// kubelet renewed.
func TestAStreamEndsWithItsToken(t *testing.T) {
	expired, fresh := jwt(time.Now().Add(-time.Second)), jwt(time.Now().Add(time.Hour))
	c := fakeAPI()
	agent := "system:serviceaccount:pulse-system:pulse-agent"
	fakenode.TokenReviews(c, "pulse", map[string]fakenode.Token{expired: {User: agent, Node: "node-1"}, fresh: {User: agent, Node: "node-1"}})
	f := newFixtureWith(t, runningReviewer(t, c))
	mine := &pulsev1.Pod{Id: 1, Uid: "uid-mine", Namespace: "ns", Name: "mine", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	err := f.runAs(t, expired, hello(), catalogue(mine))
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "token expired") {
		t.Fatalf("a message past the token's expiry: %v, want the stream ended Unauthenticated", err)
	}
	if v := f.store.View(store.ViewOptions{FreshFor: time.Hour}); len(v) != 0 {
		t.Fatalf("store = %+v: the message past the expiry was read", v)
	}
	if err := f.runAs(t, fresh, hello(), catalogue(mine)); err != nil {
		t.Fatalf("a token of an hour: %v", err)
	}
	if v := f.store.View(store.ViewOptions{FreshFor: time.Hour}); len(v) != 1 {
		t.Fatalf("store = %+v, want the pod of the stream with a live token", v)
	}
}

// TestAStreamEndsWithItsAgentsPod: a token copied from an agent's pod (a
// compromised node's) kept its stream reporting that node's pods once the
// pod was deleted, for the rest of the token's life (an hour), and opened
// new streams within the minute its review was kept. The stream now ends at
// its next message (Unauthenticated), unread, and the token is refused,
// from the review kept or a new one's, once the pod is deleted, has
// finished, or has been deleted for longer than the API honours its tokens
// after (a pod stuck terminating on a lost node); an agent's pod whose
// graceful deletion has just begun, another agent's pod gone, or any other
// pod, ends nothing.
func TestAStreamEndsWithItsAgentsPod(t *testing.T) {
	for _, how := range []string{"deleted", "finished", "terminating"} {
		t.Run(how, func(t *testing.T) {
			c := fakeAPI()
			bg := context.Background()
			for _, node := range []string{"node-1", "node-2"} {
				if _, err := c.CoreV1().Pods("pulse-system").Create(bg, agentsPod(node), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			tr := runningReviewer(t, c)
			f := newFixtureWith(t, tr)
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			// Each node's agent lists its own pod of fakeAPI's, as id 1.
			open := func(node, pod string) (pulsev1.Ingest_ReportClient, *wire.Encoder) {
				s := f.openStream(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-"+node), t, node)
				if err := s.Send(catalogue(&pulsev1.Pod{Id: 1, Uid: "uid-" + pod, Namespace: "ns", Name: pod, Ready: true,
					Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}})); err != nil {
					t.Fatal(err)
				}
				enc := wire.NewEncoder()
				sendBatch(t, s, enc, 1, 3, 1)
				return s, enc
			}
			one, enc1 := open("node-1", "mine")
			two, enc2 := open("node-2", "theirs")
			agent := Agent{Node: "node-1", PodUID: "uid-agent-on-node-1", PodNamespace: "pulse-system", PodName: "agent-on-node-1"}

			// Another pod of the cluster goes, and node-1's agent's pod is
			// past its deletion timestamp within the minute the API
			// honours its token after: nothing ends.
			if err := c.CoreV1().Pods("ns").Delete(bg, "theirs", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the pod cache sees ns/theirs go", func() bool { return tr.Gone("uid-theirs") })
			setDeletion(t, c, tr, "node-1", time.Now().Add(-deletedPodTokenGrace/2))
			sendBatch(t, one, enc1, 2, 4, 1)

			makeGone(t, c, tr, how)
			waitFor(t, "the pod cache sees node-1's agent's pod go", func() bool { return tr.AgentGone(agent) })
			b := &pulsev1.SampleBatch{Seq: 3, TimeUnixMs: 3000}
			s := wire.Sample{Pod: 1}
			s.Values.Set(metric.Waiting, 99)
			enc1.Append(b, &s)
			if err := one.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
				t.Fatal(err)
			}
			if _, err := one.Recv(); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "pulse-system/agent-on-node-1") {
				t.Fatalf("a message after the token's pod went: %v, want the stream ended Unauthenticated naming the pod", err)
			}
			for _, w := range f.store.View(store.ViewOptions{FreshFor: time.Hour}) {
				for _, p := range w.Pods {
					if p.Values["waiting"] == 99 {
						t.Fatalf("pod %s: %v: the message after the token's pod went was read", p.Name, p.Values)
					}
				}
			}
			// Its review, kept for a minute, is not believed again, nor a
			// new token's of the same pod (the API's review honours a
			// finished pod's, and one terminating within its grace).
			for _, tok := range []string{"token-node-1", "token-node-1-renewed"} {
				if err := f.runAs(t, tok, hello()); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "uid-agent-on-node-1") {
					t.Fatalf("a new stream with %s, of the pod gone: %v, want Unauthenticated naming the pod", tok, err)
				}
			}
			// node-2's agent streams on.
			sendBatch(t, two, enc2, 2, 5)
		})
	}
}

// makeGone makes node-1's agent's pod gone as how says: deleted, finished,
// or terminating past the minute the API honours its tokens after.
func makeGone(t *testing.T, c *fake.Clientset, tr *TokenReviewer, how string) {
	t.Helper()
	gone, bg := agentsPod("node-1"), context.Background()
	switch how {
	case "deleted":
		if err := c.CoreV1().Pods(gone.Namespace).Delete(bg, gone.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	case "finished":
		gone.Status.Phase = corev1.PodSucceeded
		if _, err := c.CoreV1().Pods(gone.Namespace).UpdateStatus(bg, gone, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	case "terminating":
		setDeletion(t, c, tr, "node-1", time.Now().Add(-deletedPodTokenGrace-time.Second))
	}
}

// TestAnAgentsPodFinishedBeforeTheCacheIsGone: an agent's pod already
// finished when the pod cache first listed it was never seen to finish, and
// its token (the API's review honours a finished pod's) was accepted.
func TestAnAgentsPodFinishedBeforeTheCacheIsGone(t *testing.T) {
	c := fakeAPI()
	p := agentsPod("node-1")
	p.Status.Phase = corev1.PodFailed
	if _, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := runningReviewer(t, c)
	if _, err := tr.Authenticate(context.Background(), "token-node-1"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("the token of an agent's pod finished before the cache listed it: %v, want refused", err)
	}
	if _, err := tr.Authenticate(context.Background(), "token-node-2"); err != nil {
		t.Fatalf("another node's agent (its pod not in the cache yet): %v", err)
	}
}

// TestAPodMadeAgainUnderItsNameIsGone: a pod deleted and made again under
// its name within a watch's gap comes to the pod cache as an update from
// one uid to another at the relist: the old uid was never gone (its
// stream's entry held, an agent's token honoured).
func TestAPodMadeAgainUnderItsNameIsGone(t *testing.T) {
	tr, err := NewTokenReviewer(fakeAPI(), "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	var told []string
	tr.OnGone(func(node, uid string) { told = append(told, node+" "+uid) })
	old := tr.keep(agentsPod("node-1"))
	again := tr.keep(agentsPod("node-1"))
	again.UID = "uid-again"
	tr.updated(old, again)
	a := Agent{Node: "node-1", PodUID: "uid-agent-on-node-1", PodNamespace: "pulse-system", PodName: "agent-on-node-1"}
	if !tr.Gone("uid-agent-on-node-1") || !tr.AgentGone(a) || tr.Gone("uid-again") || !slices.Equal(told, []string{"node-1 uid-agent-on-node-1"}) {
		t.Fatalf("Gone(old) %v, AgentGone(old) %v, Gone(new) %v, told %v: want the old uid alone gone", tr.Gone("uid-agent-on-node-1"), tr.AgentGone(a), tr.Gone("uid-again"), told)
	}
	again2 := tr.keep(agentsPod("node-1"))
	again2.UID, again2.Status.Phase = "uid-again", corev1.PodFailed
	tr.updated(again, again2)
	if !tr.Gone("uid-again") {
		t.Fatal("a pod that finished is not gone")
	}
}

// agentsPod is the pod fakenode's tokens of node are bound to.
func agentsPod(node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-on-" + node, Namespace: "pulse-system", UID: types.UID("uid-agent-on-" + node)},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "pulse-agent"}}
}

// setDeletion gives node's agent's pod a deletion timestamp of at, and
// waits for the pod cache's handler to have noted it.
func setDeletion(t *testing.T, c *fake.Clientset, tr *TokenReviewer, node string, at time.Time) {
	t.Helper()
	p := agentsPod(node)
	ts := metav1.NewTime(at)
	p.DeletionTimestamp = &ts
	if _, err := c.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod cache notes the deletion", func() bool {
		tr.deletingMu.RLock()
		defer tr.deletingMu.RUnlock()
		return tr.deleting[string(p.UID)].Equal(ts.Time)
	})
}

// TestPodLookupsAreBounded: until the pod cache synced, every catalogued
// pod of every reconnecting agent was a GET, at the API client's rate that
// the provisioner's Lease renewals share (15,000 pods: five minutes of
// it); after it, every made-up pod was one. A lookup now waits for the
// cache, at most a bound, and a pod not in it is a GET within a rate for
// all streams; past either that entry is not held, looked up again at a
// batch (TestAnAPIErrorRefusesNoPod), the stream's other entries held.
// Rejected entries are logged at most ten a minute a stream.
func TestPodLookupsAreBounded(t *testing.T) {
	c := fakeAPI()
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	tr.sync = 50 * time.Millisecond // its informer never runs
	if _, err := tr.PodNode(context.Background(), llama("ns", "mine", "uid-mine")); !errors.Is(err, ErrLookupUnavailable) {
		t.Fatalf("a lookup before the pod cache synced: %v, want ErrLookupUnavailable", err)
	}
	f := newFixtureWith(t, tr)
	mine := &pulsev1.Pod{Id: 1, Uid: "uid-mine", Namespace: "ns", Name: "mine", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(mine)); err != nil || f.store.Pods() != 0 {
		t.Fatalf("a catalogue before the pod cache synced: %v, %d pods held; want the entry not held, the stream kept", err, f.store.Pods())
	}
	gets := func() int { return podGets(c) }
	if n := gets(); n != 0 {
		t.Fatalf("%d pod GETs before the pod cache synced, want 0", n)
	}

	// Synced: made-up pods are GETs within the rate; past it the entry is
	// not held, the others are.
	g := newFixtureWith(t, runningReviewer(t, c))
	g.srv.auth.(*TokenReviewer).misses = rate.NewLimiter(0, 2)
	madeUp := func(id uint32) *pulsev1.Pod {
		return &pulsev1.Pod{Id: id, Uid: fmt.Sprint("uid-made-up-", id), Namespace: "ns", Name: fmt.Sprint("made-up-", id),
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	}
	err = g.runAs(t, "token-node-1", hello(), catalogue(mine, madeUp(2), madeUp(3), madeUp(4)))
	if err != nil || g.store.Pods() != 1 || !strings.Contains(g.logs.String(), "too many lookups") {
		t.Fatalf("made-up pods past the lookups' rate: %v, %d pods held; want mine held, the stream kept, the entry past the rate named", err, g.store.Pods())
	}
	if n := gets(); n != 2 {
		t.Fatalf("%d pod GETs, want the 2 of the rate", n)
	}
	if got := testutil.ToFloat64(g.srv.m.rejected.WithLabelValues("auth_unavailable")); got != 1 {
		t.Fatalf("rejected auth_unavailable = %v, want 1", got)
	}

	// Thirty entries rejected on one stream: each counted, ten logged.
	h := newFixture(t)
	msgs := []*pulsev1.AgentMessage{hello()}
	for range 10 {
		msgs = append(msgs, catalogue(&pulsev1.Pod{Id: 1}, &pulsev1.Pod{Id: 2}, &pulsev1.Pod{Id: 3}))
	}
	if err := h.run(t, msgs...); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.srv.m.rejected.WithLabelValues("invalid_entry")); got != 30 {
		t.Fatalf("rejected invalid_entry = %v, want 30", got)
	}
	if n := strings.Count(h.logs.String(), "catalogue entry rejected"); n != 10 {
		t.Fatalf("%d lines of rejected entries logged, want 10", n)
	}
}

// TestOneNodeCannotTakeEveryLookup: the GETs of pods the pod cache does
// not hold were one rate for all streams, so one node listing made-up pods
// took it, and every other node's new pods waited behind it (each not held
// until a lookup came). A node now has a share of the rate; past it its
// own entries wait, and another node's are looked up.
func TestOneNodeCannotTakeEveryLookup(t *testing.T) {
	c := fakeAPI()
	tr := runningReviewer(t, c)
	tr.misses = rate.NewLimiter(0, 6)
	tr.nodeRate, tr.nodeBurst = 0, 3
	f := newFixtureWith(t, tr)
	madeUp := func(id uint32) *pulsev1.Pod {
		return &pulsev1.Pod{Id: id, Uid: fmt.Sprint("uid-made-up-", id), Namespace: "ns", Name: fmt.Sprint("made-up-", id),
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	}
	var many []*pulsev1.Pod
	for id := range uint32(6) { // the fixture's stream takes 3 pods, and as many refused
		many = append(many, madeUp(id+1))
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(many...)); err != nil {
		t.Fatal(err)
	}
	if n := podGets(c); n != 3 {
		t.Fatalf("node-1's 6 made-up pods: %d pod GETs, want its share of 3", n)
	}
	if err := f.runAs(t, "token-node-2", helloFrom("node-2"), catalogue(madeUp(100))); err != nil {
		t.Fatal(err)
	}
	if n := podGets(c); n != 4 {
		t.Fatalf("%d pod GETs, want node-2's entry looked up too (4)", n)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("unknown_pod")); got != 4 {
		t.Fatalf("rejected unknown_pod = %v, want node-1's 3 and node-2's 1", got)
	}
}

// TestAnAPIErrorRefusesNoPod: a lookup the API could not answer (busy,
// throttled, the stream gone) refused the entry as an unknown pod, and the
// agent sends an entry again only when it changes: the pod went unreported
// for the stream's life. Then it ended the stream, every other pod of the
// node unreported until its agent reconnected. Now only a pod the API does
// not have is unknown; an entry whose pod could not be looked up is not
// held, the others are, and it is looked up again at a batch.
func TestAnAPIErrorRefusesNoPod(t *testing.T) {
	c := fakeAPI()
	f := newFixtureWith(t, runningReviewer(t, c))
	var answered atomic.Bool
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !answered.Swap(true) {
			return true, nil, apierrors.NewServiceUnavailable("the API is busy")
		}
		return false, nil, nil
	})
	fresh := &pulsev1.Pod{Id: 2, Uid: "uid-fresh", Namespace: "ns", Name: "fresh", Ready: true, // not in the pod cache
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	mine := &pulsev1.Pod{Id: 1, Uid: "uid-mine", Namespace: "ns", Name: "mine", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer token-node-1"), 20*time.Second)
	defer cancel()
	stream := f.openStream(ctx, t, "node-1")
	if err := stream.Send(catalogue(mine, fresh)); err != nil {
		t.Fatal(err)
	}
	enc := wire.NewEncoder()
	sendBatch(t, stream, enc, 1, 3, 1, 2)
	if v := f.store.View(store.ViewOptions{FreshFor: time.Hour}); len(v) != 1 || len(v[0].Pods) != 1 || v[0].Pods[0].Name != "mine" {
		t.Fatalf("after the API's 503: %+v; want mine held, the stream kept, fresh not held", v)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("unknown_pod")); got != 0 {
		t.Fatalf("rejected unknown_pod = %v after the API's 503, want 0", got)
	}
	// The pod is made; at the next batch (a second on) it is looked up
	// again and held.
	if _, err := c.CoreV1().Pods("ns").Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "fresh", Namespace: "ns", UID: "uid-fresh",
		Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "node-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(uncheckedEvery)
	sendBatch(t, stream, enc, 2, 5, 1, 2)
	v := f.store.View(store.ViewOptions{FreshFor: time.Hour})
	if len(v) != 1 || len(v[0].Pods) != 2 || v[0].Pods[0].Values["waiting"] != 5 || v[0].Pods[1].Values["waiting"] != 5 {
		t.Fatalf("after it was looked up again: %+v; want both held, with the batch's values", v)
	}
	// An entry the API does not have is refused alone, for good.
	ghost := &pulsev1.Pod{Id: 3, Uid: "uid-ghost", Namespace: "ns", Name: "ghost",
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(ghost)); err != nil {
		t.Fatalf("a pod the API does not have: %v, want the entry refused alone", err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("unknown_pod")); got != 1 {
		t.Fatalf("rejected unknown_pod = %v, want 1", got)
	}
}

// TestAHeldPodKeepsItsPlaceWhenNotLookedUpAtAReconnect: an agent's
// catalogue at a reconnect is full, and an entry in it whose lookup the
// API could not answer (its claim past what the pod cache allows, the API
// busy) was not held: the full catalogue unlisted the pod the store held,
// its series dropped and its workload a replica short until a lookup
// worked. It keeps its last admitted state, as in a catalogue of changes.
func TestAHeldPodKeepsItsPlaceWhenNotLookedUpAtAReconnect(t *testing.T) {
	c := fakeAPI()
	f := newFixtureWith(t, runningReviewer(t, c))
	if err := f.runAs(t, "token-node-1", hello(), catalogue(pod(1, "mine"))); err != nil {
		t.Fatal(err)
	}
	if !heldAs(f, "llama") {
		t.Fatal("mine is not held")
	}
	var busy atomic.Int32
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		busy.Add(1)
		return true, nil, apierrors.NewServiceUnavailable("the API is busy")
	})
	relabelled := pod(1, "mine")
	relabelled.Workloads = workspace("qwen") // not what the pod cache has: looked up
	if err := f.runAs(t, "token-node-1", hello(), catalogue(relabelled)); err != nil {
		t.Fatal(err)
	}
	if busy.Load() == 0 {
		t.Fatal("the entry was not looked up")
	}
	if !heldAs(f, "llama") || heldAs(f, "qwen") {
		t.Fatal("after the reconnect's catalogue: mine is not held as last admitted (llama)")
	}
}

// TestEveryHeldPodKeepsItsPlaceWhenTheAPIFails: after a catalogue's first
// lookup failed (the API busy), the rest of it was read without waiting on
// a context already ended, and the node's limiter's refusal of it read as
// the node's share of lookups spent by its agent: the second held pod was
// not kept as last admitted, its series dropped and its workload a replica
// short, and the log blamed an honest node. Each held pod keeps its place.
func TestEveryHeldPodKeepsItsPlaceWhenTheAPIFails(t *testing.T) {
	c := fakeAPIWith(t, "mine2")
	f := newFixtureWith(t, runningReviewer(t, c))
	if err := f.runAs(t, "token-node-1", hello(), catalogue(pod(1, "mine"), pod(2, "mine2"))); err != nil {
		t.Fatal(err)
	}
	if !podHeldAs(f, "llama", "mine") || !podHeldAs(f, "llama", "mine2") {
		t.Fatal("mine and mine2 are not held")
	}
	c.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("the API is busy")
	})
	var entries []*pulsev1.Pod
	for i, name := range []string{"mine", "mine2"} {
		p := pod(uint32(i+1), name)
		p.Workloads = workspace("qwen") // not what the pod cache has: looked up
		entries = append(entries, p)
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entries...)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mine", "mine2"} {
		if !podHeldAs(f, "llama", name) || podHeldAs(f, "qwen", name) {
			t.Errorf("after the reconnect's catalogue, the API failing: %s is not held as last admitted (llama)", name)
		}
	}
}

// podHeldAs says whether the store holds pod name under workload w.
func podHeldAs(f *fixture, w, name string) bool {
	for _, v := range f.store.View(store.ViewOptions{FreshFor: time.Hour}) {
		if v.Name == w {
			for _, p := range v.Pods {
				if p.Name == name {
					return true
				}
			}
		}
	}
	return false
}

// TestAPodGoneFromTheAPILeavesTheStreamThatListedIt: a pod the API deleted,
// or that finished (evicted: Failed), stayed held on the stream that had
// listed it, with whatever that stream sent for it until it ended (up to
// the token's hour): a compromised node's made-up load on another tenant's
// workload. It is dropped as the pod cache sees it go, and what the stream
// sends for it after is not held.
func TestAPodGoneFromTheAPILeavesTheStreamThatListedIt(t *testing.T) {
	g := listTwo(t, store.Options{})
	c, f, stream, enc, ctx := g.c, g.f, g.stream, g.enc, g.ctx
	for _, name := range []string{"mine", "mine2"} {
		if v := podView(f.store, name); v == nil || v.Values["waiting"] != 3 {
			t.Fatalf("%s: %+v; want held, waiting 3", name, v)
		}
	}
	if err := c.CoreV1().Pods("ns").Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	evicted, err := c.CoreV1().Pods("ns").Get(ctx, "mine2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evicted.Status.Phase = corev1.PodFailed
	if _, err := c.CoreV1().Pods("ns").UpdateStatus(ctx, evicted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); podView(f.store, "mine") != nil || podView(f.store, "mine2") != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted and the evicted pods still held: %+v, %+v", podView(f.store, "mine"), podView(f.store, "mine2"))
		}
	}
	sendBatch(t, stream, enc, 2, 42, 1, 2) // the stream still sends them
	for _, name := range []string{"mine", "mine2"} {
		if v := podView(f.store, name); v != nil {
			t.Errorf("%s, gone from the API, held again from its old stream's batch: %+v", name, v)
		}
	}
}

// TestAPodGoneWhileItWaitedForRoomIsNeverHeld: a pod refused for room
// waits on its stream, listed again at each batch with no new lookup, and
// one the API deleted meanwhile (the store had nothing of it to drop) was
// held once room freed, with whatever the stream sent for it, for the
// stream's life. An entry whose pod the API has let go of is held no more.
func TestAPodGoneWhileItWaitedForRoomIsNeverHeld(t *testing.T) {
	g := listTwo(t, store.Options{MaxPodsPerNamespace: 1})
	c, tr, f, stream, enc, ctx := g.c, g.tr, g.f, g.stream, g.enc, g.ctx
	if podView(f.store, "mine") == nil || podView(f.store, "mine2") != nil {
		t.Fatalf("mine %+v, mine2 %+v: want mine held, mine2 waiting for room", podView(f.store, "mine"), podView(f.store, "mine2"))
	}
	for _, name := range []string{"mine2", "mine"} { // the waiting one first, then room made
		if err := c.CoreV1().Pods("ns").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); podView(f.store, "mine") != nil || !tr.Gone("uid-mine2"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pod cache did not see both pods go")
		}
	}
	for seq := uint64(2); seq <= 4; seq++ {
		sendBatch(t, stream, enc, seq, 42, 1, 2)
	}
	if v := podView(f.store, "mine2"); v != nil {
		t.Fatalf("mine2, deleted while it waited for room, held once room was made: %+v", v)
	}
}

// twoListed is a stream of node-1's that has listed mine and mine2 (the
// API's, llama's) and sent one batch of waiting 3 for each, its store told
// of the pods the pod cache sees go.
type twoListed struct {
	c      *fake.Clientset
	tr     *TokenReviewer
	f      *fixture
	stream pulsev1.Ingest_ReportClient
	enc    *wire.Encoder
	ctx    context.Context
}

func listTwo(t *testing.T, opts store.Options) twoListed {
	t.Helper()
	g := twoListed{c: fakeAPIWith(t, "mine2"), enc: wire.NewEncoder()}
	g.tr = runningReviewer(t, g.c)
	g.f = newFixtureStore(t, g.tr, opts)
	g.tr.OnGone(g.f.store.Gone)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	g.ctx = ctx
	g.stream = g.f.openStream(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer token-node-1"), t, "node-1")
	if err := g.stream.Send(catalogue(pod(1, "mine"), pod(2, "mine2"))); err != nil {
		t.Fatal(err)
	}
	sendBatch(t, g.stream, g.enc, 1, 3, 1, 2)
	return g
}

// podGets counts the pod GETs c was asked.
func podGets(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// TestAnEntryNamesOnlyItsPodsWorkloads: an agent named the workloads of the
// pods it listed unchecked, so a compromised one could attach its node's
// pods to any workload of their namespace (its values read as that
// workload's load) or list a router's demand for a workload the router
// does not front. Each entry is now held to the pod as the API has it (its
// labels and owners; a router's demand-workloads), the one wrong entry
// refused; a pod relabelled a moment ago is taken under its new workload.
func TestAnEntryNamesOnlyItsPodsWorkloads(t *testing.T) {
	c := fakeAPI()
	router := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "router", Namespace: "ns", UID: "uid-router",
		Annotations: map[string]string{discovery.AnnotationDemandSource: "epp", discovery.AnnotationDemandWorkloads: "llama, qwen=q"}},
		Spec: corev1.PodSpec{NodeName: "node-1"}}
	if _, err := c.CoreV1().Pods("ns").Create(context.Background(), router, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, runningReviewer(t, c))
	demand := func(id uint32, name string) *pulsev1.Pod {
		return &pulsev1.Pod{Id: id, Uid: store.DemandUID("uid-router", name), Namespace: "ns", Name: "router", Ready: true, Demand: true, Workloads: workspace(name)}
	}
	entries := []*pulsev1.Pod{
		pod(1, "mine"),
		demand(2, "qwen"),
		demand(3, "victim"), // the router fronts no such workload
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entries...)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("workload_claim")); got != 1 {
		t.Fatalf("rejected workload_claim = %v, want 1 (the router's entry for a workload it does not front)", got)
	}
	held := map[string]bool{}
	for _, w := range f.store.View(store.ViewOptions{FreshFor: time.Hour}) {
		held[w.Name] = true
	}
	if !held["llama"] || !held["qwen"] || held["victim"] {
		t.Fatalf("workloads held %v, want llama and qwen, not victim", held)
	}
}

// workspace is the catalogue's list of one Workspace, name.
func workspace(name string) []*pulsev1.Workload {
	return []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: name}}
}

// TestARelabelledPodIsCheckedAgain: an entry is held to the pod as it is
// now: listed under another workload of its namespace, refused (the
// pod's entry alone); relabelled to it, taken at once (the API read when
// the pod cache lags); relabelled away, refused again (what was read of a
// pod once is not believed for its life).
func TestARelabelledPodIsCheckedAgain(t *testing.T) {
	c := fakeAPI()
	tr := runningReviewer(t, c)
	g := newFixtureWith(t, tr)
	wrong := pod(1, "mine")
	wrong.Workloads = workspace("victim")
	if err := g.runAs(t, "token-node-1", hello(), catalogue(wrong)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g.srv.m.rejected.WithLabelValues("workload_claim")); got != 1 {
		t.Fatalf("rejected workload_claim = %v, want 1", got)
	}
	if heldAs(g, "victim") {
		t.Fatal("the pod was taken as workload victim's")
	}

	// Relabelled: the entry under the new workload is taken (the API read
	// again when what is kept does not allow it).
	p, err := c.CoreV1().Pods("ns").Get(context.Background(), "mine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels[discovery.LabelWorkspace] = "victim"
	if _, err := c.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := g.runAs(t, "token-node-1", hello(), catalogue(wrong)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g.srv.m.rejected.WithLabelValues("workload_claim")); got != 1 {
		t.Fatalf("rejected workload_claim = %v after the relabel, want still 1", got)
	}
	if !heldAs(g, "victim") {
		t.Fatal("the relabelled pod is not held under its new workload")
	}

	// Relabelled back: the claim it had is refused again (what was read of
	// the pod once is not believed for its life).
	p.Labels[discovery.LabelWorkspace] = "llama"
	if _, err := c.CoreV1().Pods("ns").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		obj, _, _ := tr.podInformer.GetStore().GetByKey("ns/mine")
		if cp, ok := obj.(*corev1.Pod); ok && cp.Labels[discovery.LabelWorkspace] == "llama" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pod cache did not see the relabel")
		}
	}
	if err := g.runAs(t, "token-node-1", hello(), catalogue(wrong)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g.srv.m.rejected.WithLabelValues("workload_claim")); got != 2 {
		t.Fatalf("rejected workload_claim = %v after relabelling back, want 2", got)
	}
}

// heldAs reports whether f's store holds pod ns/mine under Workspace w.
func heldAs(f *fixture, w string) bool { return podHeldAs(f, w, "mine") }

// TestClaimsMetaKeepsWhatClaimsRead: the pod cache keeps of every pod only
// what Claims reads, bounded; Claims of it is Claims of the pod.
func TestClaimsMetaKeepsWhatClaimsRead(t *testing.T) {
	long := strings.Repeat("x", 300)
	for name, p := range map[string]*corev1.Pod{
		"deployment": {ObjectMeta: metav1.ObjectMeta{UID: "u", Labels: map[string]string{"pod-template-hash": "abc", "app": "x"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("{", 100000)},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "llama-abc"}, {Kind: "Node", Name: "n"}}}},
		"pulse.io/workload too long": {ObjectMeta: metav1.ObjectMeta{UID: "u", Annotations: map[string]string{discovery.KeyWorkload: long}}},
		"router": {ObjectMeta: metav1.ObjectMeta{UID: "u", Annotations: map[string]string{discovery.AnnotationDemandSource: "epp",
			discovery.AnnotationDemandKind: "Deployment", discovery.AnnotationDemandWorkloads: "a=" + long + ", b"}}},
		"router, a repeated name": {ObjectMeta: metav1.ObjectMeta{UID: "u", Annotations: map[string]string{discovery.AnnotationDemandSource: "epp",
			discovery.AnnotationDemandWorkloads: "a, a"}}},
	} {
		kept := &corev1.Pod{ObjectMeta: discovery.ClaimsMeta(p)}
		if got, want := discovery.Claims(kept), discovery.Claims(p); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Claims of what is kept = %v, of the pod %v", name, got, want)
		}
		n := 0
		for k, v := range kept.Annotations {
			n += len(k) + len(v)
		}
		for k, v := range kept.Labels {
			n += len(k) + len(v)
		}
		if n > 600 {
			t.Errorf("%s: %d bytes of labels and annotations kept", name, n)
		}
	}
}

// TestANodesTokenHoldsFewStreams: a token leaked from a node's agent
// opened streams without bound, each with its decoders' state. One node's
// token holds at most maxStreamsPerNode open; the next is refused
// (ResourceExhausted) and counted, another node's are not, and a stream
// that ends gives its place back.
func TestANodesTokenHoldsFewStreams(t *testing.T) {
	f := newFixtureWith(t, runningReviewer(t, fakeAPI()))
	open := func(token string) (pulsev1.Ingest_ReportClient, context.CancelFunc) {
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token))
		s, err := f.client.Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(hello()); err == nil {
			_, err = s.Recv() // the welcome, or the refusal
			if err != nil {
				cancel()
				return nil, func() {}
			}
		}
		return s, cancel
	}
	var cancels []context.CancelFunc
	for range maxStreamsPerNode {
		s, cancel := open("token-node-1")
		if s == nil {
			t.Fatal("a stream within the node's limit was refused")
		}
		cancels = append(cancels, cancel)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	if err := f.runAs(t, "token-node-1", hello()); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream past the node's %d: %v, want ResourceExhausted", maxStreamsPerNode, err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("node_streams")); got != 1 {
		t.Fatalf("rejected node_streams = %v, want 1", got)
	}
	h2 := hello()
	h2.GetHello().Node = "node-2"
	if err := f.runAs(t, "token-node-2", h2); err != nil {
		t.Fatalf("another node's stream: %v", err)
	}
	cancels[0]()
	f.waitForAPlace(t, "token-node-1", "a stream after one of the node's ended")
}

// waitForAPlace waits up to 5 s for a stream of token to be taken, the
// node's places full until then.
func (f *fixture) waitForAPlace(t *testing.T, token, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := f.runAs(t, token, hello())
		if err == nil {
			return
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// TestAStreamWithoutAHelloGivesItsPlaceBack: a stream that never sent its
// hello kept one of its node's maxStreamsPerNode places until its
// connection aged out (an hour), and the node's agent was refused. It
// now ends once helloWait has passed, and its place is given back.
func TestAStreamWithoutAHelloGivesItsPlaceBack(t *testing.T) {
	f := newFixtureWith(t, runningReviewer(t, fakeAPI()))
	f.srv.helloWait = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer token-node-1"))
	defer cancel()
	// Without the wait the streams would hang: the test ends them then.
	stop := time.AfterFunc(30*time.Second, cancel)
	defer stop.Stop()
	for range maxStreamsPerNode {
		s, err := f.client.Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no hello within") {
			t.Fatalf("a stream sending no hello ended with %v; want DeadlineExceeded, no hello", err)
		}
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("invalid_hello")); got != maxStreamsPerNode {
		t.Fatalf("rejected invalid_hello = %v, want %d", got, maxStreamsPerNode)
	}
	f.waitForAPlace(t, "token-node-1", "the node's agent after streams without a hello")
}

// TestAFramedStreamWithoutAHelloEnds: the framed transport serves a
// stream through the same Report; its read of the hello, left running
// once the wait is past, ends with the connection, which the transport
// closes when Report returns.
func TestAFramedStreamWithoutAHelloEnds(t *testing.T) {
	f := newFixtureWith(t, nil)
	f.srv.helloWait = 200 * time.Millisecond
	fs := framed.NewServer(f.srv.Report, framed.ServerOptions{Codec: Codec()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err == nil {
			fs.ServeConn(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); fs.Close() })
	c, err := framed.NewClient(ln.Addr().String(), framed.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "no hello within") {
		t.Fatalf("a framed stream sending no hello ended with %v; want DeadlineExceeded, no hello", err)
	}
	select {
	case <-served:
	case <-ctx.Done():
		t.Fatal("the framed connection is still served")
	}
}

// TestARefusedHeldEntryKeepsTheDecoderInStep: a pod held, listed again
// with the same uid and refused (here a workload its labels do not give
// it), had its decoder state forgotten while the agent's encoder, which
// forgets only a pod removed or replaced, kept its own: the next batch
// did not decode and ended the node's stream, every other pod's sample
// with it. The decoder now forgets as the encoder does.
func TestARefusedHeldEntryKeepsTheDecoderInStep(t *testing.T) {
	c := fakeAPIWith(t, "second")
	f := newFixtureWith(t, runningReviewer(t, c))
	entry := func(id uint32, name, workload string) *pulsev1.Pod {
		return &pulsev1.Pod{Id: id, Uid: "uid-" + name, Namespace: "ns", Name: name, Ready: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: workload}}}
	}
	enc := wire.NewEncoder() // one for the stream, as the agent's
	batch := func(seq uint64, waiting float64) *pulsev1.AgentMessage {
		b := &pulsev1.SampleBatch{Seq: seq, TimeUnixMs: time.Now().Add(time.Duration(seq) * time.Second).UnixMilli()}
		for id := range uint32(2) {
			s := wire.Sample{Pod: id + 1}
			s.Values.Set(metric.Waiting, waiting+float64(id))
			enc.Append(b, &s)
		}
		return &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}
	}
	msgs := []*pulsev1.AgentMessage{hello(), catalogue(entry(1, "mine", "llama"), entry(2, "second", "llama")), batch(1, 3)}
	msgs = append(msgs, &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{ // what changed, as the agent sends it
		Upsert: []*pulsev1.Pod{entry(1, "mine", "other")}}}}) // the same uid, refused
	msgs = append(msgs, batch(2, 7))
	if err := f.runAs(t, "token-node-1", msgs...); err != nil {
		t.Fatalf("a held entry refused, then a batch: %v, want the stream on", err)
	}
	if got := testutil.ToFloat64(f.srv.m.rejected.WithLabelValues("workload_claim")); got != 1 {
		t.Fatalf("rejected workload_claim = %v, want 1", got)
	}
	v := f.store.View(store.ViewOptions{FreshFor: time.Minute, Window: time.Second})
	if len(v) != 1 || len(v[0].Pods) != 1 || v[0].Pods[0].Name != "second" || v[0].Pods[0].Values["waiting"] != 8 {
		t.Fatalf("store = %+v (pods %+v): want the second pod's second sample (8), the refused pod gone", v, v[0].Pods)
	}
}

// TestANodeCannotKeepAnotherTenantsDeletedPod: the store's listing of a
// node outlived its streams, so a node (its token compromised) that
// reconnected with a delta and stayed connected kept every pod its earlier
// streams had listed: another tenant's deleted pod held that namespace's
// room (--max-pods-per-namespace) for ever, and its new replica on an
// honest node waited. A pod that only ended streams listed goes
// --pod-expiry after the last of them ended.
func TestANodeCannotKeepAnotherTenantsDeletedPod(t *testing.T) {
	c, bg := fakeAPI(), context.Background()
	mk := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "victim", UID: types.UID("uid-" + name),
			Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: node}}
	}
	entry := func(name string) *pulsev1.Pod {
		return &pulsev1.Pod{Id: 1, Uid: "uid-" + name, Namespace: "victim", Name: name, Ready: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	}
	if _, err := c.CoreV1().Pods("victim").Create(bg, mk("old", "node-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var skew atomic.Int64 // the store's clock runs ahead of the wall's by it
	f := newFixtureStore(t, runningReviewer(t, c), store.Options{MaxPods: 10, MaxPodsPerNamespace: 1, Expiry: time.Minute,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }})
	pods := func() []string {
		var out []string
		for _, w := range f.store.View(store.ViewOptions{FreshFor: 24 * time.Hour}) {
			for _, p := range w.Pods {
				out = append(out, w.Namespace+"/"+p.Name)
			}
		}
		return out
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entry("old"))); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Pods("victim").Delete(bg, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(bg, "authorization", "Bearer token-node-1"), 20*time.Second)
	defer cancel()
	s := f.openStream(ctx, t, "node-1") // reconnects with an empty delta, and stays
	if err := s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Catalogue{Catalogue: &pulsev1.Catalogue{}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: 1000}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetAck() == nil {
		t.Fatalf("the new stream's batch: %v, %v; want an ack", m, err)
	}
	// The new stream is open and its delta taken. The old pod is held
	// (stale) until --pod-expiry after the first stream ended.
	if got := pods(); len(got) != 1 || got[0] != "victim/old" {
		t.Fatalf("pods held %v; want victim/old, kept until --pod-expiry", got)
	}
	for deadline := time.Now().Add(10 * time.Second); len(pods()) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node-1's open stream listed nothing, past --pod-expiry, and the store holds %v", pods())
		}
		skew.Add(int64(time.Minute + time.Second)) // the first stream's close may come late: past it again
	}
	if _, err := c.CoreV1().Pods("victim").Create(bg, mk("new", "node-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h2 := hello()
	h2.GetHello().Node = "node-2"
	if err := f.runAs(t, "token-node-2", h2, catalogue(entry("new"))); err != nil {
		t.Fatal(err)
	}
	if got := pods(); len(got) != 1 || got[0] != "victim/new" {
		t.Fatalf("pods held %v; want victim/new alone", got)
	}
}

// TestAnIdleStreamsEntriesAreLookedUpAtABatch: an entry whose pod could not
// be looked up (here, the pod cache not synced yet: an aggregator's start)
// is not held, and its agent does not count for the warm-up; at a batch,
// an idle agent's heartbeat among them, it is looked up again, held, and
// its agent counted.
func TestAnIdleStreamsEntriesAreLookedUpAtABatch(t *testing.T) {
	c := fakeAPI()
	tr, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	tr.sync = 50 * time.Millisecond // its informer runs later
	f := newFixtureWith(t, tr)
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer token-node-1"), 20*time.Second)
	defer cancel()
	stream := f.openStream(ctx, t, "node-1")
	loading := &pulsev1.Pod{Id: 1, Uid: "uid-mine", Namespace: "ns", Name: "mine", Ready: false,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	if err := stream.Send(catalogue(loading)); err != nil {
		t.Fatal(err)
	}
	enc := wire.NewEncoder()
	sendBatch(t, stream, enc, 1, 0) // a heartbeat: no sample
	if f.store.Pods() != 0 || f.store.HeardSources() != 0 {
		t.Fatalf("before the pod cache synced: %d pods held, %d agents heard; want none", f.store.Pods(), f.store.HeardSources())
	}
	rctx, stop := context.WithCancel(context.Background())
	defer stop()
	go tr.Run(rctx)
	if !cache.WaitForCacheSync(rctx.Done(), tr.podInformer.HasSynced) {
		t.Fatal("the pod cache did not sync")
	}
	time.Sleep(uncheckedEvery)
	sendBatch(t, stream, enc, 2, 0)
	if f.store.Pods() != 1 || f.store.HeardSources() != 1 {
		t.Fatalf("at the heartbeat after the sync: %d pods held, %d agents heard; want 1 and 1", f.store.Pods(), f.store.HeardSources())
	}
}

// TestPodExistsReadsThePodCache: whether a replica whose agent is lost may
// serve on (store.Options.Exists): the pod of that uid in the cache, a
// replica of the workload asked about, not being deleted, not finished;
// true before the cache has synced (a scale-down held a moment, never a
// serving replica dropped).
func TestPodExistsReadsThePodCache(t *testing.T) {
	c := fakeAPI()
	llama := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	unsynced, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	if !unsynced.PodExists("ns", "gone", "uid-gone", llama) {
		t.Fatal("before the cache synced: want true")
	}
	tr := runningReviewer(t, c)
	for _, tc := range []struct {
		ns, name, uid string
		k             store.Key
		want          bool
	}{
		{"ns", "mine", "uid-mine", llama, true},
		{"ns", "mine", "uid-of-an-older-mine", llama, false}, // a pod of that name made again
		{"ns", "nobody", "uid-nobody", llama, false},
		{"other", "mine", "uid-mine", llama, false},
		{"ns", "mine", "uid-mine", store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "mistral"}, false},
		{"ns", "mine", "uid-mine", store.Key{Namespace: "other", Kind: store.KindWorkspace, Name: "llama"}, false},
	} {
		if got := tr.PodExists(tc.ns, tc.name, tc.uid, tc.k); got != tc.want {
			t.Errorf("PodExists(%s/%s, %s, %s) = %v, want %v", tc.ns, tc.name, tc.uid, tc.k, got, tc.want)
		}
	}
	// Being deleted (a node lost: its pods evicted stay Terminating until
	// the node goes), deleted, finished (evicted by the kubelet, a node's
	// graceful shutdown: Failed; its ReplicaSet has replaced it) or
	// relabelled out of the workload is no replica of it.
	ctx := context.Background()
	pods := c.CoreV1().Pods("ns")
	for _, name := range []string{"deleting", "failed", "relabelled"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "node-1"}}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	change := func(name string, f func(*corev1.Pod)) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(p)
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the new pods in the cache", func() bool { return tr.PodExists("ns", "relabelled", "uid-relabelled", llama) })
	change("deleting", func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now })
	change("failed", func(p *corev1.Pod) { p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted" })
	change("relabelled", func(p *corev1.Pod) { p.Labels = map[string]string{discovery.LabelWorkspace: "quarantine"} })
	if err := pods.Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"deleting", "failed", "relabelled", "mine"} {
		waitFor(t, name+" no replica of llama", func() bool { return !tr.PodExists("ns", name, "uid-"+name, llama) })
	}
}

// waitFor waits up to 10 s for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplicasReadsThePodCache: the API's replicas of a workload with
// their nodes, readiness and creation, the oldest first (the store adopts
// those on a node no agent streams from as unseen), on nodes that run an
// agent's pod (a node with no agent has none to lose: its replicas would
// hold the plan for ever): not a router claiming the workload for its
// demand, a finished pod, a pod left out of scraping, nor a pod of another
// namespace; none before the cache has synced.
func TestReplicasReadsThePodCache(t *testing.T) {
	c := fakeAPI()
	llama := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	unsynced, err := NewTokenReviewer(c, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	all := func(string) bool { return true }
	if got, ok := unsynced.Replicas(llama, all); got != nil || ok {
		t.Fatalf("before the cache synced: %v, %v; want no answer", got, ok)
	}
	created := metav1.NewTime(time.Unix(1000, 0))
	add := func(ns, name string, labels, annotations map[string]string, status corev1.PodStatus) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: created,
			Labels: labels, Annotations: annotations}, Spec: corev1.PodSpec{NodeName: "node-3"}, Status: status}
		if _, err := c.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	llamaLabel := map[string]string{discovery.LabelWorkspace: "llama"}
	add("ns", "ready", llamaLabel, nil, corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue}}})
	add("ns", "router", nil, map[string]string{discovery.AnnotationDemandSource: "epp", discovery.AnnotationDemandWorkloads: "llama"}, corev1.PodStatus{})
	add("ns", "failed", llamaLabel, nil, corev1.PodStatus{Phase: corev1.PodFailed})
	add("other", "elsewhere", llamaLabel, nil, corev1.PodStatus{})
	add("ns", "opted-out", llamaLabel, map[string]string{discovery.AnnotationScrape: "false"}, corev1.PodStatus{}) // no agent lists it
	// The agents' pods on node-1 and node-3; node-2 runs none (no agent
	// to lose), and a pod of another service account there is no agent.
	for node, sa := range map[string]string{"node-1": "pulse-agent", "node-3": "pulse-agent", "node-2": "default"} {
		a := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node, Namespace: "pulse-system", UID: types.UID("uid-agent-" + node)},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa}}
		if _, err := c.CoreV1().Pods("pulse-system").Create(context.Background(), a, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tr := runningReviewer(t, c)
	want := []store.APIPod{
		{Namespace: "ns", Name: "mine", UID: "uid-mine", Node: "node-1"},
		{Namespace: "ns", Name: "ready", UID: "uid-ready", Node: "node-3", Ready: true, CreatedMs: 1000_000},
	}
	if got, _ := tr.Replicas(llama, all); !slices.Equal(got, want) {
		t.Fatalf("Replicas = %+v\nwant %+v", got, want)
	}
	if got, _ := tr.Replicas(llama, func(node string) bool { return node == "node-3" }); !slices.Equal(got, want[1:]) {
		t.Fatalf("Replicas on node-3 = %+v\nwant %+v", got, want[1:])
	}
	if got, ok := tr.Replicas(store.Key{Namespace: "ns", Kind: store.KindInferenceSet, Name: "llama"}, all); len(got) != 0 || !ok {
		t.Fatalf("an InferenceSet of that name: %+v; want none", got)
	}
}

// TestANodeWhoseAgentsPodIsGoneHoldsNoReplica: the store, with the pod
// cache as its API, holds a replica on a node whose agent's pod is there
// and streams nothing; once that pod is gone (the DaemonSet no longer runs
// there: no agent to lose), the replica is no longer held, though the API
// still has it.
func TestANodeWhoseAgentsPodIsGoneHoldsNoReplica(t *testing.T) {
	ws := store.Key{Namespace: "ns", Kind: store.KindWorkspace, Name: "llama"}
	replica := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-0", Namespace: "ns", UID: "uid-0",
		Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "gpu-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	agent := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pulse-agent-x", Namespace: "pulse-system", UID: "uid-agent"},
		Spec: corev1.PodSpec{NodeName: "gpu-1", ServiceAccountName: "pulse-agent"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	c := fake.NewClientset(replica, agent)
	tr := runningReviewer(t, c)
	s := store.New(store.Options{Expiry: time.Minute, Exists: tr.PodExists, Replicas: tr.Replicas})
	st, err := s.OpenSource("router-node")
	if err != nil {
		t.Fatal(err)
	}
	s.Upsert(store.Source{Node: "router-node", Stream: st}, []store.PodInfo{{UID: store.DemandUID("r1", "llama"), Namespace: "ns",
		Name: "router", Demand: true, Workloads: []store.Key{ws}}}, true)
	s.Sweep()
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); !snap.LostOK || snap.Lost.Pods != 1 {
		t.Fatalf("llama-0 on gpu-1, whose agent is lost: %+v; want it held (lost, 1)", snap)
	}
	if err := c.CoreV1().Pods("pulse-system").Delete(context.Background(), "pulse-agent-x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent's pod gone from the cache", func() bool { return !tr.agentOn("gpu-1") })
	s.Sweep()
	if snap := s.Snapshot(nil, ws, time.Minute, 5*time.Second, 0); snap.LostOK {
		t.Fatalf("gpu-1 runs no agent's pod, yet llama-0 is held: %+v", snap.Lost)
	}
}

// TestAStaticPodsMirrorClaimsNoWorkload: a node's kubelet credentials may
// create a static pod's mirror bound to the node in any namespace, with any
// labels (NodeRestriction forbids only service accounts, secrets and
// owners other than the node): a node a tenant controls made one in
// another tenant's namespace, labelled with its workspace, and its agent's
// invented samples were that workload's replica (to scale it down, or up,
// and to fill its namespace's room in the store). A mirror claims no
// workload with agent authentication: its entry is refused, naming why.
func TestAStaticPodsMirrorClaimsNoWorkload(t *testing.T) {
	c := fakeAPI()
	mirror := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llama-node-1", Namespace: "victim", UID: "uid-mirror",
		Labels:      map[string]string{discovery.LabelWorkspace: "llama"},
		Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "0123"}}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	if _, err := c.CoreV1().Pods("victim").Create(context.Background(), mirror, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := runningReviewer(t, c)
	ctx := context.Background()
	if _, err := tr.PodNode(ctx, llama("victim", "llama-node-1", "uid-mirror")); !errors.Is(err, ErrClaim) || !strings.Contains(err.Error(), "static pod's mirror") {
		t.Fatalf("the mirror's entry for the victim's workspace: %v; want refused, naming the mirror", err)
	}
	if n := len(discovery.Claims(mirror)); n != 0 {
		t.Fatalf("a mirror claims %d entries; want none", n)
	}
	// The agent lists it as any pod (with --agent-auth=none, vLLM run as a
	// static pod scales as before): the refusal is the aggregator's.
	if _, ok, err := discovery.TargetOf(mirror, "node-1", labels.Everything()); !ok || err != nil {
		t.Fatalf("the agent's target of a mirror: %v, %v; want it listed", ok, err)
	}
	// A pod the scheduler placed is as before.
	if node, err := tr.PodNode(ctx, llama("ns", "mine", "uid-mine")); err != nil || node != "node-1" {
		t.Fatalf("a scheduled pod: %q, %v", node, err)
	}
}

// TestANameNoPodCanHaveIsRefused: an entry named a/b (or with a space,
// or uppercase) is no pod's: client-go refused it before asking, and that
// read as the API unavailable, so the entry was looked up again at every
// batch for the stream's life, each a lookup of the node's and the shared
// rates, and the node counted as unheard through the warm-up. It is
// refused, not held as unavailable, and looks nothing up.
func TestANameNoPodCanHaveIsRefused(t *testing.T) {
	c := fakeAPI()
	tr := runningReviewer(t, c)
	before := podGets(c)
	for _, e := range []Entry{llama("ns", "a/b", "uid-x"), llama("ns", "a b", "uid-x"), llama("NS", "mine", "uid-x"), llama("ns/x", "mine", "uid-x")} {
		e.Node = "node-1"
		if _, err := tr.PodNode(context.Background(), e); err == nil || errors.Is(err, ErrLookupUnavailable) || !strings.Contains(err.Error(), "no pod can be") {
			t.Errorf("%s/%s: %v; want refused as no pod's name", e.Namespace, e.Name, err)
		}
	}
	if n := podGets(c) - before; n != 0 {
		t.Fatalf("%d pod GETs for names no pod has", n)
	}
}

// TestADeletedPodIsNotHeldAgainUnverified: a node's agent kept a pod the
// API no longer has (here another tenant's, deleted) held and reporting
// across a reconnect, by listing made-up pods first: they took its node's
// share of the lookups, the real entry was "not looked up now", and a full
// catalogue's entry not looked up is kept as last admitted (an outage's
// rule). Once its node's share is spent in a catalogue, an entry not
// looked up is not kept.
func TestADeletedPodIsNotHeldAgainUnverified(t *testing.T) {
	c := fakeAPI()
	tr := runningReviewer(t, c)
	tr.nodeRate, tr.nodeBurst = 0.001, 1 // one GET, then none: as after a flood of the node's own
	f := newFixtureStore(t, tr, store.Options{Expiry: time.Hour})
	entry := func(id uint32, name string) *pulsev1.Pod {
		return &pulsev1.Pod{Id: id, Uid: "uid-" + name, Namespace: "ns", Name: name, Ready: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entry(1, "mine"))); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Pods("ns").Delete(context.Background(), "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod cache to drop mine", func() bool {
		_, ok, _ := tr.podInformer.GetStore().GetByKey("ns/mine")
		return !ok
	})
	tr.pods.Purge() // its identity read more than claimsFor ago
	enc := wire.NewEncoder()
	b := &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: time.Now().UnixMilli()}
	s := wire.Sample{Pod: 3}
	s.Values.Set(metric.Waiting, 42)
	enc.Append(b, &s)
	err := f.runAs(t, "token-node-1", hello(), catalogue(entry(1, "ghost-a"), entry(2, "ghost-b"), entry(3, "mine")),
		&pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}})
	if err != nil {
		t.Fatal(err)
	}
	if v := podView(f.store, "mine"); v != nil && v.Values["waiting"] == 42 {
		t.Fatalf("the API has no pod ns/mine, yet node-1's new stream holds it and stored its sample: %+v", v)
	}
}

// TestATokenReviewIsBounded: a token review the API does not answer (a
// hung connection) ends at the reviewer's bound, an error that is not
// cached, and gives its turn back: it held one of the maxReviews turns for
// as long as the API did not answer, long past the agent's giving up, and
// every node's new stream waited for the turns.
func TestATokenReviewIsBounded(t *testing.T) {
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select { // a review never answered, until the test ends
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer api.Close()
	defer close(release)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTokenReviewer(client, "pulse", []string{"pulse-system/pulse-agent"})
	if err != nil {
		t.Fatal(err)
	}
	tr.reviewFor = 50 * time.Millisecond
	for i := range maxReviews + 1 {
		if _, err := tr.Authenticate(context.Background(), fmt.Sprintf("token-%d", i)); err == nil || errors.Is(err, ErrBusy) || errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("review %d of a hung API: %v; want the review's error (turns given back, nothing cached)", i, err)
		}
	}
	if n := len(tr.turns); n != 0 {
		t.Fatalf("%d turns held after the reviews ended", n)
	}
}

// TestANodeCannotReportAPodThatIsNoReplica: a node's token (a compromised
// node) listed pods the API has on its node that its honest agent never
// lists and that are no replica (PodExists): an evicted (Failed) pod of
// another tenant's workload, which stays for days, and one left out with
// pulse.io/scrape: "false". Their made-up samples were held as a ready
// replica of that workload, again at every stream, for as long as the pod
// object stayed. Each is refused, saying why.
func TestANodeCannotReportAPodThatIsNoReplica(t *testing.T) {
	c := fakeAPI()
	mk := func(name string, ann map[string]string, phase corev1.PodPhase) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "victim", UID: types.UID("uid-" + name),
			Labels: map[string]string{discovery.LabelWorkspace: "llama"}, Annotations: ann},
			Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: phase}}
		if _, err := c.CoreV1().Pods("victim").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("evicted", nil, corev1.PodFailed)
	mk("opted-out", map[string]string{discovery.AnnotationScrape: "false"}, corev1.PodRunning)
	tr := runningReviewer(t, c)
	f := newFixtureStore(t, tr, store.Options{})
	for i, name := range []string{"evicted", "opted-out"} {
		id := uint32(i + 1)
		entry := &pulsev1.Pod{Id: id, Uid: "uid-" + name, Namespace: "victim", Name: name, Ready: true,
			Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
		b := &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: time.Now().UnixMilli()}
		s := wire.Sample{Pod: id}
		s.Values.Set(metric.Waiting, 500)
		wire.NewEncoder().Append(b, &s)
		if err := f.runAs(t, "token-node-1", hello(), catalogue(entry), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
			t.Fatal(err)
		}
		if v := podView(f.store, name); v != nil {
			t.Errorf("victim/%s, no replica, held from node-1's stream: ready=%v values=%v", name, v.Ready, v.Values)
		}
		if _, err := tr.PodNode(context.Background(), Entry{PodUID: "uid-" + name, UID: "uid-" + name, Namespace: "victim", Name: name, Node: "node-1",
			Workloads: []discovery.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}); !errors.Is(err, ErrClaim) || !strings.Contains(err.Error(), "no replica") {
			t.Errorf("victim/%s: %v; want refused as no replica", name, err)
		}
	}
}

// TestADeletedPodIsNotVouchedForFromTheUidCache: what the API said of a pod
// (kept by uid for a pod the cache does not hold yet) vouched for it for a
// minute after its last listing, though the cache had seen it deleted: a
// new stream of its node listing it was held, with its made-up samples,
// for the stream's life.
func TestADeletedPodIsNotVouchedForFromTheUidCache(t *testing.T) {
	c, bg := fakeAPI(), context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gone", Namespace: "victim", UID: "uid-gone",
		Labels: map[string]string{discovery.LabelWorkspace: "llama"}}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	if _, err := c.CoreV1().Pods("victim").Create(bg, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := runningReviewer(t, c)
	f := newFixtureStore(t, tr, store.Options{Expiry: time.Hour})
	entry := &pulsev1.Pod{Id: 1, Uid: "uid-gone", Namespace: "victim", Name: "gone", Ready: true,
		Workloads: []*pulsev1.Workload{{Kind: pulsev1.WorkloadKind_WORKLOAD_KIND_WORKSPACE, Name: "llama"}}}
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entry)); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().Pods("victim").Delete(bg, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod cache to drop it", func() bool {
		_, ok, _ := tr.podInformer.GetStore().GetByKey("victim/gone")
		return !ok
	})
	if _, ok := tr.pods.Get("uid-gone"); ok {
		// The delete handler runs after the store's update: give it its turn.
		waitFor(t, "the uid cache to drop it", func() bool { _, ok := tr.pods.Get("uid-gone"); return !ok })
	}
	b := &pulsev1.SampleBatch{Seq: 1, TimeUnixMs: time.Now().UnixMilli()}
	s := wire.Sample{Pod: 1}
	s.Values.Set(metric.Waiting, 777)
	wire.NewEncoder().Append(b, &s)
	if err := f.runAs(t, "token-node-1", hello(), catalogue(entry), &pulsev1.AgentMessage{Msg: &pulsev1.AgentMessage_Batch{Batch: b}}); err != nil {
		t.Fatal(err)
	}
	if v := podView(f.store, "gone"); v != nil && v.Values["waiting"] == 777 {
		t.Fatalf("a new stream listed deleted victim/gone, its samples held: %v", v.Values)
	}
}
