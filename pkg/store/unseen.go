package store

import (
	"slices"
	"strings"
	"time"
)

// unseenPod is a replica dropped because its agent's streams expired (its
// agent lost past Expiry), not because its agent removed it: it may serve
// on, unseen (Options.Exists says whether the API still has it).
type unseenPod struct {
	namespace, name, uid string
	node                 string // whose agent was lost
	ready                bool
	startNs              int64
	at                   time.Time // when it was dropped
}

// maxUnseen bounds the unseen replicas remembered of one workload (the
// oldest forgotten first): a workload whose nodes' agents were lost one
// after another would otherwise grow its list for lostFor.
const maxUnseen = 256

// markUnseen remembers p, dropped with node's agent, under each of its
// workloads; with no API to ask (Options.Exists nil), nothing. mu must be
// held for writing.
func (s *Store) markUnseen(p *pod, node string, now time.Time) {
	if s.opts.Exists == nil {
		return
	}
	u := unseenPod{namespace: p.Namespace, name: p.Name, uid: p.UID, node: node, ready: p.Ready, startNs: p.startNs, at: now}
	for _, k := range p.Workloads {
		list := s.unseen[k]
		if len(list) >= maxUnseen {
			s.unindex(list[0].uid, k)
			list = append(list[:0], list[1:]...)
		}
		s.unseen[k] = append(list, u)
		s.unseenKeys[p.UID] = append(s.unseenKeys[p.UID], k)
	}
}

// seenAgain forgets p wherever it is remembered unseen: it is listed
// again (its agent back), under whichever workloads it names now; mu must
// be held for writing.
func (s *Store) seenAgain(p *pod) {
	keys, ok := s.unseenKeys[p.UID]
	if !ok {
		return
	}
	delete(s.unseenKeys, p.UID)
	for _, k := range keys {
		s.unseen[k] = slices.DeleteFunc(s.unseen[k], func(u unseenPod) bool { return u.uid == p.UID })
		if len(s.unseen[k]) == 0 {
			delete(s.unseen, k)
		}
	}
}

// unindex records that k's list no longer holds uid; mu must be held for
// writing.
func (s *Store) unindex(uid string, k Key) {
	keys := slices.DeleteFunc(s.unseenKeys[uid], func(x Key) bool { return x == k })
	if len(keys) == 0 {
		delete(s.unseenKeys, uid)
	} else {
		s.unseenKeys[uid] = keys
	}
}

// sweepUnseen forgets unseen replicas dropped more than lostFor ago, and
// those the API no longer has as replicas of their workload (a uid does
// not come back); mu must be held for writing.
func (s *Store) sweepUnseen(now time.Time) {
	if s.opts.Exists == nil {
		return
	}
	s.filterUnseen(func(k Key, u unseenPod) bool {
		return now.Sub(u.at) <= lostFor && s.opts.Exists(u.namespace, u.name, u.uid, k)
	})
}

// forgetUnseenOn forgets the unseen replicas of node's lost agent: it is
// back, and has listed what runs there in full. mu must be held for
// writing.
func (s *Store) forgetUnseenOn(node string) {
	s.filterUnseen(func(_ Key, u unseenPod) bool { return u.node != node })
}

// filterUnseen keeps the unseen replicas keep says to; mu must be held for
// writing.
func (s *Store) filterUnseen(keep func(Key, unseenPod) bool) {
	for k, list := range s.unseen {
		kept := list[:0]
		for _, u := range list {
			if keep(k, u) {
				kept = append(kept, u)
			} else {
				s.unindex(u.uid, k)
			}
		}
		if len(kept) == 0 {
			delete(s.unseen, k)
		} else {
			s.unseen[k] = kept
		}
	}
}

// expiredLost adds p to list when it is a replica its agent lost (expired,
// not yet swept) that stillThere may hold: only with an API to ask.
func (s *Store) expiredLost(list []*pod, p *pod) []*pod {
	if s.opts.Exists == nil || !countsLost(p) {
		return list
	}
	return append(list, p)
}

// stillThere is workload k's replicas that its agents no longer report but
// the API still has (Options.Exists): those dropped with their agent, and
// expired ones not yet swept (expired: the caller's walk of k's pods
// collects them, expiredLost). Only called where some replica of k is
// listed: with none, the workload's loss is an error (Lost). mu must be
// held.
func (s *Store) stillThere(k Key, expired []*pod, now time.Time) []unseenPod {
	if s.opts.Exists == nil {
		return nil
	}
	var out []unseenPod
	for _, p := range expired {
		if s.opts.Exists(p.Namespace, p.Name, p.UID, k) {
			out = append(out, unseenPod{namespace: p.Namespace, name: p.Name, uid: p.UID, ready: p.Ready, startNs: p.startNs})
		}
	}
	for _, u := range s.unseen[k] {
		if now.Sub(u.at) <= lostFor && s.opts.Exists(u.namespace, u.name, u.uid, k) {
			out = append(out, u)
		}
	}
	// In uid order, as a workload's listed pods: readers see a stable
	// order (a sweep drops a node's pods in a map's).
	slices.SortFunc(out, func(a, b unseenPod) int { return strings.Compare(a.uid, b.uid) })
	return out
}

// load is u's PodLoad: ready with no sample (PodMissing), or starting.
func (u unseenPod) load(now time.Time) PodLoad {
	l := PodLoad{Name: u.name, State: PodMissing, Reason: UnseenReason, Unseen: true}
	if !u.ready {
		l.State, l.Reason = PodStarting, ""
		if u.startNs != 0 {
			l.Age = max(0, now.Sub(time.Unix(0, u.startNs)))
		}
	}
	return l
}

// value is u's PodValue, as load.
func (u unseenPod) value() PodValue {
	if !u.ready {
		return PodValue{Name: u.name, State: PodStarting}
	}
	return PodValue{Name: u.name, State: PodMissing, Reason: UnseenReason}
}

// UnseenReason is why an unseen replica (PodLoad.Unseen) has no sample.
const UnseenReason = "its agent is lost (its streams closed past --pod-expiry) and the API still has the pod"
