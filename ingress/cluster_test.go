package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestClusterRoutesToCachedPrefix runs the real mesh on loopback: embedded
// NATS, two simulated engines emitting vLLM KV events, a sidecar each, and an
// ingress that learns the engines by gossip and their caches from NATS. A
// prefix cached on one engine (warmed directly, behind the ingress's back)
// must pull requests sharing it to that engine.
func TestClusterRoutesToCachedPrefix(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns := testutil.NATS(t)

	cfg := DefaultConfig()
	cfg.ID = "ingress-test"
	cfg.Scheduler.Policy = "kvmesh"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	newLimiter := func() *ratelimit.Limiter {
		rc := ratelimit.DefaultConfig()
		rc.PerKey = ratelimit.Limits{InputTokens: 5000}
		lim, err := ratelimit.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	lim1 := newLimiter()
	cfg1 := cfg
	cfg1.AdminListen = "127.0.0.1:0"
	s := startIngress(t, cfg1, Deps{Limiter: lim1})
	seed := s.GossipAddr()
	if seed == "" {
		t.Fatal("no gossip address")
	}

	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const model = "sim/tiny"
	sims := map[string]*sim.Server{}
	for i, id := range []string{"eng-a", "eng-b"} {
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			Engine: engine.Config{BlockSize: 16, GPUBlocks: 2048, Profile: prof}, TimeScale: 500, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		sims[id] = sm
		startSidecar(t, sidecar.EngineConfig{ID: id, Model: model, URL: sm.URL(), DPSize: 1,
			RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, ns.URL(), seed, quiet)
	}
	base := "http://" + s.Addr()
	testutil.WaitFor(t, 20*time.Second, "ingress ready with both engines known by gossip and healthy (their sidecars report ready)", func() bool {
		st, _, _ := get(base + "/ready")
		return st == 200 && healthyEngines(s) == 2
	})
	if st, body, _ := get(base + "/v1/models"); st != 200 || !strings.Contains(body, model) {
		t.Fatalf("/v1/models %d %s", st, body)
	}

	// Warm a 512-token prefix on eng-a only, directly.
	prefix := make([]string, 512)
	for i := range prefix {
		prefix[i] = fmt.Sprint(100 + i*7%3000)
	}
	warm := `{"model":"` + model + `","prompt":[` + strings.Join(prefix, ",") + `],"max_tokens":1}`
	if st, _, b := post(t, http.DefaultClient, sims["eng-a"].URL()+"/v1/completions", warm); st != 200 {
		t.Fatalf("warm: %d %s", st, b)
	}
	root := kvevents.Root(model, "", "")
	ids := make([]uint32, 512)
	for i := range ids {
		ids[i] = uint32(100 + i*7%3000)
	}
	keys := kvevents.AppendKeys(nil, root, ids, 16)
	testutil.WaitFor(t, 10*time.Second, "eng-a's warmed keys in the ingress index", func() bool {
		return s.deps.Index.KeyCount("eng-a", kvevents.TierGPU) >= len(keys)
	})

	// Requests sharing the prefix go to eng-a.
	for i := 0; i < 6; i++ {
		body := `{"model":"` + model + `","prompt":[` + strings.Join(prefix, ",") + `,` + fmt.Sprint(5000+i) + `,7,8,9],"max_tokens":2}`
		st, hdr, b := post(t, http.DefaultClient, base+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "eng-a" {
			t.Fatalf("request %d: %d via %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		var u usageBody
		_ = json.Unmarshal(b, &u)
	}

	// A second replica joins: it shares the first one's rate-limit usage
	// through gossip (in-flight sharing: TestInFlightSharedByGossip).
	cfg2 := cfg
	cfg2.ID = "ingress-test-2"
	cfg2.Cluster.GossipSeeds = []string{seed}
	s2 := startIngress(t, cfg2, Deps{Limiter: newLimiter()})
	testutil.WaitFor(t, 20*time.Second, "replica 2 knows both engines, healthy", func() bool { return healthyEngines(s2) == 2 })
	testutil.WaitFor(t, 10*time.Second, "replica 2's index synced", func() bool { return s2.deps.Synced() })
	// Replica 1 spends 6×516 + 3 + 2×900 = 4,899 of the key's 5,000 input
	// tokens per minute ...
	big := make([]string, 900)
	for i := range big {
		big[i] = fmt.Sprint(i + 1)
	}
	bigBody := `{"model":"` + model + `","prompt":[` + strings.Join(big, ",") + `],"max_tokens":1}`
	shared := func() string { return string(s2.cl.node.AppStates(rateLimitAppState)[cfg.ID]) }
	for i := 0; i < 2; i++ {
		if st, _, b := post(t, http.DefaultClient, base+"/v1/completions", bigBody); st != 200 {
			t.Fatalf("big request %d on replica 1: %d %s", i, st, b)
		}
	}
	// ... so replica 2 refuses the key once gossip has carried that usage
	// (alone it would admit five more 900-token requests).
	testutil.WaitFor(t, 10*time.Second, "replica 2 sees replica 1's rate-limit usage", func() bool { return shared() == string(lim1.AppendState(nil, 1024)) })
	st, _, b := post(t, http.DefaultClient, "http://"+s2.Addr()+"/v1/completions", bigBody)
	if st != 429 {
		t.Fatalf("replica 2 admitted a request of a key exhausted on replica 1: %d %s", st, b)
	}

	admin := "http://" + s.AdminAddr()
	if st, body, _ := get(base + "/debug/index"); st != 404 {
		t.Fatalf("/debug/index on the client port: %d %s", st, body)
	}
	if st, body, _ := get(admin + "/debug/index"); st != 200 || !strings.Contains(body, "eng-a") {
		t.Fatalf("/debug/index %d %s", st, body)
	}
	if st, body, _ := get(admin + "/metrics"); st != 200 || !strings.Contains(body, "kvmesh_ingress_index_keys") || !strings.Contains(body, `kvmesh_ingress_routing_decisions_total`) {
		t.Fatalf("/metrics %d", st)
	}
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Each replica's in-flight counts reach the others, and a replica's own
// counts are not double-counted in its view (it adds its live counters).
func TestInFlightSharedByGossip(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mk := func(name string, join ...string) *gossip.Node {
		gc := gossip.DefaultConfig()
		gc.Name, gc.Profile, gc.Join, gc.Logger = name, "local", join, quiet
		gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, 500*time.Millisecond
		gc.Meta = gossip.NodeMeta{Role: gossip.RoleIngress, ID: name}
		n, err := gossip.New(gc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Shutdown() })
		return n
	}
	n1 := mk("r1")
	n2 := mk("r2", n1.Addr())
	// An engine entry as a sidecar would gossip it.
	n1.SetEngine(gossip.EngineState{ID: "e", Model: "m", URL: "http://127.0.0.1:1", Running: 2, Ready: true})
	g1, g2 := &gossipMembership{}, &gossipMembership{}
	g1.node.Store(n1)
	g2.node.Store(n2)
	g1.ShareInFlight([]EngineLoad{{Engine: "e", InFlight: 3}})
	g2.ShareInFlight([]EngineLoad{{Engine: "e", InFlight: 1}})
	view := func(g *gossipMembership) (int, bool) {
		g.refresh()
		for _, e := range g.Engines(nil) {
			if e.ID == "e" {
				return e.InFlight, e.Healthy && e.Running == 2 && e.URL == "http://127.0.0.1:1"
			}
		}
		return -1, false
	}
	testutil.WaitFor(t, 10*time.Second, "each ingress sees the other's in-flight counts", func() bool {
		a, okA := view(g1)
		b, okB := view(g2)
		return okA && okB && a == 1 && b == 3 // each sees the other's
	})
	// The sidecar's readiness is the engine's health: not ready, not routed.
	n1.SetEngine(gossip.EngineState{ID: "e", Model: "m", URL: "http://127.0.0.1:1", Running: 2})
	testutil.WaitFor(t, 10*time.Second, "the unready engine to turn unhealthy on both", func() bool {
		a, okA := view(g1)
		b, okB := view(g2)
		return a == 1 && b == 3 && !okA && !okB
	})
}
