package sidecar

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

// SGLang with EAGLE/MTP sends bigram token ids; before, one such event made
// the whole batch undecodable, the rank's history was declared lost and,
// with reset-engine, the engine was reset for every batch (compat report F3).
// Now bigram pages are keyed as the prompt's tokens; a batch the decoder
// cannot read drops the rank's state but requests no reset; and resets are
// requested at most once per resetMinInterval.
func TestUnreadableBatchesDoNotResetTheEngineAgainAndAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ResyncPolicy = ResyncResetEngine
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: "http://127.0.0.1:1", BlockSize: 4}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	e.mu.Lock()
	defer e.mu.Unlock()

	// [1.5, [["BlockStored", [1], nil, [[1,2],[2,3],[3,4],[4,5]], 4, nil, "GPU"]]]
	bigram := []byte{0x92, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0x91, 0x97, 0xab}
	bigram = append(bigram, "BlockStored"...)
	bigram = append(bigram, 0x91, 1, 0xc0, 0x94, 0x92, 1, 2, 0x92, 2, 3, 0x92, 3, 4, 0x92, 4, 5, 4, 0xc0, 0xa3, 'G', 'P', 'U')
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(bigram, &b); err != nil {
		t.Fatalf("SGLang bigram batch: %v", err)
	}
	e.handle(kvevents.Message{Kind: kvevents.MsgBatch, Batch: &b})
	want := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), []uint32{1, 2, 3, 4}, 4)
	if got := e.st.keys(kvevents.TierGPU); !slices.Equal(got, want) {
		t.Fatalf("bigram page keys %x, want the prompt's %x", got, want)
	}

	// An unreadable batch: state dropped, no reset.
	e.handle(kvevents.Message{Kind: kvevents.MsgLostHistory, From: 1, Seq: 2, Undecodable: true})
	if len(e.resetCh) != 0 {
		t.Fatal("an undecodable batch requested an engine reset")
	}
	// Orphans after the hole (their parent was in it): one reset, then none
	// for a minute however many batches follow.
	orphan := kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{9},
		ParentHash: 8, HasParent: true, TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 4}}}
	e.handle(kvevents.Message{Kind: kvevents.MsgBatch, Batch: &orphan})
	if len(e.resetCh) != 1 {
		t.Fatal("an unknown parent requested no reset")
	}
	<-e.resetCh // resetLoop takes it
	for range 5 {
		e.handle(kvevents.Message{Kind: kvevents.MsgBatch, Batch: &orphan})
		e.handle(kvevents.Message{Kind: kvevents.MsgLostHistory, From: 3, Seq: 4})
	}
	if len(e.resetCh) != 0 || e.c.resetsSuppressed.Load() != 10 {
		t.Fatalf("%d resets pending, %d suppressed; want 0 and 10", len(e.resetCh), e.c.resetsSuppressed.Load())
	}
}
