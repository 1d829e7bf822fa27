package kvevents_test

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/internal/wiretest"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

const (
	fixtureH1 = 3236607068019569386
	fixtureH2 = 2758186210834249151
)

var readFixture = wiretest.Fixture

func seq32(from, to uint32) []uint32 {
	var s []uint32
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// batchesEqual compares batches field by field, treating nil and empty
// slices alike and ts by bits (NaN-safe).
func batchesEqual(a, b *kvevents.Batch) bool {
	if math.Float64bits(a.TS) != math.Float64bits(b.TS) || a.DPRank != b.DPRank || a.HasDPRank != b.HasDPRank ||
		a.Skipped != b.Skipped || len(a.Events) != len(b.Events) {
		return false
	}
	for i := range a.Events {
		if !eventsEqual(&a.Events[i], &b.Events[i]) {
			return false
		}
	}
	return true
}

func eventsEqual(x, y *kvevents.Event) bool {
	return x.Kind == y.Kind && slices.Equal(x.BlockHashes, y.BlockHashes) && x.ParentHash == y.ParentHash &&
		x.HasParent == y.HasParent && slices.Equal(x.TokenIDs, y.TokenIDs) && x.BlockSize == y.BlockSize &&
		x.LoraID == y.LoraID && x.HasLoraID == y.HasLoraID && x.LoraName == y.LoraName && x.SpecKind == y.SpecKind &&
		x.SlidingWindow == y.SlidingWindow && x.CacheSalt == y.CacheSalt && x.SessionID == y.SessionID &&
		bytes.Equal(x.ExtraKeys, y.ExtraKeys) && x.Medium == y.Medium && x.GroupIdx == y.GroupIdx && x.HasGroupIdx == y.HasGroupIdx
}

// TestFixtures: the three fixtures decode to exactly their README values, and
// re-encoding the decoded batch reproduces the file byte for byte.
func TestFixtures(t *testing.T) {
	tests := []struct {
		file string
		form kvtest.EventForm
		want kvevents.Batch
	}{
		{"vllm_batch_array_form.msgpack", kvtest.ArrayForm, kvevents.Batch{TS: 1757500000.25, HasDPRank: true, Events: []kvevents.Event{
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{fixtureH1, fixtureH2}, TokenIDs: seq32(1, 32), BlockSize: 16, Medium: "GPU"},
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{fixtureH1}, Medium: "GPU"},
			{Kind: kvevents.AllBlocksCleared},
		}}},
		{"vllm_batch_map_form.msgpack", kvtest.MapForm, kvevents.Batch{TS: 1757500000.25, HasDPRank: true, Events: []kvevents.Event{
			{Kind: kvevents.BlockStored, BlockHashes: []uint64{fixtureH1}, TokenIDs: seq32(1, 16), BlockSize: 16, Medium: "GPU",
				ExtraKeys: []byte{0x91, 0xc0}, HasGroupIdx: true, SpecKind: "full_attention"},
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{fixtureH1}, Medium: "GPU", HasGroupIdx: true},
			{Kind: kvevents.AllBlocksCleared},
		}}},
		{"vllm_batch_bytes_hash_dp1.msgpack", kvtest.ArrayForm, kvevents.Batch{TS: 1757500000.25, DPRank: 1, HasDPRank: true, Events: []kvevents.Event{
			{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{fixtureH1}, Medium: "GPU"},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			raw := readFixture(t, tt.file)
			var got kvevents.Batch
			if err := kvevents.DecodeBatch(raw, &got); err != nil {
				t.Fatal(err)
			}
			if !batchesEqual(&got, &tt.want) {
				t.Fatalf("decoded %+v\nwant    %+v", got, tt.want)
			}
			if got.Events[0].Tier() != kvevents.TierGPU {
				t.Fatal("GPU medium must map to the GPU tier")
			}
			if tt.file == "vllm_batch_bytes_hash_dp1.msgpack" {
				return // the bin hash folds to an int, so re-encoding differs by design
			}
			if enc := kvtest.AppendBatch(nil, &got, tt.form); !bytes.Equal(enc, raw) {
				t.Fatalf("re-encoded %s form differs:\n got % x\nwant % x", tt.form, enc, raw)
			}
		})
	}
}

// mp builds msgpack by hand for the variant table.
var mp = wiretest.MP

func TestDecodeVariants(t *testing.T) {
	stored := func(fields ...any) []byte {
		return mp(append([]any{byte(0x90 | len(fields) + 1), "BlockStored"}, fields...)...)
	}
	tokens := mp(byte(0x92), 5, 6)
	tests := []struct {
		name    string
		payload []byte
		check   func(t *testing.T, b *kvevents.Batch)
	}{
		{"2-element envelope (before dp rank)", mp(byte(0x92), 1.5, byte(0x90)), func(t *testing.T, b *kvevents.Batch) {
			if b.TS != 1.5 || b.HasDPRank || len(b.Events) != 0 {
				t.Fatalf("%+v", b)
			}
		}},
		{"nil rank and nil events", mp(byte(0x93), 1.5, byte(0xc0), byte(0xc0)), func(t *testing.T, b *kvevents.Batch) {
			if b.HasDPRank || len(b.Events) != 0 {
				t.Fatalf("%+v", b)
			}
		}},
		{"map envelope with unknown key and SGLang rank name", mp(byte(0x84), "ts", 2.0, "future", byte(0x91), 7, "events", byte(0x90), "attn_dp_rank", 3), func(t *testing.T, b *kvevents.Batch) {
			if b.TS != 2 || !b.HasDPRank || b.DPRank != 3 {
				t.Fatalf("%+v", b)
			}
		}},
		{"extra envelope fields", mp(byte(0x95), 1.0, byte(0x90), 2, "x", byte(0x80)), func(t *testing.T, b *kvevents.Batch) {
			if b.DPRank != 2 {
				t.Fatalf("%+v", b)
			}
		}},
		{"oldest BlockStored (lora_id last), signed and small int hashes, float32 ts",
			mp(byte(0x93), byte(0xca), []byte{0x3f, 0xc0, 0, 0}, byte(0x91),
				stored(mp(byte(0x93), -1, byte(0xd3), []byte{0x80, 0, 0, 0, 0, 0, 0, 0}, 7), mp(byte(0xd0), byte(0x80)), tokens, 2, 9), 0),
			func(t *testing.T, b *kvevents.Batch) {
				e := b.Events[0]
				if b.TS != 1.5 || !slices.Equal(e.BlockHashes, []uint64{math.MaxUint64, 1 << 63, 7}) || !e.HasParent ||
					e.ParentHash != uint64(math.MaxUint64-127) || e.BlockSize != 2 || !e.HasLoraID || e.LoraID != 9 || e.Medium != "" || e.Tier() != kvevents.TierGPU {
					t.Fatalf("%+v", e)
				}
			}},
		{"truncated BlockStored (hashes only)", mp(byte(0x93), 1.0, byte(0x91), stored(mp(byte(0x91), 1)), 0), func(t *testing.T, b *kvevents.Batch) {
			e := b.Events[0]
			if e.Kind != kvevents.BlockStored || len(e.BlockHashes) != 1 || e.HasParent || len(e.TokenIDs) != 0 {
				t.Fatalf("%+v", e)
			}
		}},
		{"newest positional BlockStored with extras beyond the known fields",
			mp(byte(0x93), 1.0, byte(0x91), stored(mp(byte(0x91), 1), 0, tokens, 2, byte(0xc0), "CPU", "lora-a", mp(byte(0x91), byte(0x91), "s"), 1, "sliding_window", 128, "loc", "owner", "sess"), 0),
			func(t *testing.T, b *kvevents.Batch) {
				e := b.Events[0]
				if !e.HasParent || e.ParentHash != 0 || e.Medium != "CPU" || e.Tier() != kvevents.TierCPU || e.LoraName != "lora-a" || !e.HasGroupIdx ||
					e.GroupIdx != 1 || e.SpecKind != "sliding_window" || e.SlidingWindow != 128 || !bytes.Equal(e.ExtraKeys, mp(byte(0x91), byte(0x91), "s")) {
					t.Fatalf("%+v", e)
				}
			}},
		{"SGLang map event with cache_salt, session_id, negative hashes and tier names",
			mp(byte(0x93), 1.0, byte(0x92),
				mp(byte(0x86), "block_hashes", mp(byte(0x91), -5), "type", "BlockStored", "medium", "CPU_TIER2", "cache_salt", "salty", "session_id", "s1", "unknown", mp(byte(0x81), "a", byte(0x90))),
				mp(byte(0x83), "type", "BlockRemoved", "block_hashes", mp(byte(0x91), 1), "medium", "STORAGE"), 4),
			func(t *testing.T, b *kvevents.Batch) {
				e := b.Events[0]
				if e.Kind != kvevents.BlockStored || e.BlockHashes[0] != uint64(math.MaxUint64-4) || e.Medium != "CPU_TIER2" || e.Tier() != kvevents.TierCPU ||
					e.CacheSalt != "salty" || e.SessionID != "s1" || b.Events[1].Tier() != kvevents.TierOther || b.DPRank != 4 {
					t.Fatalf("%+v", b)
				}
			}},
		{"bin hashes of 16 and 4 bytes fold big-endian", mp(byte(0x93), 1.0, byte(0x91),
			mp(byte(0x92), "BlockRemoved", byte(0x92), byte(0xc4), byte(16), bytes.Repeat([]byte{0xff}, 8), []byte{1, 2, 3, 4, 5, 6, 7, 8}, byte(0xc4), byte(4), []byte{0, 0, 1, 2}), 1),
			func(t *testing.T, b *kvevents.Batch) {
				if !slices.Equal(b.Events[0].BlockHashes, []uint64{0x0102030405060708, 0x0102}) {
					t.Fatalf("%x", b.Events[0].BlockHashes)
				}
			}},
		{"unknown event types are skipped and counted", mp(byte(0x93), 1.0, byte(0x93),
			mp(byte(0x92), "PrefixCacheHit", mp(byte(0x91), 1)), mp(byte(0x83), "type", "Future", "x", 1, "medium", 5), mp(byte(0x91), "AllBlocksCleared"), 0),
			func(t *testing.T, b *kvevents.Batch) {
				if len(b.Events) != 1 || b.Events[0].Kind != kvevents.AllBlocksCleared || b.Skipped != 2 {
					t.Fatalf("%+v", b)
				}
			}},
		{"large token ids", mp(byte(0x93), 1.0, byte(0x91), stored(byte(0x90), byte(0xc0), mp(byte(0x93), 200, 70000, uint64(math.MaxUint32))), 0),
			func(t *testing.T, b *kvevents.Batch) {
				if !slices.Equal(b.Events[0].TokenIDs, []uint32{200, 70000, math.MaxUint32}) {
					t.Fatalf("%v", b.Events[0].TokenIDs)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b kvevents.Batch
			if err := kvevents.DecodeBatch(tt.payload, &b); err != nil {
				t.Fatal(err)
			}
			tt.check(t, &b)
			b.Skipped = 0 // skipped events are not re-encoded
			// Whatever decodes must survive a map-form round trip unchanged.
			var again kvevents.Batch
			if err := kvevents.DecodeBatch(kvtest.AppendBatch(nil, &b, kvtest.MapForm), &again); err != nil || !batchesEqual(&b, &again) {
				t.Fatalf("map round trip: %v\n%+v\n%+v", err, b, again)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	good := readFixture(t, "vllm_batch_array_form.msgpack")
	tests := []struct {
		name    string
		payload []byte
	}{
		{"empty", nil},
		{"not a container", []byte{0x01}},
		{"envelope too short", mp(byte(0x91), 1.0)},
		{"ts not a number", mp(byte(0x92), "x", byte(0x90))},
		{"events not an array", mp(byte(0x92), 1.0, 5)},
		{"event not a container", mp(byte(0x92), 1.0, byte(0x91), 5)},
		{"empty event array", mp(byte(0x92), 1.0, byte(0x91), byte(0x90))},
		{"map event without type", mp(byte(0x92), 1.0, byte(0x91), byte(0x81), "medium", "GPU")},
		{"map envelope without events", mp(byte(0x81), "ts", 1.0)},
		{"negative token id", mp(byte(0x92), 1.0, byte(0x91), byte(0x94), "BlockStored", byte(0x90), byte(0xc0), mp(byte(0x91), -1))},
		{"token id over uint32", mp(byte(0x92), 1.0, byte(0x91), byte(0x94), "BlockStored", byte(0x90), byte(0xc0), mp(byte(0x91), uint64(1<<32)))},
		{"medium not a string", mp(byte(0x92), 1.0, byte(0x91), byte(0x93), "BlockRemoved", byte(0x90), 3)},
		{"negative rank", mp(byte(0x93), 1.0, byte(0x90), -1)},
		{"lying array length", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(slices.Clone(good), 0)},
		{"invalid type byte", []byte{0x92, 0xc1, 0x90}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b kvevents.Batch
			err := kvevents.DecodeBatch(tt.payload, &b)
			if !errors.Is(err, kvevents.ErrBadPayload) {
				t.Fatalf("err = %v, want ErrBadPayload", err)
			}
		})
	}
}

// TestDecodeReuse: decoding into a used Batch gives the same result as into
// a fresh one, and allocates nothing once warmed up.
func TestDecodeReuse(t *testing.T) {
	big := benchPayload(kvtest.MapForm)
	small := readFixture(t, "vllm_batch_array_form.msgpack")
	var reused, fresh kvevents.Batch
	for _, p := range [][]byte{big, small, big, small} {
		if err := kvevents.DecodeBatch(p, &reused); err != nil {
			t.Fatal(err)
		}
		fresh = kvevents.Batch{}
		if err := kvevents.DecodeBatch(p, &fresh); err != nil {
			t.Fatal(err)
		}
		if !batchesEqual(&reused, &fresh) {
			t.Fatal("reused batch differs from a fresh decode")
		}
	}
	for _, form := range []kvtest.EventForm{kvtest.ArrayForm, kvtest.MapForm} {
		p := benchPayload(form)
		allocs := testing.AllocsPerRun(50, func() {
			if err := kvevents.DecodeBatch(p, &reused); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s form: %.1f allocs per decode", form, allocs)
		}
	}
}

// benchBatch is a realistic step: 8 requests each storing 4 blocks of 16
// tokens with a parent, plus evictions.
func benchBatch() *kvevents.Batch {
	b := &kvevents.Batch{TS: 1757500000.25, HasDPRank: true}
	tok := uint32(1000)
	for r := 0; r < 8; r++ {
		e := kvevents.Event{Kind: kvevents.BlockStored, HasParent: r%2 == 1, ParentHash: uint64(r) * 0x9e3779b97f4a7c15, BlockSize: 16, Medium: "GPU",
			HasGroupIdx: true, SpecKind: "full_attention"}
		for k := 0; k < 4; k++ {
			e.BlockHashes = append(e.BlockHashes, uint64(r*4+k+1)*0xbf58476d1ce4e5b9)
			for j := 0; j < 16; j++ {
				e.TokenIDs = append(e.TokenIDs, tok%128000)
				tok += 7919
			}
		}
		b.Events = append(b.Events, e)
	}
	for r := 0; r < 4; r++ {
		b.Events = append(b.Events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(r+100) * 0x94d049bb133111eb, uint64(r + 7)}, Medium: "GPU"})
	}
	return b
}

func benchPayload(form kvtest.EventForm) []byte { return kvtest.AppendBatch(nil, benchBatch(), form) }

func BenchmarkDecodeBatch(b *testing.B) {
	for _, form := range []kvtest.EventForm{kvtest.ArrayForm, kvtest.MapForm} {
		b.Run(form.String(), func(b *testing.B) {
			p := benchPayload(form)
			var dst kvevents.Batch
			b.ReportAllocs()
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if err := kvevents.DecodeBatch(p, &dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(dst.Events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func BenchmarkAppendBatch(b *testing.B) {
	src := benchBatch()
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = kvtest.AppendBatch(buf[:0], src, kvtest.MapForm)
	}
}

// SGLang with EAGLE/MTP keys its radix tree by bigrams and sends token_ids
// as pairs [t_j, t_j+1] (python/sglang/srt/mem_cache/events.py
// record_store): each position's token is the pair's first, so the block's
// tokens (and keys) are the prompt's. A pair of another length or with a
// bad id is a malformed payload.
func TestDecodeBigramTokenIDs(t *testing.T) {
	var b kvevents.Batch
	payload := mp(byte(0x92), 1.5, byte(0x91), byte(0x97), "BlockStored", byte(0x91), 1, byte(0xc0),
		byte(0x94), byte(0x92), 1, 2, byte(0x92), 2, 3, byte(0x92), 3, 70000, byte(0x92), 70000, 5, 4, byte(0xc0), "GPU")
	if err := kvevents.DecodeBatch(payload, &b); err != nil {
		t.Fatal(err)
	}
	if got := b.Events[0].TokenIDs; !slices.Equal(got, []uint32{1, 2, 3, 70000}) || b.Events[0].BlockSize != 4 {
		t.Fatalf("tokens %v, block size %d", got, b.Events[0].BlockSize)
	}
	for _, bad := range [][]byte{
		mp(byte(0x92), 1.5, byte(0x91), byte(0x95), "BlockStored", byte(0x91), 1, byte(0xc0), byte(0x91), byte(0x93), 1, 2, 3, 1),
		mp(byte(0x92), 1.5, byte(0x91), byte(0x95), "BlockStored", byte(0x91), 1, byte(0xc0), byte(0x91), byte(0x92), 1, -2, 1),
	} {
		if err := kvevents.DecodeBatch(bad, &b); !errors.Is(err, kvevents.ErrBadPayload) {
			t.Fatalf("bad bigram %x: err %v", bad, err)
		}
	}
}
