package materialize_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// snapshots is kvmesh_materializer_snapshots_total{result}.
func snapshots(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "kvmesh_materializer_snapshots_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A snapshot that no sidecar answers keeps the copy of an engine gossip
// still lists: its sidecar is alive and its NATS path is down or not back
// yet (after a NATS outage each sidecar finds its dead path on its own
// pings, seconds after the ingress reconnected and asked), and the engine's
// cache is what it was. Before, the copy was cleared, and a healthy engine
// lost its routing affinity until a retry found the sidecar (0 keys for up
// to a second after a NATS hang in the fault tester's runs). Once gossip
// drops the engine it is cleared.
func TestNoRespondersKeepsAnEngineGossipLists(t *testing.T) {
	f := newFixture(t)
	f.load(20)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", f.equal)
	head := f.m.Status()[0].Digest
	f.mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: head}})
	_ = f.sc.Close() // the sidecar's NATS side gone; gossip (the test's) still lists it

	ahead := head
	ahead.Head.Seq += 5 // gossip says the copy is behind: a snapshot is asked for
	f.mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: ahead}})
	testutil.WaitFor(t, 20*time.Second, "a snapshot no sidecar answered", func() bool {
		return snapshots(t, f.reg, "no_responders") >= 2
	})
	if !f.equal() {
		t.Fatalf("the copy of an engine gossip lists was changed by a snapshot no one answered: %d keys", len(f.idx.Keys("e1", 0)))
	}

	f.mem.set() // gossip drops it
	testutil.WaitFor(t, 10*time.Second, "engine cleared once gossip dropped it", func() bool { return len(f.idx.Engines()) == 0 })
}
