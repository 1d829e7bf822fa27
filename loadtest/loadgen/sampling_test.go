package loadgen

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
)

// TestRunParallelSampling: with N > 1 every request asks n sequences of a
// real simulator; the report counts every sequence's tokens, a prompt
// once, and a record's TPOT is one sequence's (its tokens over N); the
// Responses and Messages APIs, which have no n, are refused.
func TestRunParallelSampling(t *testing.T) {
	s, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 200, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reqs := sharedPrefix(t, 2, 3) // 80 prompt and 4 output tokens each
	for _, ep := range []Endpoint{Completions, Chat} {
		rep, err := Run(context.Background(), Config{URL: s.URL(), Model: "m", Endpoint: ep, N: 3, Rate: -1}, reqs)
		if err != nil || rep.Completed != 6 {
			t.Fatalf("%s: %v, %+v", ep, err, rep)
		}
		if rep.OutputTokens != 6*3*4 {
			t.Errorf("%s: %d output tokens, want %d (3 sequences × 4 per request)", ep, rep.OutputTokens, 6*3*4)
		}
		if ep == Completions && rep.PromptTokens != 6*80 {
			t.Errorf("%s: %d prompt tokens, want %d (each prompt once)", ep, rep.PromptTokens, 6*80)
		}
		for _, r := range rep.Run(1, nil).Records {
			if want := (r.E2E - r.TTFT) / 3; r.Sequences != 3 || math.Abs(r.TPOT()-want) > 1e-12 {
				t.Errorf("%s: record %+v: TPOT %v, want one sequence's %v", ep, r, r.TPOT(), want)
			}
		}
	}
	for _, ep := range []Endpoint{Responses, Messages} {
		_, err := Run(context.Background(), Config{URL: s.URL(), Model: "m", Endpoint: ep, N: 2}, reqs)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no n") {
			t.Errorf("%s with n 2: %v", ep, err)
		}
	}
}
