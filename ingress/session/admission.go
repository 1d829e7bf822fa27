package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// AdmissionConfig configures an Admitter.
type AdmissionConfig struct {
	// MaxConcurrent is the number of requests in flight at once before others queue.
	// Default 256. SetLimit changes it at run time (e.g. from cluster saturation).
	MaxConcurrent int
	// MaxQueue bounds waiting requests. When it is full a new request is refused with
	// ErrQueueFull, except a boosted one, which takes the place of the youngest
	// non-boosted waiter (that one gets ErrQueueFull). Default 1,024.
	MaxQueue int
	// MaxWait is the longest a request waits for a slot before ErrQueueTimeout (504).
	// Default 30 s.
	MaxWait time.Duration
	// BoostWindow: a session whose previous request finished at most this long ago is
	// boosted. Default 2 minutes, about how long a user takes to read and reply.
	BoostWindow time.Duration
	// MaxSessions bounds the memory of recently finished sessions. Default 100,000.
	MaxSessions int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultAdmissionConfig returns the defaults described on AdmissionConfig.
func DefaultAdmissionConfig() AdmissionConfig {
	return AdmissionConfig{MaxConcurrent: 256, MaxQueue: 1024, MaxWait: 30 * time.Second,
		BoostWindow: 2 * time.Minute, MaxSessions: 100_000, Now: time.Now}
}

func (c AdmissionConfig) withDefaults() AdmissionConfig {
	d := DefaultAdmissionConfig()
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = d.MaxConcurrent
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = d.MaxQueue
	}
	if c.MaxWait == 0 {
		c.MaxWait = d.MaxWait
	}
	if c.BoostWindow == 0 {
		c.BoostWindow = d.BoostWindow
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	return c
}

// Validate lists every problem with the configuration.
func (c AdmissionConfig) Validate() error {
	var errs []error
	if c.MaxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("%w: max concurrent %d < 1", ErrConfig, c.MaxConcurrent))
	}
	if c.MaxQueue < 0 {
		errs = append(errs, fmt.Errorf("%w: max queue %d < 0", ErrConfig, c.MaxQueue))
	}
	if c.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("%w: max wait %v < 0", ErrConfig, c.MaxWait))
	}
	if c.BoostWindow < 0 {
		errs = append(errs, fmt.Errorf("%w: boost window %v < 0", ErrConfig, c.BoostWindow))
	}
	if c.MaxSessions < 1 {
		errs = append(errs, fmt.Errorf("%w: max sessions %d < 1", ErrConfig, c.MaxSessions))
	}
	return errors.Join(errs...)
}

// waiter is one queued request. ch receives exactly one verdict (buffered, so the
// granter never blocks): true = a slot was handed over, false = evicted from the queue.
type waiter struct {
	ch         chan bool
	boost      bool
	prev, next *waiter
	queued     bool // still in a queue; guarded by Admitter.mu
}

// fifo is an intrusive doubly linked queue of waiters, so a timed-out waiter leaves in
// O(1).
type fifo struct {
	head, tail *waiter
	n          int
}

func (q *fifo) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *fifo) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// Admitter bounds concurrent requests with a boosted and a normal FIFO. Safe for
// concurrent use.
type Admitter struct {
	cfg     AdmissionConfig
	recent  *lru[struct{}] // sessions that finished within BoostWindow
	metrics *admissionMetrics

	mu       sync.Mutex // guards the fields below
	limit    int
	inFlight int
	boosted  fifo
	normal   fifo
}

// NewAdmitter validates cfg (after defaults) and returns an Admitter.
func NewAdmitter(cfg AdmissionConfig) (*Admitter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return &Admitter{
		cfg:     cfg,
		recent:  newLRU[struct{}](cfg.MaxSessions, cfg.BoostWindow),
		metrics: newAdmissionMetrics(),
		limit:   cfg.MaxConcurrent,
	}, nil
}

// Acquire waits for a slot. On success the caller must call release exactly once when
// the request has finished (it also marks the session as recently finished, so its
// next turn is boosted). Errors: ErrQueueFull, ErrQueueTimeout, or ctx.Err().
func (a *Admitter) Acquire(ctx context.Context, sessionID string) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	boost := sessionID != "" && a.isRecent(sessionID)
	a.mu.Lock()
	if a.inFlight < a.limit && a.boosted.n == 0 && a.normal.n == 0 {
		a.inFlight++
		a.mu.Unlock()
		a.metrics.admitted(boost, false)
		return a.releaser(sessionID), nil
	}
	w, err := a.enqueue(boost)
	a.mu.Unlock()
	if err != nil {
		a.metrics.rejectedFull.Inc()
		return nil, err
	}
	start := a.cfg.Now()
	a.metrics.queued.Inc()
	defer a.metrics.queued.Dec()
	timer := time.NewTimer(a.cfg.MaxWait)
	defer timer.Stop()
	select {
	case granted := <-w.ch:
		return a.verdict(w, granted, sessionID, start)
	case <-ctx.Done():
		err = ctx.Err() // the client left (or the server closes): counted canceled
	case <-timer.C:
		err = ErrQueueTimeout
	}
	a.mu.Lock()
	if w.queued {
		a.queueOf(w).remove(w)
		w.queued = false
		a.mu.Unlock()
		a.metrics.gaveUp(err)
		return nil, err
	}
	a.mu.Unlock()
	// A verdict raced with the timeout: it is already in the channel. A granted slot
	// is passed on rather than leaked.
	if granted := <-w.ch; granted {
		a.releaseSlot()
	}
	a.metrics.gaveUp(err)
	return nil, err
}

func (a *Admitter) verdict(w *waiter, granted bool, sessionID string, start time.Time) (func(), error) {
	if !granted {
		a.metrics.rejectedFull.Inc()
		return nil, fmt.Errorf("%w: displaced by a boosted session", ErrQueueFull)
	}
	a.metrics.wait.Observe(a.cfg.Now().Sub(start).Seconds())
	a.metrics.admitted(w.boost, true)
	return a.releaser(sessionID), nil
}

// enqueue adds a waiter under the queue policy. Caller holds a.mu.
func (a *Admitter) enqueue(boost bool) (*waiter, error) {
	if a.boosted.n+a.normal.n >= a.cfg.MaxQueue {
		if !boost || a.normal.n == 0 {
			return nil, ErrQueueFull
		}
		victim := a.normal.tail
		a.normal.remove(victim)
		victim.queued = false
		victim.ch <- false
	}
	w := &waiter{ch: make(chan bool, 1), boost: boost, queued: true}
	a.queueOf(w).push(w)
	return w, nil
}

func (a *Admitter) queueOf(w *waiter) *fifo {
	if w.boost {
		return &a.boosted
	}
	return &a.normal
}

func (a *Admitter) isRecent(sessionID string) bool {
	_, ok := a.recent.get(sessionID, a.cfg.Now(), false)
	return ok
}

// releaser returns the release function for one admitted request; extra calls are
// ignored so a deferred release after an explicit one cannot free a slot twice.
func (a *Admitter) releaser(sessionID string) func() {
	var done atomic.Bool
	return func() {
		if !done.CompareAndSwap(false, true) {
			return
		}
		if sessionID != "" {
			a.recent.put(sessionID, struct{}{}, a.cfg.Now())
		}
		a.releaseSlot()
	}
}

// releaseSlot hands a freed slot to the first boosted waiter, else the first normal
// one, else returns it to the pool.
func (a *Admitter) releaseSlot() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inFlight <= a.limit {
		if w := a.next(); w != nil {
			w.ch <- true // the slot moves to w; inFlight is unchanged
			return
		}
	}
	a.inFlight--
}

// next dequeues the waiter to admit next, or nil. Caller holds a.mu.
func (a *Admitter) next() *waiter {
	q := &a.boosted
	if q.n == 0 {
		q = &a.normal
	}
	w := q.head
	if w == nil {
		return nil
	}
	q.remove(w)
	w.queued = false
	return w
}

// SetLimit changes the number of concurrent requests (minimum 1). Raising it admits
// waiters at once; lowering it lets in-flight requests drain.
func (a *Admitter) SetLimit(n int) {
	n = max(n, 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limit = n
	for a.inFlight < a.limit {
		w := a.next()
		if w == nil {
			return
		}
		a.inFlight++
		w.ch <- true
	}
}

// Stats reports requests in flight, waiting (boosted and normal) and the current limit.
func (a *Admitter) Stats() (inFlight, boosted, normal, limit int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight, a.boosted.n, a.normal.n, a.limit
}
