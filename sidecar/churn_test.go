package sidecar_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// Engine churn: an engine process replaced at its address (another model,
// another block size) while its sidecar keeps running, with the simulator
// as the engine over loopback HTTP and ZMQ.

// simAddrs are where a simulator listens; the zero value takes free ports.
type simAddrs struct{ http, events, replay string }

// startSimAt starts a simulator serving model in blocks of blockSize at a,
// closed when the test ends (Close is idempotent: a test may close it
// first to start another at the same addresses).
func startSimAt(t *testing.T, model string, blockSize int, a simAddrs) (*sim.Server, simAddrs) {
	t.Helper()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if a == (simAddrs{}) {
		a = simAddrs{"127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"}
	}
	srv, err := sim.Start(context.Background(), sim.Config{
		Model: model, HTTPAddr: a.http, KVEvents: a.events, KVReplay: a.replay,
		Engine:    engine.Config{BlockSize: blockSize, GPUBlocks: 256, Profile: prof},
		TimeScale: 1000, Seed: 1, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv, simAddrs{srv.HTTPAddr(), srv.EventsEndpoint(0), srv.ReplayEndpoint(0)}
}

// complete sends one completion of prompt to srv as model.
func complete(t *testing.T, srv *sim.Server, model string, prompt []int) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":1}`, model, strings.ReplaceAll(fmt.Sprint(prompt), " ", ","))
	resp, err := http.Post(srv.URL()+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// observer is an ingress-role gossip member: what the ingresses see.
func observer(t *testing.T) *gossip.Node {
	t.Helper()
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.Meta = "observer", "local", gossip.NodeMeta{Role: gossip.RoleIngress, ID: "observer"}
	gc.Logger = slog.New(slog.DiscardHandler)
	n, err := gossip.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// churnSidecar runs a sidecar for the engine id serving model at srv,
// polling it at test speed, joined to obs, logging to logs.
func churnSidecar(t *testing.T, id, model string, srv *sim.Server, obs *gossip.Node, logs *testutil.SyncBuffer) *sidecar.Sidecar {
	t.Helper()
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: id, Model: model, URL: srv.URL(), Events: srv.EventsEndpoint(0), Replay: srv.ReplayEndpoint(0)}}
	cfg.NATS.URLs = []string{testutil.NATS(t).URL()}
	cfg.ScrapeInterval, cfg.ModelsInterval, cfg.GossipInterval, cfg.IdleProbe = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond, 200*time.Millisecond
	cfg.Logger, cfg.Registerer = slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry()
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.Join, g.Logger = "sidecar-"+id, "local", []string{obs.Addr()}, slog.New(slog.DiscardHandler)
	g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: id}
	cfg.Gossip = &g
	return meshtest.StartSidecar(t, cfg)
}

// gossiped waits until obs sees engine id in a state cond accepts.
func gossiped(t *testing.T, obs *gossip.Node, id, what string, cond func(gossip.EngineView) bool) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, what, func() bool {
		v, ok := obs.Engine(id)
		return ok && cond(v)
	})
}

// An engine restarted in place with another model (its sidecar kept) is
// gossiped as not ready, so the ingresses stop sending it this model's
// requests, and ready again once the model is back (churn report F1).
func TestEngineServingAnotherModelIsNotReady(t *testing.T) {
	obs := observer(t)
	a, addrs := startSimAt(t, "A", 4, simAddrs{})
	var logs testutil.SyncBuffer
	s := churnSidecar(t, "e2", "A", a, obs, &logs)
	gossiped(t, obs, "e2", "e2 ready, model A", func(v gossip.EngineView) bool { return v.Ready && v.Model == "A" })

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := startSimAt(t, "B", 4, addrs) // the same address, another model
	gossiped(t, obs, "e2", "e2 not ready while it serves B", func(v gossip.EngineView) bool { return !v.Ready })
	if st := s.Status()[0]; st.ModelMismatch != "engine serves B" {
		t.Fatalf("status while the engine serves B: %+v", st)
	}
	if !strings.Contains(logs.String(), "engine does not serve the configured model") || !strings.Contains(logs.String(), "configured=A served=B") {
		t.Fatalf("no error naming both models:\n%s", logs.String())
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	startSimAt(t, "A", 4, addrs)
	gossiped(t, obs, "e2", "e2 ready again with A back", func(v gossip.EngineView) bool { return v.Ready })
	if st := s.Status()[0]; st.ModelMismatch != "" {
		t.Fatalf("status once A is back: %+v", st)
	}
}

// An engine restarted in place with another block size: the sidecar
// gossips the new size (the ingresses key this engine's requests with it)
// and holds only keys made with it, the engine's own (churn report F2).
func TestEngineRestartedWithAnotherBlockSize(t *testing.T) {
	obs := observer(t)
	a, addrs := startSimAt(t, "m", 4, simAddrs{})
	var logs testutil.SyncBuffer
	s := churnSidecar(t, "e2", "m", a, obs, &logs)
	prompt := make([]int, 32)
	for i := range prompt {
		prompt[i] = i + 1
	}
	if code := complete(t, a, "m", prompt); code != http.StatusOK {
		t.Fatalf("completion: %d", code)
	}
	gossiped(t, obs, "e2", "block size 4", func(v gossip.EngineView) bool { return v.BlockSize == 4 })

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := startSimAt(t, "m", 8, addrs)
	if code := complete(t, b, "m", prompt[:24]); code != http.StatusOK {
		t.Fatalf("completion: %d", code)
	}
	gossiped(t, obs, "e2", "block size 8", func(v gossip.EngineView) bool { return v.BlockSize == 8 })
	want := b.CachedKeys(0, kvevents.TierGPU)
	slices.Sort(want)
	testutil.WaitFor(t, 10*time.Second, "the sidecar's keys to be the new engine's", func() bool {
		keys, _ := s.Keys("e2")
		got := keys[kvevents.TierGPU]
		slices.Sort(got)
		return len(want) > 0 && slices.Equal(got, want)
	})
	if !strings.Contains(logs.String(), "engine block size changed") || !strings.Contains(logs.String(), "from=4 to=8") {
		t.Fatalf("no warning of the change:\n%s", logs.String())
	}
}
