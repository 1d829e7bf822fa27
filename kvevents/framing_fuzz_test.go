package kvevents

import (
	"encoding/binary"
	"strings"
	"testing"

	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"
)

// FuzzParseReplay: replay replies in any framing (the fuzz input split into
// frames at 0xFE bytes) are classified without panicking; a valid data
// reply has an empty first frame, an 8-byte sequence frame and a non-empty
// payload, and at most one topic frame.
func FuzzParseReplay(f *testing.F) {
	seq := binary.BigEndian.AppendUint64(nil, 42)
	join := func(frames ...[]byte) []byte {
		var out []byte
		for i, fr := range frames {
			if i > 0 {
				out = append(out, 0xFE)
			}
			out = append(out, fr...)
		}
		return out
	}
	f.Add(join(nil, seq, []byte("payload")))
	f.Add(join(nil, []byte("topic"), seq, []byte("payload")))
	f.Add(join(nil, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil))
	f.Add(join([]byte("x"), seq, []byte("p")))
	// ff×8 is the end marker's seq: with a payload it is no batch either.
	f.Add(join(nil, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte("p")))
	f.Add(join(nil, []byte("topic"), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, []byte("p")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		frames := splitBytes(b, 0xFE)
		s, payload, end, valid := parseReplay(frames)
		if !valid {
			return
		}
		if len(frames[0]) != 0 {
			t.Fatalf("valid reply with a non-empty first frame: %q", frames)
		}
		if end {
			if len(frames[len(frames)-1]) != 0 {
				t.Fatal("end marker without an empty last frame")
			}
			return
		}
		if len(frames) > 4 || len(payload) == 0 || s != binary.BigEndian.Uint64(frames[len(frames)-2]) || s == 1<<64-1 {
			t.Fatalf("data reply %q parsed as seq %d payload %q", frames, s, payload)
		}
	})
}

func splitBytes(b []byte, sep byte) [][]byte {
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == sep {
			out = append(out, b[start:i])
			start = i + 1
		}
	}
	return append(out, b[start:])
}

// FuzzOffsetEndpoint: endpoint parsing never panics; an accepted tcp
// endpoint keeps its host, and rank 0 is the endpoint itself.
func FuzzOffsetEndpoint(f *testing.F) {
	for _, s := range []string{"tcp://127.0.0.1:5557", "tcp://*:5557", "tcp://[::1]:0", "ipc:///tmp/x", "inproc://a", "tcp://h:", "tcp://:1", "udp://x:1", "tcp://h:65535"} {
		f.Add(s, 0)
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, ep string, r int) {
		_ = zmqep.ShouldBind(ep)
		_ = zmqep.Connectable(ep)
		out, err := OffsetEndpoint(ep, r)
		if err != nil {
			return
		}
		if r == 0 && out != ep {
			t.Fatalf("rank 0 of %q is %q", ep, out)
		}
		if host, _, ok := zmqep.SplitTCP(ep); ok && strings.HasPrefix(ep, "tcp://") && !strings.HasPrefix(out, "tcp://"+host+":") {
			t.Fatalf("%q rank %d → %q lost the host", ep, r, out)
		}
	})
}
