//go:build !race

// The race detector makes sync.Pool drop items, so allocation counts mean
// nothing under -race: this file is left out of race builds (instead of a
// test that skips), and `make test` runs it in its unit-norace step.

package scheduler_test

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

func TestScheduleNoAlloc(t *testing.T) {
	x := newIdx(t)
	k := keys(256, 1)
	es := engines(16)
	for i := range es {
		x.Store(es[i].ID, kvevents.TierGPU, k[:i*16])
	}
	for _, name := range []string{"kvmesh", "llmd", "sglang"} {
		s, err := registry.NewPolicy(name, 1, x)
		if err != nil {
			t.Fatal(err)
		}
		req := &scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 4096}
		var d scheduler.Decision
		_ = s.Schedule(req, es, &d)
		if a := testing.AllocsPerRun(50, func() { _ = s.Schedule(req, es, &d) }); a != 0 {
			t.Errorf("%s: Schedule allocates %.1f per call", name, a)
		}
	}
}

// TestScheduleChainsNoAlloc: a request keyed at a second block size
// (Request.Chains) reuses the cycle's scratch too.
func TestScheduleChainsNoAlloc(t *testing.T) {
	req, es, x := mixedBlockRequest(t)
	s, err := registry.NewPolicy("kvmesh", 1, x)
	if err != nil {
		t.Fatal(err)
	}
	var d scheduler.Decision
	_ = s.Schedule(req, es, &d)
	if a := testing.AllocsPerRun(50, func() { _ = s.Schedule(req, es, &d) }); a != 0 {
		t.Errorf("Schedule with a second chain allocates %.1f per call", a)
	}
}
