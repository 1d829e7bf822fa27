package mesh

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestConvergesThroughFaults drives two small caches (one with a CPU tier)
// through one DaemonSet-mode sidecar to two materializers, and checks exact
// equality after load and after each fault. meshtest.Cache gives the test
// exact control over the engine's event stream (drops, restarts, clears).
func TestConvergesThroughFaults(t *testing.T) {
	top := t // resources started in subtests live until the whole test ends
	ns := startNATS(t)
	key := []byte("kvmesh-test-key!")
	seed := startIngress(t, "ingress-0", ns.url(), gossipConfig("ingress-0", gossip.RoleIngress, key))
	join := seed.node.Addr()
	ins := []*ingress{seed, startIngress(t, "ingress-1", ns.url(), gossipConfig("ingress-1", gossip.RoleIngress, key, join))}

	caches := map[string]*meshtest.Cache{}
	truths := map[string]truthFunc{}
	var engines []sidecar.EngineConfig
	for i, cpu := range []int{0, 24} {
		id := fmt.Sprintf("engine-%d", i)
		c, err := meshtest.NewCache("test/model", 4, 32, cpu, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Pub.Close() })
		caches[id] = c
		truths[id] = c.Truth
		engines = append(engines, sidecar.EngineConfig{ID: id, Model: "test/model", Events: c.Pub.Endpoint(), Replay: c.Pub.ReplayEndpoint(), MetricsURL: "-"})
	}
	scCfg := func() sidecar.Config {
		c := sidecar.DefaultConfig()
		c.Engines = engines
		c.NATS = natsConfig(ns.url())
		c.Gossip = gossipConfig(fmt.Sprintf("sidecar-%d", time.Now().UnixNano()), gossip.RoleSidecar, key, join)
		c.GossipInterval = 50 * time.Millisecond
		c.SnapshotChunkKeys = 5 // many chunks per snapshot, spanning tiers
		c.MaxDeltaKeys = 7      // large change sets span several deltas
		return c
	}
	sc := startSidecar(t, scCfg())

	load := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			for _, c := range caches {
				if err := c.Request(c.RandomPrompt(6, 3, 6)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}

	load(200)
	waitConverged(t, "random load", ins, truths)

	t.Run("zmq batches dropped → replay", func(t *testing.T) {
		for _, c := range caches {
			c.Pub.DropNext(5)
		}
		load(20)
		waitConverged(t, "after drops", ins, truths)
	})

	t.Run("sidecar restarted → new epoch", func(t *testing.T) {
		old := sc.Status()[0].Epoch
		sc.stop(t)
		load(30) // events while no sidecar runs: the new one replays them from seq 0
		sc = startSidecar(top, scCfg())
		if sc.Status()[0].Epoch == old {
			t.Fatal("same epoch after restart")
		}
		load(10)
		waitConverged(t, "after sidecar restart", ins, truths)
	})

	t.Run("ingress restarted → snapshot catch-up of idle engines", func(t *testing.T) {
		ins[1].stop()
		ins[1] = startIngress(top, "ingress-1b", ns.url(), gossipConfig("ingress-1b", gossip.RoleIngress, key, join))
		// No load: the engines are idle, the new ingress must find them by itself.
		waitConverged(t, "after ingress restart", ins, truths)
		testutil.WaitFor(t, 5*time.Second, "synced", ins[1].m.Synced)
	})

	t.Run("nats server restarted", func(t *testing.T) {
		ns.restart()
		load(30)
		waitConverged(t, "after nats restart", ins, truths)
	})

	t.Run("engine restarted → sequence reset", func(t *testing.T) {
		for _, c := range caches {
			c.Restart()
			c.Pub.Restart()
		}
		load(40)
		waitConverged(t, "after engine restart", ins, truths)
	})

	t.Run("reset_prefix_cache → clear", func(t *testing.T) {
		for _, c := range caches {
			if err := c.Clear(); err != nil {
				t.Fatal(err)
			}
		}
		waitConverged(t, "after clear", ins, truths)
		for _, in := range ins {
			if n := in.m.KeyCount(); n != 0 {
				t.Fatalf("%s holds %d keys after clear", in.name, n)
			}
		}
		load(20)
		waitConverged(t, "load after clear", ins, truths)
	})

	t.Run("dead sidecar → engines cleared everywhere", func(t *testing.T) {
		sc.stop(t) // leaves gossip: every ingress drops the engines
		for _, in := range ins {
			testutil.WaitFor(t, 15*time.Second, in.name+" drops the engines", func() bool {
				return len(in.idx.Engines()) == 0 && len(in.m.Status()) == 0
			})
		}
	})
	_ = kvevents.TierGPU
}
