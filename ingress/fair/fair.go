// Package fair admits requests to a bounded number of slots with weighted
// fair queuing across tenants: it orders the waiting requests by the
// tenants' weights and bounds each tenant's share of the slots in service,
// so that when the engines are saturated a freed slot goes to a tenant below
// its share before one that holds more. It never preempts: a request in
// service keeps its slot until it ends, so a tenant that arrives while
// another's long requests hold every slot waits for one of them to finish
// (MaxInServicePerTenant keeps slots from one tenant altogether).
//
// Tenants are served in strict priority classes (a higher Priority first);
// within a class, start-time fair queuing: each waiting request gets the
// virtual start tag max(V, the tenant's last finish tag) and the finish tag
// start + cost/weight, and a freed slot goes to the smallest start tag. Over
// any busy period each backlogged tenant receives slots in proportion to its
// weight (in cost units: the ingress prices a request in tokens of work, its
// prompt and the output it asks for; or 1 per request), whatever order the
// requests arrived in; a tenant that was idle starts at the current virtual
// time, so it neither hoards credit nor waits behind a backlog that is not its
// own. Within a tenant, FIFO.
//
// Slots in service, within a class: a tenant's share is MaxConcurrent ×
// its weight / the weights of the class's busy tenants (waiting or in
// service), at least 1. When the waiter with the smallest start tag belongs
// to a tenant that holds its share already while another waiting tenant
// does not, the slot goes to the waiting tenant holding the fewest slots for
// its weight instead (start tags only count the work a request asks for,
// not how long it holds its slot). The rule only chooses among waiters, so a
// tenant alone still gets every slot. MaxInServicePerTenant, when set, is a
// hard cap: a tenant holding that many waits even while slots are free.
//
// Bounded everywhere: each tenant's queue (MaxQueuePerTenant) and the total
// (MaxQueue); a full queue refuses at once with ErrQueueFull (the ingress
// answers 429 with Retry-After) and a request that waits longer than MaxWait
// gets ErrQueueTimeout (the ingress answers 504): shedding before latency
// collapses. The tenants themselves: a name is at most MaxTenantName bytes (a
// longer one is cut and tagged with a hash of the whole), an idle tenant whose
// finish tag the virtual time has passed carries nothing a fresh one would not
// and is forgotten, and at most MaxTenants are kept: when that many are busy,
// a tenant not listed in Config.Tenants shares one overflow tenant.
package fair

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"
)

var (
	// ErrQueueFull: the tenant's queue or the whole queue is full (the
	// message says which).
	ErrQueueFull = errors.New("fair queue full")
	// ErrQueueTimeout: no slot within MaxWait.
	ErrQueueTimeout = errors.New("fair queue wait timed out")
)

// Tenant is one tenant's share.
type Tenant struct {
	// Weight is the tenant's share relative to the others' (default 1).
	Weight float64 `yaml:"weight"`
	// Priority: higher classes are admitted first (default 0).
	Priority int `yaml:"priority"`
}

// Config configures a Queue.
type Config struct {
	// MaxConcurrent requests in service (default 256).
	MaxConcurrent int `yaml:"maxConcurrent"`
	// MaxQueue bounds all waiting requests (default 4,096); MaxQueuePerTenant
	// one tenant's (default 1,024).
	MaxQueue          int `yaml:"maxQueue"`
	MaxQueuePerTenant int `yaml:"maxQueuePerTenant"`
	// MaxInServicePerTenant caps one tenant's requests in service (default
	// 0: no cap but MaxConcurrent, so a tenant alone can use every slot).
	// A tenant at the cap waits even while slots are free, which leaves
	// room for tenants that arrive later without preempting anyone, at the
	// price of idle slots when that tenant is the only one with work. Below
	// the cap, a tenant holding its weighted share yields freed slots to
	// waiting tenants below theirs (see the package documentation).
	MaxInServicePerTenant int `yaml:"maxInServicePerTenant"`
	// MaxWait is the longest a request waits (default 30 s).
	MaxWait time.Duration `yaml:"maxWait"`
	// Tenants lists known tenants' weights and priorities; others get Default.
	Tenants map[string]Tenant `yaml:"tenants"`
	// Default applies to tenants not listed (default weight 1, priority 0).
	Default Tenant `yaml:"default"`
	// MaxTenants bounds the tenants the queue keeps state for (default
	// 10,000; 0: the default). Idle tenants (nothing waiting or in service)
	// are forgotten first; when every tracked tenant is busy, a tenant not
	// listed in Tenants shares one overflow tenant (Default's share) with the
	// others beyond the bound, counted in kvmesh_ingress_tenant_overflow_total.
	MaxTenants int `yaml:"maxTenants"`
	// MaxTenantName bounds a tenant name in bytes (default 256; 0: the
	// default). A longer name is cut to its first MaxTenantName−17 bytes,
	// '#' and 16 hex digits of a hash of the whole name, so long names that
	// differ stay different tenants while each costs bounded memory.
	MaxTenantName int `yaml:"maxTenantName"`
}

// Defaults of the tenant bounds.
const (
	DefaultMaxTenants    = 10_000
	DefaultMaxTenantName = 256
	minTenantName        = 32 // room for a cut name's hash tag
	sweepFloor           = 64 // tenants kept before the first sweep
)

// UnmarshalYAML decodes a tenant over the default share (weight 1), so a
// tenant given only its priority keeps weight 1. The local type has the
// type's name (strict decoding's errors still name fair.Tenant) but not
// this method (no recursion); the func-style Unmarshaler keeps the
// caller's decoder and its KnownFields.
func (t *Tenant) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = Tenant
	type Tenant fields
	v := Tenant{Weight: 1}
	err := unmarshal(&v)
	*t = fields(v)
	return err
}

// UnmarshalYAML decodes a fairQueue block over DefaultConfig, so the
// fields left out keep the defaults documented on Config (as the ingress's
// --tenant and --fair-max-concurrent flags do).
func (c *Config) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = Config
	type Config fields
	v := Config(DefaultConfig())
	err := unmarshal(&v)
	*c = fields(v)
	return err
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MaxConcurrent: 256, MaxQueue: 4096, MaxQueuePerTenant: 1024, MaxWait: 30 * time.Second,
		Default: Tenant{Weight: 1}, MaxTenants: DefaultMaxTenants, MaxTenantName: DefaultMaxTenantName}
}

// Validate lists every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("maxConcurrent %d must be ≥ 1", c.MaxConcurrent))
	}
	if c.MaxQueue < 0 || c.MaxQueuePerTenant < 0 {
		errs = append(errs, fmt.Errorf("queue bounds must be ≥ 0"))
	}
	if c.MaxInServicePerTenant < 0 || c.MaxInServicePerTenant > max(c.MaxConcurrent, 1) {
		errs = append(errs, fmt.Errorf("maxInServicePerTenant %d must be between 0 (no cap) and maxConcurrent (%d)", c.MaxInServicePerTenant, c.MaxConcurrent))
	}
	if c.MaxWait <= 0 {
		errs = append(errs, fmt.Errorf("maxWait %v must be > 0", c.MaxWait))
	}
	if !finitePositive(c.Default.Weight) {
		errs = append(errs, fmt.Errorf("default weight %v must be a finite value > 0", c.Default.Weight))
	}
	if c.MaxTenants < 0 {
		errs = append(errs, fmt.Errorf("maxTenants %d must be ≥ 0", c.MaxTenants))
	}
	if c.MaxTenantName != 0 && c.MaxTenantName < minTenantName {
		errs = append(errs, fmt.Errorf("maxTenantName %d must be ≥ %d (or 0: %d)", c.MaxTenantName, minTenantName, DefaultMaxTenantName))
	}
	maxName := c.MaxTenantName
	if maxName == 0 {
		maxName = DefaultMaxTenantName
	}
	for name, t := range c.Tenants {
		if !finitePositive(t.Weight) {
			errs = append(errs, fmt.Errorf("tenant %q: weight %v must be a finite value > 0", name, t.Weight))
		}
		if len(name) > maxName {
			errs = append(errs, fmt.Errorf("tenant %.40q...: name longer than maxTenantName (%d bytes)", name, maxName))
		}
	}
	return errors.Join(errs...)
}

// finitePositive: a weight NaN or +Inf passed "<= 0" tests and made every
// finish time (start + cost/weight) NaN or 0, the heap's order undefined.
func finitePositive(w float64) bool { return w > 0 && !math.IsInf(w, 1) }

// Ticket describes one request asking for a slot.
type Ticket struct {
	Tenant string
	// Cost in the unit shares are counted in (tokens of work, or 1); ≤ 0 counts 1.
	Cost float64
}

type waiter struct {
	ch     chan bool // receives true when granted a slot
	tenant *tenantQ
	start  float64 // virtual start tag
	seq    uint64  // arrival order, breaks ties
	index  int     // in the class's heads; -1 when not there
	lindex int     // in the class's byLoad; -1 when not there
}

// tenantQ is one tenant's state: its FIFO of waiters and last finish tag.
type tenantQ struct {
	name       string
	share      Tenant
	lastFinish float64
	fifo       []*waiter
	queued     int
	running    int // admitted, not released
	class      *class
}

// busy reports whether the tenant has requests waiting or in service.
func (tq *tenantQ) busy() bool { return tq.queued > 0 || tq.running > 0 }

// class is one priority class: its tenants' head waiters in two heaps, by
// start tag and by slots held per weight. A tenant has its head in both or
// in neither (no waiter, or at MaxInServicePerTenant: parked).
type class struct {
	prio      int
	heads     waiterHeap
	byLoad    loadHeap
	v         float64 // virtual time: the smallest start tag when a request was last admitted
	maxFinish float64 // the largest finish tag given out
	weight    float64 // the busy tenants' weights (the shares' denominator)
	nbusy     int     // busy tenants (weight is reset to 0 with the last, no drift)
}

// Queue is the fair admission queue. Safe for concurrent use.
type Queue struct {
	cfg Config

	mu       sync.Mutex
	inFlight int
	queued   int
	heads    int // tenants with a head in a class's heaps: waiters a slot can go to
	seq      uint64
	tenants  map[string]*tenantQ
	busy     int      // tenants with requests waiting or in service
	sweepAt  int      // len(tenants) at which idle tenants are looked for next
	overflow *tenantQ // the tenants beyond MaxTenants (made on first use)
	classes  []*class // by priority, highest first

	metrics *metrics
}

// New validates cfg and returns a Queue.
func New(cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fair queue: %w", err)
	}
	if cfg.MaxTenants == 0 {
		cfg.MaxTenants = DefaultMaxTenants
	}
	if cfg.MaxTenantName == 0 {
		cfg.MaxTenantName = DefaultMaxTenantName
	}
	return &Queue{cfg: cfg, tenants: map[string]*tenantQ{}, sweepAt: sweepFloor, metrics: newMetrics(cfg)}, nil
}

// Acquire implements the ingress's Admitter for callers that know no tenant.
func (q *Queue) Acquire(ctx context.Context, _ string) (func(), error) {
	return q.AcquireFor(ctx, Ticket{})
}

// AcquireFor waits for a slot for t. On success release must be called once
// when the request ends (extra calls are ignored). Errors: ErrQueueFull,
// ErrQueueTimeout or ctx.Err().
func (q *Queue) AcquireFor(ctx context.Context, t Ticket) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cost := t.Cost
	if cost <= 0 {
		cost = 1
	}
	q.mu.Lock()
	tq := q.tenant(t.Tenant)
	// A free slot with no waiter it could go to (any waiting are at the
	// cap) is this request's, unless its tenant is at the cap too.
	if q.inFlight < q.cfg.MaxConcurrent && q.heads == 0 && !q.atCap(tq) {
		q.inFlight++
		q.charge(tq, cost)
		q.started(tq)
		q.mu.Unlock()
		q.metrics.admit(tq.name, 0)
		return q.releaser(tq), nil
	}
	if err := q.full(tq); err != nil {
		q.mu.Unlock()
		q.metrics.reject(tq.name, "full")
		return nil, err
	}
	w := q.enqueue(tq, cost)
	q.mu.Unlock()

	begin := time.Now()
	timer := time.NewTimer(q.cfg.MaxWait)
	defer timer.Stop()
	reason := "timeout"
	select {
	case <-w.ch:
		q.metrics.admit(tq.name, time.Since(begin).Seconds())
		return q.releaser(tq), nil
	case <-ctx.Done():
		err, reason = ctx.Err(), "canceled" // the client left (or the server closes)
	case <-timer.C:
		err = fmt.Errorf("%w after %v", ErrQueueTimeout, q.cfg.MaxWait)
	}
	q.mu.Lock()
	if w.index >= 0 || q.inFIFO(w) {
		q.dequeue(w)
		q.mu.Unlock()
		q.metrics.reject(tq.name, reason)
		return nil, err
	}
	q.mu.Unlock()
	// The grant raced with the timeout: the slot is ours; pass it on.
	<-w.ch
	q.releaseSlot(tq)
	q.metrics.reject(tq.name, reason)
	return nil, err
}

// full says why tq's request cannot wait, or nil: its own queue is full
// (MaxQueuePerTenant), or the queue all tenants share is (MaxQueue), which
// is no fault of tq's. Caller holds mu.
func (q *Queue) full(tq *tenantQ) error {
	switch {
	case tq.queued >= q.cfg.MaxQueuePerTenant:
		return fmt.Errorf("%w: tenant %q already has %d requests waiting, the most one tenant may (maxQueuePerTenant)", ErrQueueFull, tq.name, tq.queued)
	case q.queued >= q.cfg.MaxQueue:
		return fmt.Errorf("%w: %d requests of all tenants are waiting, the most the queue holds (maxQueue)", ErrQueueFull, q.queued)
	}
	return nil
}

// atCap reports whether tq holds MaxInServicePerTenant slots. Caller holds mu.
func (q *Queue) atCap(tq *tenantQ) bool {
	return q.cfg.MaxInServicePerTenant > 0 && tq.running >= q.cfg.MaxInServicePerTenant
}

// overShare reports whether tq holds its share of the slots in its class:
// at least one, and at least MaxConcurrent × weight / the class's busy
// weight. Caller holds mu.
func (q *Queue) overShare(tq *tenantQ) bool {
	return tq.running >= 1 && float64(tq.running)*tq.class.weight >= float64(q.cfg.MaxConcurrent)*tq.share.Weight
}

// pushHead puts tq's first waiter in its class's heaps, unless tq has none
// or is at the cap (parked until one of its requests ends). Caller holds mu.
func (q *Queue) pushHead(tq *tenantQ) {
	if len(tq.fifo) == 0 || tq.fifo[0].index >= 0 || q.atCap(tq) {
		return
	}
	w := tq.fifo[0]
	heap.Push(&tq.class.heads, w)
	heap.Push(&tq.class.byLoad, w)
	q.heads++
}

// removeHead takes w, a tenant's head waiter, out of its class's heaps.
// Caller holds mu.
func (q *Queue) removeHead(w *waiter) {
	c := w.tenant.class
	heap.Remove(&c.heads, w.index)
	heap.Remove(&c.byLoad, w.lindex)
	q.heads--
}

// tenant returns (making it) the tenant's state: the overflow tenant's when
// MaxTenants are tracked and busy. Caller holds mu.
func (q *Queue) tenant(name string) *tenantQ {
	if len(name) > q.cfg.MaxTenantName {
		name = q.cutName(name)
	}
	if tq, ok := q.tenants[name]; ok {
		return tq
	}
	share, listed := q.cfg.Tenants[name]
	if !listed {
		share = q.cfg.Default
	}
	// Sweeps look for idle tenants only when there are some: a scan that
	// cannot forget any would cost every new tenant the whole map.
	if len(q.tenants) >= q.sweepAt && len(q.tenants) > q.busy {
		q.sweep(false)
	}
	if len(q.tenants) >= q.cfg.MaxTenants && len(q.tenants) > q.busy {
		q.sweep(true)
	}
	if len(q.tenants) >= q.cfg.MaxTenants && !listed {
		q.metrics.overflow.Inc()
		if q.overflow == nil {
			q.overflow = q.newTenant(overflowTenant, q.cfg.Default)
		}
		return q.overflow
	}
	tq := q.newTenant(name, share)
	q.tenants[name] = tq
	q.metrics.tracked.Set(float64(len(q.tenants)))
	return tq
}

// overflowTenant names the tenant the tenants beyond MaxTenants share (in
// errors; its metrics are other's).
const overflowTenant = "(overflow)"

func (q *Queue) newTenant(name string, share Tenant) *tenantQ {
	if share.Weight <= 0 {
		share.Weight = 1
	}
	tq := &tenantQ{name: name, share: share, class: q.classFor(share.Priority)}
	// A tenant first seen now starts at the class's virtual time.
	tq.lastFinish = tq.class.v
	return tq
}

// cutName bounds a long name: its first bytes, '#', and a hash of the whole.
func (q *Queue) cutName(name string) string {
	const tag = 17 // '#' and 16 hex digits
	return fmt.Sprintf("%s#%016x", name[:q.cfg.MaxTenantName-tag], xxh3.HashString(name))
}

// sweep forgets idle tenants (nothing waiting or in service) whose last
// finish tag the class's virtual time has passed: such a tenant would start
// at the virtual time anyway, exactly as a fresh one does. With force (the
// tenants are at MaxTenants) it forgets every idle tenant, each losing at
// most its last request's lead over the virtual time. Caller holds mu.
func (q *Queue) sweep(force bool) {
	for name, tq := range q.tenants {
		if !tq.busy() && (force || tq.lastFinish <= tq.class.v) {
			delete(q.tenants, name)
		}
	}
	q.sweepAt = min(max(2*len(q.tenants), sweepFloor), q.cfg.MaxTenants)
	q.metrics.tracked.Set(float64(len(q.tenants)))
}

// counted keeps Queue.busy after a change to tq's requests; was is whether
// tq was busy before. Caller holds mu.
func (q *Queue) counted(tq *tenantQ, was bool) {
	now, c := tq.busy(), tq.class
	switch {
	case now && !was:
		c.nbusy++
		c.weight += tq.share.Weight
	case was && !now:
		if c.nbusy--; c.nbusy == 0 {
			c.weight = 0
		} else {
			c.weight -= tq.share.Weight
		}
	}
	switch {
	case tq == q.overflow:
	case now && !was:
		q.busy++
	case was && !now:
		q.busy--
	}
}

// started and stopped count a tenant's requests in service. Caller holds mu.
func (q *Queue) started(tq *tenantQ) {
	was := tq.busy()
	tq.running++
	q.counted(tq, was)
}

// stopped also moves tq's waiting head: to its new place by load, or back
// into the heaps when tq was at the cap.
func (q *Queue) stopped(tq *tenantQ) {
	was := tq.busy()
	tq.running--
	q.counted(tq, was)
	if len(tq.fifo) > 0 {
		if w := tq.fifo[0]; w.index >= 0 {
			heap.Fix(&tq.class.byLoad, w.lindex)
		} else {
			q.pushHead(tq)
		}
	}
}

func (q *Queue) classFor(prio int) *class {
	for i, c := range q.classes {
		if c.prio == prio {
			return c
		}
		if c.prio < prio {
			nc := &class{prio: prio}
			q.classes = append(q.classes[:i], append([]*class{nc}, q.classes[i:]...)...)
			return nc
		}
	}
	nc := &class{prio: prio}
	q.classes = append(q.classes, nc)
	return nc
}

// charge advances a tenant's finish tag for a request admitted without waiting.
func (q *Queue) charge(tq *tenantQ, cost float64) {
	s := max(tq.class.v, tq.lastFinish)
	tq.lastFinish = s + cost/tq.share.Weight
	tq.class.v = s
	tq.class.maxFinish = max(tq.class.maxFinish, tq.lastFinish)
}

// enqueue tags a waiter and queues it behind its tenant's earlier ones.
func (q *Queue) enqueue(tq *tenantQ, cost float64) *waiter {
	s := max(tq.class.v, tq.lastFinish)
	tq.lastFinish = s + cost/tq.share.Weight
	tq.class.maxFinish = max(tq.class.maxFinish, tq.lastFinish)
	q.seq++
	w := &waiter{ch: make(chan bool, 1), tenant: tq, start: s, seq: q.seq, index: -1, lindex: -1}
	tq.fifo = append(tq.fifo, w)
	was := tq.busy()
	tq.queued++
	q.counted(tq, was)
	q.queued++
	q.pushHead(tq)
	q.metrics.queued(tq.name, 1)
	return w
}

func (q *Queue) inFIFO(w *waiter) bool {
	for _, x := range w.tenant.fifo {
		if x == w {
			return true
		}
	}
	return false
}

// dequeue removes a waiting w (timeout or cancel). Caller holds mu.
func (q *Queue) dequeue(w *waiter) {
	tq := w.tenant
	for i, x := range tq.fifo {
		if x == w {
			tq.fifo = append(tq.fifo[:i], tq.fifo[i+1:]...)
			break
		}
	}
	if w.index >= 0 {
		q.removeHead(w)
		q.pushHead(tq)
	}
	was := tq.busy()
	tq.queued--
	q.counted(tq, was)
	q.queued--
	q.metrics.queued(tq.name, -1)
}

// next takes the waiter to admit from the highest class with one: the
// smallest start tag, unless its tenant holds its share of the slots and the
// waiting tenant holding the fewest per weight does not; then that tenant's.
// Parked tenants (at the cap) are in no heap. Caller holds mu.
func (q *Queue) next() *waiter {
	for _, c := range q.classes {
		if c.heads.Len() == 0 {
			continue
		}
		w := c.heads[0]
		c.v = max(c.v, w.start) // the smallest start tag waiting: SFQ's order goes on from it
		if q.overShare(w.tenant) {
			if l := c.byLoad[0]; !q.overShare(l.tenant) {
				w = l
			}
		}
		q.removeHead(w)
		tq := w.tenant
		tq.fifo = tq.fifo[1:]
		tq.queued--
		tq.running++ // busy throughout
		q.queued--
		q.pushHead(tq) // after running++: the cap counts this one
		q.metrics.queued(tq.name, -1)
		return w
	}
	return nil
}

func (q *Queue) releaser(tq *tenantQ) func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			q.releaseSlot(tq)
		}
	}
}

// releaseSlot ends a request of tq and hands the freed slot to the next
// waiter, or returns it. When nothing is left in service or waiting, every
// class's virtual time moves past every finish tag (start-time fair queuing's
// rule for an idle server): what tenants did before no longer counts, and
// every tenant can be forgotten at the next sweep.
func (q *Queue) releaseSlot(tq *tenantQ) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped(tq)
	if q.inFlight <= q.cfg.MaxConcurrent {
		if w := q.next(); w != nil {
			w.ch <- true // the slot moves to w
			return
		}
	}
	q.inFlight--
	if q.inFlight == 0 && q.queued == 0 {
		for _, c := range q.classes {
			c.v = max(c.v, c.maxFinish)
		}
	}
}

// Stats reports the requests in service and waiting.
func (q *Queue) Stats() (inFlight, queued int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.inFlight, q.queued
}

// waiterHeap orders tenants' head waiters by start tag, then arrival.
type waiterHeap []*waiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].start != h[j].start {
		return h[i].start < h[j].start
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *waiterHeap) Push(x any)   { w := x.(*waiter); w.index = len(*h); *h = append(*h, w) }
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// loadHeap orders the same head waiters by their tenants' slots in service
// per weight, then start tag, then arrival: its top is the waiting tenant
// furthest below its share.
type loadHeap []*waiter

func (h loadHeap) Len() int { return len(h) }
func (h loadHeap) Less(i, j int) bool {
	a, b := h[i].tenant, h[j].tenant
	if la, lb := float64(a.running)*b.share.Weight, float64(b.running)*a.share.Weight; la != lb {
		return la < lb
	}
	if h[i].start != h[j].start {
		return h[i].start < h[j].start
	}
	return h[i].seq < h[j].seq
}
func (h loadHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].lindex = i; h[j].lindex = j }
func (h *loadHeap) Push(x any)   { w := x.(*waiter); w.lindex = len(*h); *h = append(*h, w) }
func (h *loadHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	w.lindex = -1
	return w
}
