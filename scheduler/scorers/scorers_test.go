package scorers

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
)

func run(s scheduler.Scorer, r *scheduler.Request, es ...scheduler.Engine) []float64 {
	cs := make([]scheduler.Candidate, len(es))
	for i := range es {
		cs[i] = scheduler.Candidate{Engine: &es[i], Hit: float64(i) / 2}
	}
	out := make([]float64, len(cs))
	s.Score(r, cs, out)
	return out
}

func TestScorers(t *testing.T) {
	r := &scheduler.Request{OutputTokens: 10, LoRA: "x", SessionEngine: "b"}
	eq := func(name string, got []float64, want ...float64) {
		t.Helper()
		for i := range want {
			if d := got[i] - want[i]; d > 1e-9 || d < -1e-9 {
				t.Errorf("%s: got %v want %v", name, got, want)
				return
			}
		}
	}
	eq("prefix", run(Prefix{}, r, scheduler.Engine{}, scheduler.Engine{}, scheduler.Engine{}), 0, 0.5, 1)
	eq("load", run(Load{}, r, scheduler.Engine{InFlight: 10}, scheduler.Engine{InFlight: 0}, scheduler.Engine{InFlight: 5}), 0, 1, 0.5)
	eq("load equal", run(Load{}, r, scheduler.Engine{InFlight: 3}, scheduler.Engine{InFlight: 3}), 1, 1)
	eq("queue", run(Queue{}, r, scheduler.Engine{Waiting: 4}, scheduler.Engine{Waiting: 0}), 0, 1)
	eq("kv", run(KVUsage{}, r, scheduler.Engine{KVUsage: 0.25}), 0.75)
	eq("latency", run(Latency{}, r,
		scheduler.Engine{TTFT: time.Second},
		scheduler.Engine{TTFT: 2 * time.Second},
		scheduler.Engine{}), 1, 0.5, 1)
	eq("lora", run(LoRA{}, r, scheduler.Engine{LoRAs: []string{"x"}}, scheduler.Engine{}), 1, 0)
	eq("session", run(Session{}, r, scheduler.Engine{ID: "a"}, scheduler.Engine{ID: "b"}), 0, 1)
}
