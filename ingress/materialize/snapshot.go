package materialize

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Snapshot request errors.
var (
	ErrNoResponders = errors.New("snapshot: no sidecar answers")
	ErrSnapshot     = errors.New("snapshot: bad reply")
)

// snapshot is an engine's full key set per tier as of (Epoch, Seq).
type snapshot struct {
	Epoch, Seq uint64
	Keys       [kvevents.NumTiers][]uint64
}

// fetchSnapshot asks the engine's sidecar for its key set and collects every
// chunk of the reply. The request carries an inbox subscribed beforehand, so
// chunks cannot be missed; the reply ends when all chunks arrived.
func fetchSnapshot(ctx context.Context, nc *nats.Conn, model, engine string) (*snapshot, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("snapshot subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil { // bounded by the chunk count we accept
		return nil, fmt.Errorf("snapshot subscribe: %w", err)
	}
	if err := nc.PublishRequest(natsutil.SnapSubject(model, engine), inbox, nil); err != nil {
		return nil, fmt.Errorf("snapshot request: %w", err)
	}
	var (
		s     snapshot
		chunk kvevents.SnapshotChunk
		seen  []bool
		left  int
	)
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNoResponders
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot reply: %w", err)
		}
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return nil, ErrNoResponders
		}
		if err := kvevents.DecodeSnapshotChunk(msg.Data, &chunk); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
		}
		if seen == nil {
			s.Epoch, s.Seq = chunk.Epoch, chunk.Seq
			seen, left = make([]bool, chunk.Chunks), chunk.Chunks
		}
		if chunk.Epoch != s.Epoch || chunk.Seq != s.Seq || chunk.Chunks != len(seen) || chunk.Engine != engine {
			return nil, fmt.Errorf("%w: chunks disagree (epoch %d/%d seq %d/%d)", ErrSnapshot, chunk.Epoch, s.Epoch, chunk.Seq, s.Seq)
		}
		if seen[chunk.Chunk] {
			continue
		}
		seen[chunk.Chunk] = true
		left--
		for _, op := range chunk.Ops {
			s.Keys[op.Tier] = append(s.Keys[op.Tier], op.Keys...)
		}
		if left == 0 {
			return &s, nil
		}
	}
}
