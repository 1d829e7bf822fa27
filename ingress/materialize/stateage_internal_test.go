package materialize

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// engineAgeSeries is kvmesh_materializer_engine_state_age_seconds by engine.
func engineAgeSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvmesh_materializer_engine_state_age_seconds" {
			continue
		}
		for _, s := range mf.GetMetric() {
			out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
	}
	return out
}

// An operator sees how old this ingress's copy of each engine's cache is:
// one series per engine, reset by a delta applied in sequence, a snapshot
// installed and a gossiped head and digest equal to the copy, removed when
// the engine is forgotten, and at most maxEngineAgeSeries of them (the
// oldest). Before, only the global kvmesh_materializer_stale_seconds
// existed, which stays 0 while NATS is connected whatever one engine's state.
func TestEngineStateAgeGauge(t *testing.T) {
	srv := testutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = nc, nopIndex{}, reg
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100000, 0)
	m.now = func() time.Time { return now }

	m.mu.Lock()
	busy, idle := m.engine("busy", "m"), m.engine("idle", "m")
	busy.synced, busy.epoch, busy.seq = true, 1, 1
	idle.synced, idle.epoch, idle.seq = true, 1, 7
	busy.confirmed, idle.confirmed = now.Add(-90*time.Second), now.Add(-30*time.Second)
	m.mu.Unlock()
	if got := engineAgeSeries(t, reg); len(got) != 2 || got["busy"] != 90 || got["idle"] != 30 {
		t.Fatalf("ages %v, want busy 90 and idle 30", got)
	}

	// A delta applied in sequence confirms the busy engine's copy, as of
	// its sidecar's stamp: one stamped a minute ago (an ingress a minute
	// behind its deltas) confirms it a minute ago, not now.
	stamped := time.Now().Add(-time.Minute)
	d := kvevents.Delta{Engine: "busy", Model: "m", Epoch: 1, Seq: 2, TS: stamped.UnixNano(), Ops: []kvevents.Op{{Kind: kvevents.OpStore, Keys: []uint64{1, 2}}}}
	m.onDelta(&nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)})
	m.mu.Lock()
	if !busy.confirmed.Equal(time.Unix(0, stamped.UnixNano())) {
		m.mu.Unlock()
		t.Fatalf("a delta stamped %v confirmed the state at %v, want its stamp", stamped, busy.confirmed)
	}
	m.mu.Unlock()
	// One stamped ahead of this host's clock (skew) confirms it now.
	before := time.Now()
	d = kvevents.Delta{Engine: "busy", Model: "m", Epoch: 1, Seq: 3, TS: before.Add(time.Hour).UnixNano(), Ops: []kvevents.Op{{Kind: kvevents.OpStore, Keys: []uint64{3}}}}
	m.onDelta(&nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)})
	// An idle engine's copy is confirmed by gossip's equal head and digest.
	m.mu.Lock()
	if busy.applied != 2 {
		m.mu.Unlock()
		t.Fatalf("deltas not applied: %d of 2", busy.applied)
	}
	if busy.confirmed.Before(before) {
		m.mu.Unlock()
		t.Fatalf("a delta applied in sequence left the state confirmed at %v, before %v", busy.confirmed, before)
	}
	busy.confirmed = now.Add(-time.Second)
	m.checkHeadLocked(idle, kvevents.EngineDigest{Head: idle.head(), Digests: idle.digests}, now.Add(-2*time.Second))
	m.mu.Unlock()
	if got := engineAgeSeries(t, reg); got["busy"] != 1 || got["idle"] != 2 {
		t.Fatalf("ages %v after a delta and a matching gossip digest, want busy 1 and idle 2", got)
	}

	// A snapshot installed confirms it too.
	m.mu.Lock()
	idle.confirmed = now.Add(-time.Hour)
	idle.snapshotting = true
	m.mu.Unlock()
	before = time.Now()
	m.installSnapshot(idle, &snapshot{Epoch: 1, Seq: 9}, nil)
	m.mu.Lock()
	if idle.confirmed.Before(before) || idle.seq != 9 {
		m.mu.Unlock()
		t.Fatalf("a snapshot installed (seq %d) left the state confirmed at %v, before %v", idle.seq, idle.confirmed, before)
	}
	// The series goes with the engine.
	m.forgetLocked(idle, "test")
	m.mu.Unlock()
	if got := engineAgeSeries(t, reg); len(got) != 1 || got["busy"] != 1 {
		t.Fatalf("ages %v after the idle engine was forgotten, want busy only", got)
	}

	// Bounded: past maxEngineAgeSeries engines, the oldest are exported.
	m.mu.Lock()
	for i := range maxEngineAgeSeries + 10 {
		e := m.engine(fmt.Sprintf("e%04d", i), "m")
		e.confirmed = now.Add(-time.Duration(i) * time.Second)
	}
	m.mu.Unlock()
	got := engineAgeSeries(t, reg)
	if len(got) != maxEngineAgeSeries {
		t.Fatalf("%d series for %d engines, want %d", len(got), maxEngineAgeSeries+11, maxEngineAgeSeries)
	}
	if _, ok := got["busy"]; ok {
		t.Fatal("the youngest engine exported past the bound, instead of an older one")
	}
	if got[fmt.Sprintf("e%04d", maxEngineAgeSeries+9)] != float64(maxEngineAgeSeries+9) {
		t.Fatalf("the oldest engine not exported: %v", got[fmt.Sprintf("e%04d", maxEngineAgeSeries+9)])
	}
}
