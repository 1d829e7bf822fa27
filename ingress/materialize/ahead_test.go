package materialize_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestCopyAheadOfGossipRepaired (gossip tester F3): a delta the sidecar
// never published (a forged one here: the sidecar's epoch, its next
// sequence, two extra keys) puts the copy of an idle engine ahead of
// gossip's head in the same epoch. Neither "behind" nor "mismatch at
// equal heads" matched it, so the wrong keys stayed until the engine's
// next real delta. Once gossip has stayed behind for AheadGrace with no
// delta coming, the copy is re-snapshotted (counted) and equals the
// engine again.
func TestCopyAheadOfGossipRepaired(t *testing.T) {
	srv := testutil.NATS(t)
	cache, sc := cacheEngine(t, srv.URL(), 16, 33)
	s := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	mem := &fakeMembership{}
	reg, idx := prometheus.NewRegistry(), meshtest.NewMapIndex()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer, cfg.Membership = nc, idx, reg, mem
	cfg.CheckInterval, cfg.DigestGrace, cfg.AheadGrace = 20*time.Millisecond, 50*time.Millisecond, 200*time.Millisecond
	m := startMaterializer(t, cfg) // overlap_test.go

	loadCache(t, cache, 20)
	testutil.WaitFor(t, 10*time.Second, "the copy equal to the engine", func() bool {
		st := m.Status()
		return len(st) == 1 && indexEquals(idx, cache, "e1") && st[0].Seq == s.Status()[0].Seq
	})
	// Gossip says what the sidecar published: the same head and digest.
	head := m.Status()[0].Digest
	mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: head}})

	forged := kvevents.Delta{Engine: "e1", Model: "m", Epoch: head.Head.Epoch, Seq: head.Head.Seq + 1, TS: time.Now().UnixNano(),
		Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{0xfeed_0001, 0xfeed_0002}}}}
	if err := nc.Publish(natsutil.Default().DeltaSubject("m", "e1"), kvevents.AppendDelta(nil, &forged)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the forged delta applied", func() bool { return m.Status()[0].Seq == head.Head.Seq+1 })

	// The engine stays idle; gossip stays at its real head.
	testutil.WaitFor(t, 10*time.Second, "the copy ahead of gossip repaired", func() bool {
		st := m.Status()[0]
		return counter(t, reg, "kvmesh_materializer_ahead_of_gossip_total") == 1 && st.Seq == head.Head.Seq && !st.Snapshotting && indexEquals(idx, cache, "e1")
	})
}
