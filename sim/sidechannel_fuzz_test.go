package sim

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// FuzzSideChannelFrame feeds arbitrary bytes to the side-channel frame
// reader and every body decoder: they must return frames or errors, never
// panic, never allocate beyond the input, and whatever decodes must encode
// back to the same bytes.
func FuzzSideChannelFrame(f *testing.F) {
	rd := readMsg{EngineID: "e-1", RequestID: "req-7", BlockIDs: []uint32{3, 4, 300, 1 << 31}}
	wt := waitMsg{Room: 1<<63 + 5, TimeoutMS: 30000}
	bl := blocksMsg{BlockSize: 16, Tokens: []uint32{1, 2, 70000, 4294967295}}
	er := errorMsg{Code: xferErrUnknown, Message: "no held blocks for request req-7"}
	f.Add(appendFrame(nil, frameRead, rd.appendBody(nil)))
	f.Add(appendFrame(nil, frameWait, wt.appendBody(nil)))
	f.Add(appendFrame(nil, frameBlocks, bl.appendBody(nil)))
	f.Add(appendFrame(nil, frameError, er.appendBody(nil)))
	f.Add(appendFrame(appendFrame(nil, frameDone, nil), frameAck, nil))
	f.Add([]byte{0, 0, 0, 1, 1})                           // length below the header
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 1})            // oversized length
	f.Add([]byte{0, 0, 0, 2, 9, 1})                        // wrong version
	f.Add(appendFrame(nil, frameRead, []byte{0x80, 0x80})) // truncated uvarint
	f.Add(appendFrame(nil, frameBlocks, []byte{16, 0xff, 0xff, 0xff, 0x0f}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		var buf []byte
		for {
			typ, body, err := readFrame(r, buf)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrSideChannel) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			if len(body) > len(data) {
				t.Fatalf("body of %d bytes from %d input bytes", len(body), len(data))
			}
			buf = body
			roundTrip(t, typ, body)
		}
	})
}

func roundTrip(t *testing.T, typ frameType, body []byte) {
	t.Helper()
	check := func(err error, enc func() []byte) {
		if err != nil {
			if !errors.Is(err, ErrSideChannel) {
				t.Fatalf("%v: error without ErrSideChannel: %v", typ, err)
			}
			return
		}
		if got := enc(); !bytes.Equal(got, body) {
			t.Fatalf("%v: re-encoded %x, read %x", typ, got, body)
		}
	}
	switch typ {
	case frameRead:
		m, err := decodeReadMsg(body)
		check(err, func() []byte { return m.appendBody(nil) })
	case frameWait:
		m, err := decodeWaitMsg(body)
		check(err, func() []byte { return m.appendBody(nil) })
	case frameBlocks:
		m, err := decodeBlocksMsg(body)
		check(err, func() []byte { return m.appendBody(nil) })
	case frameError:
		m, err := decodeErrorMsg(body)
		check(err, func() []byte { return m.appendBody(nil) })
	case frameDone, frameAck:
		check(decodeEmpty(body), func() []byte { return []byte{} })
	}
}

func TestSideChannelCodecRoundTrip(t *testing.T) {
	rd := readMsg{EngineID: "engine", RequestID: "r", BlockIDs: []uint32{0, 1, 2}}
	var stream []byte
	stream = appendFrame(stream, frameRead, rd.appendBody(nil))
	stream = appendFrame(stream, frameDone, nil)
	r := bufio.NewReader(bytes.NewReader(stream))
	typ, body, err := readFrame(r, nil)
	if err != nil || typ != frameRead {
		t.Fatalf("frame %v %v", typ, err)
	}
	got, err := decodeReadMsg(body)
	if err != nil || !reflect.DeepEqual(got, rd) {
		t.Fatalf("decoded %+v %v", got, err)
	}
	if typ, body, err = readFrame(r, nil); err != nil || typ != frameDone || decodeEmpty(body) != nil {
		t.Fatalf("second frame %v %v", typ, err)
	}
	if _, _, err = readFrame(r, nil); !errors.Is(err, io.EOF) {
		t.Fatalf("end: %v", err)
	}
	// A hostile element count is refused before allocating.
	if _, err := decodeBlocksMsg([]byte{16, 0xff, 0xff, 0xff, 0x0f}); !errors.Is(err, ErrSideChannel) {
		t.Fatalf("huge count: %v", err)
	}
	long := errorMsg{Code: 1, Message: string(bytes.Repeat([]byte("é"), 1000))}
	if m, err := decodeErrorMsg(long.appendBody(nil)); err != nil || len(m.Message) > maxSideString {
		t.Fatalf("long message: %d bytes, %v", len(m.Message), err)
	}
}
