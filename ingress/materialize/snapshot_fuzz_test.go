package materialize

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

// FuzzSnapshotReassembly feeds arbitrary reply messages (each a 2-byte
// length and that many bytes) through the decoder and the assembler: bad
// chunks are errors, never panics; a completed snapshot holds exactly the
// keys of its distinct chunks.
func FuzzSnapshotReassembly(f *testing.F) {
	mk := func(chunk, chunks int, keys ...uint64) []byte {
		c := kvevents.SnapshotChunk{Engine: "e", Model: "m", Epoch: 3, Seq: 9, Chunk: chunk, Chunks: chunks,
			Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}}}
		return kvevents.AppendSnapshotChunk(nil, &c)
	}
	frame := func(msgs ...[]byte) []byte {
		var out []byte
		for _, m := range msgs {
			out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
			out = append(out, m...)
		}
		return out
	}
	f.Add(frame(mk(0, 1, 1, 2, 3)))
	f.Add(frame(mk(1, 2, 4), mk(1, 2, 4), mk(0, 2, 5)))
	f.Add(frame(mk(0, 2, 1), []byte{0x93, 0x01}))
	f.Add([]byte{0, 3, 1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		a := assembler{engine: "e"}
		var c kvevents.SnapshotChunk
		want := map[int]int{}
		for len(b) >= 2 {
			n := int(binary.BigEndian.Uint16(b))
			b = b[2:]
			if n > len(b) {
				return
			}
			msg := b[:n]
			b = b[n:]
			if err := kvevents.DecodeSnapshotChunk(msg, &c); err != nil {
				return
			}
			keys := 0
			for _, op := range c.Ops {
				keys += len(op.Keys)
			}
			if _, dup := want[c.Chunk]; !dup {
				want[c.Chunk] = keys
			}
			done, err := a.add(&c)
			if err != nil {
				if !errors.Is(err, ErrSnapshot) {
					t.Fatalf("error %v is not ErrSnapshot", err)
				}
				return
			}
			if done {
				total, got := 0, 0
				for _, k := range want {
					total += k
				}
				for _, k := range a.s.Keys {
					got += len(k)
				}
				if got != total || len(want) != len(a.seen) {
					t.Fatalf("snapshot has %d keys from %d chunks, want %d from %d", got, len(want), total, len(a.seen))
				}
				return
			}
		}
	})
}
