package materialize_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// materializerConfig is the default config on a new NATS connection to
// url (closed when the test ends), with a map index and a registry of its
// own.
func materializerConfig(t *testing.T, url string) (materialize.Config, *meshtest.MapIndex, *prometheus.Registry) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	idx, reg := meshtest.NewMapIndex(), prometheus.NewRegistry()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = nc, idx, reg
	return cfg, idx, reg
}

// startMaterializer runs a materializer on cfg.Conn until the test ends.
func startMaterializer(t *testing.T, cfg materialize.Config) *materialize.Materializer {
	t.Helper()
	m, err := materialize.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return m
}

// Two live sidecars for one engine (a restart overlapping its old self:
// same engine id, same engine) publish the same changes in two epochs. The
// materializer follows the newer sidecar (the later epoch start, in every
// ingress), ignores and counts the older one's deltas, and takes no
// snapshot for them. Before, every delta of the epoch it was not on took a
// snapshot, and the two epochs took turns for ever (362 snapshots in 10 s).
func TestOverlappingSidecarsFollowTheNewerWithoutSnapshotStorm(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 0, 21)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Pub.Close() })
	start := func() *sidecar.Sidecar { // one sidecar of engine e1; the second is the newer
		sc := sidecar.DefaultConfig()
		sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", URL: "http://engine-1:8000", Events: cache.Pub.Endpoint(),
			Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
		sc.NATS.URLs = []string{srv.URL()}
		s := meshtest.StartSidecar(t, sc)
		testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
		return s
	}
	old := start()
	newer := start()

	cfg, idx, reg := materializerConfig(t, srv.URL())
	// No gossip and no idle probe: only deltas and their snapshots here. A
	// busy machine must not make the newer sidecar look gone.
	cfg.CheckInterval, cfg.IdleCheck, cfg.EpochGrace = 20*time.Millisecond, time.Hour, time.Hour
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	load := func(n int) { loadCache(t, cache, n) }
	// In step with the newer sidecar: its epoch and head, the engine's keys.
	following := func() bool {
		st, side := m.Status(), newer.Status()[0]
		if len(st) != 1 || st[0].Epoch != side.Epoch || st[0].Seq != side.Seq || st[0].Snapshotting || len(idx.Problems()) > 0 {
			return false
		}
		truth := cache.Truth()[kvevents.TierGPU]
		got := idx.Keys("e1", kvevents.TierGPU)
		if len(got) != len(truth) {
			return false
		}
		for i := range got {
			if got[i] != truth[i] {
				return false
			}
		}
		return true
	}
	load(20)
	testutil.WaitFor(t, 20*time.Second, "following the newer sidecar", following)
	if old.Status()[0].Epoch == newer.Status()[0].Epoch {
		t.Fatal("both sidecars have one epoch")
	}
	snaps, epochs := counter(t, reg, "kvmesh_materializer_snapshots_total"), counter(t, reg, "kvmesh_materializer_new_epochs_total")
	if snaps > 2 || epochs > 1 {
		t.Fatalf("%v snapshots and %v new epochs to settle on the newer sidecar, want at most 2 and 1 (first sight, then the newer epoch)", snaps, epochs)
	}
	ignored := counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total")

	// Both sidecars keep publishing every change, request after request:
	// the older one's deltas are ignored and counted, and no snapshot is
	// taken for them.
	const requests = 30
	for i := 0; i < requests; i++ {
		load(1)
		testutil.WaitFor(t, 20*time.Second, "in step with the newer sidecar, the older one done too", func() bool {
			keys, _ := old.Keys("e1")
			return following() && len(keys[kvevents.TierGPU]) == len(cache.Truth()[kvevents.TierGPU])
		})
	}
	if got := counter(t, reg, "kvmesh_materializer_snapshots_total"); got != snaps {
		t.Fatalf("%v snapshots while both sidecars published %d requests' changes, want none (%v before)", got-snaps, requests, snaps)
	}
	if got := counter(t, reg, "kvmesh_materializer_new_epochs_total"); got != epochs {
		t.Fatalf("new epochs went from %v to %v", epochs, got)
	}
	testutil.WaitFor(t, 20*time.Second, "the older sidecar's deltas counted", func() bool {
		return counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total") > ignored
	})
	if !following() {
		t.Fatal("not following the newer sidecar after the load")
	}
}

// fakeSidecar is a FAKE sidecar of an older kvmesh version (no epoch start
// in its messages): it publishes deltas of one epoch, storing one key each,
// and answers snapshot requests with its set at its head.
type fakeSidecar struct {
	t     *testing.T
	nc    *nats.Conn
	epoch uint64
	start int64 // the epoch start sent (0: none, as the older version); set before the first publish
	mu    sync.Mutex
	seq   uint64
	keys  []uint64
	sub   *nats.Subscription
}

func newFakeSidecar(t *testing.T, nc *nats.Conn, epoch uint64) *fakeSidecar {
	f := &fakeSidecar{t: t, nc: nc, epoch: epoch}
	var err error
	f.sub, err = nc.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) {
		f.mu.Lock()
		c := kvevents.SnapshotChunk{Engine: "e1", Model: "m", Epoch: f.epoch, EpochStart: f.start, Seq: f.seq, Chunks: 1,
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: append([]uint64(nil), f.keys...)}}}
		f.mu.Unlock()
		_ = msg.Respond(kvevents.AppendSnapshotChunk(nil, &c))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// publish stores key k in the next delta.
func (f *fakeSidecar) publish(k uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.keys = append(f.keys, k)
	d := kvevents.Delta{Engine: "e1", Model: "m", Epoch: f.epoch, EpochStart: f.start, Seq: f.seq, Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{k}}}}
	if err := f.nc.Publish(natsutil.Default().DeltaSubject("m", "e1"), kvevents.AppendDelta(nil, &d)); err != nil {
		f.t.Fatal(err)
	}
}

// Two live sidecars of a version before the epoch start: each epoch takes
// at most one snapshot, the second seen wins (a plain restart looks like
// that), the first's deltas are ignored, and once the followed sidecar
// goes silent while the other keeps sending (it is gone), the other is
// followed again.
func TestOverlappingOldSidecarsAtMostOneSnapshotPerEpoch(t *testing.T) {
	srv := testutil.NATS(t)
	cfg, idx, reg := materializerConfig(t, srv.URL())
	cfg.CheckInterval, cfg.IdleCheck, cfg.EpochGrace = 20*time.Millisecond, time.Hour, time.Millisecond
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	x := newFakeSidecar(t, cfg.Conn, 0x5000)
	in := func(f *fakeSidecar) func() bool {
		return func() bool {
			f.mu.Lock()
			want := meshtest.Sorted(append([]uint64(nil), f.keys...))
			seq := f.seq
			f.mu.Unlock()
			st := m.Status()
			got := idx.Keys("e1", kvevents.TierGPU)
			if len(st) != 1 || st[0].Epoch != f.epoch || st[0].Seq != seq || st[0].Snapshotting || len(got) != len(want) {
				return false
			}
			for i := range got {
				if got[i] != want[i] {
					return false
				}
			}
			return true
		}
	}
	x.publish(1)
	testutil.WaitFor(t, 10*time.Second, "x followed", in(x))
	y := newFakeSidecar(t, cfg.Conn, 0x3000) // the smaller epoch: the order is by sight
	// Alternating deltas (one NATS connection keeps their order), x's
	// publishing the change y's just did, as two sidecars of one engine do:
	// y, seen second, is newer; x's deltas are ignored from then on.
	for i := uint64(0); i < 30; i++ {
		y.publish(1000 + i)
		x.publish(1000 + i)
		testutil.WaitFor(t, 10*time.Second, "y followed", in(y))
	}
	if got := counter(t, reg, "kvmesh_materializer_snapshots_total"); got > 2 {
		t.Fatalf("%v snapshots for two epochs, want at most 2", got)
	}
	if got := counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total"); got < 1 {
		t.Fatal("the older epoch's deltas were not counted")
	}

	// y's sidecar is gone; x keeps sending: after EpochGrace of y's silence
	// x is followed again (its snapshot answered by x alone).
	if err := y.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	k := uint64(5000)
	testutil.WaitFor(t, 20*time.Second, "x followed again", func() bool {
		k++
		x.publish(k)
		return in(x)()
	})
}

// A sidecar restarted on a host whose clock is behind its dead
// predecessor's (which ran 4 minutes ahead: within MaxEpochAhead of the
// ingress's clock, as one further ahead is refused,
// TestDeltaEpochStartFarAheadRefused) starts an epoch that orders as older. Its deltas are ignored until the dead one has been silent for
// EpochGrace, then it is followed; the log says so for what it is (a
// switch because the followed epoch went silent), where it used to blame
// the live sidecar: "following an older sidecar epoch again: the newer one
// went silent", about an epoch never followed before.
func TestEarlierClockSidecarFollowedOnceTheOtherIsSilent(t *testing.T) {
	srv := testutil.NATS(t)
	cfg, idx, _ := materializerConfig(t, srv.URL())
	log := &logged{level: slog.LevelInfo}
	cfg.Logger = slog.New(log)
	cfg.CheckInterval, cfg.IdleCheck, cfg.EpochGrace = 20*time.Millisecond, time.Hour, time.Millisecond
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	now := time.Now()
	dead := newFakeSidecar(t, cfg.Conn, 0x5000)
	dead.start = now.Add(4 * time.Minute).UnixNano()
	dead.publish(1)
	testutil.WaitFor(t, 10*time.Second, "the first sidecar followed", func() bool {
		st := m.Status()
		return len(st) == 1 && st[0].Epoch == dead.epoch && !st[0].Snapshotting
	})
	if err := dead.sub.Unsubscribe(); err != nil { // killed with its engine
		t.Fatal(err)
	}
	restarted := newFakeSidecar(t, cfg.Conn, 0x3000)
	restarted.start = now.UnixNano()
	k := uint64(100)
	testutil.WaitFor(t, 20*time.Second, "the restarted sidecar followed", func() bool {
		k++
		restarted.publish(k)
		st := m.Status()
		got := idx.Keys("e1", kvevents.TierGPU)
		return len(st) == 1 && st[0].Epoch == restarted.epoch && !st[0].Snapshotting && len(got) > 0 && got[0] > 100
	})
	if n := log.count("switching to another sidecar epoch: the followed one"); n != 1 {
		t.Fatalf("%d switch messages, want 1 (logged: %q)", n, log.msgs)
	}
	if n := log.count("older sidecar epoch again"); n != 0 {
		t.Fatalf("the switch blamed the live sidecar (logged: %q)", log.msgs)
	}
}

// After the newer of two sidecars of an engine stops, a short burst of the
// engine's changes reaches the ingress only through the older one, whose
// deltas are ignored, and then the engine goes idle. The housekeeping pass
// follows the older sidecar again once the followed one has echoed none of
// those changes for EpochGrace; before, only a later delta of the older
// one switched, and the index stayed behind the engine until the next
// request (over a minute in the report). Changes the followed sidecar did
// publish, echoed late by the older one, are no reason to switch. The
// ticker is off: the test runs each pass at the time it chooses.
func TestIdleEngineFollowsOlderSidecarOnceTheNewerIsSilent(t *testing.T) {
	srv := testutil.NATS(t)
	cfg, idx, reg := materializerConfig(t, srv.URL())
	log := &logged{level: slog.LevelInfo}
	cfg.Logger = slog.New(log)
	cfg.CheckInterval, cfg.IdleCheck, cfg.SnapshotTimeout = time.Hour, time.Hour, time.Second
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)

	older := newFakeSidecar(t, cfg.Conn, 0x5000)
	older.publish(1)
	followed := func(f *fakeSidecar, keys ...uint64) func() bool {
		return func() bool {
			st := m.Status()
			got := idx.Keys("e1", kvevents.TierGPU)
			return len(st) == 1 && st[0].Epoch == f.epoch && !st[0].Snapshotting && slices.Equal(got, keys)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the first sidecar followed", followed(older, 1))
	newer := newFakeSidecar(t, cfg.Conn, 0x3000) // seen second: the newer
	newer.keys = []uint64{1}
	newer.publish(2)
	testutil.WaitFor(t, 10*time.Second, "the newer sidecar followed", followed(newer, 1, 2))
	stale := func(n float64) func() bool {
		return func() bool { return counter(t, reg, "kvmesh_materializer_stale_epoch_deltas_total") == n }
	}

	// Both live: the older sidecar publishes the change the newer one
	// already did. Ignored, and no switch however long the engine idles.
	older.publish(2)
	testutil.WaitFor(t, 10*time.Second, "the older sidecar's echo counted", stale(1))
	m.TickAt(time.Now().Add(time.Minute))
	if !followed(newer, 1, 2)() {
		t.Fatalf("switched on an echo of a change the followed sidecar published: %+v", m.Status())
	}

	// The newer sidecar is gone; the older one publishes two changes, then
	// the engine idles.
	if err := newer.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	older.publish(3)
	older.publish(4)
	testutil.WaitFor(t, 10*time.Second, "the older sidecar's changes counted", stale(3))
	m.TickAt(start) // within EpochGrace: still waiting for the newer one
	if !followed(newer, 1, 2)() {
		t.Fatalf("switched before EpochGrace: %+v", m.Status())
	}
	m.TickAt(time.Now().Add(cfg.EpochGrace))
	testutil.WaitFor(t, 10*time.Second, "the older sidecar followed again, its changes in the index", followed(older, 1, 2, 3, 4))
	if n := log.count("switching to another sidecar epoch: the followed one went silent"); n != 1 {
		t.Fatalf("%d switch messages, want 1 (logged: %q)", n, log.msgs)
	}
}
