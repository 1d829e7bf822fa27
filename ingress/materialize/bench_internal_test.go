package materialize

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

type nopIndex struct{}

func (nopIndex) Store(string, kvevents.Tier, []uint64)  {}
func (nopIndex) Remove(string, kvevents.Tier, []uint64) {}
func (nopIndex) ClearEngine(string)                     {}

// BenchmarkApplyDelta measures the in-sequence path of one delta (decode,
// set and digest updates, index calls) with 32 stored and 32 removed keys: the
// materializer's ingest rate per core, without NATS.
func BenchmarkApplyDelta(b *testing.B) {
	srv := testutil.NATS(b)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultConfig()
	cfg.Conn, cfg.Index = nc, nopIndex{}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const ring, per, lagDeltas = 4096, 32, 8
	keysOf := func(i int) []uint64 {
		k := make([]uint64, per)
		for j := range k {
			k[j] = kvevents.MixKey(uint64(i*per + j))
		}
		return k
	}
	msgs := make([]*nats.Msg, ring)
	for i := range msgs {
		d := kvevents.Delta{Engine: "e", Model: "m", Epoch: 1, Seq: uint64(i + 1), Ops: []kvevents.Op{
			{Kind: kvevents.OpStore, Keys: keysOf(i)},
			{Kind: kvevents.OpRemove, Keys: keysOf((i - lagDeltas + ring) % ring)},
		}}
		msgs[i] = &nats.Msg{Subject: natsutil.Default().DeltaSubject(d.Model, d.Engine), Data: kvevents.AppendDelta(nil, &d)}
	}
	e := m.engine("e", "m")
	e.synced, e.epoch = true, 1
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%ring == 0 {
			e.seq = 0
		}
		m.onDelta(msgs[i%ring])
	}
	b.StopTimer()
	if e.applied != uint64(b.N) {
		b.Fatalf("applied %d of %d", e.applied, b.N)
	}
	b.ReportMetric(float64(2*per*b.N)/b.Elapsed().Seconds(), "keys/s")
}
