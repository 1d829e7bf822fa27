package materialize_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// A delta that does not decode (here one over the readers' op limit, as
// sidecars wrote for a busy engine's replay) lost the engine's changes in
// silence: only kvmesh_materializer_malformed_total counted it, no log
// line, and when no delta followed to show the gap the copy stayed behind
// the sidecar's head while /debug/index said synced (h-dp F2). It is a gap:
// the engine is snapshotted at once, and a warning names the subject and
// why. No gossip and no idle check here, so nothing else would repair it.
func TestMalformedDeltaWarnsAndResyncs(t *testing.T) {
	srv := testutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	// A sidecar of engine e1 (model m) whose snapshot is its state below.
	const epoch = 77
	var mu sync.Mutex
	seq, keys := uint64(1), []uint64{1}
	if _, err := nc.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) {
		mu.Lock()
		c := kvevents.SnapshotChunk{Engine: "e1", Model: "m", Epoch: epoch, Seq: seq, TS: time.Now().UnixNano(), Chunks: 1,
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: append([]uint64(nil), keys...)}}}
		mu.Unlock()
		_ = msg.Respond(kvevents.AppendSnapshotChunk(nil, &c))
	}); err != nil {
		t.Fatal(err)
	}
	subject := natsutil.Default().DeltaSubject("m", "e1")
	publish := func(d *kvevents.Delta) {
		t.Helper()
		d.Engine, d.Model, d.Epoch, d.TS = "e1", "m", epoch, time.Now().UnixNano()
		if err := nc.Publish(subject, kvevents.AppendDelta(nil, d)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}

	var logs testutil.SyncBuffer
	idx, reg := meshtest.NewMapIndex(), prometheus.NewRegistry()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = nc, idx, reg
	cfg.CheckInterval, cfg.IdleCheck = 20*time.Millisecond, time.Hour
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	m, err := materialize.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	// Found by its first delta and snapshotted; the next applied in sequence.
	publish(&kvevents.Delta{Seq: 1, Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{1}}}})
	testutil.WaitFor(t, 10*time.Second, "e1 synced at seq 1", func() bool {
		st := m.Status()
		return len(st) == 1 && st[0].Synced && st[0].Seq == 1 && !st[0].Snapshotting
	})
	mu.Lock()
	seq, keys = 2, []uint64{1, 2}
	mu.Unlock()
	publish(&kvevents.Delta{Seq: 2, Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{2}}}})
	testutil.WaitFor(t, 10*time.Second, "seq 2 applied", func() bool { return m.Status()[0].Seq == 2 })

	// Delta 3, the engine's last for now, has more ops than readers take.
	mu.Lock()
	seq, keys = 3, []uint64{1, 3}
	mu.Unlock()
	d := kvevents.Delta{Seq: 3}
	for i := range kvevents.MaxDeltaOps + 1 {
		k := []uint64{2}
		if i%2 == 0 {
			k = []uint64{3}
		}
		d.Ops = append(d.Ops, kvevents.Op{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: k},
			kvevents.Op{Kind: kvevents.OpRemove, Tier: kvevents.TierGPU, Keys: []uint64{2}})
	}
	publish(&d)
	testutil.WaitFor(t, 10*time.Second, "the copy at the sidecar's seq 3 with its keys", func() bool {
		st := m.Status()[0]
		got := idx.Keys("e1", kvevents.TierGPU)
		return st.Seq == 3 && st.Synced && len(got) == 2 && got[0] == 1 && got[1] == 3
	})
	if got := testutil.MetricSum(t, reg, "kvmesh_materializer_malformed_total"); got != 1 {
		t.Fatalf("malformed_total %v, want 1", got)
	}
	out := logs.String()
	if !strings.Contains(out, "undecodable delta skipped") || !strings.Contains(out, "subject="+subject) ||
		!strings.Contains(out, "ops") {
		t.Fatalf("no warning naming the subject and the reason:\n%s", out)
	}

	// The warning is once a minute: a second one is counted, not logged.
	publish(&d)
	testutil.WaitFor(t, 10*time.Second, "second counted", func() bool {
		return testutil.MetricSum(t, reg, "kvmesh_materializer_malformed_total") == 2
	})
	if n := strings.Count(logs.String(), "undecodable delta skipped"); n != 1 {
		t.Fatalf("%d warnings, want 1", n)
	}
}
