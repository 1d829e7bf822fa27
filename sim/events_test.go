package sim

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// A second ZMQ client sees every batch in order and BlockStored events whose
// token ids are the prompt's and whose hashes chain through parent hashes.
func TestEventsChainAndMatchPrompt(t *testing.T) {
	s := startSim(t, nil)
	ec := newEventClient(t, s, 0)
	prompt := tokens(100, 4*6+2) // 6 full blocks
	c := complete(t, s, prompt, 3)
	if c.Usage.CompletionTokens != 3 {
		t.Fatalf("usage %+v", c.Usage)
	}
	ec.poll(5*time.Second, func() bool { return ec.next == s.EventStats(0).Published && ec.next > 0 })

	var hashes []uint64
	var toks []uint32
	for _, ev := range ec.events() {
		if ev.Kind != kvevents.BlockStored {
			t.Fatalf("unexpected %v", ev.Kind)
		}
		if ev.BlockSize != 4 || ev.Medium != "GPU" || len(ev.TokenIDs) != 4*len(ev.BlockHashes) {
			t.Fatalf("malformed %+v", ev)
		}
		if len(hashes) == 0 && ev.HasParent {
			t.Fatal("first block has a parent")
		}
		if len(hashes) > 0 && (!ev.HasParent || ev.ParentHash != hashes[len(hashes)-1]) {
			t.Fatalf("parent %x does not chain to %x", ev.ParentHash, hashes[len(hashes)-1])
		}
		hashes = append(hashes, ev.BlockHashes...)
		toks = append(toks, ev.TokenIDs...)
	}
	// Prompt blocks then generated-token blocks: 26 prompt + 2 computed outputs = 7 full blocks.
	if len(hashes) != 7 || !slices.Equal(toks[:24], prompt[:24]) {
		t.Fatalf("%d blocks, tokens %v", len(hashes), toks)
	}
	// The engine's own cache holds exactly those hashes, and its kvmesh keys
	// are the canonical keys of the same tokens.
	var cached []uint64
	for _, b := range s.CachedBlocks(0, kvevents.TierGPU) {
		cached = append(cached, b.Hash)
	}
	slices.Sort(cached)
	want := slices.Clone(hashes)
	slices.Sort(want)
	if !slices.Equal(cached, want) {
		t.Fatalf("engine cache %x, events %x", cached, want)
	}
	keys := kvevents.AppendKeys(nil, kvevents.Root("test-model", "", ""), toks, 4)
	slices.Sort(keys)
	if got := s.CachedKeys(0, kvevents.TierGPU); !slices.Equal(got, keys) {
		t.Fatalf("CachedKeys %x, want %x", got, keys)
	}

	// Reset → AllBlocksCleared, and the cache is empty.
	if code, body, _ := post(t, s.URL()+"/reset_prefix_cache", nil); code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	before := ec.next
	ec.poll(5*time.Second, func() bool { return ec.next > before })
	evs := ec.events()
	if last := evs[len(evs)-1]; last.Kind != kvevents.AllBlocksCleared {
		t.Fatalf("last event %v, want AllBlocksCleared", last.Kind)
	}
	if len(s.CachedKeys(0, kvevents.TierGPU)) != 0 {
		t.Fatal("cache not empty after reset")
	}
}

// With the drop switch on, live batches go missing and replay fills every gap.
func TestDropSwitchReplayFillsGaps(t *testing.T) {
	s := startSim(t, func(c *Config) { c.DropRate = 0.5 })
	ec := newEventClient(t, s, 0)
	for i := 0; i < 12; i++ {
		complete(t, s, tokens(1000*i+1, 9), 2)
	}
	st := s.EventStats(0)
	if st.Dropped == 0 || st.Published < 12 {
		t.Fatalf("stats %+v: the switch dropped nothing", st)
	}
	ec.poll(5*time.Second, func() bool { return ec.next == s.EventStats(0).Published })
	stored := 0
	for _, ev := range ec.events() {
		if ev.Kind == kvevents.BlockStored {
			stored += len(ev.BlockHashes)
		}
	}
	// 12 requests × (2 prompt blocks + 0 full output blocks): 9 prompt + 1 computed output = 10 tokens → 2 blocks.
	if ec.live >= int(ec.next) {
		t.Fatalf("received %d of %d batches live despite the drop switch", ec.live, ec.next)
	}
	if stored != 24 {
		t.Fatalf("%d blocks stored after replay, want 24 (%v)", stored, ec)
	}
}

// A cache smaller than the working set evicts in LRU order (tail blocks
// first) and says so with BlockRemoved.
func TestLRUEvictionEmitsBlockRemoved(t *testing.T) {
	s := startSim(t, func(c *Config) { c.Engine.GPUBlocks = 8 })
	ec := newEventClient(t, s, 0)
	a, b := tokens(10, 12), tokens(500, 12) // 3 full blocks each (+1 partial while running)
	complete(t, s, a, 1)
	complete(t, s, b, 1)
	// a is least recently used: a new 12-token prompt needs 4 blocks, evicting
	// the 2 partial blocks' slots (no event) and a's tail blocks.
	complete(t, s, tokens(900, 12), 1)
	ec.poll(5*time.Second, func() bool { return ec.next == s.EventStats(0).Published })
	storedBy := map[uint64]int{}
	var removed []uint64
	req := 0
	for _, ev := range ec.events() {
		switch ev.Kind {
		case kvevents.BlockStored:
			if !ev.HasParent {
				req++
			}
			for _, h := range ev.BlockHashes {
				storedBy[h] = req
			}
		case kvevents.BlockRemoved:
			removed = append(removed, ev.BlockHashes...)
		}
	}
	if len(removed) == 0 {
		t.Fatal("no BlockRemoved with a cache smaller than the working set")
	}
	for _, h := range removed {
		if storedBy[h] != 1 {
			t.Fatalf("evicted a block of request %d before the LRU request 1", storedBy[h])
		}
	}
	// b still hits fully; a lost its tail.
	if got := complete(t, s, b, 1).Usage.CachedTokens(); got != 8 {
		t.Fatalf("b cached %d, want 8", got)
	}
	if got := complete(t, s, a, 1).Usage.CachedTokens(); got >= 8 {
		t.Fatalf("a cached %d after eviction", got)
	}
}

// Restart: sequence numbers start again at 0 and the cache is empty.
func TestRestartResetsSequenceAndCache(t *testing.T) {
	s := startSim(t, nil)
	ec := newEventClient(t, s, 0)
	complete(t, s, tokens(1, 9), 1)
	ec.poll(5*time.Second, func() bool { return ec.next >= 1 && ec.next == s.EventStats(0).Published })
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if len(s.CachedKeys(0, kvevents.TierGPU)) != 0 {
		t.Fatal("cache survived a restart")
	}
	if c := complete(t, s, tokens(1, 9), 1); c.Usage.CachedTokens() != 0 {
		t.Fatalf("hit after restart: %+v", c.Usage)
	}
	complete(t, s, tokens(50, 9), 1)
	ec.poll(5*time.Second, func() bool { return ec.restarts == 1 })
}

// DP: each rank publishes on its own endpoint with its rank in the envelope,
// and X-data-parallel-rank pins a rank.
func TestDataParallelRanks(t *testing.T) {
	s := startSim(t, func(c *Config) { c.DP = 2 })
	ec := newEventClient(t, s, 1)
	c := complete(t, s, tokens(1, 9), 1, "X-data-parallel-rank", "1")
	if c.Usage.PromptTokens != 9 {
		t.Fatalf("%+v", c.Usage)
	}
	if s.Load(1).Finished != 1 || s.Load(0).Finished != 0 {
		t.Fatal("rank header ignored")
	}
	ec.poll(5*time.Second, func() bool { return ec.next >= 1 })
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(ec.got[0], &b); err != nil || !b.HasDPRank || b.DPRank != 1 {
		t.Fatalf("batch %+v %v", b, err)
	}
	if code, _, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": []int{1}}, "X-data-parallel-rank", "2"); code != http.StatusBadRequest {
		t.Fatalf("rank 2 of 2: status %d", code)
	}
}
