package materialize_test

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// An engine id that comes back serving another model with no gap in
// gossip (a StatefulSet pod or a DaemonSet slot restarted within
// GoneAfter with another --model, the id being the pod's name or
// address) is a new engine: its old key set is dropped and the new
// model's sidecar snapshotted. Before, the materializer kept asking the
// old model's snapshot subject (no responders, for as long as the id
// stayed in gossip) and the engine had no cache affinity at any ingress.
// With gossip the change is gossip's; without it, the newer sidecar's
// deltas tell it.
func TestEngineIDServingAnotherModel(t *testing.T) {
	for _, withGossip := range []bool{true, false} {
		name := map[bool]string{true: "gossip", false: "no gossip"}[withGossip]
		t.Run(name, func(t *testing.T) {
			srv := testutil.NATS(t)
			startSidecar := func(model string, seed uint64) (*meshtest.Cache, *sidecar.Sidecar) {
				cache, err := meshtest.NewCache(model, 4, 16, 0, seed)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cache.Pub.Close() })
				sc := sidecar.DefaultConfig()
				sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: model, Events: cache.Pub.Endpoint(),
					Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
				sc.NATS.URLs = []string{srv.URL()}
				s := meshtest.StartSidecar(t, sc)
				testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
				return cache, s
			}
			load := func(c *meshtest.Cache, n int) {
				for range n {
					if err := c.Request(c.RandomPrompt(3, 2, 3)); err != nil {
						t.Fatal(err)
					}
				}
			}
			cache, old := startSidecar("m", 3)

			cfg, idx, reg := materializerConfig(t, srv.URL())
			mem := &fakeMembership{}
			if withGossip {
				mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m"}})
				cfg.Membership = mem
			}
			cfg.CheckInterval = 20 * time.Millisecond
			m := startMaterializer(t, cfg)
			holds := func(c *meshtest.Cache, model string) func() bool {
				return func() bool {
					st := m.Status()
					truth, got := c.Truth()[kvevents.TierGPU], idx.Keys("e1", kvevents.TierGPU)
					if len(st) != 1 || st[0].Model != model || !st[0].Synced || len(got) != len(truth) || len(idx.Problems()) > 0 {
						return false
					}
					for i := range got {
						if got[i] != truth[i] {
							return false
						}
					}
					return true
				}
			}
			load(cache, 20)
			testutil.WaitFor(t, 20*time.Second, "the index holds the engine's model m keys", holds(cache, "m"))

			// The id comes back serving m2: the old sidecar stops, the new
			// one starts at once, and gossip (when there is gossip) names
			// the new model with no gap.
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			cache2, _ := startSidecar("m2", 4)
			if withGossip {
				mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m2"}})
			}
			load(cache2, 20)
			testutil.WaitFor(t, 20*time.Second, "the index holds the engine's model m2 keys", holds(cache2, "m2"))
			if n := counter(t, reg, "kvmesh_materializer_engine_model_changes_total"); n != 1 {
				t.Fatalf("%v model changes counted, want 1", n)
			}
		})
	}
}
