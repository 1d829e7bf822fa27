package fair

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// holder acquires slots for tenants and keeps them until the test releases
// them; requests that have to wait report their admission on admitted.
type holder struct {
	t        *testing.T
	q        *Queue
	ctx      context.Context
	admitted chan string // tenants of waiting requests, as they get their slot
	released chan func() // their releases, in the same order
}

func newHolder(t *testing.T, cfg Config) *holder {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &holder{t: t, q: q, ctx: ctx, admitted: make(chan string, 64), released: make(chan func(), 64)}
}

// now acquires a slot that must be granted without waiting.
func (h *holder) now(tenant string, cost float64) func() {
	h.t.Helper()
	_, before := h.q.Stats()
	rel, err := h.q.AcquireFor(h.ctx, Ticket{Tenant: tenant, Cost: cost})
	if err != nil {
		h.t.Fatalf("%s: %v", tenant, err)
	}
	if _, after := h.q.Stats(); after != before {
		h.t.Fatalf("%s waited", tenant)
	}
	return rel
}

// wait queues a request of tenant and waits until it is queued.
func (h *holder) wait(tenant string, cost float64) {
	h.t.Helper()
	_, before := h.q.Stats()
	go func() {
		rel, err := h.q.AcquireFor(h.ctx, Ticket{Tenant: tenant, Cost: cost})
		if err != nil {
			return // the test ended (ctx)
		}
		h.released <- rel
		h.admitted <- tenant
	}()
	testutil.WaitFor(h.t, 10*time.Second, tenant+" queued", func() bool { _, n := h.q.Stats(); return n == before+1 })
}

// next is the tenant of the next waiting request admitted.
func (h *holder) next() string {
	h.t.Helper()
	select {
	case tenant := <-h.admitted:
		return tenant
	case <-time.After(10 * time.Second):
		h.t.Fatal("no waiting request was admitted")
		return ""
	}
}

// F1: tenant a holds both slots and has more queued, tenant b waits with
// one request. Start tags alone put b behind a's whole backlog when b's
// last finish tag is ahead (here b's earlier request asked for a lot of
// work, and a's ask for little, as requests without max_tokens are priced),
// though a's requests hold their slots for as long as they run. a holds its
// share (1 of 2) already and b none: the slot a frees goes to b.
func TestFreedSlotGoesToTenantBelowShare(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 2
	h := newHolder(t, cfg)
	a1 := h.now("a", 1)
	h.now("b", 1000)() // b's earlier request, ended (a1 in service keeps the virtual time)
	h.now("a", 1)      // a holds both slots
	for range 4 {
		h.wait("a", 1)
	}
	h.wait("b", 1)
	a1()
	if got := h.next(); got != "b" {
		t.Fatalf("the slot a freed went to %s, want b (a holds its share of the slots, b none)", got)
	}
	// b's request ends: b waits for nothing, and a's backlog is next.
	(<-h.released)()
	if got := h.next(); got != "a" {
		t.Fatalf("next %s, want a", got)
	}
}

// Weights count: with weights 3:1 and 4 slots, a's share is 3. Holding 3, a
// yields to b; holding 2 (below its share), a keeps its start-tag turn.
func TestShareFollowsWeights(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 4
	cfg.Tenants = map[string]Tenant{"a": {Weight: 3}, "b": {Weight: 1}}
	h := newHolder(t, cfg)
	a1 := h.now("a", 1)
	h.now("b", 1000)()
	a2 := h.now("a", 1)
	h.now("a", 1)
	h.now("a", 1)
	h.wait("a", 1)
	h.wait("b", 1)
	a1() // a holds 3 = its share
	if got := h.next(); got != "b" {
		t.Fatalf("a holding its share of 3: the slot went to %s, want b", got)
	}
	h.wait("b", 1)
	a2() // a holds 2 of its 3 (b holds 1 = its share): a's start tag is first
	if got := h.next(); got != "a" {
		t.Fatalf("a below its share: the slot went to %s, want a", got)
	}
}

// A tenant alone uses every slot (the default sets no cap), and each slot
// it frees goes to its own next request: the share rule only chooses
// among waiters and never leaves a slot idle.
func TestLoneTenantUsesEverySlot(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 4
	h := newHolder(t, cfg)
	var rels []func()
	for range 4 {
		rels = append(rels, h.now("a", 1))
	}
	for range 3 {
		h.wait("a", 1)
	}
	for i, rel := range rels[:3] {
		rel()
		if got := h.next(); got != "a" {
			t.Fatalf("release %d: %s admitted", i, got)
		}
		if in, _ := h.q.Stats(); in != 4 {
			t.Fatalf("release %d: %d in service, want all 4 slots used", i, in)
		}
	}
}

// maxInServicePerTenant: a tenant at the cap waits even while slots are
// free, other tenants take those slots at once, and the tenant's waiting
// request gets a slot when one of its own ends.
func TestMaxInServicePerTenant(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent, cfg.MaxInServicePerTenant = 4, 2
	h := newHolder(t, cfg)
	a1 := h.now("a", 1)
	h.now("a", 1)
	h.wait("a", 1) // at the cap: waits with two slots free
	if in, n := h.q.Stats(); in != 2 || n != 1 {
		t.Fatalf("%d in service, %d waiting; want 2, 1", in, n)
	}
	h.now("b", 1) // a's waiting request does not hold b up
	h.now("b", 1)
	h.wait("b", 1) // b at its cap too (and no slot is free)
	a1()
	if got := h.next(); got != "a" {
		t.Fatalf("the slot a freed went to %s, want a's own waiting request (b is at the cap)", got)
	}
	if in, n := h.q.Stats(); in != 4 || n != 1 {
		t.Fatalf("%d in service, %d waiting; want 4, 1", in, n)
	}

	bad := DefaultConfig()
	bad.MaxConcurrent, bad.MaxInServicePerTenant = 4, 5
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "maxInServicePerTenant") {
		t.Errorf("a cap above maxConcurrent: %v", err)
	}
	bad.MaxInServicePerTenant = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "maxInServicePerTenant") {
		t.Errorf("a negative cap: %v", err)
	}
}

// The two ways the queue is full say which: a tenant's own queue is full
// (named), or the queue all tenants share is, which a tenant with nothing
// waiting is not told is its own.
func TestQueueFullSaysWhich(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent, cfg.MaxQueue, cfg.MaxQueuePerTenant = 1, 3, 2
	h := newHolder(t, cfg)
	h.now("a", 1)
	h.wait("a", 1)
	h.wait("a", 1)
	_, err := h.q.AcquireFor(h.ctx, Ticket{Tenant: "a"})
	if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), `tenant "a" already has 2 requests waiting`) {
		t.Fatalf("tenant a's third waiting request: %v", err)
	}
	h.wait("b", 1)
	_, err = h.q.AcquireFor(h.ctx, Ticket{Tenant: "c"})
	if !errors.Is(err, ErrQueueFull) || strings.Contains(err.Error(), `"c"`) || !strings.Contains(err.Error(), "3 requests of all tenants are waiting") {
		t.Fatalf("tenant c, nothing waiting, the whole queue full: %v", err)
	}
}

// check verifies the queue's bookkeeping: each tenant's head waiter is in
// its class's heaps exactly when it has one and is below the cap, the
// counts add up, the class weights are the busy tenants', and a free slot
// never sits beside a waiter it could go to.
func check(t *testing.T, q *Queue) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	heads, running, queued := 0, 0, 0
	weight := map[*class]float64{}
	for _, tq := range q.tenants {
		running += tq.running
		queued += tq.queued
		if tq.queued != len(tq.fifo) {
			t.Fatalf("tenant %s: queued %d, fifo %d", tq.name, tq.queued, len(tq.fifo))
		}
		if tq.busy() {
			weight[tq.class] += tq.share.Weight
		}
		in := len(tq.fifo) > 0 && tq.fifo[0].index >= 0
		if want := len(tq.fifo) > 0 && !q.atCap(tq); in != want {
			t.Fatalf("tenant %s: head in the heaps %v, want %v (running %d, queued %d)", tq.name, in, want, tq.running, tq.queued)
		}
		if in {
			heads++
			if w := tq.fifo[0]; tq.class.heads[w.index] != w || tq.class.byLoad[w.lindex] != w {
				t.Fatalf("tenant %s: head's heap indexes wrong", tq.name)
			}
		}
	}
	n := 0
	for _, c := range q.classes {
		if c.heads.Len() != c.byLoad.Len() {
			t.Fatalf("class %d: %d by start, %d by load", c.prio, c.heads.Len(), c.byLoad.Len())
		}
		n += c.heads.Len()
		if math.Abs(c.weight-weight[c]) > 1e-9 {
			t.Fatalf("class %d: weight %v, busy tenants' %v", c.prio, c.weight, weight[c])
		}
	}
	if heads != q.heads || n != q.heads || running != q.inFlight || queued != q.queued {
		t.Fatalf("heads %d/%d/%d, running %d in flight %d, queued %d/%d", heads, n, q.heads, running, q.inFlight, queued, q.queued)
	}
	if q.inFlight < q.cfg.MaxConcurrent && q.heads > 0 {
		t.Fatalf("%d of %d slots in service with %d tenants waiting below the cap", q.inFlight, q.cfg.MaxConcurrent, q.heads)
	}
}

// A seeded random run of arrivals and endings over tenants of two classes,
// weights and a cap keeps the bookkeeping right after every step and ends
// with nothing in service or waiting.
func TestRandomRunKeepsBookkeeping(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent, cfg.MaxInServicePerTenant = 5, 3
	cfg.Tenants = map[string]Tenant{"a": {Weight: 1}, "b": {Weight: 2}, "c": {Weight: 3}, "d": {Weight: 1, Priority: 1}}
	h := newHolder(t, cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	var held []func()
	settle := func(total int) { // every admitted request's release is in held
		t.Helper()
		testutil.WaitFor(t, 10*time.Second, "the queue settled", func() bool {
			for {
				select {
				case rel := <-h.released:
					<-h.admitted
					held = append(held, rel)
					continue
				default:
				}
				in, n := h.q.Stats()
				return in+n == total && len(held) == in
			}
		})
		check(t, h.q)
	}
	total := 0
	for range 400 {
		if len(held) == 0 || rng.IntN(10) < 6 {
			tenant := string(rune('a' + rng.IntN(5))) // e: not listed
			cost := float64(1 + rng.IntN(1000))
			go func() {
				rel, err := h.q.AcquireFor(h.ctx, Ticket{Tenant: tenant, Cost: cost})
				if err == nil {
					h.released <- rel
					h.admitted <- tenant
				}
			}()
			total++
		} else {
			i := rng.IntN(len(held))
			held[i]()
			held = append(held[:i], held[i+1:]...)
			total--
		}
		settle(total)
	}
	for total > 0 {
		held[0]()
		held = held[1:]
		total--
		settle(total)
	}
}
