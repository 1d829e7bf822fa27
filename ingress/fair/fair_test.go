package fair

import (
	"context"
	"errors"
	"fmt"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// rig holds a Queue with one slot, and requests that, once admitted, keep the
// slot until the test lets the next one in.
type rig struct {
	q     *Queue
	ctx   context.Context
	order chan string   // admitted tenants, in admission order
	next  chan struct{} // one send lets the current holder release
	first func()        // the warm-up request's release
	wgAdd func(func())  // runs a goroutine the rig waits for
}

func setup(t *testing.T, cfg Config) *rig {
	t.Helper()
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{q: q, ctx: ctx, order: make(chan string, 1024), next: make(chan struct{})}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	r.first, err = q.AcquireFor(ctx, Ticket{Tenant: "warmup"})
	if err != nil {
		t.Fatal(err)
	}
	r.wgAdd = func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	return r
}

// queue makes the arrivals wait, one after the other (arrival order matters
// for FIFO within a tenant, not for the shares).
func (r *rig) queue(t *testing.T, arrivals []string) {
	t.Helper()
	for i, tenant := range arrivals {
		r.wgAdd(func() {
			rel, err := r.q.AcquireFor(r.ctx, Ticket{Tenant: tenant})
			if err != nil {
				if r.ctx.Err() == nil {
					t.Errorf("request %d of %s: %v", i, tenant, err)
				}
				return
			}
			r.order <- tenant
			select {
			case <-r.next:
			case <-r.ctx.Done():
			}
			rel()
		})
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("request %d queued", i), func() bool {
			_, n := r.q.Stats()
			return n == i+1
		})
	}
}

// admit frees the slot n times and counts who got it.
func (r *rig) admit(t *testing.T, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	r.first()
	for i := 0; i < n; i++ {
		select {
		case tenant := <-r.order:
			got[tenant]++
			if i < n-1 {
				r.next <- struct{}{}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("admission %d never came", i)
		}
	}
	return got
}

// Two tenants with weights 1:3, both backlogged: admissions split 1:3 whatever
// order they arrived in (here a: all of its 40 first, then b: a burst that
// arrived first does not buy a head start).
func TestWeightedShares(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 1
	cfg.Tenants = map[string]Tenant{"a": {Weight: 1}, "b": {Weight: 3}}
	r := setup(t, cfg)
	var arrivals []string
	for i := 0; i < 40; i++ {
		arrivals = append(arrivals, "a")
	}
	for i := 0; i < 40; i++ {
		arrivals = append(arrivals, "b")
	}
	r.queue(t, arrivals)
	got := r.admit(t, 40)
	if got["a"] < 9 || got["a"] > 11 || got["b"] < 29 || got["b"] > 31 {
		t.Fatalf("first 40 admissions %v, want a:b = 10:30 (±1)", got)
	}
}

// Priorities are strict: every waiting request of the higher class goes first.
func TestPriorityClasses(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 1
	cfg.Tenants = map[string]Tenant{"batch": {Weight: 10}, "interactive": {Weight: 1, Priority: 1}}
	r := setup(t, cfg)
	r.queue(t, []string{"batch", "batch", "batch", "interactive", "batch", "interactive"})
	got := r.admit(t, 2)
	if got["interactive"] != 2 {
		t.Fatalf("first two admissions %v, want both interactive", got)
	}
}

// An idle tenant that arrives late starts at the current virtual time: it is
// served at once by its share, not after the backlog of a busy tenant.
func TestLateTenantIsNotStarved(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 1
	r := setup(t, cfg)
	var arrivals []string
	for i := 0; i < 30; i++ {
		arrivals = append(arrivals, "busy")
	}
	r.queue(t, append(arrivals, "late", "late", "late"))
	got := r.admit(t, 6)
	if got["late"] != 3 {
		t.Fatalf("first 6 admissions %v: the late tenant should get every other slot", got)
	}
}

func TestBoundsAndTimeout(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent, cfg.MaxQueue, cfg.MaxQueuePerTenant, cfg.MaxWait = 1, 3, 2, 50*time.Millisecond
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rel, err := q.AcquireFor(ctx, Ticket{Tenant: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	errs := make(chan error, 4)
	for _, tenant := range []string{"a", "a", "b"} {
		go func() { _, err := q.AcquireFor(ctx, Ticket{Tenant: tenant}); errs <- err }()
	}
	testutil.WaitFor(t, 10*time.Second, "three queued", func() bool { _, n := q.Stats(); return n == 3 })
	if _, err := q.AcquireFor(ctx, Ticket{Tenant: "a"}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third request of tenant a: %v, want ErrQueueFull (per-tenant bound)", err)
	}
	if _, err := q.AcquireFor(ctx, Ticket{Tenant: "c"}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a fourth waiting request: %v, want ErrQueueFull (total bound)", err)
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("waiter %d: %v, want ErrQueueTimeout", i, err)
		}
	}
	if in, n := q.Stats(); in != 1 || n != 0 {
		t.Fatalf("after timeouts: %d in flight, %d queued; want 1, 0", in, n)
	}
	// A cancelled waiter leaves no trace and no slot leaks.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := q.AcquireFor(cctx, Ticket{Tenant: "b"}); done <- err }()
	testutil.WaitFor(t, 10*time.Second, "one queued", func() bool { _, n := q.Stats(); return n == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	// Counted as what it was (a and b are not configured: "other"): three
	// timeouts, one cancel.
	to, cn := promtest.ToFloat64(q.metrics.rejected.WithLabelValues(otherTenants, "timeout")), promtest.ToFloat64(q.metrics.rejected.WithLabelValues(otherTenants, "canceled"))
	if to != 3 || cn != 1 {
		t.Errorf("rejected: %v timeout, %v canceled; want 3, 1", to, cn)
	}
	rel()
	rel() // a second call is ignored
	if in, n := q.Stats(); in != 0 || n != 0 {
		t.Fatalf("after release: %d in flight, %d queued", in, n)
	}
}

func TestConfigValidation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConcurrent, cfg.Tenants = 0, map[string]Tenant{"x": {Weight: -1}}
	err := cfg.Validate()
	if err == nil || !contains(err.Error(), "maxConcurrent") || !contains(err.Error(), `tenant "x"`) {
		t.Fatalf("Validate: %v, want both problems listed", err)
	}
}

// Weights NaN and ±Inf are refused as ≤ 0 is: NaN passed "<= 0" and made
// every finish tag NaN (the heap's order undefined), +Inf made them 0.
func TestConfigValidationNonFiniteWeights(t *testing.T) {
	for _, w := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		cfg := DefaultConfig()
		cfg.Tenants = map[string]Tenant{"x": {Weight: w}}
		if err := cfg.Validate(); err == nil || !contains(err.Error(), `tenant "x"`) {
			t.Errorf("tenant weight %v: %v", w, err)
		}
		cfg = DefaultConfig()
		cfg.Default.Weight = w
		if err := cfg.Validate(); err == nil || !contains(err.Error(), "default weight") {
			t.Errorf("default weight %v: %v", w, err)
		}
	}
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}
func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// A fairQueue block keeps the documented defaults for the fields it leaves
// out, a tenant given only its priority keeps weight 1, and strict decoding
// still refuses an unknown field.
func TestConfigYAMLDefaults(t *testing.T) {
	decode := func(doc string) (Config, error) {
		var c Config
		dec := yaml.NewDecoder(strings.NewReader(doc))
		dec.KnownFields(true)
		err := dec.Decode(&c)
		return c, err
	}
	c, err := decode("maxConcurrent: 8\ntenants:\n  a: {priority: 2}\n  b: {weight: 3}\ndefault: {priority: 1}\n")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.MaxConcurrent = 8
	want.Tenants = map[string]Tenant{"a": {Weight: 1, Priority: 2}, "b": {Weight: 3}}
	want.Default = Tenant{Weight: 1, Priority: 1}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("decoded %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("validate: %v", err)
	}
	if _, err := decode("maxConcurent: 8\n"); err == nil || !strings.Contains(err.Error(), "maxConcurent") {
		t.Errorf("unknown field: err %v", err)
	}
	if _, err := decode("tenants:\n  a: {wieght: 2}\n"); err == nil || !strings.Contains(err.Error(), "wieght") {
		t.Errorf("unknown tenant field: err %v", err)
	}
}
