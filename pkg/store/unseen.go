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
	// wasReady: it was ready before (PodLoad.Unready when it is not now),
	// and unreadyNs when it was first found not ready since (0: ready).
	wasReady  bool
	unreadyNs int64
}

// unseenOf is p, dropped with node's agent at now, as an unseen replica.
func unseenOf(p *pod, node string, now time.Time) unseenPod {
	return unseenPod{namespace: p.Namespace, name: p.Name, uid: p.UID, node: node, ready: p.Ready, startNs: p.startNs, at: now,
		wasReady: p.readyNs != 0, unreadyNs: p.get().unreadyNs}
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
	u := unseenOf(p, node, now)
	for _, k := range p.Workloads {
		s.remember(k, u)
	}
}

// remember adds u to k's unseen replicas, the oldest forgotten past
// maxUnseen; mu must be held for writing.
func (s *Store) remember(k Key, u unseenPod) {
	list := s.unseen[k]
	if len(list) >= maxUnseen {
		s.unindex(list[0].uid, k)
		s.forgot(list[0])
		list = append(list[:0], list[1:]...)
	}
	s.unseen[k] = append(list, u)
	s.unseenKeys[u.uid] = append(s.unseenKeys[u.uid], k)
	s.unseenOn[u.node]++
}

// forgot records that an unseen list no longer holds u (unseenOn); mu must
// be held for writing.
func (s *Store) forgot(u unseenPod) {
	if s.unseenOn[u.node]--; s.unseenOn[u.node] <= 0 {
		delete(s.unseenOn, u.node)
	}
}

// adoptUnheard remembers as unseen the API's replicas (Options.Replicas)
// of each workload some agent lists a pod of, where they run on a node no
// agent streams from (no source: none has since the store started, or its
// streams expired) and no agent lists them: an aggregator started while a
// node's agent was lost would otherwise never count that node's replicas,
// which serve on. Their agent back, it lists them (seenAgain) or lists its
// node in full without them (forgetUnseenOn). And it forgets the unseen
// replicas on such nodes that the API no longer gives (its answer is
// Options.Replicas' whole rule: on a node whose agent's pod has gone, say,
// there is no agent to lose). Sweep calls it: the API is asked with mu not
// held, so that readers wait on one map pass only.
func (s *Store) adoptUnheard(now time.Time) {
	if s.opts.Replicas == nil || s.opts.Exists == nil {
		return
	}
	s.mu.RLock()
	keys := make([]Key, 0, len(s.workloads)+len(s.unseen))
	for k := range s.workloads {
		keys = append(keys, k)
	}
	for k := range s.unseen {
		if _, listed := s.workloads[k]; !listed {
			keys = append(keys, k)
		}
	}
	s.mu.RUnlock()
	unheard := func(node string) bool {
		s.mu.RLock()
		defer s.mu.RUnlock()
		_, heard := s.sources[node]
		return !heard
	}
	answers := make(map[Key][]APIPod, len(keys))
	for _, k := range keys {
		if rs, ok := s.opts.Replicas(k, unheard); ok {
			answers[k] = rs
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, rs := range answers {
		s.reconcile(k, rs, now)
		if _, listed := s.workloads[k]; !listed {
			continue // none listed (or gone meanwhile): nothing to adopt for
		}
		for _, r := range rs {
			s.adopt(k, r, now)
		}
	}
}

// reconcile forgets k's unseen replicas on nodes no agent streams from that
// the API's answer rs, asked at asked, does not hold (one remembered since,
// its agent's streams expired meanwhile, was not asked about); mu must be
// held for writing.
func (s *Store) reconcile(k Key, rs []APIPod, asked time.Time) {
	list := s.unseen[k]
	if len(list) == 0 {
		return
	}
	kept := list[:0]
	for _, u := range list {
		_, heard := s.sources[u.node]
		if heard || !u.at.Before(asked) || slices.ContainsFunc(rs, func(r APIPod) bool { return r.UID == u.uid }) {
			kept = append(kept, u)
			continue
		}
		s.unindex(u.uid, k)
		s.forgot(u)
	}
	if len(kept) == 0 {
		delete(s.unseen, k)
	} else {
		s.unseen[k] = kept
	}
}

// adopt remembers r, the API's replica of k, as unseen unless an agent
// streams from its node or lists it (updating its readiness when it is
// already); mu must be held for writing.
func (s *Store) adopt(k Key, r APIPod, now time.Time) {
	if _, heard := s.sources[r.Node]; heard || r.Node == "" || r.Namespace != k.Namespace {
		return
	}
	if _, listed := s.pods[r.UID]; listed {
		return
	}
	if slices.Contains(s.unseenKeys[r.UID], k) {
		s.readyAsAPI(k, r, now)
		return
	}
	var startNs int64
	if r.CreatedMs > 0 {
		startNs = time.UnixMilli(r.CreatedMs).UnixNano()
	}
	s.remember(k, unseenPod{namespace: r.Namespace, name: r.Name, uid: r.UID, node: r.Node, ready: r.Ready, startNs: startNs, at: now, wasReady: r.Ready})
}

// readyAsAPI sets the readiness of k's unseen replica r.UID to the API's:
// no agent reports it, and the API's is the one there is (a replica that
// was starting turns ready; one crash-looping, or on a node the API cannot
// reach, turns starting: capacity coming, not serving). mu must be held
// for writing.
func (s *Store) readyAsAPI(k Key, r APIPod, now time.Time) {
	list := s.unseen[k]
	if i := slices.IndexFunc(list, func(u unseenPod) bool { return u.uid == r.UID }); i >= 0 {
		u := &list[i]
		u.ready = r.Ready
		switch {
		case r.Ready:
			u.wasReady, u.unreadyNs = true, 0
		case u.wasReady && u.unreadyNs == 0:
			u.unreadyNs = now.UnixNano() // its readiness lost while unseen
		}
	}
}

// resumeUnseen gives p, listed anew, what was known of it while it was
// unseen (its agent lost past the expiry, and back): that it was ready
// before (its ready time unknown), and since when it is not. A pod back
// not ready was a replica starting since its creation. mu must be held
// for writing.
func (s *Store) resumeUnseen(p *pod) {
	for _, k := range s.unseenKeys[p.UID] {
		i := slices.IndexFunc(s.unseen[k], func(u unseenPod) bool { return u.uid == p.UID })
		if i < 0 || !s.unseen[k][i].wasReady {
			continue
		}
		if p.readyNs == 0 {
			p.readyNs = -1
		}
		if at := s.unseen[k][i].unreadyNs; at != 0 {
			p.set().unreadyNs = at
		}
		return
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
		s.unseen[k] = slices.DeleteFunc(s.unseen[k], func(u unseenPod) bool {
			if u.uid == p.UID {
				s.forgot(u)
				return true
			}
			return false
		})
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
// back, and has listed what runs there in full. Every agent's stream
// opens with a full catalogue, so a node with none (unseenOn) costs no
// walk: thousands of agents reconnecting to a restarted aggregator would
// each walk every unseen replica. mu must be held for writing.
func (s *Store) forgetUnseenOn(node string) {
	if s.unseenOn[node] == 0 {
		return
	}
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
				s.forgot(u)
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
			out = append(out, unseenOf(p, "", time.Time{}))
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
		// Ready before and not now (a crash loop while its agent is lost):
		// no replica starting, as a listed one is not.
		if l.Unready = u.wasReady; u.unreadyNs != 0 {
			l.UnreadyFor = max(0, now.Sub(time.Unix(0, u.unreadyNs)))
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
const UnseenReason = "no agent reports its node (its agent lost past --pod-expiry, or not heard since the aggregator started) and the API still has the pod"
