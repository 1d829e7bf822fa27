package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// TestPDGossipGroupsAndPrefillLoads runs two ingresses and a member
// gossiping three simulated NIXL engines' states (as their sidecars do) on
// loopback memberlist:
//   - the P/D group reaches the P/D step through the ingress's engine
//     snapshot: the prefill engine pairs only with the decode engine of its
//     group, though the other decode engine is idle and this one busy;
//   - one ingress's prefill legs (in flight and queued at its admission)
//     are visible to the other through gossip, not to itself twice.
func TestPDGossipGroupsAndPrefillLoads(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}, Prefill: 1, Decode: 2})

	cfg := DefaultConfig()
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.PD.Policy = "kvmesh-always"
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local"}
	cfgA := cfg
	cfgA.ID = "ingress-a"
	a := startIngress(t, cfgA, Deps{})
	cfgB := cfg
	cfgB.ID = "ingress-b"
	cfgB.Cluster.GossipSeeds = []string{a.GossipAddr()}
	b := startIngress(t, cfgB, Deps{})

	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.BindAddr, gc.BindPort = "sidecars", "local", "127.0.0.1", 0
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "sidecars"}
	gc.Join = []string{a.GossipAddr()}
	gc.Logger = quiet
	sc, err := gossip.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	sc.SetEngine(gossip.EngineState{ID: "p0", Model: "m", URL: cl.Prefill[0].URL(), EngineRole: "prefill", Ready: true, Group: "llama-1"})
	sc.SetEngine(gossip.EngineState{ID: "d0", Model: "m", URL: cl.Decode[0].URL(), EngineRole: "decode", Ready: true, Group: "llama-0"})
	sc.SetEngine(gossip.EngineState{ID: "d1", Model: "m", URL: cl.Decode[1].URL(), EngineRole: "decode", Ready: true, Group: "llama-1",
		Running: 40, Waiting: 10, KVUsage: 0.6})
	for _, s := range []*Server{a, b} {
		testutil.WaitFor(t, 20*time.Second, s.cfg.ID+" knows the three engines by gossip", func() bool { return healthyEngines(s) == 3 })
	}

	for i := 0; i < 4; i++ {
		body := `{"model":"m","prompt":"group ` + strings.Repeat("word ", 50+i) + `","max_tokens":2}`
		st, hdr, out := post(t, http.DefaultClient, "http://"+a.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d1" {
			t.Fatalf("request %d: status %d engine %q body %s; want d1, the decode engine of p0's group", i, st, hdr.Get("X-Kvmesh-Engine"), out)
		}
	}
	if ok := val(a.pdInit().legs.WithLabelValues("prefill", "ok")); ok != 4 {
		t.Fatalf("%v prefill legs ok, want 4", ok)
	}

	// Two legs in flight and three queued on p0 at ingress a.
	g := a.pdInit().gate("p0")
	g.slots <- struct{}{}
	g.slots <- struct{}{}
	g.waiting.Add(3)
	t.Cleanup(func() { <-g.slots; <-g.slots; g.waiting.Add(-3) })
	if v, q := val(a.pdInit().legsNow), val(a.pdInit().queued); v != 2 || q != 3 {
		t.Fatalf("gauges: %v prefill legs in flight, %v queued; want 2 and 3", v, q)
	}
	testutil.WaitFor(t, 20*time.Second, "ingress b sees ingress a's prefill legs on p0", func() bool {
		for _, e := range b.deps.Membership.Engines(nil) {
			if e.ID == "p0" {
				return e.PrefillLegs == 2 && e.PrefillQueued == 3 && e.InFlight >= 3 && e.Group == "llama-1"
			}
		}
		return false
	})
	for _, e := range a.deps.Membership.Engines(nil) {
		if e.ID == "p0" && (e.PrefillLegs != 0 || e.PrefillQueued != 0) {
			t.Fatalf("ingress a counts its own prefill legs as others': %+v", e)
		}
	}
}
