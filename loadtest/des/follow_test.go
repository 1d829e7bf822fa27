package des

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// followTrace is one session of two turns in aiperf's form (the second
// sent 1 s after the first's answer) and an unrelated request between.
const followTrace = `{"timestamp": 0, "session_id": "s", "input_length": 4000, "output_length": 300, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8]}
{"session_id": "s", "delay": 1000, "input_length": 4600, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}
{"timestamp": 200, "input_length": 100, "output_length": 5, "hash_ids": [50]}
`

func followReqs(t *testing.T) []workload.Request {
	t.Helper()
	reqs, err := workload.Mooncake{}.Read(strings.NewReader(followTrace))
	if err != nil {
		t.Fatal(err)
	}
	if reqs[2].After != 1 || reqs[2].Think != time.Second || reqs[2].PromptTokens != 4600 {
		t.Fatalf("the second turn is not a follow-up of the first: %+v", reqs[2])
	}
	return reqs
}

// TestFollowUpsClosedLoop: a follow-up arrives Think after its
// predecessor's answer (no earlier, and late by at most a snapshot
// interval, the longest fused step), not at its open-loop estimate.
func TestFollowUpsClosedLoop(t *testing.T) {
	reqs := followReqs(t)
	prof, _ := engine.LookupProfile("7b-l40s")
	cfg := Config{Engines: 2, Engine: engine.Config{GPUBlocks: 4000, Profile: prof}, SnapshotInterval: 200 * time.Millisecond}
	for _, p := range []string{"random", "kvmesh"} {
		rep, err := Run(context.Background(), cfg, reqs, []string{p})
		if err != nil {
			t.Fatal(err)
		}
		var first, second float64 = -1, -1
		var firstEnd float64
		for _, r := range rep.Runs[p].Records {
			switch r.PromptTokens {
			case 4000:
				first, firstEnd = r.Start, r.Start+r.E2E
			case 4600:
				second = r.Start
			}
		}
		if first != 0 || second < 0 || firstEnd < 2 {
			t.Fatalf("%s: records %+v", p, rep.Runs[p].Records)
		}
		if gap := second - firstEnd; gap < 1 || gap > 1+cfg.SnapshotInterval.Seconds()+1e-9 {
			t.Errorf("%s: the second turn arrived %.3f s after the first's answer (%.3f s), want 1 s (+ ≤ %v)", p, gap, firstEnd, cfg.SnapshotInterval)
		}
	}
}

// TestFollowUpsPD: the P/D benchmark waits for the answer too: the run
// lasts the first turn, the delay and the second turn, where open-loop
// (the same requests without After) it overlaps them.
func TestFollowUpsPD(t *testing.T) {
	reqs := followReqs(t)
	open := append([]workload.Request(nil), reqs...)
	open[2].After = 0
	cfg := PDConfig{Roles: Roles{Prefill: 1, Decode: 1}}
	cfg.Engine.GPUBlocks = 4000
	closed, err := RunPD(context.Background(), cfg, reqs, []string{"kvmesh"})
	if err != nil {
		t.Fatal(err)
	}
	opened, err := RunPD(context.Background(), cfg, open, []string{"kvmesh"})
	if err != nil {
		t.Fatal(err)
	}
	c, o := closed.Policies["kvmesh"], opened.Policies["kvmesh"]
	t.Logf("makespan closed %v, open-loop %v", c.Makespan, o.Makespan)
	if c.Completed != 3 || o.Completed != 3 || c.Makespan < o.Makespan+time.Second {
		t.Fatalf("closed %+v, open-loop %+v", c, o)
	}
}

// TestFollowUpsInvalid: a follow-up of a later request is a configuration
// error, not a run that never ends.
func TestFollowUpsInvalid(t *testing.T) {
	reqs := followReqs(t)
	reqs[0].After = 3
	if _, err := newFollowUps(reqs); err == nil {
		t.Fatal("request 0 following request 2 accepted")
	}
}
