package scheduler_test

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// mixedBlockRequest is a 1,024-token prompt keyed at 16 (Keys) and at 32
// (a chain), with engine "a" (block 16) holding all of it, "b" (block 32)
// all of it, and "c" (block 32) half of it.
func mixedBlockRequest(t testing.TB) (*scheduler.Request, []scheduler.Engine, scheduler.PrefixIndex) {
	x := newIdx(t)
	tokens := make([]uint32, 1024)
	for i := range tokens {
		tokens[i] = uint32(i*31 + 7)
	}
	k16 := kvevents.AppendKeys(nil, 0, tokens, 16)
	k32 := kvevents.AppendKeys(nil, 0, tokens, 32)
	x.Store("a", kvevents.TierGPU, k16)
	x.Store("b", kvevents.TierGPU, k32)
	x.Store("c", kvevents.TierGPU, k32[:16])
	es := engines(4)
	es[0].BlockSize, es[1].BlockSize, es[2].BlockSize, es[3].BlockSize = 16, 32, 32, 64
	req := &scheduler.Request{Keys: k16, BlockSize: 16, PromptTokens: len(tokens),
		Chains: []scheduler.Chain{{BlockSize: 32, Keys: k32}}}
	return req, es, x
}

// TestScheduleMatchesEachBlockSize: engines of one model with different
// block sizes are each looked up with their own size's chain, and compared
// in tokens: one of block 32 holding the whole prompt matches as fully as
// one of block 16 holding it.
func TestScheduleMatchesEachBlockSize(t *testing.T) {
	req, es, x := mixedBlockRequest(t)
	s, err := registry.New(registry.DefaultConfig(), x, nil)
	if err != nil {
		t.Fatal(err)
	}
	var d scheduler.Decision
	if err := s.Schedule(req, es, &d); err != nil {
		t.Fatal(err)
	}
	got := map[string]scheduler.EngineScore{}
	for _, r := range d.Ranked {
		got[r.Engine] = r
	}
	want := map[string]struct {
		gpu, block int
		hit        float64
	}{
		"a": {64, 16, 1}, "b": {32, 32, 1}, "c": {16, 32, 0.5},
		"d": {0, 64, 0}, // block 64: no chain of its size, no match
	}
	for id, w := range want {
		r := got[id]
		if r.Match.GPU != w.gpu || r.MatchBlock != w.block || r.Hit != w.hit {
			t.Errorf("engine %s: match %+v of block %d, hit %v; want %d blocks of %d, hit %v", id, r.Match, r.MatchBlock, r.Hit, w.gpu, w.block, w.hit)
		}
	}
	var cached [4]int
	if _, err := s.WithCandidates(req, es, func(cs []scheduler.Candidate, _ *scheduler.Cycle) error {
		for _, c := range cs {
			cached[c.ID[0]-'a'] = c.CachedTokens
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if cached != [4]int{1024, 1024, 512, 0} {
		t.Errorf("cached tokens a..d %v, want [1024 1024 512 0]", cached)
	}
}
