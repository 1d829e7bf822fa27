package kvevents

import (
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

// The kvmesh messages of DESIGN.md Contract 2, written by sidecars and read by
// every ingress. Both are msgpack arrays whose first two elements are the wire
// version and the message kind, so a decoder can reject what it does not know
// before looking further:
//
//	delta:    [1, 1, engine str, model str, epoch uint, seq uint, ts int, ops (, epoch start int)]
//	snapshot: [1, 2, engine str, model str, epoch uint, seq uint, ts int, ops, chunk uint, chunks uint (, epoch start int)]
//	op:       [kind uint, tier uint, keys bin]
//
// The epoch start (when the sidecar's epoch began, unix ns) is optional and
// written only when set: readers before it skip trailing fields, and what
// sidecars before it write decodes with EpochStart 0 (unknown). A trailing
// field of another type in its place is skipped as unknown.
//
// keys are packed as little-endian uint64s in one bin: 8 bytes a key instead of
// 9, and decoding is a bounds check plus a copy. The codec is hand-written so a
// decode into a reused message allocates nothing and never panics on bad input.

// DeltaVersion is the wire version this package writes and reads.
const DeltaVersion = 1

// Message kinds (element 1 of every message).
const (
	msgDelta    = 1
	msgSnapshot = 2
)

// OpKind is what a delta op does to one tier of an engine's key set.
type OpKind uint8

const (
	OpStore  OpKind = iota + 1 // add Keys to Tier
	OpRemove                   // remove Keys from Tier
	OpClear                    // empty Tier (Keys unused)
)

// String returns the op's lower-case name.
func (k OpKind) String() string {
	switch k {
	case OpStore:
		return "store"
	case OpRemove:
		return "remove"
	case OpClear:
		return "clear"
	default:
		return "unknown"
	}
}

// Op is one change to one tier.
type Op struct {
	Kind OpKind
	Tier Tier
	Keys []uint64
}

// Delta is one change set of one engine's key set. Seq is +1 per delta within an
// Epoch (random per sidecar start), with no gaps.
type Delta struct {
	Engine string
	Model  string
	Epoch  uint64
	Seq    uint64
	// TS is the unix nanoseconds of the newest engine batch in the delta
	// (its event time); for a delta with no engine batch behind it (a
	// rank's restart, lost history) the time the sidecar made it.
	TS  int64
	Ops []Op
	// EpochStart is when the sidecar's epoch began (unix nanoseconds; 0:
	// unknown, a sidecar that predates the field). Of two live epochs of one
	// engine (a sidecar restart overlapping its old self) the later start is
	// the newer, so every ingress follows the same one (NewerEpoch).
	EpochStart int64
}

// NewerEpoch reports whether epoch a, started at aStart, is newer than b,
// started at bStart (0: unknown): the later start wins, an unknown start
// losing to a known one, and equal starts are decided by the larger epoch
// number, so every reader orders two epochs the same way.
func NewerEpoch(a uint64, aStart int64, b uint64, bStart int64) bool {
	aStart, bStart = max(aStart, 0), max(bStart, 0)
	if aStart != bStart {
		return aStart > bStart
	}
	return a > b
}

// SnapshotChunk is one part of a snapshot reply: the engine's full key set per
// tier as of delta Seq of Epoch, split over Chunks messages (Chunk counts from 0).
// Ops holds only OpStore ops; a tier may span several chunks.
type SnapshotChunk struct {
	Engine string
	Model  string
	Epoch  uint64
	Seq    uint64
	TS     int64 // unix nanoseconds when the snapshot was taken
	Ops    []Op
	Chunk  int
	Chunks int
	// EpochStart is Delta.EpochStart of the epoch the snapshot reflects.
	EpochStart int64
}

// Limits that keep a decoder bounded whatever the input claims.
const (
	deltaMaxOps       = 1 << 12
	deltaMaxChunks    = 1 << 16
	deltaMaxNameLen   = 1 << 10
	deltaMaxKeysPerOp = 1 << 24
	deltaOverhead     = 64 // a generous bound of a delta's fixed fields
)

// Errors returned by the decoders. Every decode error wraps ErrMalformedDelta.
var (
	ErrMalformedDelta = errors.New("malformed kvmesh message")
	ErrDeltaVersion   = fmt.Errorf("%w: unsupported version", ErrMalformedDelta)
	ErrDeltaKind      = fmt.Errorf("%w: unexpected message kind", ErrMalformedDelta)
)

// AppendDelta appends the encoding of d to dst.
func AppendDelta(dst []byte, d *Delta) []byte {
	if d.EpochStart != 0 {
		dst = append(dst, 0x99) // fixarray(9)
	} else {
		dst = append(dst, 0x98) // fixarray(8): what readers of every version expect
	}
	dst = deltaAppendHeader(dst, msgDelta, d.Engine, d.Model, d.Epoch, d.Seq, d.TS)
	dst = deltaAppendOps(dst, d.Ops)
	if d.EpochStart != 0 {
		dst = wire.AppendInt(dst, d.EpochStart)
	}
	return dst
}

// AppendSnapshotChunk appends the encoding of c to dst.
func AppendSnapshotChunk(dst []byte, c *SnapshotChunk) []byte {
	if c.EpochStart != 0 {
		dst = append(dst, 0x9b) // fixarray(11)
	} else {
		dst = append(dst, 0x9a) // fixarray(10)
	}
	dst = deltaAppendHeader(dst, msgSnapshot, c.Engine, c.Model, c.Epoch, c.Seq, c.TS)
	dst = deltaAppendOps(dst, c.Ops)
	dst = wire.AppendUint(dst, uint64(c.Chunk))
	dst = wire.AppendUint(dst, uint64(c.Chunks))
	if c.EpochStart != 0 {
		dst = wire.AppendInt(dst, c.EpochStart)
	}
	return dst
}

// EncodedDeltaSize is an upper bound of the encoded size of a delta or a
// snapshot chunk with the given total number of keys over nops ops; senders
// use it to bound messages.
func EncodedDeltaSize(nops, nkeys int, engine, model string) int {
	return deltaOverhead + len(engine) + len(model) + nops*8 + nkeys*8
}

// MaxKeysIn is how many keys a delta or snapshot chunk of at most nops ops
// for engine and model may carry for its encoding to fit in size bytes (a
// NATS server's max_payload); 0 when not even one key fits.
func MaxKeysIn(size, nops int, engine, model string) int {
	return max(size-EncodedDeltaSize(nops, 0, engine, model), 0) / 8
}

// MaxDeltaOps is the most ops a delta or snapshot chunk may have: readers
// reject a message with more as malformed, so writers split there.
const MaxDeltaOps = deltaMaxOps

// MaxSnapshotChunks is the most chunks a snapshot reply may have: readers
// reject a chunk count above it.
const MaxSnapshotChunks = deltaMaxChunks

// SnapshotErrorHeader names the NATS header of a sidecar's snapshot error
// reply: a message without data whose header says why the sidecar cannot
// send its key set (e.g. a chunk over the server's max_payload). Readers
// that predate it fail to decode the empty reply and retry the snapshot, as
// they would after a bad chunk.
const SnapshotErrorHeader = "Kvmesh-Snapshot-Error"

func deltaAppendHeader(dst []byte, kind uint64, engine, model string, epoch, seq uint64, ts int64) []byte {
	dst = wire.AppendUint(dst, DeltaVersion)
	dst = wire.AppendUint(dst, kind)
	dst = wire.AppendStr(dst, engine)
	dst = wire.AppendStr(dst, model)
	dst = wire.AppendUint(dst, epoch)
	dst = wire.AppendUint(dst, seq)
	return wire.AppendInt(dst, ts)
}

func deltaAppendOps(dst []byte, ops []Op) []byte {
	dst = wire.AppendArrayHeader(dst, len(ops))
	for i := range ops {
		op := &ops[i]
		dst = append(dst, 0x93)
		dst = wire.AppendUint(dst, uint64(op.Kind))
		dst = wire.AppendUint(dst, uint64(op.Tier))
		dst = deltaAppendKeys(dst, op.Keys)
	}
	return dst
}

// DecodeDelta decodes b into d, reusing d's op and key slices (and its strings
// when unchanged) so a steady stream decodes without allocating. On error d
// holds partial data and must not be used.
func DecodeDelta(b []byte, d *Delta) error {
	r := reader{b: b, bad: ErrMalformedDelta}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 8 {
		return fmt.Errorf("%w: delta has %d fields", ErrMalformedDelta, n)
	}
	kind, err := deltaHeader(&r, &d.Engine, &d.Model, &d.Epoch, &d.Seq, &d.TS)
	if err != nil {
		return err
	}
	if kind != msgDelta {
		return fmt.Errorf("%w: %d", ErrDeltaKind, kind)
	}
	if d.Ops, err = deltaOps(&r, d.Ops); err != nil {
		return err
	}
	d.EpochStart = 0
	if n > 8 {
		if d.EpochStart, err = deltaOptInt(&r); err != nil {
			return err
		}
		return deltaEnd(&r, n-9)
	}
	return deltaEnd(&r, n-8)
}

// DecodeSnapshotChunk decodes b into c, reusing c's slices like DecodeDelta.
func DecodeSnapshotChunk(b []byte, c *SnapshotChunk) error {
	r := reader{b: b, bad: ErrMalformedDelta}
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 10 {
		return fmt.Errorf("%w: snapshot chunk has %d fields", ErrMalformedDelta, n)
	}
	kind, err := deltaHeader(&r, &c.Engine, &c.Model, &c.Epoch, &c.Seq, &c.TS)
	if err != nil {
		return err
	}
	if kind != msgSnapshot {
		return fmt.Errorf("%w: %d", ErrDeltaKind, kind)
	}
	if c.Ops, err = deltaOps(&r, c.Ops); err != nil {
		return err
	}
	for _, op := range c.Ops {
		if op.Kind != OpStore {
			return fmt.Errorf("%w: snapshot op %s", ErrMalformedDelta, op.Kind)
		}
	}
	chunk, err := r.uint()
	if err != nil {
		return err
	}
	chunks, err := r.uint()
	if err != nil {
		return err
	}
	if chunks == 0 || chunks > deltaMaxChunks || chunk >= chunks {
		return fmt.Errorf("%w: snapshot chunk %d of %d", ErrMalformedDelta, chunk, chunks)
	}
	c.Chunk, c.Chunks = int(chunk), int(chunks)
	c.EpochStart = 0
	if n > 10 {
		if c.EpochStart, err = deltaOptInt(&r); err != nil {
			return err
		}
		return deltaEnd(&r, n-11)
	}
	return deltaEnd(&r, n-10)
}

// deltaOptInt reads an optional int field (any int encoding, as ts): a value
// of another type in its place is skipped and reads as 0.
func deltaOptInt(r *reader) (int64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c <= 0x7f || c >= 0xe0 || c >= 0xcc && c <= 0xd3 {
		v, _, err := r.integer()
		return int64(v), err
	}
	return 0, deltaSkip(r, 0)
}

// deltaEnd skips n trailing fields and rejects bytes after the message (found
// by FuzzDecodeDeltaOracle: they were silently ignored, unlike DecodeBatch).
func deltaEnd(r *reader, n int) error {
	if err := deltaSkipRest(r, n); err != nil {
		return err
	}
	if r.remaining() != 0 {
		return r.errf("%d trailing bytes after the message", r.remaining())
	}
	return nil
}

func deltaHeader(r *reader, engine, model *string, epoch, seq *uint64, ts *int64) (kind uint64, err error) {
	v, err := r.uint()
	if err != nil {
		return 0, err
	}
	if v != DeltaVersion {
		return 0, fmt.Errorf("%w: %d", ErrDeltaVersion, v)
	}
	if kind, err = r.uint(); err != nil {
		return 0, err
	}
	if err = deltaStr(r, engine); err != nil {
		return 0, err
	}
	if err = deltaStr(r, model); err != nil {
		return 0, err
	}
	if *epoch, err = r.uint(); err != nil {
		return 0, err
	}
	if *seq, err = r.uint(); err != nil {
		return 0, err
	}
	tsv, _, err := r.integer() // any int encoding; a uint64 above MaxInt64 wraps
	*ts = int64(tsv)
	return kind, err
}

func deltaOps(r *reader, ops []Op) ([]Op, error) {
	n, err := r.arrayLen()
	if err != nil {
		return ops, err
	}
	if n > deltaMaxOps {
		return ops, fmt.Errorf("%w: %d ops", ErrMalformedDelta, n)
	}
	if cap(ops) >= n {
		ops = ops[:n]
	} else {
		old := ops[:cap(ops)]
		ops = make([]Op, n)
		copy(ops, old) // keep the old key buffers for reuse
	}
	for i := range ops {
		op := &ops[i]
		fields, err := r.arrayLen()
		if err != nil {
			return ops, err
		}
		if fields < 3 {
			return ops, fmt.Errorf("%w: op has %d fields", ErrMalformedDelta, fields)
		}
		kind, err := r.uint()
		if err != nil {
			return ops, err
		}
		if kind < uint64(OpStore) || kind > uint64(OpClear) {
			return ops, fmt.Errorf("%w: op kind %d", ErrMalformedDelta, kind)
		}
		tier, err := r.uint()
		if err != nil {
			return ops, err
		}
		if tier >= NumTiers {
			return ops, fmt.Errorf("%w: tier %d", ErrMalformedDelta, tier)
		}
		op.Kind, op.Tier = OpKind(kind), Tier(tier)
		if op.Keys, err = deltaKeys(r, op.Keys[:0]); err != nil {
			return ops, err
		}
		if err := deltaSkipRest(r, fields-3); err != nil {
			return ops, err
		}
	}
	return ops, nil
}
