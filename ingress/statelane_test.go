package ingress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/natsrelay"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// The NATS state lane end to end: a real sidecar and the ingress publish
// their entries on kvmesh.state.<member>, and the ingress merges an
// engine's new load from the lane although gossip cannot carry it (an
// entry too large for a broadcast packet, a peer that never pushes/pulls).
func TestStateLaneCarriesLoadToIngress(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns := testutil.NATS(t)
	watch, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	var mu sync.Mutex
	subjects := map[string]bool{}
	if _, err := watch.Subscribe(natsutil.Default().StateWildcard(), func(m *nats.Msg) {
		mu.Lock()
		subjects[m.Subject] = true
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	seen := func(member string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return subjects[natsutil.Default().StateSubject(member)]
		}
	}

	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.ID = "ingress-lane"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	s := startIngress(t, cfg, Deps{Registry: reg})
	testutil.WaitFor(t, 10*time.Second, "the ingress's in-flight entry on its state subject", seen("ingress-lane"))

	// A real sidecar publishes its engine's entry on its subject.
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	sm, err := sim.Start(context.Background(), sim.Config{Model: "sim/tiny", KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		Engine: engine.Config{BlockSize: 16, GPUBlocks: 256, Profile: prof}, TimeScale: 500, Seed: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	startSidecar(t, sidecar.EngineConfig{ID: "eng-s", Model: "sim/tiny", URL: sm.URL(), DPSize: 1,
		RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, ns.URL(), s.GossipAddr(), quiet)
	testutil.WaitFor(t, 20*time.Second, "the sidecar's entry on its state subject", seen("sidecar-eng-s"))

	// A member whose new load only the lane carries.
	pub := natsrelay.NewPublisher(natsutil.Default(), quiet)
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.Join = "sidecar-big", "local", []string{s.GossipAddr()}
	gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, time.Hour
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "sidecar-big"}
	gc.Logger = quiet
	gc.Relay = pub
	node, err := gossip.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	pnc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pnc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { pub.Run(ctx, pnc) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	names := make([]string, 40)
	for i := range names {
		names[i] = fmt.Sprintf("customer-adapter-finetune-v2-%03d", i)
	}
	loras := gossip.JoinLoRAs(names)
	for _, running := range []int{3, 9, 4} {
		node.SetEngine(gossip.EngineState{ID: "eng-big", Model: "sim/tiny", URL: "http://127.0.0.1:1", LoRAs: loras, Running: running, Ready: true})
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("the ingress sees running=%d", running), func() bool {
			v, ok := s.cl.node.Engine("eng-big")
			return ok && v.Running == running
		})
	}
	testutil.WaitFor(t, 5*time.Second, "entries counted as received from the lane", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvmesh_gossip_relay_received_total" {
				return mf.GetMetric()[0].GetCounter().GetValue() >= 1
			}
		}
		return false
	})
}
