package policies

import (
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Hold is the router-side hold of the kvmesh policy (late binding): when
// every engine already has Seconds of this router's prefill queued, a new
// request waits in the router instead of joining an engine's queue, and is
// sent when an engine has room again, to an engine with room (or to one
// holding at least Affinity of its prompt).
//
// Why: an engine serves its queue in arrival order, and a request committed
// to a queue stays there. Under overload the cost model's per-request
// terms sort requests by size — long prompts onto a few engines, short ones
// onto others — and once queued, that split cannot be undone: at twice the
// Mooncake trace's rate the short-request engine ran out of work while the
// long-prompt engines' backlog ran 140 s longer (request imbalance 3.6,
// throughput 0.78× the best emulation's). Holding keeps the backlog where
// the router can still choose: each engine's queue stays short, the router
// hands the next request to whichever engine frees room first (work
// conserving), and it can choose which held request goes next.
//
// Order: smallest Key first — the request's prefill seconds plus Aging
// times its arrival time, i.e. shortest prefill first, but a request that
// has waited w seconds is served ahead of any request up to Aging·w
// seconds of prefill shorter that arrived later. That cuts mean TTFT under
// overload without starving long prompts: at Aging 0.5, p99 TTFT stayed
// below every emulation's on the Mooncake trace at 1× and 2×.
//
// The rule needs no information a real deployment lacks: the router's own
// in-flight prefill per engine (uncached tokens awaiting a first token)
// and its learned prefill rates.
type Hold struct {
	// Seconds of this router's prefill queued on every engine before it
	// holds (0 = never hold).
	Seconds float64
	// Aging is the seconds of prefill a held request gains per second
	// waited.
	Aging float64
	// Affinity: a held request may still go to an engine without room
	// that holds at least this fraction of its prompt (0 = only engines
	// with room).
	Affinity float64
}

// On reports whether the hold is configured.
func (h Hold) On() bool { return h.Seconds > 0 }

// Room reports whether an engine with localPrefillTokens of this router's
// uncached prompt tokens awaiting a first token, at rate tokens/s, may take
// another request.
func (h Hold) Room(localPrefillTokens int, rate float64) bool {
	return rate <= 0 || float64(localPrefillTokens) < h.Seconds*rate
}

// Key orders held requests (smaller first): the prompt's prefill seconds
// at rate, plus Aging times the time the request was held at (any fixed
// origin; only differences count).
func (h Hold) Key(promptTokens int, rate float64, heldAt time.Duration) float64 {
	k := h.Aging * heldAt.Seconds()
	if rate > 0 {
		k += float64(promptTokens) / rate
	}
	return k
}

// May reports whether a request of promptTokens may go now to an engine
// with room (room) whose matched prefix (confirmed or speculative) covers
// matchedTokens of it: with room, or holding at least Affinity of it.
func (h Hold) May(room bool, matchedTokens, promptTokens int) bool {
	return room || h.Affinity > 0 && float64(matchedTokens) >= h.Affinity*float64(promptTokens)
}

// Pick moves to the front of d.Ranked the best-ranked engine a request may
// go to now: one with room, or one whose matched prefix (confirmed or
// speculative) covers at least Affinity of the prompt. When none
// qualifies the ranking is left as it is. room reports an engine's room
// by id. blockSize is the tokens per block of a Match whose MatchBlock is
// not set.
func (h Hold) Pick(d *scheduler.Decision, promptTokens, blockSize int, room func(engine string) bool) {
	for i := range d.Ranked {
		r := &d.Ranked[i]
		bs := blockSize
		if r.MatchBlock > 0 {
			bs = r.MatchBlock
		}
		if !h.May(room(r.Engine), r.Match.Spec*bs, promptTokens) {
			continue
		}
		if i > 0 {
			e := d.Ranked[i]
			copy(d.Ranked[1:i+1], d.Ranked[:i])
			d.Ranked[0] = e
			d.Engine, d.Reason = e.Engine, "hold-room"
		}
		return
	}
}
