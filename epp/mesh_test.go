package epp

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// The tests run the real mesh on loopback: embedded NATS, simulated engines
// emitting vLLM KV events, a sidecar each publishing deltas and gossiping
// load, and ingress replicas (the picker's and, for comparisons, a plain
// one) that learn engines by gossip and caches from NATS. Only Envoy is a
// stand-in (envoy_test.go).

const model = "llama"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var (
	tokOnce sync.Once
	tokNat  *tokenizer.Native
	tokTpl  *tokenizer.ChatTemplate
	tokErr  error
)

// testTokenizer is bert-base-uncased with Llama 3's chat template, from the
// test data of the github.com/daulet/tokenizers module (in go.mod): the
// ingress and the simulator share it, so keys agree.
func testTokenizer(t testing.TB) (*tokenizer.Native, *tokenizer.ChatTemplate) {
	t.Helper()
	tokOnce.Do(loadTestTokenizer)
	if tokErr != nil {
		t.Fatalf("test tokenizer: %v", tokErr)
	}
	return tokNat, tokTpl
}

func loadTestTokenizer() {
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
	if err != nil {
		tokErr = err
		return
	}
	var v struct{ Dir string }
	if tokErr = json.Unmarshal(out, &v); tokErr != nil {
		return
	}
	dir := filepath.Join(v.Dir, "test", "data")
	if tokNat, tokErr = tokenizer.LoadFile(filepath.Join(dir, "bert-base-uncased.json")); tokErr == nil {
		tokTpl, tokErr = tokenizer.LoadChatTemplateFile(filepath.Join(dir, "meta-llama-3-8b-instruct", "tokenizer_config.json"))
	}
}

type mesh struct {
	t    testing.TB
	nats string
	seed string // first replica's gossip address
	sims map[string]*sim.Server
	ep   map[string]string // engine id → endpoint
	eng  map[string]string // endpoint → engine id
	tok  ingress.Tokenizer
}

func newMesh(t testing.TB) *mesh {
	ns := testutil.NATS(t)
	nt, tpl := testTokenizer(t)
	tk, err := ingress.NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	return &mesh{t: t, nats: ns.URL(), sims: map[string]*sim.Server{}, ep: map[string]string{}, eng: map[string]string{}, tok: tk}
}

// replica is one ingress (not started) with its own index and registry.
type replica struct {
	ing *ingress.Server
	idx *index.Index
	reg *prometheus.Registry
}

func (m *mesh) newReplica(id string, mut func(*ingress.Config)) *replica {
	t := m.t
	cfg := ingress.DefaultConfig()
	cfg.ID = id
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = "127.0.0.1:0" // /debug/engines lives there
	cfg.Scheduler.Policy = "kvmesh"
	// Each replica learns engine costs from its own traffic, so two replicas'
	// cost models differ by design; these tests compare decisions across
	// replicas, so both price with the same (prior) rates.
	cfg.Learn.Disabled = true
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ingress.ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{m.nats}}
	if m.seed != "" {
		cfg.Cluster.GossipSeeds = []string{m.seed}
	}
	if mut != nil {
		mut(&cfg)
	}
	idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ing, err := ingress.New(cfg, ingress.Deps{Logger: quiet, AccessLog: quiet, Registry: reg, Index: idx,
		Tokenizers: ingress.TokenizerMap{model: m.tok}})
	if err != nil {
		t.Fatal(err)
	}
	return &replica{ing: ing, idx: idx, reg: reg}
}

func (m *mesh) start(r *replica) {
	if err := r.ing.Start(context.Background()); err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { r.ing.Close() })
	if m.seed == "" {
		m.seed = r.ing.GossipAddr()
	}
}

// startEPP builds a picker around a new replica and starts both.
func (m *mesh) startEPP(id string, cfg Config, deps Deps, mut func(*ingress.Config)) (*Server, *replica) {
	t := m.t
	r := m.newReplica(id, mut)
	cfg.Listen = "127.0.0.1:0"
	cfg.DrainDelay = 0 // Close at once (TestDrainDelay covers the delay)
	if cfg.TLS == "" || cfg.TLS == TLSSelfSigned {
		cfg.TLS = TLSOff // the stand-in dials plain text; TestTLS covers the default
	}
	cfg.Logger = quiet
	cfg.Registerer = r.reg
	deps.Ingress = r.ing
	s, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	m.start(r)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s, r
}

// addEngine starts a simulated engine and its sidecar, joined to the mesh.
func (m *mesh) addEngine(id, role string, seed uint64) {
	t := m.t
	nt, tpl := testTokenizer(t)
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		Engine: engine.Config{BlockSize: 16, GPUBlocks: 4096, Profile: prof}, TimeScale: 500, Seed: seed,
		Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet, ResponsesStore: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	m.sims[id] = sm
	ep, ok := endpointOf(sm.URL())
	if !ok {
		t.Fatalf("engine url %s", sm.URL())
	}
	m.ep[id], m.eng[ep] = ep, id
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: id, Model: model, URL: sm.URL(), Role: role, DPSize: 1,
		RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}}
	sc.NATS = natsutil.DefaultConfig()
	sc.NATS.URLs = []string{m.nats}
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.Join = "sidecar-"+id, "local", []string{m.seed}
	gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, 500*time.Millisecond
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "sidecar-" + id}
	gc.Logger = quiet
	sc.Gossip = &gc
	sc.GossipInterval, sc.ScrapeInterval = 50*time.Millisecond, 100*time.Millisecond
	sc.Logger = quiet
	car, err := sidecar.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); car.Run(ctx) }()
	t.Cleanup(func() { cancel(); car.Close(); <-done })
}

// waitEngines waits until the replica knows n engines and is ready.
func (m *mesh) waitEngines(r *replica, n int) {
	testutil.WaitFor(m.t, 30*time.Second, "replica ready with every engine known by gossip", func() bool {
		var infos []engineView
		if !getJSON("http://"+r.ing.AdminAddr()+"/debug/engines", &infos) {
			return false
		}
		for _, e := range infos {
			if !e.Healthy {
				return false
			}
		}
		return len(infos) == n && r.ing.Ready()
	})
}

type engineView struct {
	ID            string  `json:"ID"`
	Healthy       bool    `json:"Healthy"`
	Running       int     `json:"Running"`
	Waiting       int     `json:"Waiting"`
	InFlight      int     `json:"InFlight"`
	LocalInFlight int     `json:"local_inflight"`
	KVUsage       float64 `json:"KVUsage"`
}

func getJSON(url string, v any) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return false
	}
	return json.NewDecoder(resp.Body).Decode(v) == nil
}

// settled reports whether the replica has nothing charged to any engine,
// every engine's gossiped load is idle and every engine is healthy (the
// scheduler's health filter drops the others).
func settled(r *replica) bool {
	var infos []engineView
	if !getJSON("http://"+r.ing.AdminAddr()+"/debug/engines", &infos) {
		return false
	}
	for _, e := range infos {
		if !e.Healthy || e.LocalInFlight != 0 || e.Running != 0 || e.Waiting != 0 || e.InFlight != 0 {
			return false
		}
	}
	return true
}
