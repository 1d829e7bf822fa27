package pd

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// TestRouterForgetsEngines: the router's Forget reaches the P/D policy's
// records (the KVMesh stall ledger, also under kvmesh-always; the SGLang
// emulation's prefill history) and its scheduler's policy.
func TestRouterForgetsEngines(t *testing.T) {
	pol := policies.NewSGLang() // the scheduler's policy, with a history
	sched, err := scheduler.New(nil, pol, nil, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := NewKVMesh(policies.KVMesh{})
	sg := NewSGLang()
	for _, p := range []Policy{k, always{k}, sg} {
		r, err := NewRouter(sched, p)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, id := range []string{"a", "b"} {
			k.stalls.add(id, now, 1)
			sg.Prefill.History.Insert(id, []uint64{1, 2})
			pol.History.Insert(id, []uint64{1, 2})
		}
		r.Forget("a")
		want := map[string]int{"ledger": 2, "sglang prefill history": 2, "scheduler history": 1}
		switch p.(type) {
		case KVMesh, always:
			want["ledger"] = 1
		case SGLang:
			want["sglang prefill history"] = 1
		}
		got := map[string]int{"ledger": k.stalls.engines(), "sglang prefill history": sg.Prefill.History.Engines(), "scheduler history": pol.History.Engines()}
		for what, n := range want {
			if got[what] != n {
				t.Errorf("%s: %s holds %d engines after forgetting a, want %d", p.Name(), what, got[what], n)
			}
		}
		if k.stalls.since("b", now.Add(-time.Second)) <= 0 {
			t.Errorf("%s: b's ledger lost", p.Name())
		}
	}
}
