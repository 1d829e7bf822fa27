package materialize_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// refused is kvmesh_materializer_refused_total{reason}.
func refused(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "kvmesh_materializer_refused_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// forger is a publisher with NATS rights on the delta and snapshot subjects
// (no gossip key): it answers every snapshot request of engine e1 with its
// own epoch and fake keys, as the security review's forger did, so that a
// forged epoch the materializer follows is installed at once.
type forger struct {
	t     *testing.T
	nc    *nats.Conn
	epoch uint64
	start int64
	keys  []uint64
}

const forgedEpoch = 424242

func newForger(t *testing.T, url string, start time.Time) *forger {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f := &forger{t: t, nc: nc, epoch: forgedEpoch, start: start.UnixNano()}
	for i := range 5000 {
		f.keys = append(f.keys, 0xf0f0_0000_0000+uint64(i))
	}
	if _, err := nc.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) {
		c := kvevents.SnapshotChunk{Engine: "e1", Model: "m", Epoch: f.epoch, EpochStart: f.start, Seq: 1, Chunks: 1,
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: f.keys}}}
		_ = msg.Respond(kvevents.AppendSnapshotChunk(nil, &c))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

// publish sends on subject one delta whose body names engine e1 of model m
// in the forger's epoch, storing its fake keys.
func (f *forger) publish(subject string) {
	f.t.Helper()
	d := kvevents.Delta{Engine: "e1", Model: "m", Epoch: f.epoch, EpochStart: f.start, Seq: 1, TS: time.Now().UnixNano(),
		Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: f.keys}}}
	if err := f.nc.Publish(subject, kvevents.AppendDelta(nil, &d)); err != nil {
		f.t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

// untouched checks that the forgery changed nothing: the copy still
// follows the real sidecar's epoch, holds the cache's keys, and took no
// snapshot or new epoch for it; and that the real deltas still apply.
func (fx *fixture) untouched(epoch uint64, snaps, epochs float64) {
	fx.t.Helper()
	if n := fx.m.KeyCount(); n != len(fx.cache.Truth()[kvevents.TierGPU]) {
		fx.t.Fatalf("%d keys in the copy after the forgery, the cache has %d", n, len(fx.cache.Truth()[kvevents.TierGPU]))
	}
	if st := fx.m.Status(); len(st) != 1 || st[0].Epoch != epoch || st[0].Engine != "e1" {
		fx.t.Fatalf("status %+v after the forgery, want engine e1 alone in epoch %x", st, epoch)
	}
	if !fx.equal() {
		fx.t.Fatalf("index holds %d keys of e1 after the forgery, the cache %d", len(fx.idx.Keys("e1", kvevents.TierGPU)), len(fx.cache.Truth()[kvevents.TierGPU]))
	}
	if s, e := counter(fx.t, fx.reg, "kvmesh_materializer_snapshots_total"), counter(fx.t, fx.reg, "kvmesh_materializer_new_epochs_total"); s != snaps || e != epochs {
		fx.t.Fatalf("the forgery took %v snapshots and %v new epochs, want none", s-snaps, e-epochs)
	}
	fx.load(10)
	testutil.WaitFor(fx.t, 10*time.Second, "the real sidecar's deltas still applied", fx.equal)
}

// A delta whose body names engine e1 but which comes on another subject
// (an unrelated one, or another engine's) is refused and counted before
// anything is learned from it: the subject is the publisher's NATS
// permission, and per-engine permissions must bound what a compromised
// sidecar can write. Before, onDelta trusted the body alone: one such delta
// with a new epoch, plus a forged snapshot answer, replaced e1's copy with
// 5,000 fake keys (the security review's finding 4).
func TestDeltaOnAnotherSubjectRefused(t *testing.T) {
	fx := newFixture(t)
	fx.load(10)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", fx.equal)
	epoch := fx.m.Status()[0].Epoch
	snaps, epochs := counter(t, fx.reg, "kvmesh_materializer_snapshots_total"), counter(t, fx.reg, "kvmesh_materializer_new_epochs_total")

	f := newForger(t, fx.srv.URL(), time.Now())
	for i, subject := range []string{"kvmesh.delta.attacker.whatever", natsutil.Default().DeltaSubject("m", "e2"), natsutil.Default().DeltaSubject("m2", "e1")} {
		f.publish(subject)
		testutil.WaitFor(t, 10*time.Second, "the delta on "+subject+" refused, or the copy changed", func() bool {
			return refused(t, fx.reg, "delta_subject") == float64(i+1) || !fx.equal()
		})
	}
	fx.untouched(epoch, snaps, epochs)
}

// A delta on its engine's own subject whose epoch starts more than
// MaxEpochAhead past this clock is refused and counted: of two epochs the
// later start is followed, so such a start would make the real sidecar's
// epoch, and its restarts, look older until that time. Before, it was
// followed and the forged snapshot installed.
func TestDeltaEpochStartFarAheadRefused(t *testing.T) {
	fx := newFixture(t)
	fx.load(10)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", fx.equal)
	epoch := fx.m.Status()[0].Epoch
	snaps, epochs := counter(t, fx.reg, "kvmesh_materializer_snapshots_total"), counter(t, fx.reg, "kvmesh_materializer_new_epochs_total")

	f := newForger(t, fx.srv.URL(), time.Now().Add(time.Hour))
	f.publish(natsutil.Default().DeltaSubject("m", "e1"))
	testutil.WaitFor(t, 10*time.Second, "the delta refused, or the copy changed", func() bool {
		return refused(t, fx.reg, "delta_epoch_ahead") == 1 || !fx.equal()
	})
	fx.untouched(epoch, snaps, epochs)
}
