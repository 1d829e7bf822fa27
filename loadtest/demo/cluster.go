package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
)

// mesh is every component of one demo, started in dependency order and stopped in
// reverse. Its methods are called from Run's goroutine only.
type mesh struct {
	cfg       Config
	nats      *natsutil.Embedded
	sims      []*sim.Server
	sidecars  []*sidecar.Sidecar
	scDone    []chan error
	engineIDs []string
	seed      string // gossip address every later member joins
	ingresses []*ingress.Server
}

// startEngines starts NATS, then each engine with its sidecar.
func (m *mesh) startEngines(ctx context.Context) error {
	port := -1 // a free port
	if m.cfg.PortBase != 0 {
		port = m.cfg.PortBase
	}
	e, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Host: "127.0.0.1", Port: port})
	if err != nil {
		return fmt.Errorf("start nats: %w", err)
	}
	m.nats = e
	for i := 0; i < m.cfg.Engines; i++ {
		id := fmt.Sprintf("engine-%d", i)
		off := 1 + portsPerEngine*i // ports.go
		// With a port base the KV-event endpoint has a fixed port, so by
		// vLLM's rule the engine's PUB connects to it and the sidecar binds
		// it; without one the engine binds a free port.
		events, bind := "tcp://"+loopback(m.cfg.PortBase, off+1), m.cfg.PortBase != 0
		s, err := sim.Start(ctx, sim.Config{
			Model: m.cfg.Model, HTTPAddr: loopback(m.cfg.PortBase, off),
			KVEvents: events, KVReplay: "tcp://" + loopback(m.cfg.PortBase, off+2),
			Engine: m.cfg.Engine, TimeScale: m.cfg.TimeScale, Seed: uint64(i + 1),
			Logger: m.cfg.Logger.With("engine", id),
		})
		if err != nil {
			return fmt.Errorf("start %s: %w", id, err)
		}
		m.sims = append(m.sims, s)
		m.engineIDs = append(m.engineIDs, id)

		sc := sidecar.DefaultConfig()
		sc.Engines = []sidecar.EngineConfig{{
			ID: id, Model: m.cfg.Model, URL: s.URL(),
			Events: s.EventsEndpoint(0), Replay: s.ReplayEndpoint(0), BlockSize: m.cfg.Engine.BlockSize, Bind: bind,
		}}
		if bind {
			sc.Engines[0].Events = events
		}
		sc.NATS = m.natsConfig("kvmesh-sidecar-" + id)
		sc.Gossip = m.gossipConfig("sidecar-"+id, gossip.RoleSidecar, portAt(m.cfg.PortBase, off+3))
		sc.Gossip.Meta.Model, sc.Gossip.Meta.EngineURL, sc.Gossip.Meta.BlockSize = m.cfg.Model, s.URL(), m.cfg.Engine.BlockSize
		sc.GossipInterval = 100 * time.Millisecond
		sc.ScrapeInterval = 250 * time.Millisecond
		sc.Logger = m.cfg.Logger.With("sidecar", id)
		sc.Registerer = prometheus.NewRegistry()
		car, err := sidecar.New(sc)
		if err != nil {
			return fmt.Errorf("sidecar %s: %w", id, err)
		}
		done := make(chan error, 1)
		go func() { done <- car.Run(ctx) }() // owned by m: Close + <-done in stop
		m.sidecars, m.scDone = append(m.sidecars, car), append(m.scDone, done)
		if err := m.waitFor(ctx, "sidecar "+id+" ready", func() bool { return car.Ready() && car.Gossip() != nil }, done); err != nil {
			return err
		}
		if m.seed == "" {
			m.seed = car.Gossip().Addr()
		}
	}
	return nil
}

func (m *mesh) natsConfig(name string) natsutil.Config {
	c := natsutil.DefaultConfig()
	c.URLs = []string{m.nats.URL()}
	c.Name = name
	c.ReconnectWait = 100 * time.Millisecond
	return c
}

func (m *mesh) gossipConfig(name, role string, port int) *gossip.Config {
	c := gossip.DefaultConfig()
	c.Name, c.Profile = name, "local"
	c.BindAddr, c.BindPort = "127.0.0.1", port
	c.BroadcastInterval = 50 * time.Millisecond
	c.PushPullInterval = 500 * time.Millisecond
	c.RejoinInterval = 200 * time.Millisecond
	c.Meta = gossip.NodeMeta{Role: role, ID: name}
	if m.seed != "" {
		c.Join = []string{m.seed}
	}
	c.Logger = m.cfg.Logger
	return &c
}

// startIngresses starts the ingress replicas with one routing policy and waits until
// each sees every engine and has synced its index.
func (m *mesh) startIngresses(ctx context.Context, policy string, run int) error {
	for i := 0; i < m.cfg.Ingresses; i++ {
		cfg, err := m.ingressConfig(i, policy, run)
		if err != nil {
			return err
		}
		cfg.Cluster.NATSURLs = []string{m.nats.URL()}
		aff, err := session.NewAffinity(session.DefaultAffinityConfig())
		if err != nil {
			return err
		}
		deps := ingress.Deps{Logger: m.cfg.Logger.With("ingress", cfg.ID), Registry: prometheus.NewRegistry(), Affinity: aff}
		srv, err := ingress.New(cfg, deps)
		if err != nil {
			return fmt.Errorf("ingress %s: %w", cfg.ID, err)
		}
		if err := srv.Start(ctx); err != nil {
			return fmt.Errorf("ingress %s: %w", cfg.ID, err)
		}
		m.ingresses = append(m.ingresses, srv)
	}
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	for _, srv := range m.ingresses {
		url := "http://" + srv.Addr() + "/ready"
		if err := m.waitFor(ctx, "ingress "+srv.Addr()+" ready with every engine", func() bool {
			return readyWith(client, url, m.cfg.Engines)
		}, nil); err != nil {
			return err
		}
	}
	return nil
}

// ingressConfig is ingress replica i's config for policy's run-th run.
func (m *mesh) ingressConfig(i int, policy string, run int) (ingress.Config, error) {
	cfg := ingress.DefaultConfig()
	cfg.ID = fmt.Sprintf("ingress-%d-%s-%d", i, policy, run)
	off := 1 + portsPerEngine*m.cfg.Engines + portsPerIngress*i // ports.go
	cfg.Listen = loopback(m.cfg.PortBase, off)
	cfg.AccessLog = false
	cfg.BlockSize = m.cfg.Engine.BlockSize
	sc, err := wallScheduler(cfg.Scheduler, policy, m.cfg.TimeScale)
	if err != nil {
		return cfg, err
	}
	cfg.Scheduler = sc
	cfg.Learn.Prior = wallPrior(m.cfg.TimeScale)
	// The ingress's other engine-time durations in wall time too: a routed
	// request's keys count as cached for the configured TTL (by default the
	// ingress's own, which the DES's index takes too), and the hold's bound
	// is its 30 engine seconds.
	ts := m.cfg.TimeScale
	ttl := m.cfg.SpeculativeTTL
	if ttl == 0 {
		ttl = index.DefaultSpeculativeTTL
	}
	cfg.SpeculativeTTL = time.Duration(float64(ttl) / ts)
	cfg.Hold.MaxWait = time.Duration(float64(ingress.DefaultHoldConfig().MaxWait) / ts)
	cfg.Cluster = ingress.ClusterConfig{
		GossipBind: loopback(m.cfg.PortBase, off+1), GossipSeeds: []string{m.seed}, GossipProfile: "local",
	}
	return cfg, nil
}

// wallScheduler is sc running policy, with the kvmesh block's
// defaults in wall time for engines running ts× faster than model time:
// its seconds (holdSeconds, balanceSeconds, saturationQueue, stepBase,
// decodeSecPerToken) divided by ts, its prefill rate multiplied. The
// ingress compares them with what its learner measures, wall seconds
// (wallPrior); left in model seconds, the router-side hold engaged at 2
// wall seconds of queued prefill, 20 engine seconds at ×10 where the DES
// holds at 2: at ×10 it never held, at ×2 it held at 4 engine seconds,
// and live and DES stopped tracking under overload (docs/BENCHMARKS.md,
// "DES vs live").
func wallScheduler(sc scheduler.Config, policy string, ts float64) (scheduler.Config, error) {
	sc.Policy = policy
	k := policies.DefaultKVMeshConfig()
	k.PrefillRate *= ts
	k.StepBase /= ts
	k.DecodeSecPerToken /= ts
	k.BalanceSeconds /= ts
	k.SaturationQueue /= ts
	k.HoldSeconds /= ts
	if err := sc.SetParams("kvmesh", k); err != nil {
		return sc, fmt.Errorf("ingress scheduler: %w", err)
	}
	return sc, nil
}

// wallPrior is the ingress learner's default prior in wall seconds for
// engines running ts× faster than model time. The learner measures wall
// seconds; with the prior in wall seconds too, prior and samples stand as
// they do in model seconds (the DES's learner), so the blend of the two is
// the DES's at every scale. With the model-second prior at scale 0.5,
// kvmesh's live hit rate fell from the DES's 0.824 to 0.779
// (docs/BENCHMARKS.md, "DES vs live").
func wallPrior(ts float64) learn.Rates {
	k := learn.DefaultPrior() // the ingress learner's default prior
	return learn.Rates{PrefillRate: k.PrefillRate * ts, StepBase: k.StepBase / ts, DecodeSecPerToken: k.DecodeSecPerToken / ts}
}

// readyWith reports whether an ingress's /ready says it is ready with n engines.
func readyWith(client *http.Client, url string, n int) bool {
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r struct {
		Ready   bool `json:"ready"`
		Engines int  `json:"engines"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil {
		return false
	}
	return r.Ready && r.Engines == n
}

func (m *mesh) ingressURLs() []string {
	out := make([]string, len(m.ingresses))
	for i, s := range m.ingresses {
		out[i] = "http://" + s.Addr()
	}
	return out
}

// stopIngresses drains and closes the ingress replicas.
func (m *mesh) stopIngresses() error {
	var errs []error
	for _, s := range m.ingresses {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	m.ingresses = nil
	return errors.Join(errs...)
}

// resetCaches empties every engine's prefix cache and waits until the sidecars have
// seen it, so the next run starts cold like the first.
func (m *mesh) resetCaches(ctx context.Context) error {
	for i, s := range m.sims {
		if err := s.ResetPrefixCache(); err != nil {
			return fmt.Errorf("reset %s: %w", m.engineIDs[i], err)
		}
	}
	return m.waitFor(ctx, "sidecars to see empty caches", func() bool {
		for i, sc := range m.sidecars {
			keys, ok := sc.Keys(m.engineIDs[i])
			if !ok {
				return false
			}
			for t := 0; t < kvevents.NumTiers; t++ {
				if len(keys[t]) > 0 {
					return false
				}
			}
		}
		return true
	}, nil)
}

// stop closes everything started, in reverse order; safe after a partial start.
func (m *mesh) stop() error {
	errs := []error{m.stopIngresses()}
	for i, sc := range m.sidecars {
		_ = sc.Close()
		if err := <-m.scDone[i]; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("sidecar %s: %w", m.engineIDs[i], err))
		}
	}
	m.sidecars, m.scDone = nil, nil
	for _, s := range m.sims {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	m.sims = nil
	if m.nats != nil {
		m.nats.Shutdown()
		m.nats = nil
	}
	return errors.Join(errs...)
}

// waitFor polls cond every 20 ms until it holds, ctx ends, StartTimeout passes, or
// (when given) a component's run channel reports it stopped.
func (m *mesh) waitFor(ctx context.Context, what string, cond func() bool, died chan error) error {
	deadline := time.NewTimer(m.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("waiting for %s: %w after %v", what, ErrTimeout, m.cfg.StartTimeout)
		case err := <-died:
			died <- err // keep it for stop
			return fmt.Errorf("waiting for %s: stopped: %w", what, err)
		case <-tick.C:
		}
	}
	return nil
}

// ErrTimeout is returned when the mesh does not come up or settle in time.
var ErrTimeout = errors.New("timed out")
