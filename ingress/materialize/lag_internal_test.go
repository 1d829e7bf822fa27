package materialize

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// lagFixture is an unrun materializer following engines synced at epoch
// 1, and a sender of their deltas stamped at ts.
func lagFixture(t *testing.T, engines ...string) (*Materializer, func(engine string, seq uint64, ts time.Time)) {
	m, _ := newUnrunMaterializer(t, func(*Config) {})
	m.mu.Lock()
	for _, id := range engines {
		e := m.engine(id, "m")
		e.synced, e.epoch, e.seq = true, 1, 0
	}
	m.mu.Unlock()
	return m, func(engine string, seq uint64, ts time.Time) {
		d := kvevents.Delta{Engine: engine, Model: "m", Epoch: 1, Seq: seq, TS: ts.UnixNano(), Ops: []kvevents.Op{{Kind: kvevents.OpStore, Keys: []uint64{seq}}}}
		m.onDelta(&nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)})
	}
}

// A delta stamped a few milliseconds ahead of this host's clock is the
// error of two NTP-synced hosts, not a broken clock: it is a lag of 0 in
// the histogram, not counted ahead (with no tolerance, every such delta
// was counted and warned about as "is NTP running?", and the histogram
// kept only the deltas slower than the skew). Beyond AheadTolerance it is
// still counted ahead.
func TestDeltasStampedWithinToleranceAreLagZero(t *testing.T) {
	m, send := lagFixture(t, "e")
	const ahead = 10 * time.Millisecond // NTP's error between hosts
	send("e", 1, time.Now().Add(ahead))
	h := histogram(t, m.met.lag)
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 0 || testutil.ToFloat64(m.met.aheadStamps) != 0 {
		t.Fatalf("a delta stamped %v ahead: %d lag samples (sum %v), %v counted ahead; want 1 sample of at least 0, none ahead",
			ahead, h.GetSampleCount(), h.GetSampleSum(), testutil.ToFloat64(m.met.aheadStamps))
	}
	send("e", 2, time.Now().Add(time.Second))
	if h := histogram(t, m.met.lag); h.GetSampleCount() != 1 || testutil.ToFloat64(m.met.aheadStamps) != 1 {
		t.Fatalf("a delta stamped 1 s ahead: %d lag samples, %v counted ahead; want 1, 1", h.GetSampleCount(), testutil.ToFloat64(m.met.aheadStamps))
	}
}

// PropagationLag (kvmesh_ingress_index_propagation_lag_seconds) is the
// largest lag of the engines' last deltas among the engines with a delta
// applied within LagWindow: an engine that sent one delta 30 s late (its
// sidecar's clock behind, or its delta queued) and went quiet drops out
// after LagWindow, while another engine's fresh deltas show. Before, the
// gauge was the largest last lag of every engine ever followed and read
// 30 s for as long as the quiet engine stayed quiet (tester h-clock).
func TestPropagationLagForgetsQuietEngines(t *testing.T) {
	m, send := lagFixture(t, "quiet", "busy")
	send("quiet", 1, time.Now().Add(-30*time.Second))
	send("busy", 1, time.Now().Add(-time.Millisecond))
	now := time.Now()
	if lag := m.PropagationLag(now); lag < 30*time.Second {
		t.Fatalf("both engines' deltas just applied: lag %v, want the quiet engine's 30 s", lag)
	}
	if lag := m.PropagationLag(now.Add(LagWindow)); lag != 0 {
		t.Fatalf("no delta for %v: lag %v, want 0", LagWindow, lag)
	}
	// The busy engine keeps sending: its last delta, measured LagWindow
	// after the quiet engine's, is the gauge.
	m.mu.Lock()
	m.observeLagLocked(m.engines["busy"], 2*time.Millisecond, now.Add(LagWindow))
	m.mu.Unlock()
	if lag := m.PropagationLag(now.Add(LagWindow)); lag != 2*time.Millisecond {
		t.Fatalf("the quiet engine's delta %v old, the busy one's fresh: lag %v, want 2ms", LagWindow, lag)
	}
}
