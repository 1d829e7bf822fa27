package sidecar

import (
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

func toks(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func stored(hashes []uint64, parent *uint64, tokens []uint32, medium string) kvevents.Event {
	e := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 4, Medium: medium}
	if parent != nil {
		e.ParentHash, e.HasParent = *parent, true
	}
	return e
}

func removed(medium string, hashes ...uint64) kvevents.Event {
	return kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hashes, Medium: medium}
}

// replay applies the pending ops to a set, as a materializer would.
func replay(sets *[kvevents.NumTiers]map[uint64]bool, ops []kvevents.Op) {
	for _, op := range ops {
		for _, k := range op.Keys {
			switch op.Kind {
			case kvevents.OpStore:
				sets[op.Tier][k] = true
			case kvevents.OpRemove:
				delete(sets[op.Tier], k)
			}
		}
		if op.Kind == kvevents.OpClear {
			clear(sets[op.Tier])
		}
	}
}

func setKeys(m map[uint64]bool) []uint64 {
	var out []uint64
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestStateRefCountsAndLocations(t *testing.T) {
	s := newState("m", 0, 1)
	root := kvevents.Root("m", "", "")
	k := kvevents.AppendKeys(nil, root, toks(0, 12), 4) // three chained blocks
	p := uint64(102)
	batch := &kvevents.Batch{Events: []kvevents.Event{
		stored([]uint64{101, 102}, nil, toks(0, 8), "GPU"),
		stored([]uint64{103}, &p, toks(8, 4), "GPU"),  // parent resolves through the map
		stored([]uint64{101}, nil, toks(0, 4), "GPU"), // a duplicate physical copy
		stored([]uint64{101, 102}, nil, nil, "CPU"),   // CPU location update
		stored([]uint64{999}, nil, nil, "CPU"),        // location update of an unknown hash
		removed("GPU", 101),                           // one copy of two: still held
		removed("GPU", 555),                           // unknown: counted
	}}
	if s.apply(0, batch) {
		t.Fatal("orphan reported without an unknown parent")
	}
	if s.blockSize != 4 {
		t.Fatalf("block size not learned: %d", s.blockSize)
	}
	sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
	replay(&sets, s.takePending())
	want := slices.Sorted(slices.Values(k))
	if got := setKeys(sets[kvevents.TierGPU]); !slices.Equal(got, want) {
		t.Fatalf("gpu keys %x, want %x", got, want)
	}
	if got := setKeys(sets[kvevents.TierCPU]); !slices.Equal(got, slices.Sorted(slices.Values(k[:2]))) {
		t.Fatalf("cpu keys %x", got)
	}
	if s.c.orphanLocations != 1 || s.c.unknownRemoves != 1 {
		t.Fatalf("counters %+v", s.c)
	}
	// The second GPU copy goes: now the key leaves the GPU tier only.
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{removed("GPU", 101)}})
	replay(&sets, s.takePending())
	if sets[kvevents.TierGPU][k[0]] || !sets[kvevents.TierCPU][k[0]] {
		t.Fatal("key 0 should be on CPU only")
	}
	// Digest equals a digest of the replayed set.
	for tier := range sets {
		var d kvevents.Digest
		for key := range sets[tier] {
			d.Add(key)
		}
		if d != s.digests[tier] {
			t.Fatalf("tier %d digest differs from the replayed set", tier)
		}
	}
	// Unknown parent: reported, counted, nothing stored.
	unknown := uint64(4242)
	if !s.apply(0, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{200}, &unknown, toks(50, 4), "GPU")}}) {
		t.Fatal("unknown parent not reported")
	}
	if s.c.orphanParents != 1 || len(s.takePending()) != 0 {
		t.Fatal("orphan stored something")
	}
}

func TestStateDropRank(t *testing.T) {
	s := newState("m", 4, 2)
	// Both ranks hold the same chain; rank 1 also holds another.
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{1}, nil, toks(0, 4), "")}})
	s.apply(1, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{7}, nil, toks(0, 4), ""), stored([]uint64{8}, nil, toks(100, 4), "")}})
	sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
	replay(&sets, s.takePending())
	if len(sets[0]) != 2 {
		t.Fatalf("union has %d keys", len(sets[0]))
	}
	s.dropRank(1) // rank 1 restarted: only its exclusive key goes
	ops := s.takePending()
	replay(&sets, ops)
	shared := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks(0, 4), 4)[0]
	if len(sets[0]) != 1 || !sets[0][shared] {
		t.Fatalf("after rank 1 drop: %x (ops %+v)", setKeys(sets[0]), ops)
	}
	// The last rank with state clears with one op per tier.
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	ops = s.takePending()
	if len(ops) != 1 || ops[0].Kind != kvevents.OpClear {
		t.Fatalf("clear ops %+v", ops)
	}
	replay(&sets, ops)
	if len(sets[0]) != 0 || s.digests[0] != (kvevents.Digest{}) {
		t.Fatal("not empty after clear")
	}
}

func TestStateSkipsSlidingWindowGroups(t *testing.T) {
	s := newState("m", 4, 1)
	ev := stored([]uint64{1}, nil, toks(0, 4), "GPU")
	ev.SpecKind = "sliding_window"
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{ev}})
	if len(s.takePending()) != 0 || s.c.skippedGroups != 1 {
		t.Fatal("sliding-window group indexed")
	}
}

// TestStateCountsBlocksWithoutTokens: a BlockStored with more hashes than
// full blocks of tokens keys the blocks it can and counts the event.
func TestStateCountsBlocksWithoutTokens(t *testing.T) {
	s := newState("m", 4, 1)
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{1, 2}, nil, toks(0, 6), "GPU")}}) // block size 4
	if n := len(s.keyRefs[0]); n != 1 || s.c.badEvents != 1 {
		t.Fatalf("%d keys, %d bad events; want 1 and 1", n, s.c.badEvents)
	}
}

func BenchmarkStateApply(b *testing.B) {
	s := newState("m", 16, 1)
	tokens := toks(0, 16*32)
	hashes := make([]uint64, 32)
	b.ReportAllocs()
	for i := range b.N {
		for j := range hashes {
			hashes[j] = uint64(i)<<8 | uint64(j)
		}
		tokens[0] = uint32(i)
		batch := kvevents.Batch{Events: []kvevents.Event{
			{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 16},
			{Kind: kvevents.BlockRemoved, BlockHashes: hashes},
		}}
		s.apply(0, &batch)
		ops := s.takePending()
		s.pending = ops[:0] // reuse, as flush does not (deltas own their ops)
	}
}

// TestStateMemoryStaysBounded: a long run of stores, removes, location
// updates, cache clears and rank restarts, each cycle with new hashes and a
// new cache salt, leaves the state no bigger after 2N cycles than after N:
// per-rank maps, key counts and pending ops are bounded by what the
// engine holds now, not by what it ever held.
func TestStateMemoryStaysBounded(t *testing.T) {
	s := newState("m", 4, 2)
	const blocks = 256
	next := uint64(1)
	cycle := func(c int) {
		r := c % 2
		hashes := make([]uint64, blocks)
		for i := range hashes {
			hashes[i] = next
			next++
		}
		ev := stored(hashes, nil, toks(c*7, blocks*4), "GPU")
		ev.CacheSalt = "salt-" + strconv.Itoa(c) // per-user salts
		b := kvevents.Batch{Events: []kvevents.Event{ev, stored(hashes[:blocks/2], nil, nil, "CPU")}}
		s.apply(r, &b)
		b = kvevents.Batch{Events: []kvevents.Event{removed("GPU", hashes[:blocks/2]...), removed("CPU", hashes[blocks/4:blocks/2]...)}}
		s.apply(r, &b)
		switch c % 3 {
		case 0:
			s.dropRank(r) // the rank's engine restarted
		case 1:
			b = kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}}
			s.apply(r, &b)
		}
		_ = s.takePending() // published as a delta
	}
	size := func() (entries int, heap uint64) {
		for _, m := range s.ranks {
			entries += len(m)
		}
		for _, m := range s.keyRefs {
			entries += len(m)
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return entries, ms.HeapAlloc
	}
	const n = 1500
	for c := 0; c < n; c++ {
		cycle(c)
	}
	e1, h1 := size()
	for c := n; c < 2*n; c++ {
		cycle(c)
	}
	e2, h2 := size()
	if e2 > 4*blocks || e2 > e1+2*blocks || len(s.pending) != 0 || h2 > h1+(4<<20) {
		t.Fatalf("after %d cycles: %d entries, heap %d KiB; after %d: %d entries, heap %d KiB", n, e1, h1>>10, 2*n, e2, h2>>10)
	}
}

// vLLM sends a request's cache_salt only in block 0's extra_keys (there is
// no cache_salt field): salted blocks get the keys the ingress computes for
// the salted request, not the unsalted ones (compat report F1).
func TestStateKeysSaltFromVLLMExtraKeys(t *testing.T) {
	s := newState("m", 4, 1)
	ev := stored([]uint64{1, 2}, nil, toks(1, 8), "GPU")
	ev.ExtraKeys = kvevents.AppendExtraKeys(nil, 2, true, "", "tenant-a")
	b := kvevents.Batch{Events: []kvevents.Event{ev}}
	s.apply(0, &b)
	want := kvevents.AppendKeys(nil, kvevents.Root("m", "", "tenant-a"), toks(1, 8), 4)
	slices.Sort(want)
	if got := setKeys(keySet(s)); !slices.Equal(got, want) {
		t.Fatalf("keys %x, want the salted request's %x", got, want)
	}
	// A LoRA block of a vLLM that sends lora_id only is not a base-model block (F2).
	s = newState("m", 4, 1)
	ev = stored([]uint64{1, 2}, nil, toks(1, 8), "GPU")
	ev.LoraID, ev.HasLoraID = 1, true
	b = kvevents.Batch{Events: []kvevents.Event{ev}}
	s.apply(0, &b)
	for _, k := range kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks(1, 8), 4) {
		if s.keyRefs[0][k] != 0 {
			t.Fatalf("adapter (lora_id 1) block keyed as the base model's %x", k)
		}
	}
}

func keySet(s *state) map[uint64]bool {
	m := map[uint64]bool{}
	for k := range s.keyRefs[0] {
		m[k] = true
	}
	return m
}

// A batch of another block size (the engine restarted with it) makes it the
// size in effect and drops every rank's keys: made with the old size, no
// request keyed with the new one can match them (churn report F2).
func TestStateBlockSizeChange(t *testing.T) {
	s := newState("m", 0, 2)
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{1, 2}, nil, toks(0, 8), "GPU")}})
	s.apply(1, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{3}, nil, toks(100, 4), "GPU")}})
	sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
	replay(&sets, s.takePending())
	if s.blockSize != 4 || len(sets[kvevents.TierGPU]) != 3 || s.c.blockSizeChanges != 0 {
		t.Fatalf("block size %d, %d keys, %d changes; want 4, 3, 0 (learned, not changed)", s.blockSize, len(sets[kvevents.TierGPU]), s.c.blockSizeChanges)
	}
	ev := stored([]uint64{9}, nil, toks(0, 8), "GPU")
	ev.BlockSize = 8
	s.apply(0, &kvevents.Batch{Events: []kvevents.Event{ev}})
	replay(&sets, s.takePending())
	want := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks(0, 8), 8)
	if got := setKeys(sets[kvevents.TierGPU]); s.blockSize != 8 || s.c.blockSizeChanges != 1 || !slices.Equal(got, want) || len(s.ranks[1]) != 0 {
		t.Fatalf("after a batch of 8-token blocks: block size %d, %d changes, keys %x (want %x), rank 1 holds %d",
			s.blockSize, s.c.blockSizeChanges, got, want, len(s.ranks[1]))
	}
}

// An engine restart forgets a learned block size once no rank holds
// anything (the engine may come back with another); while another rank
// holds keys their size stays. A configured size is kept.
func TestStateRestartForgetsLearnedBlockSize(t *testing.T) {
	for _, tc := range []struct {
		cfg, want int
		otherRank bool
	}{{0, 0, false}, {0, 4, true}, {16, 16, false}} {
		s := newState("m", tc.cfg, 2)
		s.blockSize = 4 // as learned
		s.apply(0, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{1}, nil, toks(0, 4), "GPU")}})
		if tc.otherRank {
			s.apply(1, &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{2}, nil, toks(50, 4), "GPU")}})
		}
		s.restarted(0)
		if s.blockSize != tc.want || len(s.ranks[0]) != 0 {
			t.Errorf("configured %d, other rank holding %v: block size %d after rank 0 restarted, want %d; rank 0 holds %d",
				tc.cfg, tc.otherRank, s.blockSize, tc.want, len(s.ranks[0]))
		}
	}
}
