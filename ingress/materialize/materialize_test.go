package materialize_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// fakeMembership is a gossip view the test controls (a stand-in for
// *gossip.Node, whose real behaviour is tested in package gossip and in
// test/mesh).
type fakeMembership struct {
	mu sync.Mutex
	v  []gossip.EngineView
}

func (f *fakeMembership) Engines() []gossip.EngineView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gossip.EngineView(nil), f.v...)
}

func (f *fakeMembership) set(v ...gossip.EngineView) {
	f.mu.Lock()
	f.v = v
	f.mu.Unlock()
}

type fixture struct {
	t     *testing.T
	srv   *natsutil.Embedded
	nc    *nats.Conn
	cache *meshtest.Cache
	sc    *sidecar.Sidecar
	idx   *meshtest.MapIndex
	m     *materialize.Materializer
	reg   *prometheus.Registry
	mem   *fakeMembership
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, idx: meshtest.NewMapIndex(), reg: prometheus.NewRegistry(), mem: &fakeMembership{}}
	var err error
	f.srv = testutil.NATS(t)
	if f.cache, err = meshtest.NewCache("m", 4, 16, 0, 9); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.cache.Pub.Close() })
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: f.cache.Pub.Endpoint(), Replay: f.cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	sc.NATS.URLs = []string{f.srv.URL()}
	f.sc = meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", f.sc.Ready)

	if f.nc, err = nats.Connect(f.srv.URL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.nc.Close)
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer, cfg.Membership = f.nc, f.idx, f.reg, f.mem
	cfg.CheckInterval, cfg.DigestGrace = 20*time.Millisecond, 50*time.Millisecond
	if f.m, err = materialize.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mdone := make(chan error, 1)
	go func() { mdone <- f.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-mdone; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return f
}

func (f *fixture) load(n int) { loadCache(f.t, f.cache, n) }

func (f *fixture) equal() bool { return indexEquals(f.idx, f.cache, "e1") }

// cacheEngine makes engine e1's cache (model m, gpuBlocks blocks, seed)
// and the config of a sidecar for it on NATS url; the cache's publisher
// closes when t ends.
func cacheEngine(t *testing.T, url string, gpuBlocks int, seed uint64) (*meshtest.Cache, sidecar.Config) {
	t.Helper()
	cache, err := meshtest.NewCache("m", 4, gpuBlocks, 0, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Pub.Close() })
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	sc.NATS.URLs = []string{url}
	return cache, sc
}

// loadCache sends n random prompts to cache (3 blocks each, 2 shared).
func loadCache(t *testing.T, cache *meshtest.Cache, n int) {
	t.Helper()
	for range n {
		if err := cache.Request(cache.RandomPrompt(3, 2, 3)); err != nil {
			t.Fatal(err)
		}
	}
}

// indexEquals reports whether idx holds exactly cache's GPU keys for engine,
// with no problem recorded.
func indexEquals(idx *meshtest.MapIndex, cache *meshtest.Cache, engine string) bool {
	truth, got := cache.Truth()[kvevents.TierGPU], idx.Keys(engine, kvevents.TierGPU)
	if len(got) != len(truth) || len(idx.Problems()) > 0 {
		return false
	}
	for i := range got {
		if got[i] != truth[i] {
			return false
		}
	}
	return true
}

func TestAppliesInSequenceAndReportsStatus(t *testing.T) {
	f := newFixture(t)
	f.load(50)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", f.equal)
	testutil.WaitFor(t, 5*time.Second, "synced", f.m.Synced)
	st := f.m.Status()
	if len(st) != 1 || st[0].Engine != "e1" || st[0].Model != "m" || st[0].Keys[kvevents.TierGPU] != len(f.cache.Truth()[kvevents.TierGPU]) {
		t.Fatalf("status %+v", st)
	}
	side := f.sc.Status()[0]
	testutil.WaitFor(t, 5*time.Second, "same head as the sidecar", func() bool {
		s := f.m.Status()[0]
		return s.Epoch == side.Epoch && s.Seq == f.sc.Status()[0].Seq
	})
	// Once synced, new changes arrive as deltas applied in sequence.
	before := counter(t, f.reg, "kvmesh_materializer_deltas_applied_total")
	f.load(20)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache again", f.equal)
	if got := counter(t, f.reg, "kvmesh_materializer_deltas_applied_total"); got <= before {
		t.Fatal("no delta applied in sequence")
	}
	if got := counter(t, f.reg, "kvmesh_materializer_propagation_lag_seconds"); got == 0 {
		t.Fatal("no lag observed")
	}
}

func TestMalformedDeltaCountedAndSkipped(t *testing.T) {
	f := newFixture(t)
	f.load(10)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", f.equal)
	before := counter(t, f.reg, "kvmesh_materializer_malformed_total")
	if err := f.nc.Publish(natsutil.Default().DeltaSubject("m", "e1"), []byte{0x98, 0xff, 0x00}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "malformed counted", func() bool {
		return counter(t, f.reg, "kvmesh_materializer_malformed_total") == before+1
	})
	f.load(10)
	testutil.WaitFor(t, 10*time.Second, "still in sync", f.equal)
}

func TestDigestMismatchTriggersSnapshot(t *testing.T) {
	f := newFixture(t)
	f.load(20)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", f.equal)
	st := f.m.Status()[0]
	// Gossip claims the same head with another digest: the materializer must
	// resync (and, the sidecar being right, end up where it was).
	bad := st.Digest
	bad.Digests[kvevents.TierGPU].Sum++
	f.mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: bad}})
	testutil.WaitFor(t, 5*time.Second, "mismatch resync", func() bool {
		return counter(t, f.reg, "kvmesh_materializer_digest_mismatches_total") > 0
	})
	f.mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: f.m.Status()[0].Digest}})
	testutil.WaitFor(t, 5*time.Second, "equal after resync", f.equal)

	// Gossip ahead of the applied head (deltas lost with none after them to
	// show the gap): resync too.
	ahead := f.m.Status()[0].Digest
	ahead.Head.Seq += 5
	gaps := counter(t, f.reg, "kvmesh_materializer_gaps_total")
	f.mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m", Digest: ahead}})
	testutil.WaitFor(t, 5*time.Second, "behind resync", func() bool {
		return counter(t, f.reg, "kvmesh_materializer_gaps_total") > gaps
	})

	// The engine leaves gossip: it is cleared from the index.
	f.mem.set()
	testutil.WaitFor(t, 5*time.Second, "engine cleared", func() bool {
		return len(f.idx.Engines()) == 0 && len(f.m.Status()) == 0
	})
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := materialize.DefaultConfig()
	c.SnapshotTimeout = 0
	c.MaxBuffered = -1
	err := c.Validate()
	if !errors.Is(err, materialize.ErrConfig) {
		t.Fatal(err)
	}
	for _, want := range []string{"no NATS", "no index", "snapshot timeout", "max buffered"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

// counter sums a metric family's counter values (or a histogram's count).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			}
			if m.GetHistogram() != nil {
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// Without gossip, an engine whose sidecar is gone is found by the idle check
// (its snapshot request has no responder) and cleared.
func TestIdleCheckClearsVanishedEngineWithoutGossip(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 0, 11)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	sc.NATS.URLs = []string{srv.URL()}
	s := meshtest.StartSidecar(t, sc)

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	idx := meshtest.NewMapIndex()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index = nc, idx
	cfg.CheckInterval, cfg.IdleCheck = 20*time.Millisecond, 200*time.Millisecond
	m, err := materialize.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mdone := make(chan error, 1)
	go func() { mdone <- m.Run(ctx) }()
	defer func() { cancel(); <-mdone }()

	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	for i := 0; i < 10; i++ {
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "keys indexed", func() bool {
		return len(idx.Keys("e1", kvevents.TierGPU)) == len(cache.Truth()[kvevents.TierGPU])
	})
	_ = s.Close()
	testutil.WaitFor(t, 10*time.Second, "vanished engine cleared", func() bool { return len(idx.Engines()) == 0 })
}

// TestEnginesComingAndGoingWithoutGossip: without Membership, engines that
// left (their sidecar no longer answers, no delta comes) are forgotten, not
// only cleared: after many engines came and went the materializer and the
// real index hold nothing for them. Before, each stayed in the engine map
// and was re-snapshotted with backoff forever.
func TestEnginesComingAndGoingWithoutGossip(t *testing.T) {
	srv := testutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Logger = nc, idx, slog.New(slog.DiscardHandler)
	// SnapshotTimeout also bounds Run's first flush, so not too short for a
	// busy machine; each gone engine's unanswered snapshots wait it out.
	cfg.CheckInterval, cfg.IdleCheck, cfg.SnapshotTimeout = 10*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond
	m, err := materialize.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mdone := make(chan error, 1)
	go func() { mdone <- m.Run(ctx) }()
	defer func() { cancel(); <-mdone }()
	// Deltas are core NATS: one published before the materializer
	// subscribed is lost, and without gossip nothing else names the
	// engine. Synced means subscribed (and flushed).
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	const engines = 20
	for i := 0; i < engines; i++ {
		id := "e" + strconv.Itoa(i)
		keys := []uint64{uint64(i)*10 + 1, uint64(i)*10 + 2, uint64(i)*10 + 3}
		// A sidecar for the engine's lifetime: it serves one snapshot and
		// publishes one delta, then the engine goes away.
		var buf []byte
		snap, err := nc.Subscribe(natsutil.Default().SnapSubject("m", id), func(msg *nats.Msg) {
			c := kvevents.SnapshotChunk{Engine: id, Model: "m", Epoch: 1, Seq: 1, Chunks: 1,
				Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}}}
			buf = kvevents.AppendSnapshotChunk(buf[:0], &c)
			_ = msg.Respond(buf)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		d := kvevents.Delta{Engine: id, Model: "m", Epoch: 1, Seq: 1, Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}}}
		if err := nc.Publish(natsutil.Default().DeltaSubject("m", id), kvevents.AppendDelta(nil, &d)); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, id+" indexed", func() bool { return idx.KeyCount(id, kvevents.TierGPU) == 3 })
		if err := snap.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "every engine that left forgotten", func() bool {
		return len(m.Status()) == 0 && m.KeyCount() == 0 && len(idx.Engines()) == 0 && idx.MemStats().Entries == 0
	})
}
