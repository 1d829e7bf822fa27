package des

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestHoldUnderOverload: at twice the Mooncake trace's rate (its first 1,000
// requests on 8 L40S engines) the engines cannot keep up. Without the
// router-side hold the policy sorts requests by size into the engines'
// queues and the long-prompt queues drain long after the others; with it
// the backlog waits in the router and goes to whichever engine frees room
// first: more throughput, a shorter tail, an even spread. Side by side in
// one run (virtual time; the machine's load does not enter).
//
// The spread's bound is 1.45 at the ingress's speculative TTL (5 s); it
// was 1.3 when the DES ran the index's 2 s, which gives 1.15 here. Any TTL
// from 3 s on gives 1.40: one early decision lands otherwise, and on this
// 1,000-request slice which engines the first prefixes go to decides the
// rest (docs/BENCHMARKS.md, "The DES's speculative TTL"; the whole trace
// at 2× evens out better at 5 s, 1.18 → 1.12).
func TestHoldUnderOverload(t *testing.T) {
	reqs, err := workload.Mooncake{Limit: 1000, RateScale: 2}.ReadFile("../../testdata/traces/mooncake_synthetic_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	prof, _ := engine.LookupProfile("7b-l40s")
	cfg := Config{Engines: 8, Engine: engine.Config{GPUBlocks: 30000, Profile: prof}}
	hold, err := Run(context.Background(), cfg, reqs, []string{"kvmesh"})
	if err != nil {
		t.Fatal(err)
	}
	holdOff(t, &cfg.Scheduler)
	free, err := Run(context.Background(), cfg, reqs, []string{"kvmesh"})
	if err != nil {
		t.Fatal(err)
	}
	h, f := hold.Policies["kvmesh"], free.Policies["kvmesh"]
	t.Logf("hold: %.2f rps, TTFT mean %.1f s p99 %.1f s, imbalance %.2f; without: %.2f rps, %.1f s, %.1f s, %.2f",
		h.ThroughputRPS, h.TTFTMean, h.TTFTP99, h.LoadImbalance, f.ThroughputRPS, f.TTFTMean, f.TTFTP99, f.LoadImbalance)
	if h.Completed != len(reqs) || f.Completed != len(reqs) {
		t.Fatalf("incomplete: %d and %d of %d", h.Completed, f.Completed, len(reqs))
	}
	if h.ThroughputRPS < 1.2*f.ThroughputRPS || h.TTFTP99 > 0.7*f.TTFTP99 || h.LoadImbalance > 1.45 || f.LoadImbalance < 2 {
		t.Errorf("the hold must raise throughput ≥ 20 %%, cut p99 ≥ 30 %% and even out the load (≤ 1.45, from ≥ 2)")
	}
}

// holdOff sets the kvmesh policy's defaults with the hold off in sc.
func holdOff(t *testing.T, sc *scheduler.Config) {
	t.Helper()
	off := policies.DefaultKVMeshConfig()
	off.HoldSeconds = 0
	if err := sc.SetParams("kvmesh", off); err != nil {
		t.Fatal(err)
	}
}
