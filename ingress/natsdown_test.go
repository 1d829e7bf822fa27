package ingress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// An ingress and a sidecar started before NATS (a fresh install, a restart
// during an outage) run instead of exiting, and once NATS comes up on the
// configured address the sidecar creates the stream and publishes, and the
// ingress discovers the engine and indexes its cache — no restart.
func TestStartsBeforeNATS(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gate := testutil.NewGate(t) // NATS is down until the gate opens onto it below
	url := "nats://" + gate.Addr()

	cfg := DefaultConfig()
	cfg.ID = "ingress-before-nats"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{url}}
	s := startIngress(t, cfg, Deps{}) // fails the test if the ingress cannot start
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const model = "sim/tiny"
	sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		Engine: engine.Config{BlockSize: 16, GPUBlocks: 2048, Profile: prof}, TimeScale: 500, Seed: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	startSidecar(t, sidecar.EngineConfig{ID: "eng-a", Model: model, URL: sm.URL(), DPSize: 1,
		RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, url, s.GossipAddr(), quiet)
	base := "http://" + s.Addr()
	testutil.WaitFor(t, 20*time.Second, "the sidecar's engine known by gossip", func() bool {
		return len(s.deps.Membership.Engines(nil)) == 1
	})
	if st, body, _ := get(base + "/ready"); st != 503 {
		t.Fatalf("/ready %d %s without NATS (no index sync, no grace): want 503", st, body)
	}

	ns, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	gate.Open(strings.TrimPrefix(ns.URL(), "nats://"))
	var ready string
	testutil.WaitFor(t, 30*time.Second, "ingress ready with the engine healthy once NATS is up", func() bool {
		var st int
		st, ready, _ = get(base + "/ready")
		return st == 200 && healthyEngines(s) == 1
	})
	// Connected: /ready says the index is not stale.
	if !strings.Contains(ready, `"index_stale_seconds": 0`) {
		t.Fatalf("/ready %s", ready)
	}
	// A prompt through the ingress: the engine's KV events reach the ingress's
	// index by way of the sidecar and NATS.
	if st, _, b := post(t, http.DefaultClient, base+"/v1/completions", `{"model":"sim/tiny","prompt":[`+ids(64)+`],"max_tokens":2}`); st != 200 {
		t.Fatalf("request: %d %s", st, b)
	}
	testutil.WaitFor(t, 20*time.Second, "the engine's blocks in the ingress's index", func() bool {
		for _, e := range s.cl.mat.Status() {
			if e.Engine == "eng-a" && e.Synced && e.Keys[0] > 0 {
				return true
			}
		}
		return false
	})
}

func ids(n int) string {
	b := make([]byte, 0, 4*n)
	for i := 0; i < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d", 100+i)
	}
	return string(b)
}

// With NATS unreachable, an ingress is ready once its index sync grace has
// passed (routing on load until NATS answers), and says so.
func TestReadyAfterIndexSyncGrace(t *testing.T) {
	url := "nats://" + testutil.NewGate(t).Addr() // never opened: NATS stays down
	good := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: good.url()})
	cfg.Cluster = ClusterConfig{NATSURLs: []string{url}, IndexSyncGrace: 200 * time.Millisecond}
	s := startIngress(t, cfg, Deps{})
	base := "http://" + s.Addr()
	var body string
	testutil.WaitFor(t, 10*time.Second, "ready after the grace", func() bool {
		var st int
		st, body, _ = get(base + "/ready")
		return st == 200
	})
	if !strings.Contains(body, `"index_synced": false`) || !strings.Contains(body, `"index_sync_grace_passed": true`) {
		t.Fatalf("/ready %s", body)
	}
	if st, hdr, b := post(t, http.DefaultClient, base+"/v1/completions", `{"model":"m","prompt":[1,2]}`); st != 200 || hdr.Get("X-Kvmesh-Engine") != "e" {
		t.Fatalf("request without NATS: %d %s", st, b)
	}
}
