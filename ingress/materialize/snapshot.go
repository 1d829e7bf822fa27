package materialize

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Snapshot request errors.
var (
	ErrNoResponders = errors.New("snapshot: no sidecar answers")
	ErrSnapshot     = errors.New("snapshot: bad reply")
	// ErrSidecarFailed: the sidecar answered that it cannot send its key
	// set (kvevents.SnapshotErrorHeader), e.g. a chunk over NATS max_payload.
	ErrSidecarFailed = errors.New("snapshot: the sidecar cannot send its key set")
)

// snapshot is an engine's full key set per tier as of (Epoch, Seq).
type snapshot struct {
	Epoch, Seq uint64
	EpochStart int64
	Keys       [kvevents.NumTiers][]uint64
	// Fallback: no reply of an accepted epoch came before the deadline and
	// this one, of an epoch the request did not accept (older than the one
	// followed), did.
	Fallback bool
	// Others are the other epochs that answered before this one completed.
	Others []epochInfo
}

// maxReplyEpochs bounds the epochs one snapshot request assembles replies
// of (normally one sidecar answers; two while a restart overlaps itself).
const maxReplyEpochs = 4

// fetchSnapshot asks the engine's sidecars for their key set and collects
// every chunk of the replies. The request carries an inbox subscribed
// beforehand, so chunks cannot be missed. Two sidecars may answer (a restart
// overlapping its old self, each with its own epoch): chunks are assembled
// per epoch, and the first complete reply of an epoch accept takes is the
// answer. A complete reply accept refuses (an older epoch) is kept and
// returned, marked Fallback, when nothing else completed by ctx's deadline.
// responders is how many sidecars are expected to answer (2 while another
// epoch than the followed one was heard from lately, else 1): an error reply
// ends the request at once only when that many error replies came and no
// other reply is under way; otherwise it is returned at ctx's deadline if
// nothing completed by then. first, when positive, bounds the wait for
// the first reply of any kind (FirstReplyTimeout). A chunk chunkRefusal
// refuses (another engine's or model's, an epoch start too far ahead) is
// passed to refuse and skipped: the request goes on waiting for its
// sidecar's reply, which a forged one that came first does not end.
func fetchSnapshot(ctx context.Context, nc *nats.Conn, subj natsutil.Subjects, model, engine string, accept func(epoch uint64, start int64) bool, responders int, first time.Duration,
	refuse func(reason, subject, engine, model string, start int64, now time.Time)) (*snapshot, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("snapshot subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil { // bounded by the chunk count we accept
		return nil, fmt.Errorf("snapshot subscribe: %w", err)
	}
	if err := nc.PublishRequest(subj.SnapSubject(model, engine), inbox, nil); err != nil {
		return nil, fmt.Errorf("snapshot request: %w", err)
	}
	var chunk kvevents.SnapshotChunk
	var replies []*assembler
	var fallback *snapshot
	var failed error // an error reply, while another epoch's reply may still complete
	failures := 0    // error replies
	wait := ctx
	if first > 0 {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, first)
		defer cancel()
	}
	for {
		msg, err := sub.NextMsgWithContext(wait)
		if err == nil {
			wait = ctx // a reply is under way: the whole request's bound from here
		}
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, ErrNoResponders
		}
		if err != nil {
			if fallback != nil && errors.Is(err, context.DeadlineExceeded) {
				fallback.Fallback = true
				return fallback, nil
			}
			if failed != nil && errors.Is(err, context.DeadlineExceeded) {
				return nil, failed
			}
			return nil, fmt.Errorf("snapshot reply: %w", err)
		}
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return nil, ErrNoResponders
		}
		if why := msg.Header.Get(kvevents.SnapshotErrorHeader); why != "" {
			failed = fmt.Errorf("%w: %s", ErrSidecarFailed, why)
			failures++
			if failures >= responders && len(replies) == 0 && fallback == nil {
				return nil, failed
			}
			// Another sidecar's reply is under way, or expected: during an
			// epoch overlap (a restart) the tiny error reply of one
			// usually comes before the other's chunks.
			continue
		}
		if err := kvevents.DecodeSnapshotChunk(msg.Data, &chunk); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSnapshot, err)
		}
		now := time.Now()
		if why := chunkRefusal(model, engine, &chunk, now); why != "" {
			if refuse != nil {
				refuse(why, subj.SnapSubject(model, engine), chunk.Engine, chunk.Model, chunk.EpochStart, now)
			}
			continue
		}
		var a *assembler
		for _, r := range replies {
			if r.s.Epoch == chunk.Epoch {
				a = r
			}
		}
		if a == nil {
			if len(replies) == maxReplyEpochs {
				continue
			}
			a = &assembler{engine: engine}
			replies = append(replies, a)
		}
		done, err := a.add(&chunk)
		if err != nil {
			return nil, err
		}
		if !done {
			continue
		}
		if accept == nil || accept(a.s.Epoch, a.s.EpochStart) {
			for _, r := range replies {
				if r != a {
					a.s.Others = append(a.s.Others, epochInfo{epoch: r.s.Epoch, start: r.s.EpochStart})
				}
			}
			return &a.s, nil
		}
		if fallback == nil {
			fallback = &a.s
		}
	}
}

// assembler reassembles one snapshot reply from its chunks, which may arrive
// in any order and more than once; every chunk must name the same engine,
// epoch, sequence and chunk count as the first.
type assembler struct {
	engine string
	s      snapshot
	seen   []bool
	left   int
}

// add takes one decoded chunk (its Chunk < Chunks, as DecodeSnapshotChunk
// guarantees); done is true once every chunk arrived.
func (a *assembler) add(c *kvevents.SnapshotChunk) (done bool, err error) {
	if a.seen == nil {
		if c.Chunks <= 0 {
			return false, fmt.Errorf("%w: %d chunks", ErrSnapshot, c.Chunks)
		}
		a.s.Epoch, a.s.Seq, a.s.EpochStart = c.Epoch, c.Seq, c.EpochStart
		a.seen, a.left = make([]bool, c.Chunks), c.Chunks
	}
	if c.Epoch != a.s.Epoch || c.Seq != a.s.Seq || c.Chunks != len(a.seen) || c.Engine != a.engine {
		return false, fmt.Errorf("%w: chunks disagree (epoch %d/%d seq %d/%d)", ErrSnapshot, c.Epoch, a.s.Epoch, c.Seq, a.s.Seq)
	}
	if c.Chunk < 0 || c.Chunk >= len(a.seen) {
		return false, fmt.Errorf("%w: chunk %d of %d", ErrSnapshot, c.Chunk, len(a.seen))
	}
	if a.seen[c.Chunk] {
		return a.left == 0, nil
	}
	a.seen[c.Chunk] = true
	a.left--
	for _, op := range c.Ops {
		if int(op.Tier) >= kvevents.NumTiers {
			return false, fmt.Errorf("%w: tier %d", ErrSnapshot, op.Tier)
		}
		a.s.Keys[op.Tier] = append(a.s.Keys[op.Tier], op.Keys...)
	}
	return a.left == 0, nil
}
