package des

import (
	"time"

	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// The router-side hold (policies.Hold), as the ingress runs it: once every
// engine has Hold.Seconds of the router's own prefill queued, arrivals wait
// in the router, smallest Hold.Key first, and go one at a time as first
// tokens free room. The time held counts in the request's TTFT and E2E.

// holdState is a run's held requests; zero when the policy does not hold
// (since is allocated only when it does, with the learner's rates).
type holdState struct {
	rule  policies.Hold
	held  []heldReq
	since []time.Duration // per request: how long it was held (0: never)
}

type heldReq struct {
	i   int
	at  time.Duration
	key float64
}

func (s *sim) holding() bool { return s.hold.since != nil }

// room reports whether engine e may take another request now.
func (s *sim) room(e int) bool {
	v := &s.view[e]
	return s.hold.rule.Room(v.LocalPrefillTokens, s.learner.Rates(v.ID).PrefillRate)
}

func (s *sim) anyRoom() bool {
	for e := range s.view {
		if s.room(e) {
			return true
		}
	}
	return false
}

// holdArrival queues request i (its client slot is taken while it waits)
// and sends what the engines have room for.
func (s *sim) holdArrival(i int, now time.Duration) {
	s.inflight++
	k := s.hold.rule.Key(s.reqs[i].PromptTokens, s.learner.Pooled().PrefillRate, now)
	s.hold.held = append(s.hold.held, heldReq{i: i, at: now, key: k})
	s.drainHeld(now)
}

// drainHeld sends held requests, smallest key first, while an engine has
// room; each is charged to its engine before the next is considered.
func (s *sim) drainHeld(now time.Duration) {
	for len(s.hold.held) > 0 && s.anyRoom() {
		k := 0
		for j := range s.hold.held {
			if s.hold.held[j].key < s.hold.held[k].key {
				k = j
			}
		}
		h := s.hold.held[k]
		s.hold.held = append(s.hold.held[:k], s.hold.held[k+1:]...)
		s.hold.since[h.i] = now - h.at
		s.inflight--
		s.send(h.i, now)
	}
}

// pickRoom moves the decision to the best-ranked engine with room (or
// holding Hold.Affinity of the prompt).
func (s *sim) pickRoom(promptTokens int) {
	s.hold.rule.Pick(&s.decision, promptTokens, s.cfg.Engine.BlockSize, func(id string) bool { return s.room(s.ids[id]) })
}
