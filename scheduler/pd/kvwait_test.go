package pd

import (
	"math"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// kvwaitScores routes one request (prompt 8,192, output 256) over a prefill
// engine p0 and a decode engine d0 (8 running streams, the given KV blocks,
// snapshot KV usage and this router's in-flight tokens, which matched no
// prefix there) and returns each option's score by its prefill engine (""
// for aggregated on d0).
func kvwaitScores(t *testing.T, cfg Config, blocks int, usage float64, active int) map[string]float64 {
	t.Helper()
	return kvwaitPlan(t, cfg, setup{prompt: 8192, engines: []eng{{id: "p0", role: P},
		{id: "d0", role: D, running: 8, tpot: 30 * time.Millisecond, blocks: blocks, kvUsage: usage, active: active, kv: active}}})
}

// kvwaitPlan routes s over p0 and d0 and returns each option's score by its
// prefill engine ("" for aggregated on d0).
func kvwaitPlan(t *testing.T, cfg Config, s setup) map[string]float64 {
	t.Helper()
	plan, err := route(t, s, mustPolicy(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, o := range plan.Options {
		if o.Decode != "d0" {
			t.Fatalf("option %+v: want decode on d0", o)
		}
		got[o.Prefill] = o.Score
	}
	if len(got) != 2 {
		t.Fatalf("options %+v: want aggregated on d0 and p0→d0", plan.Options)
	}
	return got
}

// TestKVWaitSeesRouterInFlight: a decode engine whose snapshot (up to a
// scrape interval old) still shows free KV but to which this router has
// just sent enough prompt and output tokens to fill it is priced with the
// KV wait, the same as when the snapshot shows it full (docs/BENCHMARKS.md,
// "Multi-turn sessions with growing context (stop 68)"); with SLOs the
// wait is part of the TTFT the miss term prices, so the same holds there.
func TestKVWaitSeesRouterInFlight(t *testing.T) {
	const blocks = 4096
	full := blocks * bs // the engine's whole KV, in tokens
	for _, cfg := range []Config{{}, {SLOTTFT: 2, SLOTPOT: 0.1}} {
		sent := kvwaitScores(t, cfg, blocks, 0, full)     // snapshot empty, the router's requests fill it
		reported := kvwaitScores(t, cfg, blocks, 1, full) // the snapshot shows them
		room := kvwaitScores(t, cfg, 1_000_000, 0, full)  // same load, KV to spare: no wait
		for _, o := range []string{"", "p0"} {
			if sent[o] != reported[o] {
				t.Errorf("%+v option %q: score %v with the router's in-flight tokens filling d0, %v with the snapshot full: want the same KV wait",
					cfg, o, sent[o], reported[o])
			}
			// No block is free: the request waits until d0 has freed
			// its 528 blocks, 528/4,096 of a stream lifetime (256
			// tokens at about 21 ms: about 0.7 s here).
			if !(sent[o] < room[o]-0.5) {
				t.Errorf("%+v option %q: score %v on a %d-block engine the router has filled, %v with KV to spare: want a KV wait of its decode time",
					cfg, o, sent[o], blocks, room[o])
			}
		}
	}
}

// TestKVWaitInTTFT: under a TTFT objective the KV wait is part of the
// predicted TTFT, so it costs more than the wait alone (the request's
// chance of missing the objective rises).
func TestKVWaitInTTFT(t *testing.T) {
	const blocks = 4096
	full := blocks * bs
	plain := Config{}
	slo := Config{SLOTTFT: 2, SLOTPOT: 0.1}
	for _, o := range []string{"", "p0"} {
		waitPlain := kvwaitScores(t, plain, 1_000_000, 0, full)[o] - kvwaitScores(t, plain, blocks, 0, full)[o]
		waitSLO := kvwaitScores(t, slo, 1_000_000, 0, full)[o] - kvwaitScores(t, slo, blocks, 0, full)[o]
		if !(waitSLO > waitPlain+1) {
			t.Errorf("option %q: the KV wait costs %v s under a 2 s TTFT objective, %v s without: want the miss term to price it", o, waitSLO, waitPlain)
		}
	}
}

// TestKVWaitSharedPrefixOnce: requests in flight on a decode engine that
// share a prefix hold its blocks once, as the engine caches them once (tester
// h-reg7 F1's geometry: a 2,048-token shared prefix, 1,024 own prompt
// tokens, 768 output, 240 blocks a request, 600 on the engine). Three of
// them in flight hold the 128 prefix blocks once and 112 own blocks each,
// 464 blocks (LocalKVTokens); the next one, matching the prefix, needs 112
// of the 136 free: no wait, although prompt + output per request (720
// blocks, LocalActiveTokens) is more than the engine holds. A fourth in
// flight (576 blocks) leaves 24 free, and the wait is priced.
func TestKVWaitSharedPrefixOnce(t *testing.T) {
	const (
		blocks           = 600
		prompt, output   = 3072, 768
		shared, perReq   = 128, (prompt + output) / bs // blocks
		own              = perReq - shared
		prefixCached     = shared
		active3, active4 = 3 * (prompt + output), 4 * (prompt + output)
	)
	kv := func(n int) int { return (perReq + (n-1)*own) * bs }
	at := func(cfg Config, blocks int, usage float64, active, kv int) map[string]float64 {
		return kvwaitPlan(t, cfg, setup{prompt: prompt, output: output, engines: []eng{{id: "p0", role: P},
			{id: "d0", role: D, running: 3, tpot: 30 * time.Millisecond, cached: prefixCached,
				blocks: blocks, kvUsage: usage, active: active, kv: kv}}})
	}
	for _, cfg := range []Config{{}, {SLOTTFT: 2, SLOTPOT: 0.1}} {
		room := at(cfg, 1_000_000, 0, active3, kv(3))
		for _, usage := range []float64{0, float64(kv(3)/bs) / blocks} { // before the snapshot shows them, and after
			three := at(cfg, blocks, usage, active3, kv(3))
			for _, o := range []string{"", "p0"} {
				if three[o] != room[o] {
					t.Errorf("%+v usage %.2f option %q: score %v with three requests of the prefix in flight (464 of 600 blocks), %v with KV to spare: want no KV wait",
						cfg, usage, o, three[o], room[o])
				}
			}
		}
		four := at(cfg, blocks, 0, active4, kv(4))
		for _, o := range []string{"", "p0"} {
			if !(four[o] < room[o]-0.1) {
				t.Errorf("%+v option %q: score %v with four requests of the prefix in flight (576 of 600 blocks), %v with KV to spare: want a KV wait",
					cfg, o, four[o], room[o])
			}
		}
	}
}

// TestKVWaitForm: the KV wait is the blocks the engine must free before the
// request fits (its need beyond the free blocks, and beyond what the
// requests in flight over-commit it by) at a full engine's rate, its
// capacity once per stream lifetime (output × TPOT, unweighted). It grows
// from zero where the request just fits and has no cap: the earlier form,
// the missing fraction of the request's own need times its weighted decode
// time, stayed at that cap however over-committed the engine was, and with
// every decode engine full the router piled requests onto one with a queue
// waiting for KV (docs/BENCHMARKS.md, "The KV wait's form (2026-12-07)").
func TestKVWaitForm(t *testing.T) {
	const (
		blocks         = 4096
		prompt, output = 8192, 256
		need           = (prompt + output) / bs // 528 blocks
		tpot           = 0.03
		life           = output * tpot // 7.68 s
	)
	k := NewKVMesh(policies.KVMesh{})
	tests := []struct {
		name    string
		gpu     int     // GPU blocks (0 unknown)
		usage   float64 // the snapshot's KV usage
		kv      int     // this router's in-flight KV there, in blocks
		matched int     // the request's prefix cached there, in blocks
		want    float64 // seconds
	}{
		{name: "capacity unknown", gpu: 0, kv: 10 * blocks},
		{name: "fits", gpu: blocks, kv: blocks - need},
		{name: "one block short: a sliver of a lifetime", gpu: blocks, kv: blocks - need + 1, want: 1.0 / blocks * life},
		{name: "no block free: its need at the engine's rate", gpu: blocks, kv: blocks, want: float64(need) / blocks * life},
		{name: "the snapshot shows it full", gpu: blocks, usage: 1, want: float64(need) / blocks * life},
		{name: "over-committed by a whole engine: behind the queue too, past a lifetime", gpu: blocks, kv: 2 * blocks,
			want: float64(need+blocks) / blocks * life},
		{name: "a cached prefix is not needed again", gpu: blocks, kv: blocks, matched: 128, want: float64(need-128) / blocks * life},
		{name: "the cached prefix is all it needs", gpu: blocks, kv: 2 * blocks, matched: need},
	}
	prev := -1.0
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := scheduler.Candidate{Engine: &scheduler.Engine{ID: "d0", Role: D, GPUBlocks: tc.gpu, KVUsage: tc.usage,
				LocalKVTokens: tc.kv * bs}, Match: index.Match{GPU: tc.matched}}
			r := scheduler.Request{BlockSize: bs, PromptTokens: prompt, OutputTokens: output}
			got := k.kvWait(&r, &c, policies.Terms{TPOT: tpot, Decode: 0.15 * life})
			if math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("wait %v s, want %v", got, tc.want)
			}
		})
	}
	// More in flight never waits less, and nothing caps it.
	for kv := blocks - need; kv <= 3*blocks; kv += 64 {
		c := scheduler.Candidate{Engine: &scheduler.Engine{ID: "d0", Role: D, GPUBlocks: blocks, LocalKVTokens: kv * bs}}
		r := scheduler.Request{BlockSize: bs, PromptTokens: prompt, OutputTokens: output}
		got := k.kvWait(&r, &c, policies.Terms{TPOT: tpot})
		if got < prev {
			t.Fatalf("%d blocks in flight: wait %v s, less than %v s with fewer", kv, got, prev)
		}
		prev = got
	}
	if !(prev > 2*life) {
		t.Fatalf("wait %v s on an engine over-committed twice over, want more than two lifetimes (%v s)", prev, 2*life)
	}
}
