package aggregator

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/hashicorp/golang-lru/v2/expirable"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/pulse-io/pulse/pkg/app"
	"github.com/pulse-io/pulse/pkg/debug"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/logging"
)

// Bounds of the reviews behind /metrics and the debug endpoints on the
// http port (--metrics-auth=kubernetes).
const (
	// metricsAuthTTL: how long an answer for a token is kept (a RoleBinding
	// granted or taken back is seen within it), never past the token's
	// own expiry. A token allowed is served from its answer for up to
	// twice that while no review can be made: a flood of made-up tokens
	// has taken the rate all share, or its user's own requests its user's
	// (a reader whose RoleBinding was taken back can so keep its access
	// for up to two minutes; refusing it then, tried on 2026-12-06, also
	// refused a Prometheus whose namespace's rate a dashboard's reader of
	// the same namespace had spent).
	metricsAuthTTL = time.Minute
	// metricsAuthCache: the tokens allowed whose answers are kept; the
	// tokens refused have a cache of their own, so that made-up tokens
	// push out only each other.
	metricsAuthCache = 1024
	// Reviews of tokens not known: at most metricsAuthRate a second (a
	// burst of metricsAuthBurst), past it 503 at once; the reviews again of
	// tokens allowed before as many, apart; the same token's reviews at
	// once are one. /metrics has rates of its own, apart from the debug
	// endpoints': a tenant granted its own namespace's debug pages, asking
	// for a thousand of them, took the rate of reviews again, and
	// Prometheus's answer, old, was refused 503.
	metricsAuthRate    = 10
	metricsAuthBurst   = 20
	metricsAuthTimeout = 5 * time.Second
	// One token's reviews: at most metricsTokenRate a second (a burst of
	// metricsTokenBurst), before the rates above: a tenant granted its own
	// namespace's pages asked for a new name of it twenty times a second,
	// each a review, and took the debug endpoints' rates from every other
	// reader (and the API client's from the rest of the aggregator).
	metricsTokenRate  = 2
	metricsTokenBurst = 10
	// maxReviewedToken: a token longer is refused unreviewed.
	maxReviewedToken = app.MaxBearerToken
)

// metricsAuthorizer admits a request to /metrics, or to a debug endpoint
// served on the http port, whose bearer token the API server authenticates
// (a TokenReview) and whose user may get the request's path as a
// non-resource URL (a SubjectAccessReview): what kube-rbac-proxy and
// controller-runtime's secure metrics do. The per-trigger series and the
// debug pages name every tenant's workloads and their load, which no
// tenant may read of another. An answer is kept per token and path; an API
// error is answered 503 and not kept.
type metricsAuthorizer struct {
	kube    kubernetes.Interface
	log     *slog.Logger
	allowed *expirable.LRU[[sha256.Size]byte, allowance] // a token allowed: until when, and its user
	refused *expirable.LRU[[sha256.Size]byte, struct{}]  // a token authenticated and refused the path (a token no one's: strangers)
	limit   [2]*rate.Limiter                             // reviews of tokens not known, by class (metricsClass)
	tokens  *lru.Cache[[sha256.Size]byte, *rate.Limiter] // each token's own rate of reviews
	// users: each user's rate of the reviews again of its tokens allowed
	// before, apart from tokens: a limiter among the tokens' was pushed
	// out by a flood of made-up tokens, and came back with a fresh burst.
	users *lru.Cache[[sha256.Size]byte, *rate.Limiter]
	renew [2]*rate.Limiter // reviews of tokens allowed before, their answer old
	// identities: who each token reviewed is (or that it is none), until
	// its answer's time is out: a token's new path costs a
	// SubjectAccessReview alone, within its user's rate and the known
	// tokens' (known). Each token's every new path was a TokenReview
	// within the rate of tokens not known: a tenant minting tokens of its
	// own account, each with a fresh rate of its own, took that rate from
	// every other reader's new path.
	// identities hold the tokens authenticated, strangers those that are
	// not, apart: made-up tokens push out only each other (one cache of
	// both let a flood of them push out every reader's identity, and its
	// new paths wait on the rate of tokens not known again).
	identities, strangers *expirable.LRU[[sha256.Size]byte, identity]
	known                 [2]*rate.Limiter // reviews of a known token's new paths
	// readers: the remote addresses (hosts) a token was allowed from
	// within readerMemory: a new token from one (Prometheus's after the
	// kubelet rotates it, about every 48 minutes for a token of an hour)
	// is reviewed within a rate of the readers' own (fromReaders) and its
	// address's (addresses), not the rate of tokens not known, which a
	// flood of made-up tokens takes. Within the known tokens' rate, a
	// tenant's made-up tokens from its own pod (a reader's address once
	// its own token was allowed) took every known token's new paths.
	readers     *expirable.LRU[string, struct{}]
	fromReaders [2]*rate.Limiter
	addresses   *lru.Cache[[sha256.Size]byte, *rate.Limiter]
	flight      singleflight.Group
	warnMu      sync.Mutex
	warned      time.Time
}

func newMetricsAuthorizer(kube kubernetes.Interface, log *slog.Logger) *metricsAuthorizer {
	tokens, _ := lru.New[[sha256.Size]byte, *rate.Limiter](metricsAuthCache) // errs only on a size of 0
	users, _ := lru.New[[sha256.Size]byte, *rate.Limiter](metricsAuthCache)
	addresses, _ := lru.New[[sha256.Size]byte, *rate.Limiter](metricsAuthCache)
	return &metricsAuthorizer{kube: kube, log: log,
		allowed:     expirable.NewLRU[[sha256.Size]byte, allowance](metricsAuthCache, nil, 2*metricsAuthTTL),
		refused:     expirable.NewLRU[[sha256.Size]byte, struct{}](metricsAuthCache, nil, metricsAuthTTL),
		limit:       [2]*rate.Limiter{rate.NewLimiter(metricsAuthRate, metricsAuthBurst), rate.NewLimiter(metricsAuthRate, metricsAuthBurst)},
		tokens:      tokens,
		users:       users,
		renew:       [2]*rate.Limiter{rate.NewLimiter(metricsAuthRate, metricsAuthBurst), rate.NewLimiter(metricsAuthRate, metricsAuthBurst)},
		identities:  expirable.NewLRU[[sha256.Size]byte, identity](metricsAuthCache, nil, metricsAuthTTL),
		strangers:   expirable.NewLRU[[sha256.Size]byte, identity](metricsAuthCache, nil, metricsAuthTTL),
		known:       [2]*rate.Limiter{rate.NewLimiter(metricsAuthRate, metricsAuthBurst), rate.NewLimiter(metricsAuthRate, metricsAuthBurst)},
		readers:     expirable.NewLRU[string, struct{}](metricsAuthCache, nil, readerMemory),
		fromReaders: [2]*rate.Limiter{rate.NewLimiter(metricsAuthRate, metricsAuthBurst), rate.NewLimiter(metricsAuthRate, metricsAuthBurst)},
		addresses:   addresses}
}

// readerMemory: how long an address a token was allowed from is a reader's
// (metricsAuthorizer.readers): past a projected token's rotation.
const readerMemory = time.Hour

// identity is a token's TokenReview: whether it is authenticated, as whom,
// until when (its answer's time, never past the token's expiry).
type identity struct {
	authenticated bool
	user          authnv1.UserInfo
	until         time.Time
}

// identityOf is token's identity, if reviewed and still in its time.
func (m *metricsAuthorizer) identityOf(token string, now time.Time) (identity, bool) {
	key := sha256.Sum256([]byte(token))
	id, ok := m.identities.Get(key)
	if !ok {
		id, ok = m.strangers.Get(key)
	}
	if !ok || !now.Before(id.until) {
		return identity{}, false
	}
	return id, true
}

// raterOf is whose rate a user's reviews, and whose one debug answer under
// way, are within: a ServiceAccount's namespace (a tenant may make as many
// accounts in its namespace as tokens of one), any other user's name. The
// two kinds apart: a user named "serviceaccounts:team-b" (an OIDC user
// whose name the authenticator does not prefix) shared team-b's accounts'
// rate and held their answer (found in a review, 2026-12-07).
func raterOf(username string) string {
	if rest, ok := strings.CutPrefix(username, "system:serviceaccount:"); ok {
		if ns, _, ok := strings.Cut(rest, ":"); ok {
			return "serviceaccounts:" + ns
		}
	}
	return "user:" + username
}

// metricsClass is the class of path's reviews' rates: 0 for /metrics, 1
// for the debug endpoints.
func metricsClass(path string) int {
	if path == "/metrics" {
		return 0
	}
	return 1
}

// errReviewsBusy: the reviews' rate is taken.
var errReviewsBusy = errors.New("too many token reviews: try again")

// wrap is next behind the review of the request's path.
func (m *metricsAuthorizer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse-aggregator"`)
			http.Error(w, fmt.Sprintf("%s needs a bearer token whose user may get the non-resource URL %s (--metrics-auth=kubernetes)", path, path), http.StatusUnauthorized)
			return
		}
		if len(token) > maxReviewedToken {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse-aggregator"`)
			http.Error(w, fmt.Sprintf("the bearer token is over %d bytes: no ServiceAccount's is", maxReviewedToken), http.StatusUnauthorized)
			return
		}
		from, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			from = r.RemoteAddr
		}
		ans, err := m.answer(r.Context(), from, path, token)
		switch {
		case errors.Is(err, errReviewsBusy):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case err != nil:
			m.warn(err)
			http.Error(w, "the token could not be reviewed: the API server did not answer; try again", http.StatusServiceUnavailable)
		case !ans.authenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse-aggregator"`)
			http.Error(w, "the token is not authenticated", http.StatusUnauthorized)
		case !ans.allowed:
			http.Error(w, "the token's user may not get the non-resource URL "+path, http.StatusForbidden)
		default:
			m.readers.Add(from, struct{}{})
			next.ServeHTTP(w, r.WithContext(debug.WithCaller(r.Context(), ans.rater)))
		}
	})
}

// warn logs a review's error, at most once a minute.
func (m *metricsAuthorizer) warn(err error) {
	m.warnMu.Lock()
	defer m.warnMu.Unlock()
	if time.Since(m.warned) < time.Minute {
		return
	}
	m.warned = time.Now()
	m.log.Warn("a token for /metrics or a debug endpoint could not be reviewed (logged once a minute)", logging.KeyErr, err)
}

// allow says whether token's user may get path, and whether the token is
// authenticated at all: from an answer kept, else a review.
func (m *metricsAuthorizer) allow(ctx context.Context, path, token string) (allowed, authenticated bool, err error) {
	ans, err := m.answer(ctx, "", path, token)
	return ans.allowed, ans.authenticated, err
}

// answer is allow's answer, for a request from the remote host from ("":
// none a reader's), with whose rate an allowed token's reviews are within
// (raterOf its user).
func (m *metricsAuthorizer) answer(ctx context.Context, from, path, token string) (answer, error) {
	key := answerKey(path, token)
	now := time.Now()
	a, known := m.allowed.Get(key)
	until := a.until
	if known && now.Before(until) {
		return answer{authenticated: true, allowed: true, rater: a.user}, nil
	}
	if _, ok := m.refused.Get(key); ok {
		return answer{authenticated: true}, nil
	}
	id, idKnown := m.identityOf(token, now)
	if idKnown && !id.authenticated {
		return answer{}, nil
	}
	// A token allowed before is reviewed again within a rate of its own,
	// and a token reviewed asking a new path within another: made-up
	// tokens, however many, take only the rate of tokens not known (the
	// caches of tokens allowed and reviewed hold only what the API server
	// answered). Each token's reviews have a rate of their own; those of a
	// token allowed or reviewed before, its user's (raterOf): a tenant
	// minting tokens of its own account (each a fresh rate) took the
	// reviews again of every token allowed before, the operator's among
	// them.
	class := metricsClass(path)
	limit, rates, rateOf := m.limit[class], m.tokens, token
	switch {
	case known:
		limit, rates, rateOf = m.renew[class], m.users, a.user
	case idKnown:
		limit, rates, rateOf = m.known[class], m.users, raterOf(id.user.Username)
	case from != "" && m.readers.Contains(from):
		// A new token from where a token was allowed: within the
		// readers' rate and its address's. Within the rate of tokens
		// not known, a flood of made-up tokens (10 a second from
		// anywhere) kept Prometheus's rotated token out for as long as
		// it went on (found in a review, 2026-12-07).
		limit, rates, rateOf = m.fromReaders[class], m.addresses, from
	}
	if !rateAllows(rates, rateOf) || !limit.Allow() {
		// A token allowed a minute ago, still unexpired, keeps its answer
		// while the rate is taken.
		if known && now.Before(until.Add(metricsAuthTTL)) {
			if exp, ok := ingest.TokenExpiry(token); !ok || now.Before(exp) {
				return answer{authenticated: true, allowed: true, rater: a.user}, nil
			}
		}
		return answer{}, errReviewsBusy
	}
	v, err, _ := m.flight.Do(string(key[:]), func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsAuthTimeout)
		defer cancel()
		return m.review(rctx, path, token, key, id, idKnown)
	})
	if err != nil {
		return answer{}, err
	}
	return v.(answer), nil
}

// allowance is a token's answer allowed: until when, and whose rate
// (raterOf its user) its reviews again are within.
type allowance struct {
	until time.Time
	user  string
}

// rateAllows takes one of the reviews of who (a token, or a user: the
// cache of its kind's rates), if its rate has one.
func rateAllows(rates *lru.Cache[[sha256.Size]byte, *rate.Limiter], who string) bool {
	l := rate.NewLimiter(metricsTokenRate, metricsTokenBurst)
	if prev, ok, _ := rates.PeekOrAdd(sha256.Sum256([]byte(who)), l); ok {
		l = prev // one limiter a token, whatever its requests at once
	}
	return l.Allow()
}

// answerKey is the key of token's answer for path. A path can hold a NUL
// byte (%00 decodes to one), a token cannot (Go's HTTP server refuses
// control bytes in a header's value), so the last NUL splits the two
// unambiguously: no other path and token have the same key.
func answerKey(path, token string) [sha256.Size]byte {
	return sha256.Sum256([]byte(path + "\x00" + token))
}

// answer is a review's: rater is set when allowed.
type answer struct {
	authenticated, allowed bool
	rater                  string
}

// review asks the API server about token and path (who the token is only
// when id is not known), and keeps the answers.
func (m *metricsAuthorizer) review(ctx context.Context, path, token string, key [sha256.Size]byte, id identity, idKnown bool) (answer, error) {
	if !idKnown {
		var err error
		if id, err = m.reviewToken(ctx, token); err != nil {
			return answer{}, err
		}
	}
	if !id.authenticated {
		return answer{}, nil // kept as a stranger's (reviewToken), for every path
	}
	u := id.user
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := m.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return answer{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	if !sar.Status.Allowed {
		m.refused.Add(key, struct{}{})
		return answer{authenticated: true}, nil
	}
	// Never past who the token is was reviewed (id.until: its review's
	// minute, its expiry): an answer made from an identity a minute old
	// held a token a ServiceAccount deleted since for a minute more.
	until := time.Now().Add(metricsAuthTTL)
	if id.until.Before(until) {
		until = id.until
	}
	m.allowed.Add(key, allowance{until: until, user: raterOf(u.Username)})
	return answer{authenticated: true, allowed: true, rater: raterOf(u.Username)}, nil
}

// reviewToken asks the API server who token is, and keeps the answer
// (identityOf).
func (m *metricsAuthorizer) reviewToken(ctx context.Context, token string) (identity, error) {
	tr, err := m.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return identity{}, fmt.Errorf("TokenReview: %w", err)
	}
	id := identity{authenticated: tr.Status.Authenticated, user: tr.Status.User, until: time.Now().Add(metricsAuthTTL)}
	if exp, ok := ingest.TokenExpiry(token); ok && exp.Before(id.until) {
		id.until = exp
	}
	if id.authenticated {
		m.identities.Add(sha256.Sum256([]byte(token)), id)
	} else {
		m.strangers.Add(sha256.Sum256([]byte(token)), id)
	}
	return id, nil
}
