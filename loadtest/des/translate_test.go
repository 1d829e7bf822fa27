package des

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

func TestTranslator(t *testing.T) {
	tr := newTranslator("m", 2)
	root := kvevents.Root("m", "", "")
	k0 := kvevents.ChainKey(root, []uint32{1, 2})
	k1 := kvevents.ChainKey(k0, []uint32{3, 4})
	evs := []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{100, 101}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2},
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{101}, ParentHash: 100, HasParent: true, TokenIDs: []uint32{3, 4}}, // duplicate copy
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{101}},                                                            // one copy left
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{101, 999}},                                                       // last copy; 999 unknown
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{7}, ParentHash: 555, HasParent: true, TokenIDs: []uint32{9, 9}},   // unknown parent
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{100}, Medium: "CPU"},                                              // known hash, CPU tier
	}
	tr.translate(evs)
	type got struct {
		kind opKind
		tier kvevents.Tier
		keys []uint64
	}
	var ops []got
	for _, o := range tr.ops {
		ops = append(ops, got{o.kind, o.tier, append([]uint64(nil), tr.keys[o.start:o.end]...)})
	}
	want := []got{
		{opStore, kvevents.TierGPU, []uint64{k0, k1}},
		{opRemove, kvevents.TierGPU, []uint64{k1}},
		{opStore, kvevents.TierCPU, []uint64{k0}},
	}
	if len(ops) != len(want) {
		t.Fatalf("ops %+v, want %+v", ops, want)
	}
	for i := range want {
		if ops[i].kind != want[i].kind || ops[i].tier != want[i].tier || len(ops[i].keys) != len(want[i].keys) || ops[i].keys[0] != want[i].keys[0] {
			t.Fatalf("op %d: %+v, want %+v", i, ops[i], want[i])
		}
	}
	if tr.bad != 2 {
		t.Fatalf("bad = %d, want 2 (unknown removed hash, unknown parent)", tr.bad)
	}
	tr.ops, tr.keys = tr.ops[:0], tr.keys[:0]
	tr.translate([]kvevents.Event{{Kind: kvevents.AllBlocksCleared}})
	if len(tr.ops) != 1 || tr.ops[0].kind != opClear || len(tr.known) != 0 {
		t.Fatalf("clear: %+v known %d", tr.ops, len(tr.known))
	}
}
