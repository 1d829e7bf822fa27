package des

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// twoPrefills is two 4,096-token prompts of different groups, one output
// token each, the second sent at arrive.
func twoPrefills(t *testing.T, arrive time.Duration) []workload.Request {
	t.Helper()
	reqs, err := workload.SharedPrefix{Groups: 2, Prompts: 1, Shared: 2048, Question: 2048, Output: 1, Rate: 1, Seed: 1}.Generate()
	if err != nil || len(reqs) != 2 {
		t.Fatalf("workload: %d requests, %v", len(reqs), err)
	}
	reqs[0].Arrival, reqs[1].Arrival = 0, arrive
	return reqs
}

// firstTokens returns when each request's first token came (its Start +
// TTFT), by arrival order.
func firstTokens(t *testing.T, run report.Run) []float64 {
	t.Helper()
	if len(run.Records) != 2 {
		t.Fatalf("%d records, want 2", len(run.Records))
	}
	at := []float64{run.Records[0].Start + run.Records[0].TTFT, run.Records[1].Start + run.Records[1].TTFT}
	if run.Records[0].Start > run.Records[1].Start {
		at[0], at[1] = at[1], at[0]
	}
	return at
}

// TestEngineBusyUntilStepEnd: a step that finishes every request an engine
// has (a one-token answer, a P/D prefill leg) still occupies the engine
// until its end; a request arriving meanwhile starts there, not beside it.
// The DES used to start it at its arrival, so an engine ran two steps at
// once (about 15 s of a 4 + 4 run's prefill time at long prompts, rate 6).
func TestEngineBusyUntilStepEnd(t *testing.T) {
	prof, _ := engine.LookupProfile("7b-l40s")
	ec := engine.Config{GPUBlocks: 8000, Profile: prof, MaxBatchTokens: 8192}
	cfg := Config{Engines: 1, Concurrency: 8, Engine: ec}
	alone, err := Run(context.Background(), cfg, twoPrefills(t, time.Hour), []string{"round-robin"})
	if err != nil {
		t.Fatal(err)
	}
	solo := firstTokens(t, alone.Runs["round-robin"]) // each prefill alone
	p0, p1 := solo[0], solo[1]-time.Hour.Seconds()
	if p0 <= 0 || p1 <= 0 {
		t.Fatalf("prefill times %v, %v", p0, p1)
	}
	arrive := time.Duration(p0 / 2 * float64(time.Second)) // mid-way through the first prefill
	rep, err := Run(context.Background(), cfg, twoPrefills(t, arrive), []string{"round-robin"})
	if err != nil {
		t.Fatal(err)
	}
	at := firstTokens(t, rep.Runs["round-robin"])
	if want := p0 + p1; at[1] < want-1e-6 {
		t.Errorf("aggregated: the second first token at %.4fs, want ≥ %.4fs (after the first prefill's end at %.4fs, plus its own %.4fs)", at[1], want, p0, p1)
	}

	// P/D: one prefill engine, the prefill legs back to back.
	pd := PDConfig{Config: Config{Engine: ec}, Roles: Roles{Prefill: 1, Decode: 1}}
	prep, err := RunPD(context.Background(), pd, twoPrefills(t, arrive), []string{"kvmesh-always"})
	if err != nil {
		t.Fatal(err)
	}
	at = firstTokens(t, prep.Runs["kvmesh-always"])
	if gap := at[1] - at[0]; gap < p1-1e-6 {
		t.Errorf("P/D: first tokens %.4fs apart, want ≥ the second prefill's %.4fs (prefill legs on one engine run one after the other)", gap, p1)
	}
}
