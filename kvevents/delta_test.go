package kvevents

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

func sampleDelta() *Delta {
	return &Delta{
		Engine: "engine-0", Model: "meta-llama/Llama-3.1-8B", Epoch: 0xdeadbeefcafef00d, Seq: 42, TS: 1757500000250000000,
		Ops: []Op{
			{Kind: OpStore, Tier: TierGPU, Keys: []uint64{1, 2, math.MaxUint64}},
			{Kind: OpRemove, Tier: TierCPU, Keys: []uint64{7}},
			{Kind: OpClear, Tier: TierOther, Keys: []uint64{}},
		},
	}
}

func TestDeltaRoundTrip(t *testing.T) {
	for _, d := range []*Delta{
		sampleDelta(),
		{Engine: "", Model: "", Ops: []Op{}},
		{Engine: "e", Model: "m", Epoch: 1, Seq: 1, TS: -5, Ops: []Op{{Kind: OpStore, Tier: TierGPU, Keys: make([]uint64, 40000)}}},
	} {
		b := AppendDelta(nil, d)
		if got, bound := len(b), EncodedDeltaSize(len(d.Ops), countKeys(d.Ops), d.Engine, d.Model); got > bound {
			t.Errorf("encoded %d bytes, size bound says %d", got, bound)
		}
		var got Delta
		if err := DecodeDelta(b, &got); err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(normalize(&got), normalize(d)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, *d)
		}
	}
}

func countKeys(ops []Op) int {
	n := 0
	for _, op := range ops {
		n += len(op.Keys)
	}
	return n
}

func TestSnapshotChunkRoundTrip(t *testing.T) {
	c := &SnapshotChunk{Engine: "e1", Model: "m", Epoch: 9, Seq: 100, TS: 3, Chunk: 2, Chunks: 3,
		Ops: []Op{{Kind: OpStore, Tier: TierGPU, Keys: []uint64{5, 6}}, {Kind: OpStore, Tier: TierCPU, Keys: []uint64{}}}}
	var got SnapshotChunk
	if err := DecodeSnapshotChunk(AppendSnapshotChunk(nil, c), &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalizeOps(got.Ops), normalizeOps(c.Ops)) || got.Chunk != c.Chunk || got.Chunks != c.Chunks || got.Seq != c.Seq || got.Epoch != c.Epoch {
		t.Fatalf("got %+v want %+v", got, *c)
	}
	// A delta is not a snapshot and the other way round.
	if err := DecodeDelta(AppendSnapshotChunk(nil, c), &Delta{}); !errors.Is(err, ErrDeltaKind) {
		t.Errorf("snapshot decoded as delta: %v", err)
	}
	if err := DecodeSnapshotChunk(AppendDelta(nil, sampleDelta()), &got); !errors.Is(err, ErrMalformedDelta) {
		t.Errorf("delta decoded as snapshot: %v", err)
	}
}

func TestDeltaDecodeRejects(t *testing.T) {
	good := AppendDelta(nil, sampleDelta())
	for i := 0; i < len(good); i++ {
		if err := DecodeDelta(good[:i], &Delta{}); !errors.Is(err, ErrMalformedDelta) {
			t.Fatalf("truncated at %d: err %v", i, err)
		}
	}
	bad := append([]byte{}, good...)
	bad[1] = 2 // version
	if err := DecodeDelta(bad, &Delta{}); !errors.Is(err, ErrDeltaVersion) {
		t.Errorf("version 2: %v", err)
	}
	badChunk := AppendSnapshotChunk(nil, &SnapshotChunk{Chunk: 3, Chunks: 3})
	if err := DecodeSnapshotChunk(badChunk, &SnapshotChunk{}); !errors.Is(err, ErrMalformedDelta) {
		t.Errorf("chunk 3 of 3 accepted: %v", err)
	}
}

// A newer writer may append fields; this reader skips them.
func TestDeltaSkipsTrailingFields(t *testing.T) {
	d := sampleDelta()
	b := AppendDelta(nil, d)
	b[0] = 0x9a                                       // fixarray(10)
	b = append(b, 0xa3, 'n', 'e', 'w', 0x92, 1, 0xc0) // "new", [1, nil]
	var got Delta
	if err := DecodeDelta(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(&got), normalize(d)) {
		t.Fatalf("got %+v", got)
	}
}

// The epoch start is an optional trailing field: written only when set, as
// one int after what every earlier reader reads (which skips trailing
// fields), and absent from what earlier sidecars write (read as 0).
func TestEpochStartIsOptionalTrailingField(t *testing.T) {
	const start = 1757500000250000000
	d := sampleDelta()
	old := AppendDelta(nil, d)
	d.EpochStart = start
	b := AppendDelta(nil, d)
	want := append(append([]byte{0x99}, old[1:]...), wire.AppendInt(nil, start)...)
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("a delta with its epoch start is not the old encoding plus one trailing int:\n% x\n% x", b, want)
	}
	var got Delta
	if err := DecodeDelta(b, &got); err != nil || got.EpochStart != start || got.Seq != d.Seq {
		t.Fatalf("decode: %v %+v", err, got)
	}
	if err := DecodeDelta(old, &got); err != nil || got.EpochStart != 0 {
		t.Fatalf("an old sidecar's delta: %v, epoch start %d (want 0, unknown)", err, got.EpochStart)
	}

	c := &SnapshotChunk{Engine: "e1", Model: "m", Epoch: 9, Seq: 100, TS: 3, Chunk: 0, Chunks: 1,
		Ops: []Op{{Kind: OpStore, Tier: TierGPU, Keys: []uint64{5, 6}}}}
	oldChunk := AppendSnapshotChunk(nil, c)
	c.EpochStart = start
	b = AppendSnapshotChunk(nil, c)
	want = append(append([]byte{0x9b}, oldChunk[1:]...), wire.AppendInt(nil, start)...)
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("a chunk with its epoch start is not the old encoding plus one trailing int")
	}
	var gc SnapshotChunk
	if err := DecodeSnapshotChunk(b, &gc); err != nil || gc.EpochStart != start || gc.Chunks != 1 {
		t.Fatalf("decode chunk: %v %+v", err, gc)
	}
	if err := DecodeSnapshotChunk(oldChunk, &gc); err != nil || gc.EpochStart != 0 {
		t.Fatalf("an old sidecar's chunk: %v, epoch start %d", err, gc.EpochStart)
	}
}

func TestNewerEpoch(t *testing.T) {
	for _, tc := range []struct {
		a      uint64
		aStart int64
		b      uint64
		bStart int64
		want   bool
	}{
		{a: 1, aStart: 200, b: 9, bStart: 100, want: true}, // the later start wins whatever the numbers
		{a: 9, aStart: 100, b: 1, bStart: 200, want: false},
		{a: 1, aStart: 100, b: 9, bStart: 0, want: true}, // a known start beats an unknown one
		{a: 9, aStart: 0, b: 1, bStart: 100, want: false},
		{a: 9, aStart: 0, b: 1, bStart: 0, want: true}, // both unknown: the larger epoch, the same everywhere
		{a: 1, aStart: 0, b: 9, bStart: 0, want: false},
		{a: 5, aStart: 7, b: 5, bStart: 7, want: false}, // an epoch is not newer than itself
	} {
		if got := NewerEpoch(tc.a, tc.aStart, tc.b, tc.bStart); got != tc.want {
			t.Errorf("NewerEpoch(%d@%d, %d@%d) = %v", tc.a, tc.aStart, tc.b, tc.bStart, got)
		}
	}
}

func TestDigestOrderIndependent(t *testing.T) {
	var a, b Digest
	keys := []uint64{1, 99, 12345, math.MaxUint64, 0}
	for _, k := range keys {
		a.Add(k)
	}
	for i := len(keys) - 1; i >= 0; i-- {
		b.Add(keys[i])
	}
	if a != b {
		t.Fatalf("order matters: %+v vs %+v", a, b)
	}
	b.Add(777)
	if a == b {
		t.Fatal("an added key did not change the digest")
	}
	b.Remove(777)
	if a != b {
		t.Fatal("remove is not the inverse of add")
	}
	var c Digest
	for _, k := range []uint64{1, 99, 12345, math.MaxUint64, 1} { // same count, one key differs
		c.Add(k)
	}
	if a == c {
		t.Fatal("different sets, same digest")
	}
}

func FuzzDecodeDelta(f *testing.F) {
	f.Add(AppendDelta(nil, sampleDelta()))
	f.Add(AppendSnapshotChunk(nil, &SnapshotChunk{Engine: "x", Chunks: 1, Ops: []Op{{Kind: OpStore, Keys: []uint64{1}}}}))
	f.Add(AppendDelta(nil, &Delta{Engine: "x", Epoch: 2, Seq: 1, EpochStart: -3}))
	f.Add(AppendSnapshotChunk(nil, &SnapshotChunk{Engine: "x", Chunks: 1, EpochStart: 1 << 60}))
	f.Add([]byte{0x98, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Delta
		if err := DecodeDelta(b, &d); err == nil {
			// What decodes must re-encode to something that decodes the same.
			var again Delta
			if err := DecodeDelta(AppendDelta(nil, &d), &again); err != nil || !reflect.DeepEqual(normalize(&d), normalize(&again)) {
				t.Fatalf("re-encode mismatch: %v", err)
			}
		}
		var c SnapshotChunk
		_ = DecodeSnapshotChunk(b, &c)
	})
}

// normalize makes empty key lists nil so DeepEqual compares content.
func normalize(d *Delta) *Delta {
	if len(d.Ops) == 0 {
		d.Ops = nil
	}
	normalizeOps(d.Ops)
	return d
}

func normalizeOps(ops []Op) []Op {
	for i := range ops {
		if len(ops[i].Keys) == 0 {
			ops[i].Keys = nil
		}
	}
	return ops
}

func BenchmarkDecodeDelta(b *testing.B) {
	keys := make([]uint64, 64)
	for i := range keys {
		keys[i] = MixKey(uint64(i))
	}
	msg := AppendDelta(nil, &Delta{Engine: "engine-7", Model: "m", Epoch: 1, Seq: 1, Ops: []Op{{Kind: OpStore, Keys: keys}, {Kind: OpRemove, Keys: keys[:16]}}})
	var d Delta
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if err := DecodeDelta(msg, &d); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendDelta(b *testing.B) {
	d := sampleDelta()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendDelta(buf[:0], d)
	}
}

// TestMaxKeysInFits: a delta and a snapshot chunk of MaxKeysIn keys, with
// every field at its widest (longest names a reader accepts, 64-bit epoch,
// seq, ts and epoch start, the last chunk of the most chunks, keys spread
// over every tier), encode to at most the size asked for, and one key more
// than MaxKeysIn allows may not: senders cut messages to a NATS server's
// max_payload with it (a snapshot chunked by key count alone failed on a
// 64 KiB max_payload).
func TestMaxKeysInFits(t *testing.T) {
	long := strings.Repeat("x", deltaMaxNameLen)
	for _, size := range []int{200, 1000, 4096, 64 << 10, 1 << 20, 8 << 20} {
		for _, names := range [][2]string{{"e", "m"}, {long, long}} {
			n := MaxKeysIn(size, NumTiers, names[0], names[1])
			if n < 1 {
				if len(names[0]) == 1 {
					t.Fatalf("size %d: no key fits", size)
				}
				continue // the names alone take more than size
			}
			ops := spread(n)
			c := SnapshotChunk{Engine: names[0], Model: names[1], Epoch: math.MaxUint64, Seq: math.MaxUint64, TS: math.MinInt64,
				Ops: ops, Chunk: MaxSnapshotChunks - 1, Chunks: MaxSnapshotChunks, EpochStart: math.MinInt64}
			if got := len(AppendSnapshotChunk(nil, &c)); got > size {
				t.Errorf("size %d, names %d bytes: a chunk of %d keys takes %d bytes", size, len(names[0]), n, got)
			}
			d := Delta{Engine: names[0], Model: names[1], Epoch: math.MaxUint64, Seq: math.MaxUint64, TS: math.MinInt64,
				Ops: ops, EpochStart: math.MinInt64}
			if got := len(AppendDelta(nil, &d)); got > size {
				t.Errorf("size %d, names %d bytes: a delta of %d keys takes %d bytes", size, len(names[0]), n, got)
			}
			var back SnapshotChunk
			if err := DecodeSnapshotChunk(AppendSnapshotChunk(nil, &c), &back); err != nil {
				t.Fatalf("the widest chunk does not decode: %v", err)
			}
		}
	}
	if n := MaxKeysIn(50, NumTiers, "e", "m"); n != 0 {
		t.Fatalf("MaxKeysIn(50) = %d, want 0", n)
	}
}

// spread puts n keys over every tier (one op each).
func spread(n int) []Op {
	ops := make([]Op, NumTiers)
	for i := 0; i < n; i++ {
		t := i % NumTiers
		ops[t].Kind, ops[t].Tier = OpStore, Tier(t)
		ops[t].Keys = append(ops[t].Keys, math.MaxUint64-uint64(i))
	}
	for t := range ops {
		ops[t].Kind, ops[t].Tier = OpStore, Tier(t)
	}
	return ops
}
