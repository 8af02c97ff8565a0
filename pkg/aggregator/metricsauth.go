package aggregator

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Bounds of the reviews behind /metrics (--metrics-auth=kubernetes).
const (
	// metricsAuthTTL: how long an answer for a token is kept (a RoleBinding
	// granted or taken back is seen within it).
	metricsAuthTTL = time.Minute
	// metricsAuthCache: the tokens whose answers are kept.
	metricsAuthCache = 1024
	// metricsAuthInFlight reviews at once; a request waits at most
	// metricsAuthWait for one (503 past it), so that made-up tokens cost
	// the API server a bounded rate of reviews.
	metricsAuthInFlight = 4
	metricsAuthWait     = 2 * time.Second
	metricsAuthTimeout  = 5 * time.Second
)

// metricsAuthorizer admits a request to /metrics whose bearer token the
// API server authenticates (a TokenReview) and whose user may get the
// non-resource URL /metrics (a SubjectAccessReview): what kube-rbac-proxy
// and controller-runtime's secure metrics do. The per-trigger series name
// every tenant's workloads and their load, which no tenant may read of
// another. An API error is answered 503 and not kept.
type metricsAuthorizer struct {
	kube    kubernetes.Interface
	answers *expirable.LRU[[sha256.Size]byte, answer] // by the token's hash
	reviews chan struct{}
}

// answer is a review's: whether the token is authenticated, and whether
// its user may get /metrics.
type answer struct{ authenticated, allowed bool }

func newMetricsAuthorizer(kube kubernetes.Interface) *metricsAuthorizer {
	return &metricsAuthorizer{kube: kube, answers: expirable.NewLRU[[sha256.Size]byte, answer](metricsAuthCache, nil, metricsAuthTTL),
		reviews: make(chan struct{}, metricsAuthInFlight)}
}

// errReviewsBusy: every review slot stayed taken for metricsAuthWait.
var errReviewsBusy = errors.New("too many token reviews in flight")

// wrap is next behind the review.
func (m *metricsAuthorizer) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse-aggregator"`)
			http.Error(w, "/metrics needs a bearer token whose user may get the non-resource URL /metrics (--metrics-auth=kubernetes)", http.StatusUnauthorized)
			return
		}
		allowed, authenticated, err := m.allow(r.Context(), token)
		switch {
		case err != nil:
			http.Error(w, fmt.Sprintf("the token could not be reviewed: %v", err), http.StatusServiceUnavailable)
		case !authenticated:
			w.Header().Set("WWW-Authenticate", `Bearer realm="pulse-aggregator"`)
			http.Error(w, "the token is not authenticated", http.StatusUnauthorized)
		case !allowed:
			http.Error(w, "the token's user may not get the non-resource URL /metrics", http.StatusForbidden)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// allow reviews token: whether its user may get /metrics, and whether it
// is authenticated at all; an answer is kept for metricsAuthTTL, an error
// is not.
func (m *metricsAuthorizer) allow(ctx context.Context, token string) (allowed, authenticated bool, err error) {
	key := sha256.Sum256([]byte(token))
	if a, ok := m.answers.Get(key); ok {
		return a.allowed, a.authenticated, nil
	}
	wait := time.NewTimer(metricsAuthWait)
	defer wait.Stop()
	select {
	case m.reviews <- struct{}{}:
	case <-wait.C:
		return false, false, errReviewsBusy
	case <-ctx.Done():
		return false, false, ctx.Err()
	}
	defer func() { <-m.reviews }()
	ctx, cancel := context.WithTimeout(ctx, metricsAuthTimeout)
	defer cancel()
	tr, err := m.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return false, false, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		m.answers.Add(key, answer{})
		return false, false, nil
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := m.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, true, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	m.answers.Add(key, answer{authenticated: true, allowed: sar.Status.Allowed})
	return sar.Status.Allowed, true, nil
}
