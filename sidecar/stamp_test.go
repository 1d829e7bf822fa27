package sidecar_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"

	"github.com/kvmesh/kvmesh/sidecar"
)

// A delta with no engine batch behind it (here the clear of an idle
// engine's restart, found by the idle probe) carries the time the sidecar
// made it, not the stamp of the engine's last batch: with that, every
// ingress took the engine's idle time since for propagation lag, and its
// lag gauge stayed there (h-kvev finding 1). A delta of engine batches
// keeps the newest batch's stamp.
func TestDeltaWithoutBatchIsStampedNow(t *testing.T) {
	srv := testutil.NATS(t)
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deltas, err := nc.SubscribeSync(natsutil.DeltaWildcard)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := sidecar.DefaultConfig()
	cfg.IdleProbe = 20 * time.Millisecond
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: pub.Endpoint(), Replay: pub.ReplayEndpoint(), MetricsURL: "-"}}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.Logger = slog.New(slog.DiscardHandler)
	s := meshtest.StartSidecar(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)

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
