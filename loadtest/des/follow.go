package des

import (
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// followUps schedules closed-loop follow-ups (workload.Request.After): a
// request with After > 0 arrives Think after request After−1 has finished
// or failed, as aiperf replays a session's next turn, not at its Arrival.
// A nil *followUps (no request has After) schedules nothing.
//
// A follow-up is scheduled exactly Think after its predecessor's finish.
// The finish is seen when the engine's Step returns, which may have fused
// decode steps past it (up to the next arrival, snapshot or scheduled
// follow-up); a follow-up routed to that same engine then starts when
// that Step ends: late by at most the fused span (SnapshotInterval by
// default), never early.
type followUps struct {
	reqs        []workload.Request
	first, next []int     // per request: its first follow-up; the next follow-up of its predecessor (-1: none)
	pend        eventHeap // the scheduled follow-ups' times, for the step horizon
}

func newFollowUps(reqs []workload.Request) (*followUps, error) {
	first, next, err := workload.FollowUps(reqs)
	if err != nil || first == nil {
		return nil, err
	}
	return &followUps{reqs: reqs, first: first, next: next}, nil
}

// done schedules request i's follow-ups on h: i finished or failed at
// end, seen at now.
func (f *followUps) done(h *eventHeap, i int, end, now time.Duration) {
	if f == nil {
		return
	}
	for j := f.first[i]; j >= 0; j = f.next[j] {
		at := max(end+f.reqs[j].Think, now)
		h.push(at, evFollow, j)
		f.pend.push(at, evFollow, j)
	}
}

// fired drops the earliest scheduled follow-up: its event fired (events
// fire in time order, so it is the earliest pending).
func (f *followUps) fired() { f.pend.pop() }

// earliest is the earliest scheduled follow-up's time (for horizons).
func (f *followUps) earliest() (time.Duration, bool) {
	if f == nil {
		return 0, false
	}
	return f.pend.peek()
}
