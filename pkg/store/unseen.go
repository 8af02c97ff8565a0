package store

import "time"

// unseenPod is a replica dropped because its agent's streams expired (its
// agent lost past Expiry), not because its agent removed it: it may serve
// on, unseen (Options.Exists says whether the API still has it).
type unseenPod struct {
	namespace, name, uid string
	ready                bool
	startNs              int64
	at                   time.Time // when it was dropped
}

// maxUnseen bounds the unseen replicas remembered of one workload (the
// oldest forgotten first): a workload whose nodes' agents were lost one
// after another would otherwise grow its list for lostFor.
const maxUnseen = 256

// markUnseen remembers p, dropped with its agent, under each of its
// workloads; mu must be held for writing.
func (s *Store) markUnseen(p *pod, now time.Time) {
	u := unseenPod{namespace: p.Namespace, name: p.Name, uid: p.UID, ready: p.Ready, startNs: p.startNs, at: now}
	for _, k := range p.Workloads {
		list := s.unseen[k]
		if len(list) >= maxUnseen {
			list = append(list[:0], list[1:]...)
		}
		s.unseen[k] = append(list, u)
	}
}

// seenAgain forgets p among its workloads' unseen replicas: it is listed
// again (its agent back); mu must be held for writing.
func (s *Store) seenAgain(p *pod) {
	for _, k := range p.Workloads {
		list, ok := s.unseen[k]
		if !ok {
			continue
		}
		kept := list[:0]
		for _, u := range list {
			if u.uid != p.UID {
				kept = append(kept, u)
			}
		}
		if len(kept) == 0 {
			delete(s.unseen, k)
		} else {
			s.unseen[k] = kept
		}
	}
}

// sweepUnseen forgets unseen replicas dropped more than lostFor ago; mu
// must be held for writing.
func (s *Store) sweepUnseen(now time.Time) {
	for k, list := range s.unseen {
		kept := list[:0]
		for _, u := range list {
			if now.Sub(u.at) <= lostFor {
				kept = append(kept, u)
			}
		}
		if len(kept) == 0 {
			delete(s.unseen, k)
		} else {
			s.unseen[k] = kept
		}
	}
}

// unseenLoad is the PodLoad of a replica its agent no longer reports but
// the API still has: ready with no sample (PodMissing), or starting.
func unseenLoad(name string, ready bool, startNs int64, now time.Time) PodLoad {
	l := PodLoad{Name: name, State: PodMissing, Reason: UnseenReason, Unseen: true}
	if !ready {
		l.State, l.Reason = PodStarting, ""
		if startNs != 0 {
			l.Age = max(0, now.Sub(time.Unix(0, startNs)))
		}
	}
	return l
}

// UnseenReason is why an unseen replica (PodLoad.Unseen) has no sample.
const UnseenReason = "its agent is lost (its streams closed past --pod-expiry) and the API still has the pod"

// appendUnseen adds to snap workload k's replicas that its agents no
// longer report but the API still has (Options.Exists): those dropped
// with their agent, and expired ones not yet swept (expired); mu must be
// held.
func (s *Store) appendUnseen(snap *Snapshot, k Key, expired []*pod, now time.Time) {
	if s.opts.Exists == nil {
		return
	}
	for _, p := range expired {
		if s.opts.Exists(p.Namespace, p.Name, p.UID) {
			snap.Pods = append(snap.Pods, unseenLoad(p.Name, p.Ready, p.startNs, now))
		}
	}
	for _, u := range s.unseen[k] {
		if now.Sub(u.at) <= lostFor && s.opts.Exists(u.namespace, u.name, u.uid) {
			snap.Pods = append(snap.Pods, unseenLoad(u.name, u.ready, u.startNs, now))
		}
	}
}
