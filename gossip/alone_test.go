package gossip

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestAloneMemberWarnsAndSaysSo: a member whose seeds do not answer (a
// dead seed here; a wrong gossip key or a partition look the same to it)
// is alone: kvmesh_gossip_alone is 1, and it warns while it lasts (at
// most once per aloneWarnEvery, a minute in production), not only at
// debug. Once the seed is up it joins, says so, and the gauge is 0. A
// member without seeds is never alone in this sense.
func TestAloneMemberWarnsAndSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seedAddr := ln.Addr().String()
	_ = ln.Close() // nothing listens there: the seed is dead

	var logs testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	c := testConfig("lonely", RoleSidecar, nil, seedAddr)
	c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c.Registerer = reg
	c.aloneWarnEvery = time.Millisecond
	n := start(t, c)

	if n.EverJoined() {
		t.Fatal("joined before any seed answered")
	}
	if !n.Alone() || testutil.MetricSum(t, reg, "kvmesh_gossip_alone") != 1 || testutil.MetricSum(t, reg, "kvmesh_gossip_members") != 1 {
		t.Fatalf("alone %v, kvmesh_gossip_alone %v, members %v", n.Alone(), testutil.MetricSum(t, reg, "kvmesh_gossip_alone"), testutil.MetricSum(t, reg, "kvmesh_gossip_members"))
	}
	testutil.WaitFor(t, 10*time.Second, "the alone warnings of failed rejoins", func() bool {
		return strings.Count(logs.String(), "level=WARN msg=\"gossip member alone") >= 2
	})

	sc := testConfig("seed", RoleIngress, nil)
	sc.BindAddr, sc.BindPort = addrParts(t, seedAddr)
	seed := start(t, sc)
	testutil.WaitFor(t, 15*time.Second, "the member to join the seed", func() bool { return n.NumMembers() == 2 && !n.Alone() })
	if v := testutil.MetricSum(t, reg, "kvmesh_gossip_alone"); v != 0 {
		t.Fatalf("kvmesh_gossip_alone %v once joined", v)
	}
	testutil.WaitFor(t, 10*time.Second, "the end of the alone spell logged", func() bool {
		return strings.Contains(logs.String(), "gossip member no longer alone")
	})
	if seed.Alone() || !n.EverJoined() { // no seeds: never alone
		t.Fatalf("seed alone %v; member ever joined %v", seed.Alone(), n.EverJoined())
	}
}
