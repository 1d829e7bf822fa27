package loadgen

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
)

// The Responses and Messages endpoints against the simulator: streamed and
// not, every request completes with the workload's output length, the
// prompt's tokens and its cached prefix from the answer's usage, and a TTFT
// no later than its end.
func TestRunNamedEventEndpoints(t *testing.T) {
	s, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Seed: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reqs := sharedPrefix(t, 2, 4)
	for _, ep := range []Endpoint{Responses, Messages} {
		for _, noStream := range []bool{false, true} {
			rep, err := Run(context.Background(), Config{URL: s.URL(), Model: "m", Endpoint: ep, NoStream: noStream, Rate: -1, Concurrency: 2}, reqs)
			if err != nil || rep.Completed != len(reqs) || rep.Failed != 0 {
				t.Fatalf("%s noStream=%v: %v, completed %d, errors %v", ep, noStream, err, rep.Completed, rep.Errors)
			}
			if rep.OutputTokens != int64(4*len(reqs)) || rep.PromptTokens < int64(80*len(reqs)) || rep.CachedTokens == 0 {
				t.Fatalf("%s noStream=%v: output %d prompt %d cached %d tokens", ep, noStream, rep.OutputTokens, rep.PromptTokens, rep.CachedTokens)
			}
			for _, r := range rep.Results {
				if r.TTFT <= 0 || r.TTFT > r.E2E {
					t.Fatalf("%s noStream=%v: TTFT %v, E2E %v", ep, noStream, r.TTFT, r.E2E)
				}
			}
		}
	}
}
