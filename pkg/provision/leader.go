package provision

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/pulse-io/pulse/pkg/logging"
)

// Election is how replicas agree on the one that provisions: a
// coordination.k8s.io Lease, as kube-controller-manager's.
type Election struct {
	// Enabled: without it this replica provisions alone (one replica only).
	Enabled bool
	// Namespace and Name of the Lease.
	Namespace, Name string
	// Identity of this replica (default: $POD_NAME, or the host name, with
	// a random suffix).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as client-go's
	// leaderelection takes them (15s, 10s, 2s in the chart).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Leases                                    coordinationv1.LeasesGetter
	// Owner, if set, is the owner of the Lease when this replica creates
	// it (a Lease made before, without it, is left as it is), read at each
	// create: an owner made again since the start (another UID) owns it,
	// and an error (the owner gone, or being deleted) makes none. A Lease
	// made with an owner gone was deleted by the garbage collector, made
	// again by another replica, and so on: two leaders at once, each time,
	// until the first's renew deadline.
	Owner func(context.Context) (metav1.OwnerReference, error)
}

// DefaultIdentity is $POD_NAME (or the host name) and a random suffix, so
// that a restarted pod of the same name is a new candidate.
func DefaultIdentity() string {
	id := os.Getenv("POD_NAME")
	if id == "" {
		id, _ = os.Hostname()
	}
	return id + "_" + rand.String(8)
}

// RunElected provisions while this replica holds the Lease, until ctx ends.
// A replica that loses the Lease stops provisioning and stands again; on
// ctx's end it releases the Lease, so that another takes over at once.
func (c *Controller) RunElected(ctx context.Context, e Election) error {
	if e.Identity == "" {
		e.Identity = DefaultIdentity()
	}
	c.mu.Lock()
	c.identity = e.Identity
	c.mu.Unlock()
	if !e.Enabled {
		c.setLeading(true, e.Identity)
		defer c.setLeading(false, e.Identity)
		for ctx.Err() == nil {
			if err := c.Run(ctx); err != nil {
				c.o.Log.Error("provisioning stopped; trying again in a minute", logging.KeyErr, err)
				sleepCtx(ctx, time.Minute)
			}
		}
		return nil
	}
	lease := e.Namespace + "/" + e.Name
	for ctx.Err() == nil {
		// A term whose provisioning fails (ScaledObjects cannot be listed)
		// gives the Lease back, so that another replica may try, and this
		// one stands again a lease duration later: it once held the Lease
		// and provisioned nothing.
		tctx, endTerm := context.WithCancel(ctx)
		var failed atomic.Bool
		le, err := c.term(tctx, e, lease, func() { failed.Store(true); endTerm() })
		if err != nil {
			endTerm()
			return fmt.Errorf("leader election on Lease %s: %w", lease, err)
		}
		le.Run(tctx)
		endTerm()
		if failed.Load() {
			sleepCtx(ctx, e.LeaseDuration)
		}
	}
	return nil
}

// term is the elector of one term on the Lease (tctx its context): fail
// gives the Lease back when provisioning stops.
func (c *Controller) term(tctx context.Context, e Election, lease string, fail func()) (*leaderelection.LeaderElector, error) {
	ll := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     e.Leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	var lock resourcelock.Interface = ll
	if e.Owner != nil {
		lock = &ownedLease{LeaseLock: ll, owner: e.Owner, retry: e.RetryPeriod, sleep: sleepCtx}
	}
	var le *leaderelection.LeaderElector
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   e.LeaseDuration,
		RenewDeadline:   e.RenewDeadline,
		RetryPeriod:     e.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            "pulse-provisioner",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				c.setLeading(true, e.Identity)
				c.o.Log.Info("leading: provisioning ScaledObjects", logging.KeyLease, lease, logging.KeyIdentity, e.Identity)
				if err := c.Run(ctx); err != nil {
					c.o.Log.Error("provisioning stopped: the Lease is given back", logging.KeyErr, err)
					fail()
				}
			},
			OnStoppedLeading: func() {
				c.setLeading(false, e.Identity)
				c.o.Log.Info("not leading: provisioning stopped", logging.KeyLease, lease, logging.KeyIdentity, e.Identity)
			},
			OnNewLeader: func(id string) {
				// client-go reports from a goroutine of its own, which
				// may run behind a later report or after the term: the
				// holder is read from the elector when it runs, and a
				// report after the term is dropped.
				if tctx.Err() != nil {
					return
				}
				c.setHolder(le.GetLeader(), e.Identity)
				if id != e.Identity {
					c.o.Log.Info("another replica provisions", logging.KeyLease, lease, logging.KeyLeader, id)
				}
			},
		},
	})
	return le, err
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// setLeading: this replica (identity) leads, or no longer does. One that
// stops is no longer named the leader (the leader is unknown until
// another is seen): it named itself, standing by, "X stands by; X
// provisions", until another replica took the Lease.
func (c *Controller) setLeading(on bool, identity string) {
	c.mu.Lock()
	c.leading = on
	switch {
	case on:
		c.holder = identity
	case c.holder == identity:
		c.holder = ""
	}
	c.mu.Unlock()
}

// setHolder: replica id holds the Lease. This replica (self) is named by
// setLeading alone: a report of itself that comes after its term named it
// the leader while it stood by.
func (c *Controller) setHolder(id, self string) {
	c.mu.Lock()
	if id != self || c.leading {
		c.holder = id
	}
	c.mu.Unlock()
}

// ownedLease is client-go's LeaseLock whose Create gives the Lease an
// owner (LeaseLock's own Create sets its name and labels only).
type ownedLease struct {
	*resourcelock.LeaseLock
	owner func(context.Context) (metav1.OwnerReference, error)
	// wait: how long Create waits, its owner not read, before it says so
	// (client-go logs each failed create as an error and tries again a
	// retry period on): none at the first, then the retry period, doubled
	// at each to maxOwnerWait, none again once the owner is read. While
	// the ClusterRole was gone each replica logged an error every 2 s.
	wait, retry time.Duration
	sleep       func(context.Context, time.Duration)
}

// maxOwnerWait bounds ownedLease's wait: the Lease is made at most this
// long and a retry period after its owner can be read again.
const maxOwnerWait = 30 * time.Second

func (l *ownedLease) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	owner, err := l.owner(ctx)
	if err != nil {
		l.sleep(ctx, l.wait)
		l.wait = min(max(l.retry, 2*l.wait), maxOwnerWait)
		return fmt.Errorf("the Lease's owner: %w", err)
	}
	l.wait = 0
	_, err = l.Client.Leases(l.LeaseMeta.Namespace).Create(ctx, &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.LeaseMeta.Name, Namespace: l.LeaseMeta.Namespace, Labels: l.Labels,
			OwnerReferences: []metav1.OwnerReference{owner}},
		Spec: resourcelock.LeaderElectionRecordToLeaseSpec(&ler),
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	_, _, err = l.Get(ctx) // LeaseLock keeps the Lease it read for its updates
	return err
}
