package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// A delta with no engine batch behind it (here the clear of an idle
// engine's restart, found by the idle probe) carries the time the sidecar
// made it, not the stamp of the engine's last batch: with that, every
// ingress took the engine's idle time since for propagation lag, and its
// lag gauge stayed there (h-kvev finding 1). A delta of engine batches
// keeps the newest batch's stamp.
func TestDeltaWithoutBatchIsStampedNow(t *testing.T) {
	r := startDeltaRig(t)
	pub, deltas := r.pub, r.deltas

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// next is the next delta with an op of kind k.
	next := func(k kvevents.OpKind) kvevents.Delta {
		t.Helper()
		for {
			msg, err := deltas.NextMsgWithContext(ctx)
			if err != nil {
				t.Fatalf("waiting for a %v delta: %v", k, err)
			}
			var d kvevents.Delta
			if err := kvevents.DecodeDelta(msg.Data, &d); err != nil {
				t.Fatal(err)
			}
			for _, op := range d.Ops {
				if op.Kind == k {
					return d
				}
			}
		}
	}

	// The engine's last batch, an hour ago (its clock's stamp).
	hourAgo := time.Now().Add(-time.Hour)
	b := &kvevents.Batch{TS: float64(hourAgo.UnixNano()) / 1e9, Events: []kvevents.Event{{
		Kind: kvevents.BlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, Medium: "GPU"}}}
	// Should the live link not be up yet, the idle probe replays the batch.
	if _, err := pub.Publish(b); err != nil {
		t.Fatal(err)
	}
	stored := next(kvevents.OpStore)
	if got := time.Unix(0, stored.TS); got.Sub(hourAgo).Abs() > time.Millisecond {
		t.Fatalf("the store's delta stamped %v, want its batch's %v", got, hourAgo)
	}

	before := time.Now()
	pub.Restart() // back idle with an empty buffer: the idle probe finds it
	cleared := next(kvevents.OpClear)
	if got := time.Unix(0, cleared.TS); got.Before(before) || got.After(time.Now()) {
		t.Fatalf("the restart's clear stamped %v (%v before the restart): want the time the sidecar made it, after %v",
			got, before.Sub(got).Round(time.Second), before)
	}
}
