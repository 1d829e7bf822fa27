package kvevents_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

// FuzzParseReplay: replay framing (["", seq, payload], ["", topic, seq,
// payload] and the end markers) never panics, and a reply it accepts has
// the payload of its last frame and the sequence of the frame before.
func FuzzParseReplay(f *testing.F) {
	seq := binary.BigEndian.AppendUint64(nil, 7)
	f.Add([]byte{}, []byte("kv"), seq, []byte{0x93}, uint8(4))
	f.Add([]byte{}, seq, []byte{0x93}, []byte{}, uint8(3))
	f.Add([]byte{}, []byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{}, uint8(4))
	f.Add([]byte("x"), seq, []byte{1}, []byte{}, uint8(3))
	f.Fuzz(func(t *testing.T, a, b, c, d []byte, n uint8) {
		frames := [][]byte{a, b, c, d}[:int(n)%5]
		s, payload, end, valid := kvevents.ParseReplay(frames)
		if !valid {
			return
		}
		if len(frames) < 3 || len(frames[0]) != 0 {
			t.Fatalf("accepted %d frames starting %q", len(frames), frames[0])
		}
		last := frames[len(frames)-1]
		if end != (len(last) == 0) {
			t.Fatalf("end %v with a last frame of %d bytes", end, len(last))
		}
		if !end && (!bytes.Equal(payload, last) || s != binary.BigEndian.Uint64(frames[len(frames)-2])) {
			t.Fatalf("seq %d payload %x from %x", s, payload, frames)
		}
	})
}
