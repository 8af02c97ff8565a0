package aggregator

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pulse-io/pulse/test/testpki"
)

const (
	promUser  = "system:serviceaccount:monitoring:prometheus"
	debugUser = "system:serviceaccount:ops:debugger"
)

// reviewingAPI answers TokenReviews and SubjectAccessReviews as an API
// server would for these tokens: prometheus's user may get /metrics,
// debugger's /debug/* (as RBAC's nonResourceURLs match), a tenant's
// neither, a made-up token is not authenticated, and the first review of
// "flaky" fails. It counts the reviews.
func reviewingAPI(reviews *atomic.Int64) *fake.Clientset {
	c := fake.NewClientset()
	users := map[string]string{"prometheus": promUser, "prometheus-rotated": promUser, "tenant": "system:serviceaccount:team-a:app", "flaky": promUser, "debugger": debugUser}
	var failed atomic.Bool
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == "flaky" && failed.CompareAndSwap(false, true) {
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		u, ok := users[tr.Spec.Token]
		if strings.HasPrefix(tr.Spec.Token, "minted-") {
			u, ok = tenantReader, true
		}
		if ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: u, Groups: []string{"system:serviceaccounts"}}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		na := sar.Spec.NonResourceAttributes
		switch {
		case na == nil || na.Verb != "get":
		case sar.Spec.User == promUser:
			sar.Status.Allowed = na.Path == "/metrics"
		case sar.Spec.User == debugUser:
			sar.Status.Allowed = strings.HasPrefix(na.Path, "/debug/")
		case sar.Spec.User == tenantReader:
			sar.Status.Allowed = strings.HasPrefix(na.Path, "/debug/workloads/team-a")
		}
		return true, sar, nil
	})
	return c
}

func getWithToken(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsNeedAReviewedToken: /metrics names every tenant's workloads
// and their load (the per-trigger series), and any pod that reached the
// http port read them. With --metrics-auth=kubernetes a request needs a
// bearer token the API server authenticates, whose user may get the
// non-resource URL /metrics; with --http-tls the port speaks TLS with the
// ingest port's certificate, so the token never travels in plaintext. The
// probes stay open to the kubelet. Answers are kept a minute; an API
// error is a 503, not kept.
func TestMetricsNeedAReviewedToken(t *testing.T) {
	ca := testpki.NewCA(t)
	cert, key := ca.Issue(t, "pulse-aggregator", 2, x509.ExtKeyUsageServerAuth)
	paths := testpki.Write(t, t.TempDir(), map[string][]byte{"tls.crt": cert, "tls.key": key}, "tls.crt", "tls.key")
	var reviews atomic.Int64
	a := startWith(t, func(o *Options) {
		o.Serving.MetricsAuth, o.Serving.HTTPTLS, o.Serving.HealthAddr = "kubernetes", true, "127.0.0.1:0"
		o.IngestTLS.CertFile, o.IngestTLS.KeyFile = paths[0], paths[1]
	}, Deps{Kube: reviewingAPI(&reviews)})
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	base := "https://" + a.HTTPAddr()
	if code, _ := getWithToken(t, c, base+"/livez", ""); code != http.StatusOK {
		t.Fatalf("/livez without a token: %d, want 200 (the kubelet's probes carry none)", code)
	}
	if resp, err := http.Get("http://" + a.HTTPAddr() + "/livez"); err == nil && resp.StatusCode == http.StatusOK {
		resp.Body.Close()
		t.Fatal("the http port answered in plaintext with --http-tls")
	}
	// The kubelet's probes on --health-addr, in plaintext; nothing else
	// there.
	hbase := "http://" + a.healthLn.Addr().String()
	if code, _ := httpStatus(t, hbase+"/livez"); code != http.StatusOK {
		t.Fatalf("/livez on the health port: %d", code)
	}
	if code, _ := httpStatus(t, hbase+"/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics on the health port: %d, want 404", code)
	}
	for token, want := range map[string]int{"": http.StatusUnauthorized, "made-up": http.StatusUnauthorized, "tenant": http.StatusForbidden} {
		if code, body := getWithToken(t, c, base+"/metrics", token); code != want || strings.Contains(body, "pulse_aggregator") {
			t.Errorf("/metrics with token %q: %d, want %d and no series", token, code, want)
		}
	}
	if code, body := getWithToken(t, c, base+"/metrics", "prometheus"); code != http.StatusOK || !strings.Contains(body, "pulse_aggregator_") {
		t.Fatalf("/metrics with prometheus's token: %d", code)
	}
	before := reviews.Load()
	for _, token := range []string{"prometheus", "tenant", "made-up"} {
		getWithToken(t, c, base+"/metrics", token)
	}
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("%d reviews for tokens answered within the minute, want 0", n)
	}
	if code, _ := getWithToken(t, c, base+"/metrics", "flaky"); code != http.StatusServiceUnavailable {
		t.Errorf("/metrics while the API fails: %d, want 503", code)
	}
	if code, _ := getWithToken(t, c, base+"/metrics", "flaky"); code != http.StatusOK {
		t.Errorf("/metrics once the API answers: %d, want 200 (an error is not kept)", code)
	}
}

func TestMetricsAuthIsValidated(t *testing.T) {
	o := NewOptions()
	o.Serving.MetricsAuth, o.Serving.HTTPTLS = "bearer", true
	err := o.Validate()
	for _, want := range []string{`--metrics-auth "bearer"`, "--http-tls serves the ingest port's certificate"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--metrics-auth bearer --http-tls without ingest TLS: %v, want %q", err, want)
		}
	}
}

// prometheusAllowed is an authorizer of reviewingAPI that has allowed
// prometheus's token /metrics, and the count of its reviews.
func prometheusAllowed(t *testing.T) (*metricsAuthorizer, *atomic.Int64) {
	t.Helper()
	reviews := new(atomic.Int64)
	m := newMetricsAuthorizer(reviewingAPI(reviews), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if ok, _, err := m.allow(context.Background(), "/metrics", "prometheus"); !ok || err != nil {
		t.Fatalf("prometheus: %v %v", ok, err)
	}
	return m, reviews
}

// TestARotatedTokenFromAReadersAddressIsNotLockedOut: a flood of made-up
// tokens takes the rate of tokens not known; Prometheus's token, rotated
// by the kubelet (about every 48 minutes for a token of an hour), is new
// to the aggregator, and was refused with them for as long as the flood
// went on (found in a review, 2026-12-07). A new token from an address a
// token was allowed from is reviewed within the known tokens' rate; from
// the flood's address it is not.
func TestARotatedTokenFromAReadersAddressIsNotLockedOut(t *testing.T) {
	reviews := new(atomic.Int64)
	m := newMetricsAuthorizer(reviewingAPI(reviews), slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := m.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func(from, token string) int { return getPath(h, from, "/metrics", token) }
	if code := get("10.0.0.5", "prometheus"); code != 200 {
		t.Fatalf("prometheus: %d", code)
	}
	busy := 0
	for i := range 200 {
		if get("10.0.0.9", fmt.Sprintf("made-up-%d", i)) == http.StatusServiceUnavailable {
			busy++
		}
	}
	m.limit[0].SetBurst(0) // the flood goes on
	if busy == 0 {
		t.Fatal("200 made-up tokens: none refused as busy; want the rate taken")
	}
	if code := get("10.0.0.9", "prometheus-rotated"); code != http.StatusServiceUnavailable {
		t.Errorf("a new token from the flood's address: %d; want 503, within the rate of tokens not known", code)
	}
	if code := get("10.0.0.5", "prometheus-rotated"); code != 200 {
		t.Errorf("Prometheus's rotated token, from its address, during the flood: %d; want 200", code)
	}
	// A tenant's made-up tokens from its own pod, a reader's address once
	// its own token was allowed, take its address's rate alone: not the
	// known tokens' new paths (the operator's), nor another reader's.
	if code := getPath(h, "10.1.1.1", "/debug/workloads/team-a/llama", "minted-1"); code != 200 {
		t.Fatalf("the tenant's own page: %d", code)
	}
	if code := getPath(h, "10.2.2.2", "/debug/triggers", "debugger"); code != 200 {
		t.Fatalf("the operator's page: %d", code)
	}
	for i := range 100 {
		getPath(h, "10.1.1.1", "/debug/triggers", fmt.Sprintf("made-up-debug-%d", i))
	}
	if code := getPath(h, "10.2.2.2", "/debug/triggers/team-b", "debugger"); code != 200 {
		t.Errorf("the operator's new path after the tenant's flood from its own address: %d; want 200", code)
	}
}

// getPath serves a GET of path from the remote host from with token.
func getPath(h http.Handler, from, path, token string) int {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr, r.Header = from+":41000", http.Header{"Authorization": {"Bearer " + token}}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// TestMadeUpTokensDoNotLockPrometheusOut: made-up tokens, each a review,
// once filled the one cache of answers (pushing out Prometheus's) and
// queued every review behind them. Now the reviews of tokens not known
// have a rate (past it 503 at once), tokens refused a cache of their own,
// a token allowed before is reviewed again within a rate of its own, and
// keeps its answer while that is taken, up to two minutes and never past
// its own expiry.
func TestMadeUpTokensDoNotLockPrometheusOut(t *testing.T) {
	m, reviews := prometheusAllowed(t)
	ctx := context.Background()
	busy := 0
	for i := range 5000 {
		if _, _, err := m.allow(ctx, "/metrics", fmt.Sprintf("made-up-%d", i)); errors.Is(err, errReviewsBusy) {
			busy++
		}
	}
	if busy == 0 || reviews.Load() > 2*metricsAuthBurst+10 {
		t.Fatalf("5,000 made-up tokens: %d reviews, %d refused as busy; want the reviews bounded by the rate", reviews.Load(), busy)
	}
	// The flood goes on: each review the rate gives back is a made-up
	// token's. (Left to real time, the rate gives one back every 0.1 s,
	// and a tenant's token checked below could be reviewed in a slow
	// run.)
	m.limit[0].SetBurst(0)
	if ok, _, err := m.allow(ctx, "/metrics", "prometheus"); !ok || err != nil {
		t.Fatalf("prometheus during the flood: %v %v, want its answer kept", ok, err)
	}
	// Its answer a minute old: kept while no review can be made.
	key := answerKey("/metrics", "prometheus")
	m.allowed.Add(key, allowance{until: time.Now().Add(-time.Second), user: promUser})
	if ok, _, err := m.allow(ctx, "/metrics", "prometheus"); !ok || err != nil {
		t.Fatalf("prometheus, its answer just past a minute, the rate taken: %v %v", ok, err)
	}
	if _, _, err := m.allow(ctx, "/metrics", "tenant"); !errors.Is(err, errReviewsBusy) {
		t.Fatalf("a token never reviewed while the rate is taken: %v, want busy", err)
	}
	// Its answer past the two minutes, the flood still on: reviewed again
	// within a rate of its own (it shared the made-up tokens' once, and
	// was locked out).
	m.allowed.Add(key, allowance{until: time.Now().Add(-3 * time.Minute), user: promUser})
	m.identities.Purge() // who the token is, reviewed as long ago
	before := reviews.Load()
	if ok, _, err := m.allow(ctx, "/metrics", "prometheus"); !ok || err != nil || reviews.Load() != before+1 {
		t.Fatalf("prometheus, its answer three minutes old, the rate of tokens not known taken: %v %v (%d reviews)", ok, err, reviews.Load()-before)
	}
	// Never past the token's own expiry.
	expired := testJWT(time.Now().Add(-time.Second))
	m.allowed.Add(answerKey("/metrics", expired), allowance{until: time.Now().Add(-time.Second), user: "expired"})
	if ok, _, _ := m.allow(ctx, "/metrics", expired); ok {
		t.Fatal("an expired token allowed from its old answer")
	}
}

// TestDebugPagesDoNotLockPrometheusOut: a user granted debug pages (a
// tenant, its own namespace's) asking for a thousand of them, each a path
// of its own and so a review of its own, took the rate of reviews that
// /metrics shared with them: Prometheus's review waited, its answer old,
// then was refused 503. /metrics has rates of its own.
func TestDebugPagesDoNotLockPrometheusOut(t *testing.T) {
	m, _ := prometheusAllowed(t)
	ctx := context.Background()
	busy := 0
	for i := range 1000 {
		path := fmt.Sprintf("/debug/workloads/team-a/x%d", i)
		if _, _, err := m.allow(ctx, path, "debugger"); errors.Is(err, errReviewsBusy) {
			busy++
		}
		// Allowed before, its answer old: reviewed again.
		m.allowed.Add(answerKey(path, "debugger"), allowance{until: time.Now().Add(-3 * time.Minute), user: debugUser})
		if _, _, err := m.allow(ctx, path, "debugger"); errors.Is(err, errReviewsBusy) {
			busy++
		}
	}
	if busy == 0 {
		t.Fatal("a thousand debug pages, twice: no review refused as busy; the test's flood took no rate")
	}
	// Prometheus's answer past the two minutes: reviewed again.
	m.allowed.Add(answerKey("/metrics", "prometheus"), allowance{until: time.Now().Add(-3 * time.Minute), user: promUser})
	if ok, _, err := m.allow(ctx, "/metrics", "prometheus"); !ok || err != nil {
		t.Fatalf("prometheus after the debug pages' flood: %v %v, want reviewed and allowed", ok, err)
	}
}

// testJWT is a token shaped as a JWT, expiring at exp (unsigned: only its
// exp claim is read here).
func testJWT(exp time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"exp":%d}`, exp.Unix())))
	return "e30." + payload + ".sig"
}

// TestDebugOnTheHTTPPortNeedsAReviewedToken: the debug endpoints served on
// the http port (no --debug-addr) name every tenant's workloads as
// /metrics does, and were open to whoever reached the port. They are now
// behind the same review, of the request's own path: a user granted
// /metrics alone may not read them. A path no endpoint serves is answered
// 404 without a review (no path of a caller's choosing goes to the API
// server). On their own --debug-addr they are not on the http port.
func TestDebugOnTheHTTPPortNeedsAReviewedToken(t *testing.T) {
	var reviews atomic.Int64
	a := startWith(t, func(o *Options) { o.Serving.MetricsAuth, o.Serving.Profiling = "kubernetes", true },
		Deps{Kube: reviewingAPI(&reviews)})
	base := "http://" + a.HTTPAddr()
	for _, path := range []string{"/debug/workloads", "/debug/triggers", "/debug/workloads/team-a/llama", "/debug/pprof/heap"} {
		for token, want := range map[string]int{"": http.StatusUnauthorized, "made-up": http.StatusUnauthorized,
			"tenant": http.StatusForbidden, "prometheus": http.StatusForbidden} {
			if code, _ := getWithToken(t, http.DefaultClient, base+path, token); code != want {
				t.Errorf("%s with token %q: %d, want %d", path, token, code, want)
			}
		}
		if code, body := getWithToken(t, http.DefaultClient, base+path, "debugger"); code != http.StatusOK && code != http.StatusNotFound {
			t.Errorf("%s with a token whose user may get /debug/*: %d %s", path, code, body)
		}
	}
	if code, body := getWithToken(t, http.DefaultClient, base+"/debug/triggers", "debugger"); code != http.StatusOK || !strings.Contains(body, `"triggers"`) {
		t.Errorf("/debug/triggers with the debugger's token: %d %q, want the triggers", code, body)
	}
	before := reviews.Load()
	if code, _ := getWithToken(t, http.DefaultClient, base+"/debug/no-such-endpoint", "never-seen"); code != http.StatusNotFound {
		t.Errorf("a path no endpoint serves: %d, want 404", code)
	}
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("%d reviews for a path no endpoint serves, want 0", n)
	}

	// With --debug-addr: the http port has none of them, the debug address
	// all (it is the pod's loopback in the chart).
	b := startWith(t, func(o *Options) { o.Serving.MetricsAuth, o.Serving.DebugAddr = "kubernetes", "127.0.0.1:0" },
		Deps{Kube: reviewingAPI(&reviews)})
	if code, _ := getWithToken(t, http.DefaultClient, "http://"+b.HTTPAddr()+"/debug/triggers", "debugger"); code != http.StatusNotFound {
		t.Errorf("/debug/triggers on the http port with --debug-addr: %d, want 404", code)
	}
	if code, _ := httpStatus(t, "http://"+b.DebugAddr()+"/debug/triggers"); code != http.StatusOK {
		t.Errorf("/debug/triggers on --debug-addr: %d, want 200", code)
	}
}

// TestOneTokensReviewsAreBounded: a tenant granted its own namespace's
// debug pages asked for a new name of it at each request, each a review,
// and took the debug endpoints' rate from every other reader. A token has
// a rate of its own first: past it that token waits, and another's review
// is made.
func TestOneTokensReviewsAreBounded(t *testing.T) {
	m, reviews := prometheusAllowed(t)
	ctx := context.Background()
	before := reviews.Load()
	busy := 0
	for i := range 100 {
		if _, _, err := m.allow(ctx, fmt.Sprintf("/debug/workloads/team-a/x%d", i), "debugger"); errors.Is(err, errReviewsBusy) {
			busy++
		}
	}
	if n := reviews.Load() - before; n > metricsTokenBurst+2 || busy == 0 {
		t.Fatalf("one token's 100 new paths at once: %d reviews, %d refused busy; want at most its burst (%d) reviewed", n, busy, metricsTokenBurst)
	}
	if _, auth, err := m.allow(ctx, "/debug/workloads/team-a/y", "tenant"); err != nil || !auth {
		t.Fatalf("another token after the flood: %v (authenticated %v); want reviewed", err, auth)
	}
}

// TestPathsAndTokensNoObjectHasAreNotReviewed: a path or a token of a
// caller's choosing went to the API server whole (a name of about 1 MiB in
// a SubjectAccessReview, a 1 MiB token in a TokenReview, each up to the
// reviews' rate); and a namespace escaped, team-a%2F1, routed as one of its
// own (past the one answer a namespace may have under way) and was
// reviewed as team-a's. A namespace that is no DNS label, a name no
// workload's (a slash, a control character, past 253 bytes), or a path
// past 512 bytes is 404, and a token past 16 KiB 401, unreviewed.
func TestPathsAndTokensNoObjectHasAreNotReviewed(t *testing.T) {
	var reviews atomic.Int64
	a := startWith(t, func(o *Options) { o.Serving.MetricsAuth = "kubernetes" }, Deps{Kube: reviewingAPI(&reviews)})
	base := "http://" + a.HTTPAddr()
	for _, path := range []string{
		"/debug/workloads/team-a%2F1", "/debug/triggers/team-a%2F..%2Fteam-b", "/debug/workloads/Team-A",
		"/debug/workloads/team-a/" + strings.Repeat("x", 300), "/debug/provisioning/" + strings.Repeat("n", 64),
		"/debug/workloads/team-a/a%2Fb", "/debug/workloads/team-a/a%0Ab",
		// A page's word escaped is routed as the page: checked as it.
		"/debug/%77orkloads/team-a%2F1", "/debug/%74riggers/team-a%2F..%2Fteam-b", "/debug/%77orkloads/team-a/a%0Ab",
		"/%64ebug/provisioning/Team-A",
	} {
		if code, _ := getWithToken(t, http.DefaultClient, base+path, "debugger"); code != http.StatusNotFound {
			t.Errorf("%.80s: %d, want 404", path, code)
		}
	}
	if code, _ := getWithToken(t, http.DefaultClient, base+"/debug/triggers", strings.Repeat("t", 17<<10)); code != http.StatusUnauthorized {
		t.Errorf("a token of 17 KiB: %d, want 401", code)
	}
	if n := reviews.Load(); n != 0 {
		t.Fatalf("%d reviews made for them; want none", n)
	}
	// A workload's name is pulse.io/workload's, more than a DNS name.
	for _, path := range []string{"/debug/workloads/team-a", "/debug/workloads/team-a/llama.v2", "/debug/triggers/team-a",
		"/debug/workloads/team-a/Llama_70B", "/debug/workloads/team-a/llama:7b", "/debug/workloads/team-a/my%20model"} {
		// Reviewed and served (a workload not there is the page's own 404).
		if code, body := getWithToken(t, http.DefaultClient, base+path, "debugger"); code != http.StatusOK && !strings.Contains(body, "no workload") {
			t.Errorf("%s: %d %s, want it served", path, code, body)
		}
	}
	if reviews.Load() == 0 {
		t.Fatal("no review for paths an object can have")
	}
}

// tenantReader is a tenant's account, granted its own namespace's debug
// pages (tokens "minted-N" are its).
const tenantReader = "system:serviceaccount:team-a:reader"

// TestTokensMintedByOneUserShareItsReviews: each token's reviews had a rate
// of their own, and a tenant may mint as many tokens of its own account as
// it likes (kubectl create token), each a fresh rate: nine of them over
// their own namespace's pages took the reviews again of every token
// allowed before, and the operator's, its answer old, was refused 503. A
// token allowed before is reviewed again within its user's rate.
func TestTokensMintedByOneUserShareItsReviews(t *testing.T) {
	reviews := new(atomic.Int64)
	m := newMetricsAuthorizer(reviewingAPI(reviews), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	old := time.Now().Add(-metricsAuthTTL - time.Second) // past the minute an old answer is kept
	m.allowed.Add(answerKey("/debug/triggers", "debugger"), allowance{until: old, user: debugUser})
	for tok := range 9 {
		for p := range 10 {
			path, token := fmt.Sprintf("/debug/workloads/team-a/x%d", p), fmt.Sprintf("minted-%d", tok)
			m.allowed.Add(answerKey(path, token), allowance{until: old, user: tenantReader})
			_, _, _ = m.allow(ctx, path, token)
		}
	}
	if ok, _, err := m.allow(ctx, "/debug/triggers", "debugger"); !ok || err != nil {
		t.Fatalf("the operator's page after a tenant's nine tokens: %v %v, want reviewed and allowed", ok, err)
	}
	// Its user's rate spent, made-up tokens (each reviewed, and refused)
	// do not push it out: its limiter had come back with a fresh burst.
	spent := fmt.Sprintf("minted-%d", 9)
	for p := range 2 * metricsTokenBurst {
		path := fmt.Sprintf("/debug/workloads/team-a/y%d", p)
		m.allowed.Add(answerKey(path, spent), allowance{until: old, user: tenantReader})
		_, _, _ = m.allow(ctx, path, spent)
	}
	// Its limiter gives nothing back from here (left to real time, one
	// review every half second, which the thousand reviews below can
	// take): a fresh one in its place would give a burst.
	users, ok := m.users.Peek(sha256.Sum256([]byte(tenantReader)))
	if !ok {
		t.Fatal("no limiter of the tenant's user after its tokens' reviews")
	}
	users.SetBurst(0)
	for i := range metricsAuthCache {
		m.limit[1] = rate.NewLimiter(rate.Inf, 0) // the shared rate, not the tokens', is not what is tested here
		_, _, _ = m.allow(ctx, "/debug/triggers", fmt.Sprintf("garbage-%d", i))
	}
	m.renew[1] = rate.NewLimiter(rate.Inf, 0)
	path := "/debug/workloads/team-a/z"
	m.allowed.Add(answerKey(path, spent), allowance{until: old, user: tenantReader})
	if _, _, err := m.allow(ctx, path, spent); !errors.Is(err, errReviewsBusy) {
		t.Fatalf("a tenant's user, its rate spent, after %d made-up tokens: %v; want errReviewsBusy (its rate kept)", metricsAuthCache, err)
	}
}

// TestMintedTokensNewPathsLeaveOthersTheirReviews: every new path of a
// token was a TokenReview within the rate of tokens not known, and each
// token had a fresh rate of its own: three tokens a tenant minted of its
// own account, asking ten new paths of its namespace each, took that rate,
// and another reader's first request was refused 503. Who a token is is
// now kept: its new paths cost a SubjectAccessReview alone, within its
// namespace's rate and the known tokens'.
func TestMintedTokensNewPathsLeaveOthersTheirReviews(t *testing.T) {
	reviews := new(atomic.Int64)
	m := newMetricsAuthorizer(reviewingAPI(reviews), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	allowed := 0
	for tok := range 3 {
		for p := range 10 {
			if ok, _, err := m.allow(ctx, fmt.Sprintf("/debug/workloads/team-a/x%d", p), fmt.Sprintf("minted-%d", tok)); ok && err == nil {
				allowed++
			}
		}
	}
	if n := reviews.Load(); n != 3 || allowed < metricsTokenBurst {
		t.Fatalf("three tokens' 30 new paths: %d TokenReviews and %d allowed; want one review a token, and at least the namespace's burst (%d) allowed", n, allowed, metricsTokenBurst)
	}
	if ok, _, err := m.allow(ctx, "/debug/triggers", "debugger"); !ok || err != nil {
		t.Fatalf("another reader's first request after them: %v %v; want reviewed and allowed", ok, err)
	}
	// Made-up tokens are refused once each, whatever the paths they ask.
	before := reviews.Load()
	for p := range 5 {
		if ok, auth, err := m.allow(ctx, fmt.Sprintf("/debug/workloads/team-a/y%d", p), "made-up"); ok || auth || err != nil {
			t.Fatalf("a made-up token: %v %v %v; want refused, not authenticated", ok, auth, err)
		}
	}
	if n := reviews.Load() - before; n != 1 {
		t.Fatalf("a made-up token's 5 paths: %d TokenReviews, want 1", n)
	}
	if u := "serviceaccounts:team-b"; raterOf(u) == raterOf("system:serviceaccount:team-b:reader") {
		t.Errorf("a user named %q shares team-b's accounts' rate (%q)", u, raterOf(u))
	}
	if raterOf("system:serviceaccount:team-a:reader") != raterOf("system:serviceaccount:team-a:other") || raterOf("system:serviceaccount:team-b:reader") == raterOf("system:serviceaccount:team-a:reader") {
		t.Fatal("a namespace's accounts share one rate, and only theirs")
	}
}

// TestPathsNoObjectHasAreRefusedWithoutAReview: with --metrics-auth=none
// the debug endpoints on the http port skipped the checks of a path an
// object can have: team-a%2F1 routed as a namespace of its own (past the
// one answer team-a may have under way), Team-A answered an empty list,
// and a name of any length was echoed in the 404. They are a 404 there
// too, as on --debug-addr.
func TestPathsNoObjectHasAreRefusedWithoutAReview(t *testing.T) {
	for _, debugAddr := range []bool{false, true} {
		a := startWith(t, func(o *Options) {
			if debugAddr {
				o.Serving.DebugAddr = "127.0.0.1:0"
			}
		}, Deps{})
		base := "http://" + a.HTTPAddr()
		if debugAddr {
			base = "http://" + a.DebugAddr()
		}
		for _, path := range []string{"/debug/workloads/team-a%2F1", "/debug/workloads/Team-A", "/debug/triggers/Team-A",
			"/debug/workloads/team-a/" + strings.Repeat("x", 300), "/debug/workloads/team-a/a%0Ab"} {
			code, body := getWithToken(t, http.DefaultClient, base+path, "")
			if code != http.StatusNotFound || len(body) > 200 {
				t.Errorf("debug address %v, %.60s: %d (%d bytes), want a short 404", debugAddr, path, code, len(body))
			}
		}
		if code, _ := getWithToken(t, http.DefaultClient, base+"/debug/workloads/team-a", ""); code != http.StatusOK {
			t.Errorf("debug address %v, a namespace's page: %d, want 200", debugAddr, code)
		}
	}
}

// TestMadeUpTokensKeepNoReadersIdentityOut: who a token is was kept in one
// cache with the tokens that are no one's, so a flood of made-up tokens
// pushed every reader's identity out, and its next new path waited on the
// rate of tokens not known again, which the flood held (503). And an
// answer made from an identity reviewed a minute before held for a minute
// more, past it: a ServiceAccount deleted since was allowed for two.
func TestMadeUpTokensKeepNoReadersIdentityOut(t *testing.T) {
	reviews := new(atomic.Int64)
	m := newMetricsAuthorizer(reviewingAPI(reviews), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	if ok, _, err := m.allow(ctx, "/debug/triggers", "debugger"); !ok || err != nil {
		t.Fatalf("the operator: %v %v", ok, err)
	}
	m.limit[1] = rate.NewLimiter(rate.Inf, 0)
	for i := range 2 * metricsAuthCache {
		_, _, _ = m.allow(ctx, "/debug/triggers", fmt.Sprintf("made-up-%d", i))
	}
	m.limit[1] = rate.NewLimiter(0, 0) // the flood holds the rate of tokens not known
	if ok, _, err := m.allow(ctx, "/debug/workloads", "debugger"); !ok || err != nil {
		t.Fatalf("the operator's new path after %d made-up tokens: %v %v; want allowed (who it is kept)", 2*metricsAuthCache, ok, err)
	}
	// An identity a second from its end: the answer made from it ends with it.
	id, _ := m.identityOf("debugger", time.Now())
	id.until = time.Now().Add(time.Second)
	m.identities.Add(sha256.Sum256([]byte("debugger")), id)
	if ok, _, err := m.allow(ctx, "/debug/provisioning", "debugger"); !ok || err != nil {
		t.Fatalf("a new path: %v %v", ok, err)
	}
	if a, _ := m.allowed.Get(answerKey("/debug/provisioning", "debugger")); a.until.After(id.until) {
		t.Fatalf("an answer until %v from an identity reviewed until %v", a.until, id.until)
	}
}
