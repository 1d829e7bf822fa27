package materialize_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// smallPayloadNATS runs an embedded nats-server whose max_payload is
// maxPayload bytes until the test ends, and returns its client URL.
func smallPayloadNATS(t *testing.T, maxPayload int32) string {
	t.Helper()
	return testutil.NATSServer(t, server.Options{JetStream: true, MaxPayload: maxPayload}).ClientURL()
}

// longPrompt is a prompt of blocks full blocks no other prompt shares.
func longPrompt(rng *rand.Rand, blocks, blockSize int) []uint32 {
	toks := make([]uint32, blocks*blockSize)
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	return toks
}

// startCacheSidecar starts a sidecar for engine e1 of model m, fed by a
// simulated cache of gpuBlocks blocks (seeded), publishing on NATS url,
// with its config changed by set; it returns once the sidecar is ready.
func startCacheSidecar(t *testing.T, url string, gpuBlocks int, seed uint64, set func(*sidecar.Config)) (*meshtest.Cache, *sidecar.Sidecar) {
	t.Helper()
	cache, sc := cacheEngine(t, url, gpuBlocks, seed)
	set(&sc)
	side := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", side.Ready)
	return cache, side
}

// With a NATS max_payload of 64 KiB (below a default snapshot chunk of
// 65,536 keys, ~520 KB, and a 10,000-key delta), a restarted
// ingress still gets the sidecar's whole key set by snapshot, and a running
// one follows by deltas without gaps: the sidecar cuts both to the server's
// limit. Before, every snapshot failed (ErrMaxPayload, counted as a timeout
// by the ingress), the new ingress reported ready with an empty index, and
// deltas over the limit were lost.
func TestSmallMaxPayloadSnapshotsAndDeltasFit(t *testing.T) {
	url := smallPayloadNATS(t, 64<<10)
	cache, side := startCacheSidecar(t, url, 30000, 41, func(*sidecar.Config) {})

	rng := rand.New(rand.NewPCG(41, 1))
	load := func(blocks ...int) {
		for _, n := range blocks {
			if err := cache.Request(longPrompt(rng, n, 4)); err != nil {
				t.Fatal(err)
			}
		}
	}
	sideHas := func(n int) func() bool {
		return func() bool { return side.Status()[0].Keys[kvevents.TierGPU] == n }
	}
	load(6000, 6000) // 12,000 keys: a snapshot of 2 chunks at most 8,180 keys each
	testutil.WaitFor(t, 20*time.Second, "the sidecar's key set", sideHas(12000))

	cfg, idx, reg := materializerConfig(t, url)
	cfg.CheckInterval, cfg.IdleCheck = 20*time.Millisecond, time.Hour // no resync but for a gap
	m := startMaterializer(t, cfg)
	equal := func() bool {
		keys, _ := side.Keys("e1")
		want, got := meshtest.Sorted(keys[kvevents.TierGPU]), idx.Keys("e1", kvevents.TierGPU)
		if len(got) != len(want) || len(want) == 0 || len(idx.Problems()) > 0 {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	}
	testutil.WaitFor(t, 30*time.Second, "the new ingress's index equal to the sidecar's", func() bool { return m.Synced() && equal() })

	load(10000) // a delta of 10,000 keys (~80 KB) to the running ingress
	testutil.WaitFor(t, 20*time.Second, "the sidecar's new key set", sideHas(22000))
	testutil.WaitFor(t, 30*time.Second, "the running ingress's index equal to the sidecar's", equal)
	if g, n := counter(t, reg, "kvmesh_materializer_gaps_total"), counter(t, reg, "kvmesh_materializer_snapshots_total"); g != 0 || n != 1 {
		t.Fatalf("%v gaps, %v snapshots: deltas over the max_payload were lost", g, n)
	}
}

// logged records the messages logged at level or above.
type logged struct {
	level slog.Level
	mu    sync.Mutex
	msgs  []string
}

func (w *logged) Enabled(_ context.Context, l slog.Level) bool { return l >= w.level }
func (w *logged) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *logged) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *logged) WithGroup(string) slog.Handler      { return w }

func (w *logged) count(sub string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// A sidecar that cannot send its key set at all (a max_payload too small
// for one key) answers with an error reply: the ingress counts it as
// result="sidecar_error", not as a timeout, and once three in a row failed
// (readiness stops waiting for the engine) it warns once and counts the
// engine in kvmesh_materializer_failing_engines. Before, the reply failed
// silently on the sidecar's side and the ingress saw only timeouts.
func TestSnapshotErrorReplyIsCountedAndVisible(t *testing.T) {
	url := smallPayloadNATS(t, 96)
	cache, side := startCacheSidecar(t, url, 64, 43, func(sc *sidecar.Config) { sc.NATS.Stream.Disabled = true })
	if err := cache.Request(cache.RandomPrompt(3, 2, 3)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the sidecar's key set", func() bool { return side.Status()[0].Keys[kvevents.TierGPU] > 0 })

	cfg, _, reg := materializerConfig(t, url)
	warned := &logged{level: slog.LevelWarn}
	cfg.Logger = slog.New(warned)
	mem := &fakeMembership{}
	mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "e1", Model: "m"}})
	cfg.Membership = mem
	cfg.CheckInterval = 20 * time.Millisecond
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 30*time.Second, "failing snapshots counted as sidecar errors", func() bool {
		return snapshots(t, reg, "sidecar_error") >= 4 && gauge(t, reg, "kvmesh_materializer_failing_engines") == 1
	})
	if n := snapshots(t, reg, "timeout"); n != 0 {
		t.Fatalf("%v snapshots counted as timeouts", n)
	}
	if st := m.Status(); len(st) != 1 || st[0].SnapshotFailures < 3 || st[0].Synced {
		t.Fatalf("status %+v: want the engine unsynced with its failures", st)
	}
	if n := warned.count("snapshots of an engine keep failing"); n != 1 {
		t.Fatalf("%d warnings about the failing engine, want 1 (%q)", n, warned.msgs)
	}
}
