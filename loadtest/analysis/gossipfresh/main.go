// Command gossipfresh measures how fresh an ingress's view of engine load is
// as the mesh grows: real gossip.Node members on loopback in one process,
// S sidecars owning K engines each whose running count changes every -tick
// (as a busy engine's does), and I ingresses; the first ingress reads
// Engines() every 20 ms. With -nats an in-process NATS server carries the
// state lane (gossip/natsrelay: sidecars and ingresses publish, ingresses
// subscribe), as `kvmesh sidecar` and `kvmesh ingress` do with --nats;
// without it, gossip alone (--state-over-nats=false).
//
// It prints the staleness of the observed values (how long the view had
// been out of date when read: 0 when it held the newest) at p50/p90/p99/max,
// the share of all values set that the observer ever saw, and how often an
// engine was not listed at all.
//
//	go run ./loadtest/analysis/gossipfresh -sidecars 64 -engines 1 -dur 20s -nats
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/natsrelay"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

func main() {
	sidecars := flag.Int("sidecars", 16, "sidecar members")
	perSidecar := flag.Int("engines", 1, "engines per sidecar (DaemonSet mode when > 1)")
	ingresses := flag.Int("ingresses", 3, "ingress members (the first observes)")
	loras := flag.Int("loras", 0, "LoRA adapters per engine (32-byte names; dozens make an entry larger than a broadcast packet)")
	tick := flag.Duration("tick", 250*time.Millisecond, "how often each engine's load changes")
	dur := flag.Duration("dur", 20*time.Second, "measurement after a 3 s warm-up")
	useNATS := flag.Bool("nats", false, "run an in-process NATS server and the state lane")
	flag.Parse()
	if err := run(*sidecars, *perSidecar, *ingresses, *loras, *tick, *dur, *useNATS); err != nil {
		log.Fatal(err)
	}
}

type engine struct {
	node *gossip.Node
	id   string
}

func run(sidecars, perSidecar, ingresses, loras int, tick, dur time.Duration, useNATS bool) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var natsURL string
	if useNATS {
		srv, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		natsURL = srv.URL()
	}
	var (
		nodes []*gossip.Node
		conns []*nats.Conn
		wg    sync.WaitGroup
	)
	defer func() {
		cancel()
		wg.Wait() // publishers stopped before their connections close
		for _, n := range nodes {
			n.Shutdown()
		}
		for _, nc := range conns {
			nc.Close()
		}
	}()
	join := ""
	member := func(name, role string) (*gossip.Node, error) {
		c := gossip.DefaultConfig()
		c.Name, c.Logger = name, quiet
		c.Meta = gossip.NodeMeta{Role: role, ID: name}
		if join != "" {
			c.Join = []string{join}
		}
		var nc *nats.Conn
		if useNATS {
			var err error
			if nc, err = nats.Connect(natsURL); err != nil {
				return nil, err
			}
			conns = append(conns, nc)
			pub := natsrelay.NewPublisher(natsutil.Default(), quiet)
			c.Relay = pub
			wg.Add(1)
			go func() { defer wg.Done(); pub.Run(ctx, nc) }()
		}
		n, err := gossip.New(c)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
		if useNATS && role == gossip.RoleIngress {
			if _, err := natsrelay.Subscribe(nc, natsutil.Default(), n, quiet); err != nil {
				return nil, err
			}
		}
		return n, nil
	}
	obs, err := member("ingress-0", gossip.RoleIngress)
	if err != nil {
		return err
	}
	join = obs.Addr()
	for i := 1; i < ingresses; i++ {
		if _, err := member(fmt.Sprintf("ingress-%d", i), gossip.RoleIngress); err != nil {
			return err
		}
	}
	var names []string
	for i := range loras {
		names = append(names, fmt.Sprintf("tenant-adapter-%017d", i))
	}
	adapters := gossip.JoinLoRAs(names)
	var engines []engine
	for s := range sidecars {
		n, err := member(fmt.Sprintf("sidecar-%d", s), gossip.RoleSidecar)
		if err != nil {
			return err
		}
		for k := range perSidecar {
			engines = append(engines, engine{n, fmt.Sprintf("10.244.%d.%d:8000", s, k)})
		}
	}
	start := time.Now()
	for obs.NumMembers() < ingresses+sidecars && time.Since(start) < time.Minute {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("%d members joined in %v\n", obs.NumMembers(), time.Since(start).Round(time.Millisecond))

	// setAt[engine][v] is when the engine's running count became v.
	var mu sync.Mutex
	setAt := make(map[string]map[int]time.Time, len(engines))
	for _, e := range engines {
		setAt[e.id] = map[int]time.Time{}
	}
	wg.Add(1)
	go func() { // the engines' load; stopped by cancel
		defer wg.Done()
		t := time.NewTicker(tick)
		defer t.Stop()
		for v := 1; ; v++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			mu.Lock()
			for _, e := range engines {
				setAt[e.id][v] = now
			}
			mu.Unlock()
			for _, e := range engines {
				e.node.SetEngine(gossip.EngineState{ID: e.id, Model: "meta-llama/Llama-3.1-8B-Instruct", URL: "http://" + e.id,
					EngineRole: "mixed", DPSize: 1, BlockSize: 16, Running: v, Waiting: v % 7, KVUsage: 0.5, Ready: true,
					LoRAs: adapters, MaxModelLen: 131072, Root: "meta-llama/Llama-3.1-8B-Instruct"})
			}
		}
	}()
	time.Sleep(3 * time.Second) // warm-up

	var ages []float64
	seen := make(map[string]map[int]bool, len(engines))
	missing, rounds := 0, 0
	for end := time.Now().Add(dur); time.Now().Before(end); rounds++ {
		views := obs.Engines()
		now := time.Now()
		running := make(map[string]int, len(views))
		for _, v := range views {
			running[v.ID] = v.Running
		}
		mu.Lock()
		for _, e := range engines {
			r, ok := running[e.id]
			if !ok {
				missing++
				continue
			}
			age := 0.0 // the view holds the newest value
			if next, ok := setAt[e.id][r+1]; ok {
				age = now.Sub(next).Seconds()
			}
			ages = append(ages, age)
			if seen[e.id] == nil {
				seen[e.id] = map[int]bool{}
			}
			seen[e.id][r] = true
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if len(ages) == 0 {
		return fmt.Errorf("the observer never listed an engine")
	}
	slices.Sort(ages)
	q := func(p float64) float64 { return ages[int(p*float64(len(ages)-1))] }
	nseen := 0
	for _, m := range seen {
		nseen += len(m)
	}
	values := (int(dur/tick) + 1) * len(engines) // + the value current when the window opened
	lane := "gossip only"
	if useNATS {
		lane = "gossip + NATS state lane"
	}
	fmt.Printf("%s: %d sidecars × %d engines, %d ingresses, %d adapters: staleness p50 %.2fs p90 %.2fs p99 %.2fs max %.2fs; values seen %.0f%%; engine not listed in %d of %d samples\n",
		lane, sidecars, perSidecar, ingresses, loras, q(.5), q(.9), q(.99), ages[len(ages)-1],
		100*float64(nseen)/float64(values), missing, rounds*len(engines))
	return nil
}
