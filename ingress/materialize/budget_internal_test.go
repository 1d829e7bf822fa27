package materialize

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	kvtestutil "github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// newUnrunMaterializer is a Materializer that is not running: a snapshot it
// asks for stays due (retryAt), so every delta of an engine not yet synced
// is buffered, as it is while a snapshot is in flight.
func newUnrunMaterializer(t *testing.T, edit func(*Config)) (*Materializer, *prometheus.Registry) {
	t.Helper()
	srv := kvtestutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = nc, nopIndex{}, reg
	edit(&cfg)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func sendDelta(m *Materializer, engine string, seq uint64, keys int) {
	d := kvevents.Delta{Engine: engine, Model: "m", Epoch: 1, Seq: seq, Ops: []kvevents.Op{{Kind: kvevents.OpStore, Keys: make([]uint64, keys)}}}
	for i := range d.Ops[0].Keys {
		d.Ops[0].Keys[i] = seq<<32 | uint64(i)
	}
	m.onDelta(&nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)})
}

// The deltas buffered while snapshots are in flight are bounded over every
// engine, not only per engine: after a NATS reconnect every engine
// snapshots at once, and 4,096 deltas for each of a thousand engines could
// hold gigabytes. Past the budget the largest buffer goes (the snapshot
// recovers it, a missing delta after it shows up as a gap), and the others
// keep theirs.
func TestBufferedDeltasBoundedOverEngines(t *testing.T) {
	one := deltaBytes(&kvevents.Delta{Engine: "big", Model: "m", Ops: []kvevents.Op{{Keys: make([]uint64, 100)}}})
	m, reg := newUnrunMaterializer(t, func(c *Config) { c.MaxBufferedBytes = 4 * one })
	for seq := uint64(1); seq <= 3; seq++ {
		sendDelta(m, "big", seq, 100)
	}
	sendDelta(m, "few", 1, 100)
	m.mu.Lock()
	big, few := m.engines["big"], m.engines["few"]
	if len(big.buf) != 3 || len(few.buf) != 1 || m.bufBytes != 4*one {
		m.mu.Unlock()
		t.Fatalf("buffers %d and %d deltas, %d bytes, want 3, 1 and %d", len(big.buf), len(few.buf), m.bufBytes, 4*one)
	}
	m.mu.Unlock()

	sendDelta(m, "few", 2, 100) // over the budget: the largest buffer goes
	m.mu.Lock()
	if len(big.buf) != 0 || big.bufBytes != 0 || len(few.buf) != 2 || m.bufBytes != 2*one {
		m.mu.Unlock()
		t.Fatalf("after the budget was reached: buffers %d and %d deltas, %d bytes; want the largest (big) dropped, few's 2 kept, %d bytes",
			len(big.buf), len(few.buf), m.bufBytes, 2*one)
	}
	m.mu.Unlock()
	if got := testutil.ToFloat64(m.met.bufferDrops.WithLabelValues("byte_budget")); got != 1 {
		t.Fatalf("byte_budget drops %v, want 1", got)
	}
	if got := kvtestutil.MetricSum(t, reg, "kvmesh_materializer_buffered_bytes"); got != float64(2*one) {
		t.Fatalf("kvmesh_materializer_buffered_bytes %v, want %d", got, 2*one)
	}

	// A delta larger than the whole budget is not kept at all.
	sendDelta(m, "few", 3, 1000)
	m.mu.Lock()
	if m.bufBytes > m.cfg.MaxBufferedBytes || len(few.buf) != 0 {
		m.mu.Unlock()
		t.Fatalf("a delta over the budget: %d bytes buffered (budget %d), few holds %d deltas", m.bufBytes, m.cfg.MaxBufferedBytes, len(few.buf))
	}
	m.mu.Unlock()

	// The snapshot then recovers the engine whose buffer went: installed at
	// seq 1, the next delta (4) is a gap, which asks for another snapshot.
	m.installSnapshot(big, &snapshot{Epoch: 1, Seq: 1}, nil)
	sendDelta(m, "big", 4, 10)
	m.mu.Lock()
	defer m.mu.Unlock()
	if big.seq != 1 || big.retryAt.IsZero() || len(big.buf) != 1 {
		t.Fatalf("after the snapshot: seq %d, snapshot due %v, %d buffered; want seq 1, another snapshot due and seq 4 buffered",
			big.seq, !big.retryAt.IsZero(), len(big.buf))
	}
	// The bytes counted are the buffers' own.
	sum := 0
	for _, e := range m.engines {
		sum += e.bufBytes
	}
	if sum != m.bufBytes {
		t.Fatalf("buffered bytes %d, the engines' buffers hold %d", m.bufBytes, sum)
	}
}

// listed is a Membership listing a fixed set of engines (gossip's view as
// a test sets it).
type listed []gossip.EngineView

func (l listed) Engines() []gossip.EngineView { return l }

// With gossip, an id seen only on the delta subjects becomes a record at
// most MaxUnlisted times: a publisher sending deltas under ever new engine
// ids cannot make the ingress hold a record (and ask for a snapshot) for
// each. Gossip discovers a live engine regardless, and an unlisted record
// forgotten makes room again.
func TestUnlistedEnginesBounded(t *testing.T) {
	var members listed
	m, _ := newUnrunMaterializer(t, func(c *Config) { c.MaxUnlisted, c.Membership = 3, &members })
	for i := range 5 {
		sendDelta(m, fmt.Sprintf("x%d", i), 1, 1)
	}
	if n := len(m.Status()); n != 3 {
		t.Fatalf("%d engines known from deltas alone, want at most 3", n)
	}
	if got := testutil.ToFloat64(m.met.unlistedDropped); got != 2 {
		t.Fatalf("unlisted drops %v, want 2", got)
	}
	// Gossip lists x4, which was dropped, and x0: both known now, and x0
	// no longer counts as unlisted.
	members = listed{{EngineState: gossip.EngineState{ID: "x4", Model: "m"}}, {EngineState: gossip.EngineState{ID: "x0", Model: "m"}}}
	now := time.Now()
	m.TickAt(now)
	m.mu.Lock()
	if m.engines["x4"] == nil || m.unlisted != 2 {
		m.mu.Unlock()
		t.Fatalf("after gossip listed x4 and x0: x4 known %v, %d unlisted; want true and 2", m.engines["x4"] != nil, m.unlisted)
	}
	m.mu.Unlock()
	sendDelta(m, "y", 1, 1) // room for one more unlisted engine
	sendDelta(m, "z", 1, 1) // and none after it
	m.mu.Lock()
	if m.engines["y"] == nil || m.engines["z"] != nil {
		m.mu.Unlock()
		t.Fatalf("y known %v, z known %v; want y only", m.engines["y"] != nil, m.engines["z"] != nil)
	}
	m.mu.Unlock()
	// The unlisted, never-synced engines are forgotten after ten snapshot
	// timeouts without a delta, which makes room again.
	m.TickAt(now.Add(11 * m.cfg.SnapshotTimeout))
	sendDelta(m, "z", 1, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.engines["z"] == nil || m.unlisted != 1 || m.engines["x4"] == nil {
		t.Fatalf("after the unlisted ones were forgotten: z known %v, %d unlisted, x4 known %v; want true, 1, true",
			m.engines["z"] != nil, m.unlisted, m.engines["x4"] != nil)
	}
}

// Without gossip every engine is known from its deltas alone: no bound.
func TestUnlistedUnboundedWithoutGossip(t *testing.T) {
	m, _ := newUnrunMaterializer(t, func(c *Config) { c.MaxUnlisted = 2 })
	for i := range 5 {
		sendDelta(m, fmt.Sprintf("x%d", i), 1, 1)
	}
	if n := len(m.Status()); n != 5 {
		t.Fatalf("%d engines known without gossip, want 5", n)
	}
}

// A sidecar whose host clock is ahead of the ingress's stamps its deltas in
// this host's future. That is no propagation lag: observed, the histogram's
// sum went below zero (an ingress ten minutes behind read -100,798 s, so a
// lag alert could never fire). Such deltas are counted instead, and the
// others still measured.
func TestDeltasStampedAheadKeptOutOfTheLag(t *testing.T) {
	m, _ := newUnrunMaterializer(t, func(*Config) {})
	m.mu.Lock()
	e := m.engine("e", "m")
	e.synced, e.epoch, e.seq = true, 1, 0
	m.mu.Unlock()
	send := func(seq uint64, ts time.Time) {
		d := kvevents.Delta{Engine: "e", Model: "m", Epoch: 1, Seq: seq, TS: ts.UnixNano(), Ops: []kvevents.Op{{Kind: kvevents.OpStore, Keys: []uint64{seq}}}}
		m.onDelta(&nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)})
	}
	send(1, time.Now().Add(10*time.Minute))
	if n := testutil.CollectAndCount(m.met.lag); n != 1 {
		t.Fatalf("%d lag series", n)
	}
	h := histogram(t, m.met.lag)
	if h.GetSampleCount() != 0 || testutil.ToFloat64(m.met.aheadStamps) != 1 {
		t.Fatalf("a delta stamped 10 min ahead: %d lag samples (sum %v), %v counted ahead; want 0 and 1",
			h.GetSampleCount(), h.GetSampleSum(), testutil.ToFloat64(m.met.aheadStamps))
	}
	send(2, time.Now().Add(-2*time.Second))
	h = histogram(t, m.met.lag)
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 2 {
		t.Fatalf("a delta stamped 2 s ago: %d lag samples, sum %v; want 1 sample of at least 2 s", h.GetSampleCount(), h.GetSampleSum())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.applied != 2 {
		t.Fatalf("%d deltas applied, want both", e.applied)
	}
}

func histogram(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var out dto.Metric
	if err := h.Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram()
}
