package des

import (
	"math"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// clock is what every simulation of this package drives its run with: the
// event heap, the workload's open-loop arrivals, closed-loop follow-ups,
// the client's concurrency limit with its backlog, and the router's
// periodic snapshot. A simulation embeds it and handles its own events
// (steps, transfers, scaling) between the clock's.
type clock struct {
	h     eventHeap
	reqs  []workload.Request
	fol   *followUps    // closed-loop follow-ups (nil: none)
	limit int           // requests the client keeps in flight (0: no limit)
	every time.Duration // snapshot interval (0: no snapshots)

	nextArr  int           // next request to push as an arrival (arrivals are pushed one at a time)
	arrAt    time.Duration // time of the pending arrival (-1 = none)
	nextSnap time.Duration // time of the pending snapshot event (-1 = none)
	inflight int
	backlog  []int // requests the client's limit holds back, in arrival order
	bhead    int
	pending  int // arrivals not yet dispatched + in flight

	prog      *progress // progress lines (nil: none)
	snapshots int       // snapshots taken
	everyTick bool      // tests: snapshot at every grid point, idle or not (snapshotted)
}

func (c *clock) init(reqs []workload.Request, limit int, every time.Duration) error {
	c.reqs, c.limit, c.every = reqs, limit, every
	var err error
	c.fol, err = newFollowUps(reqs)
	return err
}

// start schedules the first arrival and the first snapshot (at 0).
func (c *clock) start() {
	c.pushArrival()
	c.pending = len(c.reqs)
	c.nextSnap = -1
	if c.every > 0 {
		c.nextSnap = 0
		c.h.push(0, evSnapshot, 0)
	}
}

// arrived takes an evArrival or evFollow event: it schedules the next
// arrival (or drops the follow-up from the horizon) and says whether the
// request may be dispatched now; if not, the client holds it in the
// backlog until a slot frees (next).
func (c *clock) arrived(ev event) bool {
	if ev.kind == evArrival {
		c.pushArrival()
	} else {
		c.fol.fired()
	}
	if !c.free() {
		c.backlog = append(c.backlog, ev.arg)
		return false
	}
	return true
}

// progressed is the run loop's periodic call (with its cancellation check):
// progress, at the virtual time now.
func (c *clock) progressed(now time.Duration) { c.prog.tick(c, now) }

// free says whether the client may send another request.
func (c *clock) free() bool { return c.limit == 0 || c.inflight < c.limit }

// next takes the request the backlog releases, if any; the caller has a
// free client slot for it.
func (c *clock) next() (int, bool) {
	if c.bhead == len(c.backlog) {
		return 0, false
	}
	i := c.backlog[c.bhead]
	c.bhead++
	return i, true
}

// snapshotted schedules the snapshot after the one just taken at now,
// while requests remain: the next point of the grid now + k·every, skipping
// those before the next event of any kind (the heap's top). A snapshot
// reads only what events change (engine load, the latencies finished since
// the last one, which this one has just zeroed), so one with no event
// since the last reads the same and changes nothing; and the one pushed
// here is, as the last of the skipped ones would have been, the newest in
// the heap, first at its time only before what its time's events push.
// So no result changes, and an idle stretch — a trace's night, a row with
// a relative timestamp among epoch ones — costs one event, not one per
// interval (a 55-year gap took half an hour of 200 ms snapshots).
func (c *clock) snapshotted(now time.Duration) {
	c.snapshots++
	c.nextSnap = -1
	if c.pending == 0 {
		return
	}
	c.nextSnap = now + c.every
	if !c.everyTick {
		c.nextSnap = nextGridPoint(now, c.every, &c.h)
	}
	c.h.push(c.nextSnap, evSnapshot, 0)
}

// nextGridPoint is the first point of now + k·every (k ≥ 1) at or after
// the earliest event of h (now + every when h is empty or its top is
// sooner). A point past the largest time.Duration is the event's time
// itself (off the grid: no such run has a meaningful result anyway).
func nextGridPoint(now, every time.Duration, h *eventHeap) time.Duration {
	next := now + every
	t, ok := h.peek()
	if !ok || t <= next {
		return next
	}
	k := (t - now) / every
	if (t-now)%every != 0 {
		k++
	}
	if k > (math.MaxInt64-now)/every {
		return t
	}
	return now + k*every
}

// pushArrival schedules the next workload request's arrival. Arrivals are
// sorted, so one pending arrival at a time keeps the heap small and makes
// the next arrival time known for step fusing. Follow-ups arrive when
// their predecessor ends (followUps).
func (c *clock) pushArrival() {
	c.arrAt = -1
	for c.nextArr < len(c.reqs) && c.reqs[c.nextArr].After > 0 {
		c.nextArr++
	}
	if c.nextArr < len(c.reqs) {
		c.arrAt = c.reqs[c.nextArr].Arrival
		c.h.push(c.arrAt, evArrival, c.nextArr)
		c.nextArr++
	}
}

// horizon is the earliest time an outside event can change an engine's
// input, passed to Step so it fuses decode-only steps up to it: the next
// arrival, snapshot or follow-up. When any event may add a request to an
// engine (busy: the caller's own, e.g. prefill legs in flight; or a
// client backlog, which a finish anywhere releases) it is the heap top.
func (c *clock) horizon(busy bool) time.Duration {
	if busy || c.bhead < len(c.backlog) {
		if t, ok := c.h.peek(); ok {
			return t
		}
	}
	until := time.Duration(math.MaxInt64)
	if c.arrAt >= 0 {
		until = c.arrAt
	}
	if c.nextSnap >= 0 && c.nextSnap < until {
		until = c.nextSnap
	}
	if t, ok := c.fol.earliest(); ok && t < until {
		until = t
	}
	return until
}

// scrape is what gossip and the metrics scrapes give every router: each
// engine's running, waiting and KV usage, and the means of its TTFT and
// TPOT histograms since the last scrape. vLLM exports no queued prefill
// tokens metric, so no router gets it (each counts its own in-flight
// prefill tokens).
func scrape(engines []*engine.Engine, view []scheduler.Engine, lat []latAcc) {
	for e, eng := range engines {
		l := eng.Load()
		v := &view[e]
		v.Running, v.Waiting, v.KVUsage = l.Running, l.Waiting, l.KVUsage
		if a := &lat[e]; a.n > 0 {
			v.TTFT, v.TPOT = a.ttft/time.Duration(a.n), a.tpot/time.Duration(a.n)
			*a = latAcc{}
		}
	}
}
