package materialize_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// During a sidecar restart overlapping its old self both sidecars answer a
// snapshot request, and one that cannot send its key set answers first (its
// error reply is tiny): the other's good reply is still taken. Here the
// engine's old epoch A is followed, the newer epoch B's first delta asks for
// a snapshot, and the reply to it is an error followed by B's key set, on
// one connection so the error comes first. Before, the error reply ended
// the request whenever it came first: the snapshot failed (sidecar_error),
// and so did every retry.
func TestSnapshotErrorReplyFirstDoesNotEndAnOverlap(t *testing.T) {
	srv := testutil.NATS(t)
	side, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(side.Close)
	const epochA, epochB = 11, 22
	startA := time.Now().Add(-time.Hour).UnixNano()
	startB := startA + int64(time.Minute)
	chunk := func(epoch uint64, start int64, keys ...uint64) []byte {
		return kvevents.AppendSnapshotChunk(nil, &kvevents.SnapshotChunk{Engine: "e1", Model: "m", Epoch: epoch, Seq: 1, TS: time.Now().UnixNano(),
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}}, Chunks: 1, EpochStart: start})
	}
	var overlap atomic.Bool // both sidecars answer: A with an error, B with its key set
	sub, err := side.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) {
		if !overlap.Load() {
			_ = msg.Respond(chunk(epochA, startA, 1))
			return
		}
		r := nats.NewMsg(msg.Reply)
		r.Header.Set(kvevents.SnapshotErrorHeader, "max_payload 96 leaves no room for a key")
		_ = msg.RespondMsg(r)
		_ = msg.Respond(chunk(epochB, startB, 1, 2))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := side.Flush(); err != nil {
		t.Fatal(err)
	}
	delta := func(epoch uint64, start int64, keys ...uint64) {
		t.Helper()
		d := kvevents.Delta{Engine: "e1", Model: "m", Epoch: epoch, Seq: 1, TS: time.Now().UnixNano(), EpochStart: start,
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}}}
		if err := side.Publish(natsutil.Default().DeltaSubject("m", "e1"), kvevents.AppendDelta(nil, &d)); err != nil {
			t.Fatal(err)
		}
	}

	cfg, _, _ := materializerConfig(t, srv.URL())
	cfg.CheckInterval, cfg.IdleCheck, cfg.EpochGrace = 20*time.Millisecond, time.Hour, time.Hour
	cfg.SnapshotTimeout = time.Minute // the old epoch was heard from within it
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)
	synced := func(epoch uint64, keys int) func() bool {
		return func() bool {
			st := m.Status()
			return len(st) == 1 && st[0].Synced && st[0].Epoch == epoch && !st[0].Snapshotting && st[0].Keys[kvevents.TierGPU] == keys
		}
	}
	delta(epochA, startA, 1)
	testutil.WaitFor(t, 10*time.Second, "following epoch A", synced(epochA, 1))

	overlap.Store(true)
	delta(epochB, startB, 2)
	testutil.WaitFor(t, 20*time.Second, "following epoch B, its key set taken despite the error reply before it", synced(epochB, 2))
	if got := m.Status()[0].SnapshotFailures; got != 0 {
		t.Fatalf("%d snapshot failures", got)
	}
}
