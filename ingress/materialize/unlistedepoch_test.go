package materialize_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestEpochGossipListsWinsOverAnotherDeployments (tester h-natsops F2):
// two installations on one NATS, each with a sidecar of engine e1. This
// ingress's gossip lists its own sidecar's epoch; the other installation's
// sidecar, started later, has the newer epoch, which won: the ingress
// indexed the other installation's cache for e1, silently, for as long as
// both ran. Now deltas from an epoch gossip has not listed for
// OutsideGossipAfter are counted and warned about, and the epoch gossip
// lists is followed again and kept, the other's deltas ignored. With an
// epoch grace longer than the test, only gossip's word brings ours back.
func TestEpochGossipListsWinsOverAnotherDeployments(t *testing.T) {
	unlistedEpochRun(t, time.Hour)
}

// TestEpochGossipListsKeptThroughSilence: with a short epoch grace, ours
// idle while the other's stays busy took the other's epoch back each time
// (the switch to an older epoch whose deltas keep coming while the
// followed one is silent); an epoch gossip has not listed for
// OutsideGossipAfter is not switched to that way.
func TestEpochGossipListsKeptThroughSilence(t *testing.T) {
	unlistedEpochRun(t, 50*time.Millisecond)
}

func unlistedEpochRun(t *testing.T, epochGrace time.Duration) {
	srv := testutil.NATS(t)
	ours, scOurs := cacheEngine(t, srv.URL(), 16, 21)
	sOurs := meshtest.StartSidecar(t, scOurs)
	testutil.WaitFor(t, 10*time.Second, "our sidecar ready", sOurs.Ready)
	other, scOther := cacheEngine(t, srv.URL(), 16, 22) // the other installation's e1, newer
	sOther := meshtest.StartSidecar(t, scOther)
	testutil.WaitFor(t, 10*time.Second, "the other sidecar ready", sOther.Ready)
	ourEpoch := sOurs.Status()[0].Epoch
	if ourEpoch == sOther.Status()[0].Epoch {
		t.Fatal("both sidecars have one epoch")
	}

	mem := &fakeMembership{}
	// Gossip lists our epoch; its head stays put, and the head checks are
	// kept out of this test (DigestGrace, AheadGrace).
	mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m",
		Digest: kvevents.EngineDigest{Head: kvevents.Head{Epoch: ourEpoch}}}})
	cfg, idx, reg := materializerConfig(t, srv.URL())
	var logs testutil.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Membership = mem
	cfg.CheckInterval, cfg.OutsideGossipAfter = 20*time.Millisecond, 300*time.Millisecond
	cfg.DigestGrace, cfg.AheadGrace, cfg.IdleCheck = time.Hour, time.Hour, time.Hour
	cfg.EpochGrace = epochGrace
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	// The other installation's sidecar publishes first: its newer epoch is
	// followed, as a restarted sidecar's would be.
	loadCache(t, other, 3)
	followsOurs := func() bool {
		st := m.Status()
		return len(st) == 1 && st[0].Epoch == ourEpoch && !st[0].Snapshotting && indexEquals(idx, ours, "e1")
	}
	// Both keep publishing: once the other's epoch has gone unlisted for
	// OutsideGossipAfter, ours is followed again.
	testutil.WaitFor(t, 30*time.Second, "our sidecar's epoch followed, our cache indexed", func() bool {
		loadCache(t, other, 1)
		loadCache(t, ours, 1)
		return followsOurs()
	})
	testutil.WaitFor(t, 10*time.Second, "the unlisted epoch warned about", func() bool {
		l := logs.String()
		return strings.Contains(l, "level=WARN") && strings.Contains(l, "gossip does not list for it") && strings.Contains(l, "engine=e1")
	})
	if counter(t, reg, "kvmesh_materializer_unlisted_epoch_deltas_total") == 0 {
		t.Fatal("kvmesh_materializer_unlisted_epoch_deltas_total 0")
	}
	// And kept: the other's deltas, busy while ours idles, do not take it
	// back (the silent-epoch switch is not for an epoch gossip does not list).
	stale := counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total")
	testutil.WaitFor(t, 20*time.Second, "the other's deltas ignored past the epoch grace", func() bool {
		loadCache(t, other, 1)
		return counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total") >= stale+20
	})
	if !followsOurs() {
		t.Fatalf("the other installation's epoch taken back: %+v", m.Status())
	}
}
