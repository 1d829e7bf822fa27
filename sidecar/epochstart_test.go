package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// Deltas and snapshot replies carry the epoch's start, the sidecar's start,
// so that of two live sidecars of one engine (a restart overlapping its old
// self) every ingress follows the same, newer one (kvevents.NewerEpoch).
func TestDeltasAndSnapshotsCarryEpochStart(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	deltas, err := nc.SubscribeSync(natsutil.Default().DeltaWildcard())
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixNano()
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	cfg.NATS.URLs = []string{srv.URL()}
	s := meshtest.StartSidecar(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg, err := deltas.NextMsgWithContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var d kvevents.Delta
	if err := kvevents.DecodeDelta(msg.Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.EpochStart < before || d.EpochStart > time.Now().UnixNano() {
		t.Fatalf("delta epoch start %d, want the sidecar's start (after %d)", d.EpochStart, before)
	}
	reply, err := nc.RequestWithContext(ctx, natsutil.Default().SnapSubject("m", "e1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var c kvevents.SnapshotChunk
	if err := kvevents.DecodeSnapshotChunk(reply.Data, &c); err != nil {
		t.Fatal(err)
	}
	if c.Epoch != d.Epoch || c.EpochStart != d.EpochStart {
		t.Fatalf("snapshot epoch %d start %d, deltas' %d start %d", c.Epoch, c.EpochStart, d.Epoch, d.EpochStart)
	}
}
