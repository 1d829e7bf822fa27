package pd

import (
	"testing"
	"time"
)

// TestOutputDist: priced at the mean output (256 tokens), a local prefill
// on the decode engine costs its 8 streams little TPOT and beats the
// prefill engine's queue; when most finished requests had 2–3 output
// tokens, the same prefill is one stalled step of a stream's two or three,
// and kvmesh disaggregates. An empty distribution prices at the mean.
func TestOutputDist(t *testing.T) {
	s := setup{prompt: 8192, output: 256, engines: []eng{{id: "p0", role: P, running: 2, waiting: 2, local: 20000},
		{id: "d0", role: D, running: 8, tpot: 30 * time.Millisecond}}}
	short := NewOutputDist() // short requests' prompts keep them at the engine 2 s each; a 2,000-token one 30 s
	for i := 0; i < 200; i++ {
		short.Observe("m", 2+i%2, 2)
		if i%10 == 0 {
			short.Observe("m", 2000, 30)
		}
	}
	tests := []struct {
		name string
		outs *OutputDist
		mode Mode
	}{
		{"no distribution: priced at the mean", nil, Aggregated},
		{"empty distribution: priced at the mean", NewOutputDist(), Aggregated},
		{"mostly short outputs: the stall breaks streams", short, Disaggregated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, s, mustPolicy(t, Config{SLOTTFT: 2, SLOTPOT: 0.05, Outputs: tc.outs}))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Mode != tc.mode {
				t.Fatalf("plan %v %q→%q, want %v; options %+v", plan.Mode, plan.Prefill, plan.Decode, tc.mode, plan.Options)
			}
		})
	}
	// A mixed engine's streams stay priced at the mean (streamRisk).
	t.Run("mixed engine: priced at the mean", func(t *testing.T) {
		m := setup{prompt: s.prompt, output: s.output, engines: []eng{s.engines[0], s.engines[1]}}
		m.engines[1].role = M
		plan, err := route(t, m, mustPolicy(t, Config{SLOTTFT: 2, SLOTPOT: 0.05, Outputs: short}))
		if err != nil {
			t.Fatal(err)
		}
		if plan.Mode != Aggregated {
			t.Fatalf("plan %v %q→%q, want aggregated; options %+v", plan.Mode, plan.Prefill, plan.Decode, plan.Options)
		}
	})
}

func TestOutputDistRisk(t *testing.T) {
	var nilDist *OutputDist
	if _, ok := nilDist.pMissStall("m", 0.03, 0.3, 0.05); ok {
		t.Fatal("nil distribution priced")
	}
	d := NewOutputDist()
	d.Observe("m", 0, 1) // ignored
	if _, ok := d.pMissStall("m", 0.03, 0.3, 0.05); ok {
		t.Fatal("empty distribution priced")
	}
	d.Observe("m", 1000, 15)
	long, _ := d.pMissStall("m", 0.03, 0.3, 0.05)
	d.Observe("m", 2, 15) // as long at the engine as the long one (a long prompt)
	mixed, _ := d.pMissStall("m", 0.03, 0.3, 0.05)
	if !(long < 0.3) || !(mixed > long+0.3) {
		t.Fatalf("risk %v with one 1000-token output, %v with a 2-token one added", long, mixed)
	}
	// The same two requests, the short one 150 ms at the engine: a stream
	// found running is the long one 99 % of the time.
	e := NewOutputDist()
	e.Observe("m", 1000, 15)
	e.Observe("m", 2, 0.15)
	brief, _ := e.pMissStall("m", 0.03, 0.3, 0.05)
	if !(brief < long+0.02) {
		t.Fatalf("risk %v with a 2-token output that stayed 1 %% of the time, %v without it", brief, long)
	}
	// Per model: another model's streams have no distribution yet.
	if _, ok := e.pMissStall("other", 0.03, 0.3, 0.05); ok {
		t.Fatal("a model with no finished request priced over another's")
	}
}
