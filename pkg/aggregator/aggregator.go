// Package aggregator wires pulse's aggregator: the agents' ingest stream
// server, the store, the KEDA external-push scaler and the HTTP endpoints.
package aggregator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pulse-io/pulse/pkg/certs"
	"github.com/pulse-io/pulse/pkg/ingest"
	"github.com/pulse-io/pulse/pkg/logging"
	"github.com/pulse-io/pulse/pkg/provision"
	"github.com/pulse-io/pulse/pkg/scaler"
	"github.com/pulse-io/pulse/pkg/store"
	"github.com/pulse-io/pulse/pkg/version"
)

// Aggregator is a wired aggregator whose listeners are open.
type Aggregator struct {
	opts *Options
	log  *slog.Logger
	deps Deps
	// refused counts connections closed past a port's bounds.
	refused *prometheus.CounterVec
	// owner owns what the aggregator creates (--owner-cluster-role), or nil.
	owner *metav1.OwnerReference

	store    *store.Store
	ingest   *ingest.Server
	scaler   *scaler.Server
	health   *health
	warmup   *warmup
	resolver *scaler.InformerResolver // nil unless --resolve-scale-targets
	managed  *certs.Managed           // nil unless --manage-certs
	reviewer *ingest.TokenReviewer    // nil unless --agent-auth=tokenreview
	// provisioner keeps ScaledObjects while elected; nil unless
	// --provision-scaledobjects.
	provisioner *provision.Controller
	election    provision.Election
	ingestSrv   *grpc.Server
	scalerSrv   *grpc.Server
	httpSrv     *http.Server
	debugSrv    *http.Server // nil unless --debug-addr
	healthSrv   *http.Server // nil unless --health-addr

	ingestLn, scalerLn, httpLn net.Listener
	// scalerConns: the scaler port's connections, each charged to the
	// namespace its calls name.
	scalerConns *scalerConns
	// ingestMux serves ingestLn's gRPC connections to ingestSrv, and its
	// framed ones itself.
	ingestMux *ingestMux
	// ingestTLS: the ingest port's server TLS (nil: plaintext), which
	// --http-tls serves on the http port too.
	ingestTLS *tls.Config
	debugLn   net.Listener // nil unless --debug-addr
	healthLn  net.Listener // nil unless --health-addr
	// streamsWarned: warnIfStreamsOutgrowMemory has warned, and the pods
	// and streams have not fitted since (housekeep's alone).
	streamsWarned bool
}

// housekeepEvery is the period of the housekeeping loop (sweeping expired
// pods); /livez fails when a tick is 1.5 periods late.
const housekeepEvery = 2 * time.Second

// IngestAddr is the bound ingest address.
func (a *Aggregator) IngestAddr() string { return a.ingestLn.Addr().String() }

// ScalerAddr is the bound scaler address.
func (a *Aggregator) ScalerAddr() string { return a.scalerLn.Addr().String() }

// DebugAddr is the bound --debug-addr, or the HTTP address.
func (a *Aggregator) DebugAddr() string {
	if a.debugLn != nil {
		return a.debugLn.Addr().String()
	}
	return a.HTTPAddr()
}

// HTTPAddr is the bound HTTP address.
func (a *Aggregator) HTTPAddr() string { return a.httpLn.Addr().String() }

// Run serves until ctx ends, then stops gracefully.
func (a *Aggregator) Run(ctx context.Context) error {
	a.log.Info("aggregator listening", logging.KeyIngest, a.IngestAddr(), logging.KeyScaler, a.ScalerAddr(),
		logging.KeyHTTP, a.HTTPAddr(), logging.KeyVersion, version.Version)
	// The loops behind the answers (the caches, the learner, the
	// housekeeping, the certificates) run until the stop has ended, not
	// from the signal: the replica answers KEDA through --shutdown-delay
	// and the drain, and a ScaledObject made meanwhile was Unavailable, a
	// pod relabelled read from a frozen cache. The provisioner alone stops
	// at the signal (it gives its Lease back at once).
	bg, stopped := context.WithCancel(context.WithoutCancel(ctx))
	defer stopped()
	g, gctx := errgroup.WithContext(bg)
	signalled, cancelSignalled := context.WithCancel(gctx)
	defer cancelSignalled()
	go func() {
		select {
		case <-ctx.Done():
			cancelSignalled()
		case <-signalled.Done():
		}
	}()
	a.runLoops(gctx, signalled, g)
	for _, s := range []struct {
		srv  *http.Server
		ln   net.Listener
		what string
	}{{a.healthSrv, a.healthLn, "health"}, {a.debugSrv, a.debugLn, "debug"}, {a.httpSrv, a.httpLn, "http"}} {
		if s.srv != nil {
			g.Go(func() error { return serveHTTP(s.srv, s.ln, s.what) })
		}
	}
	g.Go(func() error { return serveGRPC(a.ingestSrv, a.ingestMux, "ingest") })
	g.Go(func() error { return serveGRPC(a.scalerSrv, a.scalerLn, "scaler") })
	g.Go(func() error {
		<-signalled.Done() // the signal, or a part that failed
		a.stop()
		stopped()
		return nil
	})
	err := g.Wait()
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}

// runLoops starts in g the loops behind the answers, on ctx (until the
// stop has ended), and the provisioner, on signalled (the signal).
func (a *Aggregator) runLoops(gctx, signalled context.Context, g *errgroup.Group) {
	if a.resolver != nil {
		g.Go(func() error { a.resolver.Run(gctx); return nil })
		// Every replica learns every planner trigger it watches, not only
		// those KEDA asks it about (scaler.Learn).
		g.Go(func() error { a.scaler.LearnFrom(gctx, a.resolver); return nil })
	}
	// What the aggregator creates (its certificates' Secrets and ConfigMap,
	// the provisioner's Lease) is owned by --owner-cluster-role: those
	// parts start once it is read.
	owned := func() {
		if a.managed != nil {
			g.Go(func() error { return a.managed.Run(gctx) })
		}
		if a.provisioner != nil {
			g.Go(func() error { return a.provisioner.RunElected(signalled, a.election) })
		}
	}
	if a.owner != nil {
		g.Go(func() error {
			if err := a.resolveOwner(gctx); err != nil {
				return err
			}
			owned()
			return nil
		})
	} else {
		owned()
	}
	if a.reviewer != nil {
		g.Go(func() error { a.reviewer.Run(gctx); return nil })
	}
	if ds := a.opts.Warmup.AgentDaemonSet; ds != "" {
		ns, name, _ := strings.Cut(ds, "/")
		g.Go(func() error { a.warmup.followDaemonSet(gctx, a.deps.Kube, ns, name); return nil })
	}
	g.Go(func() error { a.housekeep(gctx); return nil })
}

// serveHTTP serves srv on ln until it is shut down.
func serveHTTP(srv *http.Server, ln net.Listener, what string) error {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", what, err)
	}
	return nil
}

// resolveOwner reads --owner-cluster-role's UID into a.owner, the owner
// reference of what the aggregator creates. An API that does not answer
// (unavailable, throttled, unreachable) is waited for, the next read up
// to ownerRetryLongest later; a ClusterRole the API says is not there, or
// that the aggregator may not read, is an error (the process ends: its
// chart is wrong). It was read once at start, and one 503 of the API
// ended the process, restarted under CrashLoopBackOff for up to five
// minutes after the API was back.
func (a *Aggregator) resolveOwner(ctx context.Context) error {
	name := a.opts.Kube.OwnerClusterRole
	wait := ownerRetryFirst
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cr, err := a.deps.Kube.RbacV1().ClusterRoles().Get(rctx, name, metav1.GetOptions{})
		cancel()
		switch {
		case err == nil:
			*a.owner = metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: cr.Name, UID: cr.UID}
			a.log.Info("what the aggregator creates is owned by a ClusterRole", logging.KeyName, name)
			return nil
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return fmt.Errorf("--owner-cluster-role %s: %w", name, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		a.log.Warn("--owner-cluster-role not read: the certificates and the provisioner wait for it", logging.KeyName, name, logging.KeyErr, err, logging.KeyRetryIn, wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, ownerRetryLongest)
	}
}

// ownerNow is the owner of what is made now (certs.OwnerNow): the
// ClusterRole of --owner-cluster-role as the API has it, its UID that of
// one made again since the start; an error while it is gone, being
// deleted, or not read.
func (a *Aggregator) ownerNow(ctx context.Context) (metav1.OwnerReference, error) {
	owner, _, err := certs.OwnerNow(ctx, a.deps.Kube, *a.owner)
	return owner, err
}

// ownerRetryFirst and ownerRetryLongest bound the wait between reads of the
// owner ClusterRole while the API does not answer.
var (
	ownerRetryFirst   = time.Second
	ownerRetryLongest = 30 * time.Second
)

// housekeep sweeps the pods of agents gone longer than --pod-expiry (so
// that a dead node's pods go even when no other catalogue changes) and
// proves the process live, every housekeepEvery.
func (a *Aggregator) housekeep(ctx context.Context) {
	t := time.NewTicker(housekeepEvery)
	defer t.Stop()
	for tick := 0; ; tick++ {
		a.store.Sweep()
		_ = a.warmup.check() // logs the end of the warm-up when it comes
		a.health.tick()
		if tick%int(time.Minute/housekeepEvery) == 0 {
			a.warnIfStreamsOutgrowMemory(a.ingest.Streams(), a.ingest.SawHistograms())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func serveGRPC(s *grpc.Server, ln net.Listener, what string) error {
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve %s: %w", what, err)
	}
	return nil
}

// stop is the graceful stop: not ready at once, the listeners open for
// --shutdown-delay more (the scaler Service's endpoints drop this replica
// meanwhile, so KEDA's new connections go to the others; the agents, who
// stream to every replica, are cut below and reconnect), then KEDA's streams
// ended (each with EOF: KEDA reconnects in 2s), the scaler and the http
// servers drained, all within --shutdown-timeout, past which they are cut.
func (a *Aggregator) stop() {
	a.health.stopping.Store(true)
	time.Sleep(a.opts.Serving.ShutdownDelay)
	deadline := time.Now().Add(a.opts.Serving.ShutdownTimeout)
	drained := make(chan struct{})
	go func() { a.scaler.Shutdown(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(deadline)):
		// A stream handler stuck sending to a peer that reads nothing:
		// stopping the server below ends it.
		a.log.Warn("KEDA's streams did not end within --shutdown-timeout: cut")
	}
	stopGracefully(a.scalerSrv, max(time.Until(deadline), 0))
	<-drained
	// Agent streams never end by themselves and carry cumulative values,
	// so cutting them loses nothing; agents reconnect to another replica.
	a.ingestSrv.Stop()
	for _, srv := range []*http.Server{a.debugSrv, a.healthSrv, a.httpSrv} {
		if srv == nil {
			continue
		}
		// A second past the deadline (README: --shutdown-timeout): the
		// scaler's drain may have taken it all, and a scrape begun then
		// is let finish.
		sctx, cancel := context.WithDeadline(context.Background(), deadline.Add(time.Second))
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close() // a download still running (a profile, a debug page): cut
		}
		cancel()
	}
}

// stopGracefully waits up to timeout for RPCs to end, then cuts them.
func stopGracefully(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { s.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		s.Stop()
		<-done
	}
}
