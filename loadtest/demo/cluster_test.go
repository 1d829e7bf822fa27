package demo

import (
	"math"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// TestIngressSchedulerWallTime: at --time-scale ts the ingresses' kvmesh
// policy holds at holdSeconds/ts wall seconds of queued prefill, the
// default's 2 engine seconds (the DES's), not 2 wall seconds (20 engine
// seconds at ×10: the hold never engaged), and its other seconds scale
// with it.
func TestIngressSchedulerWallTime(t *testing.T) {
	for _, ts := range []float64{1, 2, 10} {
		m := &mesh{cfg: DefaultConfig()}
		m.cfg.TimeScale = ts
		cfg, err := m.ingressConfig(0, "kvmesh", 0)
		if err != nil {
			t.Fatal(err)
		}
		sc := cfg.Scheduler
		if err := registry.Validate(&sc); err != nil {
			t.Fatalf("ts %g: %v", ts, err)
		}
		pol, err := registry.Policy(&sc)
		if err != nil {
			t.Fatal(err)
		}
		k := pol.(policies.KVMesh)
		d := policies.DefaultKVMeshConfig()
		near := func(name string, got, want float64) {
			if math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) {
				t.Errorf("ts %g: %s %v, want %v", ts, name, got, want)
			}
		}
		near("hold seconds", k.Hold.Seconds, d.HoldSeconds/ts)
		near("balance seconds", k.BalanceSeconds, d.BalanceSeconds/ts)
		near("saturation queue", k.SaturationQueue, d.SaturationQueue/ts)
		near("step base", k.StepBase, d.StepBase/ts)
		near("decode s/token", k.DecodeSecPerToken, d.DecodeSecPerToken/ts)
		near("prefill rate", k.PrefillRate, d.PrefillRate*ts)
		near("hold aging (a ratio)", k.Hold.Aging, d.HoldAging)
		near("speculative TTL", cfg.SpeculativeTTL.Seconds(), ingress.DefaultConfig().SpeculativeTTL.Seconds()/ts)
		near("hold max wait", cfg.Hold.MaxWait.Seconds(), ingress.DefaultHoldConfig().MaxWait.Seconds()/ts)
		if err := cfg.Validate(); err != nil {
			t.Errorf("ts %g: %v", ts, err)
		}
		if cfg.Scheduler.Policy != "kvmesh" {
			t.Errorf("policy %q", cfg.Scheduler.Policy)
		}
	}
}

// TestIngressSpeculativeTTL: the live mesh's ingresses keep a routed
// request's keys speculative for the configured TTL in engine time (the
// DES's --speculative-ttl), divided by the time scale; unset, for the
// ingress's own default.
func TestIngressSpeculativeTTL(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		ts   float64
		want time.Duration
	}{
		{0, 1, ingress.DefaultConfig().SpeculativeTTL},
		{0, 4, ingress.DefaultConfig().SpeculativeTTL / 4},
		{2 * time.Second, 1, 2 * time.Second},
		{3 * time.Second, 10, 300 * time.Millisecond},
	} {
		m := &mesh{cfg: DefaultConfig()}
		m.cfg.TimeScale, m.cfg.SpeculativeTTL = c.ts, c.ttl
		cfg, err := m.ingressConfig(0, "kvmesh", 0)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.SpeculativeTTL != c.want {
			t.Errorf("TTL %v at ×%g: the ingress's %v, want %v", c.ttl, c.ts, cfg.SpeculativeTTL, c.want)
		}
	}
	c := DefaultConfig()
	c.SpeculativeTTL = -time.Second
	if err := c.Validate(); err == nil {
		t.Error("a negative speculative TTL validated")
	}
}
