package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// The ingress knows an engine's KV capacity, which P/D's kvwait term and
// llm-d's autotune are sized by: the simulator reports it as vLLM does
// (vllm:cache_config_info's num_gpu_blocks), its sidecar scrapes and
// gossips it, and the ingress's engine view (the scheduler's input, shown
// on /debug/engines) carries it as GPUBlocks.
func TestEngineCapacityFromSidecar(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns := testutil.NATS(t)
	cfg := DefaultConfig()
	cfg.ID = "ingress-capacity"
	cfg.AdminListen = "127.0.0.1:0"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	s := startIngress(t, cfg, Deps{})

	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const model, blocks = "sim/tiny", 3000
	sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		Engine: engine.Config{BlockSize: 16, GPUBlocks: blocks, Profile: prof}, TimeScale: 500, Seed: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	if st, body, _ := get(sm.URL() + "/metrics"); st != 200 || !strings.Contains(body, `num_gpu_blocks="3000"`) {
		t.Fatalf("the simulator's /metrics (%d) reports no num_gpu_blocks of 3000", st)
	}
	startSidecar(t, sidecar.EngineConfig{ID: "eng-a", Model: model, URL: sm.URL(), DPSize: 1,
		RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, ns.URL(), s.GossipAddr(), quiet)

	testutil.WaitFor(t, 20*time.Second, "the engine known by gossip, healthy, with its capacity", func() bool {
		es := s.deps.Membership.Engines(nil)
		return len(es) == 1 && es[0].Healthy && es[0].GPUBlocks == blocks
	})
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/engines", "")
	var view []struct {
		ID        string
		GPUBlocks int
	}
	if err := json.Unmarshal([]byte(body), &view); st != 200 || err != nil || len(view) != 1 || view[0].ID != "eng-a" || view[0].GPUBlocks != blocks {
		t.Fatalf("/debug/engines %d (%v): %s", st, err, body)
	}
}
