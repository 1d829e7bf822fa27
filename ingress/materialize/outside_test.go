package materialize_test

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestEnginesOutsideGossipCountedAndWarned (gossip tester F2): a gossip
// split-brain, two islands sharing NATS. The ingress's gossip member does
// not list the engine of the other island's sidecar, whose deltas it
// follows all the same: once they have kept coming for OutsideGossipAfter,
// kvmesh_materializer_engines_outside_gossip counts the engine and a
// warning names it. Bridging the islands lists it: the gauge is 0.
func TestEnginesOutsideGossipCountedAndWarned(t *testing.T) {
	srv := testutil.NATS(t)
	member := func(name, role string, join ...string) *gossip.Node {
		gc := gossip.DefaultConfig()
		gc.Name, gc.Profile, gc.Join, gc.Logger = name, "local", join, slog.New(slog.DiscardHandler)
		gc.BroadcastInterval, gc.RejoinInterval = 50*time.Millisecond, 100*time.Millisecond
		gc.Meta = gossip.NodeMeta{Role: role, ID: name}
		n, err := gossip.New(gc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		return n
	}
	islandA := member("ingress-a", gossip.RoleIngress) // the sidecar's island
	islandB := member("ingress-b", gossip.RoleIngress) // this ingress's: no seed in common

	cache, sc := cacheEngine(t, srv.URL(), 16, 21)
	sc.GossipInterval = 50 * time.Millisecond
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.Join, g.Logger = "sidecar-e1", "local", []string{islandA.Addr()}, slog.New(slog.DiscardHandler)
	g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1"}
	sc.Gossip = &g
	s := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	testutil.WaitFor(t, 10*time.Second, "island A lists e1", func() bool { _, ok := islandA.Engine("e1"); return ok })

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var logs testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	idx := meshtest.NewMapIndex()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer, cfg.Membership = nc, idx, reg, islandB
	cfg.CheckInterval, cfg.OutsideGossipAfter = 20*time.Millisecond, 300*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	m := startMaterializer(t, cfg) // overlap_test.go

	gauge := func() float64 { return testutil.MetricSum(t, reg, "kvmesh_materializer_engines_outside_gossip") }
	loadCache(t, cache, 5) // the first deltas: not outside yet (an engine joining looks the same)
	testutil.WaitFor(t, 10*time.Second, "e1 followed from its deltas", func() bool { return len(m.Status()) == 1 })
	if v := gauge(); v != 0 {
		t.Fatalf("kvmesh_materializer_engines_outside_gossip %v at the engine's first deltas", v)
	}
	// Deltas keep coming, gossip never lists it.
	testutil.WaitFor(t, 20*time.Second, "e1 counted outside gossip", func() bool {
		loadCache(t, cache, 1)
		return gauge() == 1
	})
	if got := m.OutsideGossip(); !slices.Equal(got, []string{"e1"}) || m.Status()[0].InGossip {
		t.Fatalf("outside gossip %v, status %+v", got, m.Status()[0])
	}
	testutil.WaitFor(t, 10*time.Second, "the warning naming e1", func() bool {
		l := logs.String()
		return strings.Contains(l, "level=WARN") && strings.Contains(l, "gossip does not list them") && strings.Contains(l, "engines=[e1]")
	})

	// A bridge: island B joins island A. The engine is listed, the gauge 0.
	if _, err := islandB.Join([]string{islandA.Addr()}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "e1 listed once the islands merged", func() bool {
		return gauge() == 0 && len(m.Status()) == 1 && m.Status()[0].InGossip
	})
}
