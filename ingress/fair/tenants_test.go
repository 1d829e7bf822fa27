package fair

import (
	"context"
	"fmt"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// tracked is how many tenants q keeps state for.
func tracked(q *Queue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.tenants)
}

// One request each from 30,000 tenants with 8 KB names, while another tenant keeps a
// request in service (so the virtual time never resets): the queue keeps state for
// at most MaxTenants of them, each under MaxTenantName bytes, and nothing is
// refused or folded away, since every one of them is idle when the next arrives.
func TestTenantsBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTenants = 500
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hold, err := q.AcquireFor(ctx, Ticket{Tenant: "steady", Cost: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer hold()
	pad := strings.Repeat("x", 8<<10)
	for i := 0; i < 30_000; i++ {
		rel, err := q.AcquireFor(ctx, Ticket{Tenant: fmt.Sprint(i, pad), Cost: 500})
		if err != nil {
			t.Fatalf("tenant %d: %v", i, err)
		}
		rel()
		if n := tracked(q); n > cfg.MaxTenants {
			t.Fatalf("after %d tenants, %d tracked > maxTenants %d", i+1, n, cfg.MaxTenants)
		}
	}
	q.mu.Lock()
	for name := range q.tenants {
		if len(name) > DefaultMaxTenantName {
			t.Errorf("a tenant name of %d bytes kept", len(name))
			break
		}
	}
	q.mu.Unlock()
	if got := promtest.ToFloat64(q.metrics.overflow); got != 0 {
		t.Errorf("%v requests folded into the overflow tenant, want 0 (every tenant was idle)", got)
	}
	if got := promtest.ToFloat64(q.metrics.tracked); int(got) != tracked(q) {
		t.Errorf("kvmesh_ingress_tenants = %v, want %d", got, tracked(q))
	}
}

// When nothing is in service or waiting, the virtual time passes every finish tag
// and the next sweep forgets every tenant: an ingress that served many tenants and
// went idle keeps state for few.
func TestIdleTenantsForgotten(t *testing.T) {
	q, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var rels []func()
	for i := 0; i < 200; i++ {
		rel, err := q.AcquireFor(ctx, Ticket{Tenant: fmt.Sprint("t", i), Cost: 1000})
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	for _, rel := range rels {
		rel()
	}
	for i := 0; i < 1000; i++ { // one at a time: each is idle when the next comes
		rel, err := q.AcquireFor(ctx, Ticket{Tenant: fmt.Sprint("u", i)})
		if err != nil {
			t.Fatal(err)
		}
		rel()
	}
	if n := tracked(q); n > 2*sweepFloor {
		t.Fatalf("%d tenants tracked after the burst, want at most %d", n, 2*sweepFloor)
	}
}

// A sweep forgets an idle tenant only once the virtual time has passed its last
// finish tag: one still ahead would otherwise start again at the virtual time and
// jump the queue after each request. Busy tenants are never forgotten.
func TestSweepKeepsTenantsAhead(t *testing.T) {
	q, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	ahead, behind, busy := q.tenant("ahead"), q.tenant("behind"), q.tenant("busy")
	ahead.lastFinish = ahead.class.v + 500
	busy.lastFinish = busy.class.v - 1
	q.started(busy)
	q.sweep(false)
	if _, ok := q.tenants["ahead"]; !ok {
		t.Error("an idle tenant still ahead of the virtual time was forgotten")
	}
	if _, ok := q.tenants["behind"]; ok {
		t.Error("an idle tenant behind the virtual time was kept")
	}
	_ = behind
	q.sweep(true)
	if _, ok := q.tenants["ahead"]; ok {
		t.Error("a forced sweep kept an idle tenant")
	}
	if _, ok := q.tenants["busy"]; !ok {
		t.Error("a busy tenant was forgotten")
	}
}

// With MaxTenants tenants busy, a new unlisted tenant shares the overflow tenant
// (counted); a listed one still gets its own; once one is idle again, new tenants
// are tracked again.
func TestOverflowTenant(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxTenants = 4
	cfg.Tenants = map[string]Tenant{"listed": {Weight: 2}}
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var rels []func()
	for i := 0; i < 4; i++ {
		rel, err := q.AcquireFor(ctx, Ticket{Tenant: fmt.Sprint("busy", i)})
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, rel)
	}
	for _, name := range []string{"new-1", "new-2"} {
		rel, err := q.AcquireFor(ctx, Ticket{Tenant: name})
		if err != nil {
			t.Fatal(err)
		}
		defer rel()
	}
	if got := promtest.ToFloat64(q.metrics.overflow); got != 2 {
		t.Fatalf("overflow_total = %v, want 2", got)
	}
	q.mu.Lock()
	_, tracked1 := q.tenants["new-1"]
	q.mu.Unlock()
	if tracked1 || q.overflow == nil || q.overflow.running != 2 {
		t.Fatalf("new tenants beyond maxTenants not in the overflow tenant (tracked %v)", tracked1)
	}
	rels[0]()
	rel, err := q.AcquireFor(ctx, Ticket{Tenant: "new-3"})
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	q.mu.Lock()
	_, tracked3 := q.tenants["new-3"]
	q.mu.Unlock()
	if !tracked3 {
		t.Fatal("a new tenant not tracked after a tracked one went idle")
	}
	rel, err = q.AcquireFor(ctx, Ticket{Tenant: "listed"})
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	q.mu.Lock()
	l := q.tenants["listed"]
	q.mu.Unlock()
	if l == nil || l.share.Weight != 2 {
		t.Fatal("a listed tenant was folded into the overflow tenant")
	}
	for _, r := range rels[1:] {
		r()
	}
}

// A long name is cut to MaxTenantName bytes with a hash of the whole: the same name
// is the same tenant, two long names with one prefix stay two.
func TestLongTenantNames(t *testing.T) {
	q, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("t", 8<<10)
	q.mu.Lock()
	defer q.mu.Unlock()
	a1, a2, b := q.tenant(long+"a"), q.tenant(long+"a"), q.tenant(long+"b")
	if a1 != a2 {
		t.Error("one long name made two tenants")
	}
	if a1 == b {
		t.Error("two long names with one prefix made one tenant")
	}
	if len(a1.name) != DefaultMaxTenantName || !strings.HasPrefix(a1.name, "ttt") || !strings.Contains(a1.name, "#") {
		t.Errorf("cut name %.60q... of %d bytes", a1.name, len(a1.name))
	}
	cfg := DefaultConfig()
	cfg.Tenants = map[string]Tenant{long: {Weight: 1}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "maxTenantName") {
		t.Errorf("a listed tenant name over maxTenantName: %v", err)
	}
}
