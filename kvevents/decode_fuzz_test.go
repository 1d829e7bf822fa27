package kvevents_test

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/internal/wiretest"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

func fuzzSeeds(f *testing.F) {
	for _, name := range wiretest.Fixtures {
		f.Add(readFixture(f, name))
	}
	f.Add(benchPayload(kvtest.ArrayForm))
	f.Add(benchPayload(kvtest.MapForm))
	f.Add(mp(byte(0x84), "ts", 2.0, "future", byte(0x91), 7, "events", byte(0x90), "attn_dp_rank", 3))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
}

// FuzzDecodeBatch: any input either decodes or returns ErrBadPayload, never
// panics; whatever decodes re-decodes identically from both encodings.
func FuzzDecodeBatch(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var b kvevents.Batch
		if err := kvevents.DecodeBatch(data, &b); err != nil {
			if !errors.Is(err, kvevents.ErrBadPayload) {
				t.Fatalf("error does not wrap ErrBadPayload: %v", err)
			}
			return
		}
		checkRoundTrip(t, &b)
	})
}

// FuzzRoundTrip builds arbitrary batches from the fuzz input (not only ones
// the decoder produced) and checks decode(encode(x)) == x in both forms.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(bytes.Repeat([]byte{0xff, 0x80, 0x7f, 0x01}, 40))
	f.Add(readFixture(f, "vllm_batch_map_form.msgpack"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := byteGen{data: data}
		b := kvevents.Batch{TS: math.Float64frombits(g.u64()), HasDPRank: g.bit()}
		if b.HasDPRank {
			b.DPRank = int(g.u64() % (1 << 31))
		}
		for n := int(g.byte() % 6); n > 0; n-- {
			e := kvevents.Event{Kind: kvevents.EventKind(1 + g.byte()%3)}
			if e.Kind != kvevents.AllBlocksCleared {
				for k := int(g.byte() % 4); k > 0; k-- {
					e.BlockHashes = append(e.BlockHashes, g.u64())
				}
				e.Medium = g.str()
				e.GroupIdx, e.HasGroupIdx = int64(g.u64()), g.bit()
				if !e.HasGroupIdx {
					e.GroupIdx = 0
				}
			}
			if e.Kind == kvevents.BlockStored {
				e.ParentHash, e.HasParent = g.u64(), g.bit()
				if !e.HasParent {
					e.ParentHash = 0
				}
				for k := int(g.byte() % 20); k > 0; k-- {
					e.TokenIDs = append(e.TokenIDs, uint32(g.u64()))
				}
				e.BlockSize = int(g.byte())
				e.LoraID, e.HasLoraID = int64(g.u64()), g.bit()
				if !e.HasLoraID {
					e.LoraID = 0
				}
				e.LoraName, e.SpecKind, e.SessionID, e.CacheSalt = g.str(), g.str(), g.str(), g.str()
				e.SlidingWindow = int64(g.u64())
				if g.bit() {
					e.ExtraKeys = mp(byte(0x91), byte(0x92), g.str(), int(int64(g.u64())))
				}
			}
			b.Events = append(b.Events, e)
		}
		checkRoundTrip(t, &b)
	})
}

// byteGen turns fuzz bytes into values; it yields zeros once exhausted.
type byteGen struct {
	data []byte
	i    int
}

func (g *byteGen) byte() byte {
	if g.i >= len(g.data) {
		return 0
	}
	g.i++
	return g.data[g.i-1]
}

func (g *byteGen) bit() bool { return g.byte()&1 == 1 }

func (g *byteGen) u64() uint64 {
	var v uint64
	for n := 1 + int(g.byte()%8); n > 0; n-- { // vary the width
		v = v<<8 | uint64(g.byte())
	}
	if g.bit() {
		v = -v
	}
	return v
}

func (g *byteGen) str() string {
	n := int(g.byte() % 40)
	var s []byte
	for ; n > 0; n-- {
		s = append(s, g.byte())
	}
	return string(s)
}

func checkRoundTrip(t *testing.T, b *kvevents.Batch) {
	t.Helper()
	b.Skipped = 0 // skipped events are not re-encoded
	mapEnc := kvtest.AppendBatch(nil, b, kvtest.MapForm)
	var got kvevents.Batch
	if err := kvevents.DecodeBatch(mapEnc, &got); err != nil {
		t.Fatalf("map form of a decoded batch does not decode: %v", err)
	}
	if !batchesEqual(b, &got) {
		t.Fatalf("map round trip differs:\n%+v\n%+v", b, got)
	}
	if again := kvtest.AppendBatch(nil, &got, kvtest.MapForm); !bytes.Equal(again, mapEnc) {
		t.Fatal("map encoding is not stable")
	}
	// Array form carries everything but the by-name-only fields.
	arr := *b
	arr.Events = nil
	for _, e := range b.Events {
		e.CacheSalt, e.SessionID = "", ""
		arr.Events = append(arr.Events, e)
	}
	if err := kvevents.DecodeBatch(kvtest.AppendBatch(nil, &arr, kvtest.ArrayForm), &got); err != nil {
		t.Fatalf("array form does not decode: %v", err)
	}
	if !batchesEqual(&arr, &got) {
		t.Fatalf("array round trip differs:\n%+v\n%+v", arr, got)
	}
}
