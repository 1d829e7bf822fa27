package des

import (
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// The router-side hold (policies.Hold), as the ingress runs it: once every
// engine has Hold.Seconds of the router's own prefill queued, arrivals wait
// in the router, smallest Hold.Key first, and go one at a time as first
// tokens free room. The time held counts in the request's TTFT and E2E.
// The aggregated benchmark (sim) and the P/D benchmark's aggregated routing
// (pdSim) run it alike; a P/D router does not hold (nor does the ingress
// with P/D configured).

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

// newHoldState holds with rule when it is on and the run learns its rates
// (lr not nil), for n requests.
func newHoldState(rule policies.Hold, lr *learn.Learner, n int) holdState {
	if lr == nil || !rule.On() {
		return holdState{}
	}
	return holdState{rule: rule, since: make([]time.Duration, n)}
}

func (h *holdState) on() bool { return h.since != nil }

// room reports whether engine v may take another request now.
func (h *holdState) room(v *scheduler.Engine, lr *learn.Learner) bool {
	return h.rule.Room(v.LocalPrefillTokens, lr.Rates(v.ID).PrefillRate)
}

func (h *holdState) anyRoom(view []scheduler.Engine, lr *learn.Learner) bool {
	for e := range view {
		if h.room(&view[e], lr) {
			return true
		}
	}
	return false
}

// arrive queues request i of promptTokens (the caller keeps its client
// slot taken while it waits).
func (h *holdState) arrive(i, promptTokens int, lr *learn.Learner, now time.Duration) {
	k := h.rule.Key(promptTokens, lr.Pooled().PrefillRate, now)
	h.held = append(h.held, heldReq{i: i, at: now, key: k})
}

// next takes the smallest-key held request when an engine has room; the
// caller sends it (charging its engine) before asking again.
func (h *holdState) next(view []scheduler.Engine, lr *learn.Learner, now time.Duration) (int, bool) {
	if len(h.held) == 0 || !h.anyRoom(view, lr) {
		return 0, false
	}
	k := 0
	for j := range h.held {
		if h.held[j].key < h.held[k].key {
			k = j
		}
	}
	r := h.held[k]
	h.held = append(h.held[:k], h.held[k+1:]...)
	h.since[r.i] = now - r.at
	return r.i, true
}

// drain sends held requests, smallest key first, while an engine has
// room; send charges each to its engine before the next is considered.
// inflight is the run's client slots in use: a held request's is handed on
// to send.
func (h *holdState) drain(view []scheduler.Engine, lr *learn.Learner, now time.Duration, inflight *int, send func(int, time.Duration)) {
	for {
		i, ok := h.next(view, lr, now)
		if !ok {
			return
		}
		*inflight--
		send(i, now)
	}
}

// heldFor is how long request i was held.
func (h *holdState) heldFor(i int) time.Duration {
	if h.since == nil {
		return 0
	}
	return h.since[i]
}

func (s *sim) holding() bool { return s.hold.on() }

// holdArrival queues request i (its client slot is taken while it waits)
// and sends what the engines have room for.
func (s *sim) holdArrival(i int, now time.Duration) {
	s.inflight++
	s.hold.arrive(i, s.reqs[i].PromptTokens, s.learner, now)
	s.drainHeld(now)
}

// drainHeld sends held requests, smallest key first, while an engine has
// room; each is charged to its engine before the next is considered.
func (s *sim) drainHeld(now time.Duration) { s.hold.drain(s.view, s.learner, now, &s.inflight, s.send) }

// pickRoom moves the decision to the best-ranked engine with room (or
// holding Hold.Affinity of the prompt).
func (s *sim) pickRoom(promptTokens int) {
	s.hold.rule.Pick(&s.decision, promptTokens, s.cfg.Engine.BlockSize, func(id string) bool {
		return s.hold.room(&s.view[s.ids[id]], s.learner)
	})
}
