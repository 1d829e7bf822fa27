package pd

import (
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// TestKVWaitInItsOwnBlocks: the KV wait counts an engine's room in its own
// blocks, those of its GPUBlocks report, and its matched prefix in blocks
// of its Match (MatchBlock), whatever the request's block size (16 here,
// the model's most common). Counted at 16, a block-32 engine needed twice
// its blocks, held twice its in-flight KV and half its matched prefix.
func TestKVWaitInItsOwnBlocks(t *testing.T) {
	const (
		prompt, output = 8192, 256
		gpu            = 4096 // the engine's KV capacity, in its own blocks
		tpot           = 0.03
		life           = output * tpot
	)
	k := NewKVMesh(policies.KVMesh{})
	tests := []struct {
		name       string
		block      int // the engine's block size (0 unknown)
		matchBlock int // tokens per block of its Match
		kvFree     int // its blocks no request in flight holds
		matched    int // its matched prefix, in blocks of matchBlock
		want       float64
	}{
		{name: "block 16 fits", block: 16, matchBlock: 16, kvFree: (prompt + output) / 16},
		{name: "block 32 fits in 264 of its blocks", block: 32, matchBlock: 32, kvFree: (prompt + output) / 32},
		{name: "block 32, one block short", block: 32, matchBlock: 32, kvFree: (prompt+output)/32 - 1, want: 1.0 / gpu * life},
		{name: "block 32 full: 264 blocks at its rate", block: 32, matchBlock: 32, want: 264.0 / gpu * life},
		{name: "block 32 full, 128 of its blocks cached", block: 32, matchBlock: 32, matched: 128, want: 136.0 / gpu * life},
		{name: "size unknown: its match's", matchBlock: 32, matched: 128, want: 136.0 / gpu * life},
		{name: "block 32 matched at 16 (no chain of its size)", block: 32, matchBlock: 16, matched: 256, want: 136.0 / gpu * life},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bsz := tc.block
			if bsz == 0 {
				bsz = tc.matchBlock
			}
			c := scheduler.Candidate{Engine: &scheduler.Engine{ID: "d0", Role: D, BlockSize: tc.block, GPUBlocks: gpu,
				LocalKVTokens: (gpu - tc.kvFree) * bsz}, Match: index.Match{GPU: tc.matched}, MatchBlock: tc.matchBlock}
			r := scheduler.Request{BlockSize: 16, PromptTokens: prompt, OutputTokens: output}
			if got := k.kvWait(&r, &c, policies.Terms{TPOT: tpot}); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("wait %v s, want %v", got, tc.want)
			}
		})
	}
}

// TestEmulationsCountMatchInItsBlocks: the P/D emulations turn a decode
// engine's match into tokens at its own block size (MatchBlock), not the
// request's (16 here): llm-d's uncached tokens, Dynamo's eff_isl and the
// prefill blocks its decode worker choice weighs.
func TestEmulationsCountMatchInItsBlocks(t *testing.T) {
	tests := []struct {
		name, policy string
		s            setup
		mode         Mode
		decode       string
	}{
		// 128 blocks of 32 are the whole prompt; at 16, half of it.
		{name: "llmd: a block-32 decode engine holding the whole prompt: local", policy: "llmd",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P, blockSize: 32}, {id: "d0", role: D, blockSize: 32, cached: 128}}},
			mode: Aggregated, decode: "d0"},
		// eff_isl 4096 − 80×32 = 1536 (< 2048, ratio 0.375); at 16, 2816.
		{name: "dynamo: eff_isl in the decode engine's blocks: local", policy: "dynamo",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P, blockSize: 32}, {id: "d0", role: D, blockSize: 32, cached: 80}}},
			mode: Aggregated, decode: "d0"},
		// d32 holds the whole prompt (128 of its blocks, 256 of 16), d16
		// 192 of 256: d32's load 0 + 256 beats d16's 64 + 256; taking
		// d32's 128 blocks for 16-token ones gave it 128 + 256.
		{name: "dynamo: the decode worker's prefill blocks in the request's blocks", policy: "dynamo",
			s: setup{prompt: 4096, engines: []eng{{id: "p0", role: P, blockSize: 32},
				{id: "d16", role: D, blockSize: 16, cached: 192}, {id: "d32", role: D, blockSize: 32, cached: 128}}},
			mode: Aggregated, decode: "d32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, tc.s, mustPolicy(t, Config{Policy: tc.policy}))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Mode != tc.mode || plan.Decode != tc.decode {
				t.Fatalf("plan %v %q→%q (%s), want %v on %q; options %+v", plan.Mode, plan.Prefill, plan.Decode, plan.Reason,
					tc.mode, tc.decode, plan.Options)
			}
		})
	}
}
