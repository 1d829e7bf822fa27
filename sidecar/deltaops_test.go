package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// One flush of thousands of one-key ops (a busy engine's history of
// alternating stores and removes, GPU and CPU tiers interleaved, as a
// start-up or gap replay brings it) is published as deltas every reader
// decodes: ops merge only while consecutive, so the flush held about 7,500
// ops, far under the 16,384-key cap, and its one delta was refused by every
// DecodeDelta (over kvevents.MaxDeltaOps) while the sidecar counted it
// published (h-dp F2). The deltas, applied in order, give the sidecar's own
// key set, and follow each other in sequence.
func TestManyOpsSplitIntoDecodableDeltas(t *testing.T) {
	r := startDeltaRig(t)
	pub, nc, deltas, s := r.pub, r.nc, r.deltas, r.s

	// One batch, so one flush: block i stored on the GPU, every other one
	// offloaded to the CPU too, and block i-1 evicted from the GPU.
	const n = 3000
	b := &kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9}
	for i := range uint64(n) {
		h := 1000 + i
		tok := uint32(4 * i)
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{h},
			TokenIDs: []uint32{tok, tok + 1, tok + 2, tok + 3}, BlockSize: 4, Medium: "GPU"})
		if i%2 == 0 {
			b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{h}, Medium: "CPU"})
		}
		if i > 0 {
			b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{h - 1}, Medium: "GPU"})
		}
	}
	if _, err := pub.Publish(b); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the batch applied", func() bool {
		k := s.Status()[0].Keys
		return k[kvevents.TierGPU] == 1 && k[kvevents.TierCPU] == n/2
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reply, err := nc.RequestWithContext(ctx, natsutil.Default().SnapSubject("m", "e1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var snap kvevents.SnapshotChunk
	if err := kvevents.DecodeSnapshotChunk(reply.Data, &snap); err != nil || snap.Chunks != 1 {
		t.Fatalf("snapshot: %v, %d chunks", err, snap.Chunks)
	}
	var want [kvevents.NumTiers]map[uint64]struct{}
	var got [kvevents.NumTiers]map[uint64]struct{}
	for t := range want {
		want[t], got[t] = map[uint64]struct{}{}, map[uint64]struct{}{}
	}
	for _, op := range snap.Ops {
		for _, k := range op.Keys {
			want[op.Tier][k] = struct{}{}
		}
	}

	// Every delta up to the snapshot's head decodes and follows the one
	// before; applied in order they give the snapshot's key set.
	var last, ops uint64
	for last < snap.Seq {
		msg, err := deltas.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatalf("delta after seq %d (head %d): %v", last, snap.Seq, err)
		}
		var d kvevents.Delta
		if err := kvevents.DecodeDelta(msg.Data, &d); err != nil {
			t.Fatalf("delta after seq %d (%d bytes) refused: %v", last, len(msg.Data), err)
		}
		if d.Epoch != snap.Epoch || d.Seq != last+1 {
			t.Fatalf("delta epoch %d seq %d after seq %d, want epoch %d seq %d", d.Epoch, d.Seq, last, snap.Epoch, last+1)
		}
		last = d.Seq
		for _, op := range d.Ops {
			ops++
			set := got[op.Tier]
			switch op.Kind {
			case kvevents.OpStore:
				for _, k := range op.Keys {
					set[k] = struct{}{}
				}
			case kvevents.OpRemove:
				for _, k := range op.Keys {
					delete(set, k)
				}
			case kvevents.OpClear:
				clear(set)
			}
		}
	}
	if ops <= kvevents.MaxDeltaOps {
		t.Fatalf("only %d ops published: the case needs more than one delta's %d", ops, kvevents.MaxDeltaOps)
	}
	for tier := range want {
		if len(got[tier]) != len(want[tier]) {
			t.Fatalf("tier %d: the deltas give %d keys, the sidecar holds %d", tier, len(got[tier]), len(want[tier]))
		}
		for k := range want[tier] {
			if _, ok := got[tier][k]; !ok {
				t.Fatalf("tier %d: key %d held by the sidecar, missing from its deltas", tier, k)
			}
		}
	}
}
