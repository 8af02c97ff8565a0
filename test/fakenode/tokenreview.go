package fakenode

import (
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Token is what the API server's TokenReview says of a token.
type Token struct {
	User string // the username, e.g. system:serviceaccount:pulse-system:pulse-agent
	Node string // the node of the pod the token is bound to; "" for none
	// NotPodBound: a token with a node claim but no pod's (one bound to a
	// Node object); with Node set, a token is otherwise bound to a pod.
	NotPodBound bool
	// AudienceUnaware: the review answers no audience, as an authenticator
	// that does not check them.
	AudienceUnaware bool
	// PodOnly: the token names its pod and no node, as an API server
	// before Kubernetes 1.30 answers (Node unused).
	PodOnly bool
}

// PodClaim is the TokenReview extra that names a pod-bound token's pod.
const PodClaim = "authentication.kubernetes.io/pod-name"

// PodUIDClaim is the TokenReview extra that gives a pod-bound token's pod's
// uid.
const PodUIDClaim = "authentication.kubernetes.io/pod-uid"

// NodeClaim is the TokenReview extra that names a pod-bound token's node.
const NodeClaim = "authentication.kubernetes.io/node-name"

// TokenReviews makes c answer TokenReviews for the given tokens and
// audience as the API server does; any other token is not authenticated.
func TokenReviews(c *fake.Clientset, audience string, tokens map[string]Token) {
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		tok, ok := tokens[tr.Spec.Token]
		ok = ok && len(tr.Spec.Audiences) == 1 && tr.Spec.Audiences[0] == audience
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: ok}
		if ok {
			tr.Status.User = authenticationv1.UserInfo{Username: tok.User}
			if !tok.AudienceUnaware {
				tr.Status.Audiences = []string{audience}
			}
			if tok.PodOnly {
				tr.Status.User.Extra = map[string]authenticationv1.ExtraValue{PodClaim: {"agent"}, PodUIDClaim: {"uid-agent"}}
			}
			if tok.Node != "" && !tok.PodOnly {
				tr.Status.User.Extra = map[string]authenticationv1.ExtraValue{NodeClaim: {tok.Node}}
				if !tok.NotPodBound {
					pod := "agent-on-" + tok.Node
					tr.Status.User.Extra[PodClaim] = authenticationv1.ExtraValue{pod}
					// The API server names the pod's uid beside its name.
					tr.Status.User.Extra[PodUIDClaim] = authenticationv1.ExtraValue{"uid-" + pod}
				}
			}
		}
		return true, tr, nil
	})
}
