package main

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestTTFTBoundHoldsInTheDES: the zero-queue bound is below every policy's
// mean and p99 TTFT in the DES, loaded and unloaded, on two profiles, and it
// is tight where it should be: one engine with room for everything, requests
// far apart, gets the oracle's hits and no queue, so its TTFT is the bound's.
func TestTTFTBoundHoldsInTheDES(t *testing.T) {
	for _, name := range []string{"7b-l40s", "8b-h100"} {
		prof, err := engine.LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		// Loaded: 3 small engines, more prefixes than they hold.
		reqs, err := workload.SharedPrefix{Groups: 16, Prompts: 8, Shared: 3000, Question: 300, Output: 16, Rate: 40, Seed: 5}.Generate()
		if err != nil {
			t.Fatal(err)
		}
		cfg := des.Config{Engines: 3, Engine: engine.Config{GPUBlocks: 1500, Profile: prof}}
		rep, err := des.Run(context.Background(), cfg, reqs, []string{"random", "least-request", "kvmesh"})
		if err != nil {
			t.Fatal(err)
		}
		mean, p99 := ttftBound(reqs, prof, 16, 0)
		if mean <= 0 || p99 < mean {
			t.Fatalf("%s: bound mean %.4f s, p99 %.4f s", name, mean, p99)
		}
		for pol, r := range rep.Policies {
			if r.Completed != len(reqs) {
				t.Fatalf("%s %s: %d of %d completed", name, pol, r.Completed, len(reqs))
			}
			if r.TTFTMean < mean*(1-1e-9) || r.TTFTP99 < p99*(1-1e-9) {
				t.Errorf("%s %s: TTFT mean %.4f s, p99 %.4f s below the bound's %.4f s, %.4f s", name, pol, r.TTFTMean, r.TTFTP99, mean, p99)
			}
		}

		// Unloaded: one engine, one request every 500 s on average.
		reqs, err = workload.SharedPrefix{Groups: 4, Prompts: 6, Shared: 5000, Question: 700, Output: 4, Rate: 0.002, Seed: 5}.Generate()
		if err != nil {
			t.Fatal(err)
		}
		cfg = des.Config{Engines: 1, Engine: engine.Config{GPUBlocks: 20000, Profile: prof}}
		rep, err = des.Run(context.Background(), cfg, reqs, []string{"kvmesh"})
		if err != nil {
			t.Fatal(err)
		}
		mean, _ = ttftBound(reqs, prof, 16, 0)
		got := rep.Policies["kvmesh"].TTFTMean
		if got < mean*(1-1e-9) || got > 1.05*mean { // equal but for float rounding when exact
			t.Errorf("%s alone: TTFT mean %.9f s, bound %.9f s: want within 5 %% above", name, got, mean)
		}
	}
}

func TestZeroQueueTTFT(t *testing.T) {
	p, _ := engine.LookupProfile("7b-l40s")
	// A fully cached prompt still computes its last token: one step.
	one := zeroQueueTTFT(p, 2048, 16, 4096, 4096)
	if want := zeroQueueTTFT(p, 2048, 16, 1, 0); one < want {
		t.Errorf("full hit %v below one token's %v", one, want)
	}
	// More hit, less time; longer prompt, more time; a bigger budget, fewer steps.
	if a, b := zeroQueueTTFT(p, 2048, 16, 4096, 1024), zeroQueueTTFT(p, 2048, 16, 4096, 0); a >= b {
		t.Errorf("1,024 cached: %v, none: %v", a, b)
	}
	if a, b := zeroQueueTTFT(p, 2048, 16, 8192, 0), zeroQueueTTFT(p, 2048, 16, 4096, 0); a <= b {
		t.Errorf("8,192 tokens: %v, 4,096: %v", a, b)
	}
	if a, b := zeroQueueTTFT(p, 8192, 16, 8192, 0), zeroQueueTTFT(p, 2048, 16, 8192, 0); a >= b {
		t.Errorf("budget 8,192: %v, 2,048: %v", a, b)
	}
	// The lone unchunked prefill the engine models is never below the bound.
	for _, n := range []int{1, 100, 2048, 5000} {
		if b, e := zeroQueueTTFT(p, 1<<20, 16, n, 0), p.PrefillTime(0, n); b > e {
			t.Errorf("%d tokens: bound %v above the engine's lone prefill %v", n, b, e)
		}
	}
}
