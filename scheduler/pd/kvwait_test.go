package pd

import (
	"testing"
	"time"
)

// kvwaitScores routes one request (prompt 8,192, output 256) over a prefill
// engine p0 and a decode engine d0 (8 running streams, the given KV blocks,
// snapshot KV usage and this router's in-flight tokens) and returns each
// option's score by its prefill engine ("" for aggregated on d0).
func kvwaitScores(t *testing.T, cfg Config, blocks int, usage float64, active int) map[string]float64 {
	t.Helper()
	plan, err := route(t, setup{prompt: 8192, engines: []eng{{id: "p0", role: P},
		{id: "d0", role: D, running: 8, tpot: 30 * time.Millisecond, blocks: blocks, kvUsage: usage, active: active}}},
		mustPolicy(t, cfg))
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
			// No block is free: the request waits its whole decode
			// term (about 0.8 s here).
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
