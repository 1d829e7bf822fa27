package materialize

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	kvtestutil "github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// A snapshot reply chunk naming another model than the request's subject,
// or whose epoch starts more than MaxEpochAhead past this clock, is refused
// (counted through refuse) and skipped: the request goes on waiting for a
// reply it may use, here none, so it times out. Before, either was
// assembled and returned, and a far-future start made the forged epoch the
// one followed (a newer epoch than the followed one answered).
func TestForgedSnapshotChunksRefused(t *testing.T) {
	srv := kvtestutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	for _, tc := range []struct {
		reason string
		chunk  kvevents.SnapshotChunk
	}{
		{refusedSnapSubject, kvevents.SnapshotChunk{Engine: "e1", Model: "other", Epoch: 7, EpochStart: time.Now().UnixNano()}},
		{refusedSnapSubject, kvevents.SnapshotChunk{Engine: "e2", Model: "m", Epoch: 7, EpochStart: time.Now().UnixNano()}},
		{refusedSnapEpochAhead, kvevents.SnapshotChunk{Engine: "e1", Model: "m", Epoch: 7, EpochStart: time.Now().Add(time.Hour).UnixNano()}},
	} {
		c := tc.chunk
		c.Seq, c.Chunks = 1, 1
		c.Ops = []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{1, 2, 3}}}
		sub, err := nc.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(msg *nats.Msg) { _ = msg.Respond(kvevents.AppendSnapshotChunk(nil, &c)) })
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		s, err := fetchSnapshot(ctx, nc, natsutil.Default(), "m", "e1", nil, 1, 0, func(reason, _, _, _ string, _ int64, _ time.Time) { got = append(got, reason) })
		cancel()
		_ = sub.Unsubscribe()
		if s != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: a forged reply gave snapshot %+v, err %v; want it skipped and the request timed out", tc.reason, s, err)
		}
		if len(got) != 1 || got[0] != tc.reason {
			t.Fatalf("refused %v, want [%s]", got, tc.reason)
		}
	}
}
