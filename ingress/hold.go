package ingress

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// The router-side hold (late binding) of the kvmesh policy
// (policies.Hold, whose comment says why), as the discrete-event benchmark
// runs it (loadtest/des/hold.go):
//
//   - An engine has room while this replica's prefill queued on it is
//     under Hold.Seconds of its learned prefill rate: streamed requests'
//     uncached prompt tokens awaiting a first byte (upstream.streamPrefill)
//     plus what is left of non-streamed requests' estimated prefill
//     (upstream.bufDone, queueBuffered).
//   - After admission and before scheduling, a request waits here when
//     requests are already waiting (or one just released has not charged
//     its engine yet), or when none of its candidate engines has room.
//     Waiters are ordered by Hold.Key (prefill seconds at the pooled
//     learned rate, plus Hold.Aging times the time it was held at).
//   - One waiter goes at a time (the baton): the smallest key whose own
//     candidates include an engine with room, so a waiter for a model
//     whose engines are full does not block another model's. It charges
//     its engine (startAttempt) before the next is considered; the baton
//     passes on from there, or when the request ends any other way.
//     Waiters are reconsidered when a prefill charge ends (firstByte,
//     endAttempt), when the baton passes, and every holdRecheck (learned
//     rates and membership change too).
//   - After scheduling, Hold.Pick moves the best-ranked engine with room
//     (or holding Hold.Affinity of the prompt) to the front.
//
// Bounded: a wait past HoldConfig.MaxWait sends the request anyway (the
// hold decides where requests queue, it is not admission control), a
// request arriving with MaxQueue waiters is not held, and the wait ends
// with the server's life (as the admission queue's: 504) or when the
// client closes its connection (waitCtx, clientwatch.go: the request is
// never sent, 499).
//
// Only with the kvmesh policy and its online learner (the rule prices
// with learned rates), not with P/D configured, and never for the
// passthrough endpoints.

// holdRecheck is how often waiters are reconsidered without a wake-up.
const holdRecheck = 50 * time.Millisecond

// HoldConfig bounds the kvmesh policy's router-side hold (on when the
// policy's holdSeconds is > 0 and the cost learner runs; docs/OPERATIONS.md,
// "Router-side hold").
type HoldConfig struct {
	// MaxWait bounds a request's wait in the hold; past it the request is
	// sent anyway. Default 30s.
	MaxWait time.Duration `yaml:"maxWait"`
	// MaxQueue bounds the requests held at once: one arriving with MaxQueue
	// waiters is sent at once. Default 4096; 0: never hold.
	MaxQueue int `yaml:"maxQueue"`
}

// DefaultHoldConfig is HoldConfig's defaults.
func DefaultHoldConfig() HoldConfig { return HoldConfig{MaxWait: 30 * time.Second, MaxQueue: 4096} }

func (c *HoldConfig) problems(bad func(string, ...any)) {
	if c.MaxWait <= 0 {
		bad("hold: maxWait must be > 0, got %v", c.MaxWait)
	}
	if c.MaxQueue < 0 {
		bad("hold: maxQueue must be >= 0 (0: never hold), got %d", c.MaxQueue)
	}
}

// holdQueue is the held requests. Lock rule: mu guards ws, baton, closed
// and seen; room is called under mu.
type holdQueue struct {
	rule    policies.Hold
	maxWait time.Duration
	maxLen  int
	room    func(engine string) bool // an engine's room now
	now     func() time.Duration     // the keys' clock (any fixed origin)

	n       atomic.Int64 // len(ws), read without the lock
	pending atomic.Int64 // len(ws) plus a baton out: 0 lets a request with room go without the lock

	mu     sync.Mutex
	ws     []*holdWaiter // smallest key first
	baton  bool          // a released waiter has not charged its engine yet
	closed bool          // the server is closing: nothing waits
	seen   map[string]bool

	waitS   prometheus.Histogram // set together by register (or newHoldQueue: unregistered)
	expired prometheus.Counter
	full    prometheus.Counter // sent unheld: maxQueue waiters already
	left    prometheus.Counter // the client closed its connection while held
}

// holdWaiter is one held request.
type holdWaiter struct {
	key   float64
	cands []scheduler.Engine
	ready chan struct{} // closed when released
	out   bool          // left ws (released, expired, canceled or flushed); under mu
	baton bool          // released holding the baton
}

func newHoldQueue(rule policies.Hold, cfg HoldConfig, room func(string) bool, now func() time.Duration) *holdQueue {
	q := &holdQueue{rule: rule, maxWait: cfg.MaxWait, maxLen: cfg.MaxQueue, room: room, now: now, seen: map[string]bool{}}
	q.metrics(nil)
	return q
}

// metrics makes the hold's series with the labels cl.
func (q *holdQueue) metrics(cl prometheus.Labels) {
	q.waitS = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvmesh_ingress_hold_seconds",
		Help: "Time held requests waited in the router-side hold (released, sent after maxWait, or ended).", ConstLabels: cl, Buckets: latencyBuckets})
	q.expired = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_hold_expired_total",
		Help: "Held requests sent after waiting hold.maxWait, with no engine's room.", ConstLabels: cl})
	q.full = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_hold_full_total",
		Help: "Requests the hold would have held, sent at once because hold.maxQueue requests were held already.", ConstLabels: cl})
	q.left = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_hold_left_total",
		Help: "Held requests whose client closed its connection while held: never sent (status 499).", ConstLabels: cl})
}

// register adds the hold's series to reg.
func (q *holdQueue) register(reg prometheus.Registerer, cl prometheus.Labels) {
	q.metrics(cl)
	reg.MustRegister(q.waitS, q.expired, q.full, q.left, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_held_requests",
		Help: "Requests waiting in the router-side hold now.", ConstLabels: cl}, func() float64 { return float64(q.n.Load()) }))
}

// anyRoom reports whether one of cands has room, or none can take the
// request: nothing to wait for (the scheduler answers).
func (q *holdQueue) anyRoom(cands []scheduler.Engine) bool { return q.roomIn(cands, nil) }

// roomIn is anyRoom with each engine's room asked once per pass when seen
// is not nil (a dispatch pass, under mu).
func (q *holdQueue) roomIn(cands []scheduler.Engine, seen map[string]bool) bool {
	some := false
	for i := range cands {
		if !holdable(&cands[i]) {
			continue
		}
		some = true
		id := cands[i].ID
		r, ok := seen[id]
		if !ok {
			r = q.room(id)
			if seen != nil {
				seen[id] = r
			}
		}
		if r {
			return true
		}
	}
	return !some
}

// holdable reports whether e can take the request at all: an unhealthy
// engine, or a prefill-role one (P/D off: the scheduler drops it), has
// room because nothing is sent there; its room must not release anyone.
func holdable(e *scheduler.Engine) bool { return e.Healthy && e.Role != scheduler.RolePrefill }

// holdVerdict is how a wait ended.
type holdVerdict int

const (
	holdNot      holdVerdict = iota // not held
	holdReleased                    // released (with the baton unless flushed)
	holdExpired                     // waited maxWait: send anyway
	holdEnded                       // done fired: the request ends
)

// wait holds a request whose candidates are cands and whose key is key
// when the rule says so, until it is released, maxWait passes or done
// fires. baton: the request holds the baton and must pass it (pass).
func (q *holdQueue) wait(done <-chan struct{}, cands []scheduler.Engine, key float64) (v holdVerdict, baton bool) {
	q.mu.Lock() // the lock-free fast path is the caller's (holdStep)
	if q.closed || len(q.ws) == 0 && !q.baton && q.anyRoom(cands) {
		q.mu.Unlock()
		return holdNot, false
	}
	if len(q.ws) >= q.maxLen {
		q.mu.Unlock()
		if q.maxLen > 0 {
			q.full.Inc()
		}
		return holdNot, false
	}
	w := &holdWaiter{key: key, cands: cands, ready: make(chan struct{})}
	i, _ := slices.BinarySearchFunc(q.ws, key, func(w *holdWaiter, k float64) int {
		if w.key <= k { // equal keys: first come first
			return -1
		}
		return 1
	})
	q.ws = slices.Insert(q.ws, i, w)
	q.count()
	q.dispatchLocked()
	q.mu.Unlock()

	t := time.NewTimer(q.maxWait)
	defer t.Stop()
	select {
	case <-w.ready:
		return holdReleased, w.baton
	case <-t.C:
		v = holdExpired
	case <-done:
		v = holdEnded
	}
	q.mu.Lock()
	if w.out { // released meanwhile
		q.mu.Unlock()
		if v == holdEnded {
			if w.baton {
				q.pass()
			}
			return holdEnded, false
		}
		return holdReleased, w.baton
	}
	q.remove(w)
	q.dispatchLocked()
	q.mu.Unlock()
	if v == holdExpired {
		q.expired.Inc()
	}
	return v, false
}

// remove takes w out of ws (under mu).
func (q *holdQueue) remove(w *holdWaiter) {
	if i := slices.Index(q.ws, w); i >= 0 {
		q.ws = slices.Delete(q.ws, i, i+1)
	}
	w.out = true
	q.count()
}

// count refreshes the lock-free counts (under mu).
func (q *holdQueue) count() {
	n := int64(len(q.ws))
	q.n.Store(n)
	if q.baton {
		n++
	}
	q.pending.Store(n)
}

// dispatchLocked releases the smallest-key waiter one of whose candidates
// has room, unless a released one still holds the baton (under mu).
func (q *holdQueue) dispatchLocked() {
	if q.baton || len(q.ws) == 0 {
		return
	}
	clear(q.seen)
	for i, w := range q.ws {
		if !q.roomIn(w.cands, q.seen) {
			continue
		}
		q.ws = slices.Delete(q.ws, i, i+1)
		w.out, w.baton, q.baton = true, true, true
		q.count()
		close(w.ready)
		return
	}
}

// pass hands the baton on: the released request charged its engine (or
// ended).
func (q *holdQueue) pass() {
	q.mu.Lock()
	q.baton = false
	q.count()
	q.dispatchLocked()
	q.mu.Unlock()
}

// wake reconsiders the waiters (room may have freed).
func (q *holdQueue) wake() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.dispatchLocked()
	q.mu.Unlock()
}

// close releases every waiter (without the baton) and holds nothing from
// now on: the server is closing, and held requests are in service.
func (q *holdQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, w := range q.ws {
		w.out = true
		close(w.ready)
	}
	q.ws = nil
	q.count()
}

// holdLoop reconsiders the waiters every holdRecheck until the server
// closes, then releases them.
func (s *Server) holdLoop() {
	t := time.NewTicker(holdRecheck)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			s.holdQ.close()
			return
		case <-t.C:
			s.holdQ.wake()
		}
	}
}

// engineRoom reports whether engine id has room under the hold's rule:
// this replica's streamed requests' prefill awaiting a first byte
// (upstream.streamPrefill) plus what is left of its non-streamed requests'
// estimated prefill (upstream.bufDone), at the learned rate.
func (s *Server) engineRoom(id string) bool {
	rate := s.learn.Rates(id).PrefillRate
	up := s.ups.lookup(id)
	if up == nil {
		return s.hold.Room(0, rate)
	}
	pending := float64(up.streamPrefill.Load())
	if ahead := up.bufDone.Load() - s.holdNow(); ahead > 0 && rate > 0 {
		pending += float64(ahead) / 1e9 * rate
	}
	return s.hold.Room(int(pending), rate)
}

// queueBuffered puts a non-streamed attempt's uncached prompt tokens on
// its engine's estimated prefill clock (upstream.bufDone): its first byte
// is its whole answer, so the hold cannot wait for it to free the room;
// instead the room frees as the learned rate says the engine prefills it,
// after the non-streamed prefill this replica sent there before it.
func (c *call) queueBuffered(up *upstream) {
	s := c.s
	if s.holdQ == nil || c.ep == epOther || c.prefillCharge <= 0 {
		return
	}
	rate := s.learn.Rates(up.id).PrefillRate
	if rate <= 0 {
		return
	}
	d := int64(float64(c.prefillCharge) / rate * 1e9)
	now := s.holdNow()
	for {
		cur := up.bufDone.Load()
		end := max(cur, now) + d
		if up.bufDone.CompareAndSwap(cur, end) {
			c.bufEnd, c.bufDur = end, d
			return
		}
	}
}

// unqueueBuffered takes back what is left of the attempt's estimated
// prefill when its answer (or failure) comes before the estimate's end.
func (c *call) unqueueBuffered(up *upstream) {
	if c.bufEnd == 0 {
		return
	}
	if left := min(c.bufEnd-c.s.holdNow(), c.bufDur); left > 0 {
		up.bufDone.Add(-left)
	}
	c.bufEnd, c.bufDur = 0, 0
}

// holdStep is the hold before scheduling: the request waits while the
// rule holds it. A request that waited is scheduled against fresh
// candidates (their load changed meanwhile).
func (c *call) holdStep(ctx *fasthttp.RequestCtx) error {
	s := c.s
	q := s.holdQ
	if q == nil || c.ep == epOther {
		return nil
	}
	if q.pending.Load() == 0 && q.anyRoom(c.cands) {
		return nil // the common case: no lock, no allocation
	}
	t := time.Now()
	key := q.rule.Key(c.promptTokens, s.learn.Pooled().PrefillRate, q.now())
	wctx := c.waitContext(ctx)
	v, baton := q.wait(wctx.Done(), c.cands, key)
	c.wctx.stop()
	if v == holdNot {
		return nil
	}
	c.baton = baton
	q.waitS.Observe(time.Since(t).Seconds())
	if v == holdEnded {
		err := wctx.Err()
		if errors.Is(err, ErrClientGone) {
			q.left.Inc()
			return fmt.Errorf("hold: %w", err)
		}
		if err == nil {
			err = context.Canceled
		}
		return fmt.Errorf("hold: %w: %w", ErrQueueTimeout, err)
	}
	return c.refreshCandidates()
}

// holdPick moves the best-ranked engine the hold lets the request go to
// to the front of the ranking (policies.Hold.Pick).
func (c *call) holdPick() {
	q := c.s.holdQ
	if q == nil || c.ep == epOther {
		return
	}
	q.rule.Pick(&c.dec, c.promptTokens, c.block, c.s.roomFn)
	c.picked = c.dec.Engine
}

// passBaton hands the hold's baton on once the request charged its engine
// or ended.
func (c *call) passBaton() {
	if c.baton {
		c.baton = false
		c.s.holdQ.pass()
	}
}

// holdWake reconsiders held requests after a prefill charge ended.
func (s *Server) holdWake() {
	if s.holdQ != nil {
		s.holdQ.wake()
	}
}
