package sidecar

import (
	"maps"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

var forms = []kvtest.EventForm{kvtest.ArrayForm, kvtest.MapForm}

// applyWire applies events to rank r of s as an engine sends them: encoded
// in form and decoded again. It returns apply's orphan report.
func applyWire(t *testing.T, s *state, r int, form kvtest.EventForm, events ...kvevents.Event) bool {
	t.Helper()
	payload := kvtest.AppendBatch(nil, &kvevents.Batch{TS: 1, DPRank: r, HasDPRank: true, Events: events}, form)
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(payload, &b); err != nil {
		t.Fatalf("%s form: %v", form, err)
	}
	return s.apply(b.DPRank, &b)
}

func parentOf(h uint64) *uint64 { return &h }

// tierKeys is tier t's key set, sorted.
func tierKeys(s *state, t kvevents.Tier) []uint64 { return slices.Sorted(maps.Keys(s.keyRefs[t])) }

// checkDigests: each tier's digest and published ops agree with its key set.
func checkDigests(t *testing.T, s *state, sets *[kvevents.NumTiers]map[uint64]bool) {
	t.Helper()
	replay(sets, s.takePending())
	for tier := range sets {
		var d kvevents.Digest
		for key := range sets[tier] {
			d.Add(key)
		}
		if d != s.digests[tier] || !slices.Equal(setKeys(sets[tier]), tierKeys(s, kvevents.Tier(tier))) {
			t.Fatalf("tier %d: published keys %x, state %x", tier, setKeys(sets[tier]), tierKeys(s, kvevents.Tier(tier)))
		}
	}
}

// LMCache's BlockStored (medium "cpu", block_size the chunk's token count,
// block_hashes its own chunk keys, parent the chunk before) is an offload
// tier of its own granularity: it never changes the engine's block size nor
// drops its keys. A chunk of a whole number of engine blocks is keyed at the
// engine's block size and held in the CPU tier; a partial chunk of no whole
// number is counted and ignored (tester h-dp F1).
func TestStateLMCacheChunksKeepTheEngineBlockSize(t *testing.T) {
	for _, form := range forms {
		t.Run(form.String(), func(t *testing.T) {
			s := newState("m", 0, 2) // block size learned from the GPU events
			root := kvevents.Root("m", "", "")
			gpu := kvevents.AppendKeys(nil, root, toks(1, 12), 4)
			applyWire(t, s, 0, form, stored([]uint64{1, 2, 3}, nil, toks(1, 12), "GPU"))
			applyWire(t, s, 1, form, stored([]uint64{7}, nil, toks(500, 4), "GPU"))
			other := kvevents.AppendKeys(nil, root, toks(500, 4), 4)
			sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
			checkDigests(t, s, &sets)

			chunk := func(h uint64, parent *uint64, tokens []uint32) kvevents.Event {
				ev := stored([]uint64{h}, parent, tokens, "cpu")
				ev.BlockSize = len(tokens)
				return ev
			}
			orphan := applyWire(t, s, 0, form,
				chunk(9001, nil, toks(1, 8)),
				chunk(9002, parentOf(9001), toks(9, 8)),
				chunk(9003, parentOf(9002), toks(17, 6)), // a partial last chunk: 1.5 engine blocks
			)
			checkDigests(t, s, &sets)
			wantGPU := slices.Sorted(slices.Values(append(slices.Clone(gpu), other...)))
			cpu := kvevents.AppendKeys(nil, root, toks(1, 16), 4)
			if s.blockSize != 4 || s.c.blockSizeChanges != 0 || !slices.Equal(tierKeys(s, kvevents.TierGPU), wantGPU) {
				t.Fatalf("block size %d, %d changes, gpu keys %x; want 4, 0, %x", s.blockSize, s.c.blockSizeChanges, tierKeys(s, kvevents.TierGPU), wantGPU)
			}
			if orphan {
				t.Fatal("LMCache chunks reported an unknown parent")
			}
			if got := tierKeys(s, kvevents.TierCPU); !slices.Equal(got, slices.Sorted(slices.Values(cpu))) {
				t.Fatalf("cpu keys %x, want the 4 engine blocks of the two chunks %x", got, cpu)
			}
			if s.c.badEvents != 1 {
				t.Fatalf("%d bad events, want 1 (the partial chunk)", s.c.badEvents)
			}
			// The first chunk leaves the CPU tier: its two engine blocks go.
			applyWire(t, s, 0, form, removed("cpu", 9001))
			checkDigests(t, s, &sets)
			if got := tierKeys(s, kvevents.TierCPU); !slices.Equal(got, slices.Sorted(slices.Values(cpu[2:]))) {
				t.Fatalf("cpu keys %x after chunk 1's removal, want %x", got, cpu[2:])
			}
			// Rank 0 restarts while rank 1 holds keys: its chunks go too.
			s.restarted(0)
			checkDigests(t, s, &sets)
			if len(sets[kvevents.TierCPU]) != 0 || !slices.Equal(setKeys(sets[kvevents.TierGPU]), other) {
				t.Fatalf("after rank 0's restart: gpu %x cpu %x; want %x and none", setKeys(sets[kvevents.TierGPU]), setKeys(sets[kvevents.TierCPU]), other)
			}
			// Before any GPU event the engine's block size is unknown: a
			// chunk is ignored, the size not learned from it.
			s = newState("m", 0, 1)
			applyWire(t, s, 0, form, chunk(9001, nil, toks(1, 8)))
			applyWire(t, s, 0, form, stored([]uint64{1}, nil, toks(1, 4), "GPU"))
			if s.blockSize != 4 || s.c.blockSizeChanges != 0 || len(s.keyRefs[kvevents.TierCPU]) != 0 || len(s.keyRefs[kvevents.TierGPU]) != 1 {
				t.Fatalf("chunk before the block size: size %d, %d changes, keys gpu %d cpu %d; want 4, 0, 1, 0",
					s.blockSize, s.c.blockSizeChanges, len(s.keyRefs[kvevents.TierGPU]), len(s.keyRefs[kvevents.TierCPU]))
			}
		})
	}
}

// On a hybrid model vLLM stores and removes a block's hash in every KV-cache
// group; kvmesh indexes the full-attention group only, so a removal of the
// sliding-window group must not drop the key the full-attention group still
// holds (tester h-dp F3).
func TestStateHybridGroupRemovalsKeepFullAttentionKeys(t *testing.T) {
	for _, form := range forms {
		t.Run(form.String(), func(t *testing.T) {
			s := newState("m", 4, 1)
			full := stored([]uint64{3001}, nil, toks(501, 4), "GPU")
			full.GroupIdx, full.HasGroupIdx, full.SpecKind = 0, true, "full_attention"
			sliding := full
			sliding.GroupIdx, sliding.SpecKind, sliding.SlidingWindow = 1, "sliding_window", 128
			rm := func(group int64) kvevents.Event {
				ev := removed("GPU", 3001)
				ev.GroupIdx, ev.HasGroupIdx = group, true
				return ev
			}
			// The sliding-window group's CPU location update names the group
			// by its index alone.
			loc := stored([]uint64{3001}, nil, nil, "CPU")
			loc.GroupIdx, loc.HasGroupIdx = 1, true
			applyWire(t, s, 0, form, full, sliding, loc)
			applyWire(t, s, 0, form, rm(1)) // the sliding window moves on
			if len(s.keyRefs[kvevents.TierGPU]) != 1 || len(s.keyRefs[kvevents.TierCPU]) != 0 || s.c.skippedGroups != 3 {
				t.Fatalf("after the sliding-window group's removal: %d keys (%d on CPU), %d skipped; want 1 (0), 3",
					len(s.keyRefs[kvevents.TierGPU]), len(s.keyRefs[kvevents.TierCPU]), s.c.skippedGroups)
			}
			applyWire(t, s, 0, form, rm(0))
			if len(s.keyRefs[kvevents.TierGPU]) != 0 || s.c.unknownRemoves != 0 {
				t.Fatalf("after the full-attention group's removal: %d keys, %d unknown removes; want 0, 0", len(s.keyRefs[kvevents.TierGPU]), s.c.unknownRemoves)
			}
		})
	}
}

// vLLM's OffloadingConnector with an offloaded block of k engine blocks
// names each in its CPU BlockStored (token_ids [], block_size k×B) by the
// hash of its last engine block: the CPU tier holds all k blocks, and they
// leave it together (tester h-dp F4).
func TestStateOffloadedBlocksOfSeveralEngineBlocks(t *testing.T) {
	for _, form := range forms {
		t.Run(form.String(), func(t *testing.T) {
			s := newState("m", 4, 2)
			keys := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks(801, 16), 4)
			sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
			applyWire(t, s, 1, form, stored([]uint64{6001, 6002, 6003, 6004}, nil, toks(801, 16), "GPU"))
			cpu := stored([]uint64{6002, 6004}, nil, nil, "CPU")
			cpu.BlockSize = 8
			applyWire(t, s, 1, form, cpu)
			applyWire(t, s, 1, form, removed("GPU", 6001, 6002, 6003, 6004))
			checkDigests(t, s, &sets)
			if got := setKeys(sets[kvevents.TierCPU]); len(sets[kvevents.TierGPU]) != 0 || !slices.Equal(got, slices.Sorted(slices.Values(keys))) {
				t.Fatalf("gpu %x, cpu %x; want none and all 4 %x", setKeys(sets[kvevents.TierGPU]), got, keys)
			}
			applyWire(t, s, 1, form, removed("CPU", 6002))
			checkDigests(t, s, &sets)
			if got := setKeys(sets[kvevents.TierCPU]); !slices.Equal(got, slices.Sorted(slices.Values(keys[2:]))) {
				t.Fatalf("cpu %x after the first offloaded block's removal, want %x", got, keys[2:])
			}
			applyWire(t, s, 1, form, removed("CPU", 6004))
			checkDigests(t, s, &sets)
			if len(sets[kvevents.TierCPU]) != 0 || len(s.ranks[1]) != 0 || s.c.unknownRemoves != 0 {
				t.Fatalf("left: cpu %x, %d hashes, %d unknown removes", setKeys(sets[kvevents.TierCPU]), len(s.ranks[1]), s.c.unknownRemoves)
			}
		})
	}
}

// FuzzStateApply applies two decoded batches to two ranks, each twice, and
// checks that the published ops, the digests and the key counts agree, and
// that dropping both ranks leaves nothing: every key a store, a chunk or an
// offloaded block put in a tier is taken out with it.
func FuzzStateApply(f *testing.F) {
	seed := func(form kvtest.EventForm, evs ...kvevents.Event) []byte {
		return kvtest.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: evs}, form)
	}
	for _, form := range forms {
		chunk := stored([]uint64{9001}, nil, toks(1, 8), "cpu")
		chunk.BlockSize = 8
		chunk2 := stored([]uint64{9002}, parentOf(9001), toks(9, 8), "cpu")
		chunk2.BlockSize = 8
		loc := stored([]uint64{2, 4}, nil, nil, "CPU")
		loc.BlockSize = 8
		sliding := stored([]uint64{1}, nil, toks(1, 4), "GPU")
		sliding.GroupIdx, sliding.HasGroupIdx, sliding.SpecKind = 1, true, "sliding_window"
		rm := removed("GPU", 1)
		rm.GroupIdx, rm.HasGroupIdx = 1, true
		f.Add(seed(form, stored([]uint64{1, 2, 3, 4}, nil, toks(1, 16), "GPU"), loc, removed("GPU", 1, 2)),
			seed(form, chunk, chunk2, sliding, rm, removed("cpu", 9001), removed("CPU", 4)))
		f.Add(seed(form, stored([]uint64{1}, nil, toks(1, 4), "GPU"), stored([]uint64{2}, parentOf(1), toks(5, 4), "GPU"), removed("GPU", 1)),
			seed(form, stored([]uint64{1}, parentOf(2), toks(9, 4), "GPU"), loc))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		s := newState("m", 4, 2)
		sets := [kvevents.NumTiers]map[uint64]bool{{}, {}, {}}
		for i, p := range [][]byte{a, b, a, b} {
			var batch kvevents.Batch
			if kvevents.DecodeBatch(p, &batch) != nil {
				continue
			}
			s.apply(i%2, &batch)
			checkDigests(t, s, &sets)
		}
		s.dropRank(0)
		checkDigests(t, s, &sets)
		s.dropRank(1)
		checkDigests(t, s, &sets)
		for tier := range s.keyRefs {
			if len(s.keyRefs[tier]) != 0 || len(sets[tier]) != 0 {
				t.Fatalf("tier %d holds %d keys (%d published) with no rank holding anything", tier, len(s.keyRefs[tier]), len(sets[tier]))
			}
		}
	})
}
