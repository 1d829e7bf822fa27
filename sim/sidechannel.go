package sim

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"unicode/utf8"
)

// The KV side channel: how a decode engine reads a prefill engine's held
// blocks. Real vLLM does a ZMQ handshake on VLLM_NIXL_SIDE_CHANNEL_PORT and
// then moves the KV with NIXL (RDMA); SGLang's decode registers with the
// prefill's bootstrap server and the prefill pushes the KV. The simulator
// replaces both with one small framed protocol over a real TCP connection
// (one transfer per connection), moving the blocks' token ids as the
// stand-in for their KV and modelling the transfer's duration from the
// profile's bytes per block and the configured bandwidth.
//
// Frame (all integers big-endian; uvarint = encoding/binary's unsigned varint):
//
//	length  uint32   bytes after this field, 2..MaxSideChannelFrame
//	version uint8    sideChannelVersion (1)
//	type    uint8    one of the frame types below
//	body    length−2 bytes
//
// Bodies (str = uvarint length ≤ 1024, then UTF-8 bytes):
//
//	READ    (decode → prefill) str engine_id, str request_id, uvarint n, n × uvarint block id
//	WAIT    (decode → prefill) uint64 bootstrap_room, uvarint timeout in ms
//	BLOCKS  (prefill → decode) uvarint block_size, uvarint n, n × uvarint token id
//	                           (the tokens held in the requested blocks, in order)
//	DONE    (decode → prefill) empty: the read finished, free the blocks
//	ACK     (prefill → decode) empty: freed
//	ERROR   (prefill → decode) uint8 code, str message
//
// A conversation is READ|WAIT → BLOCKS|ERROR → DONE → ACK, then either side
// closes. A decode that never sends DONE leaves the blocks held until the
// prefill's abort timeout frees them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
// Anything else (an unknown type or version, a short or oversized frame,
// trailing bytes in a body) is a protocol error: the receiver counts it and
// closes the connection.

// MaxSideChannelFrame bounds a frame's length field (8 MiB: a 1M-token
// prompt's token ids as uvarints of at most 5 bytes would not fit, but
// prompts are bounded by max_model_len long before that).
const MaxSideChannelFrame = 8 << 20

const (
	sideChannelVersion = 1
	maxSideString      = 1024
)

// frameType is a side-channel frame's type byte.
type frameType uint8

const (
	frameRead   frameType = 1
	frameWait   frameType = 2
	frameBlocks frameType = 3
	frameDone   frameType = 4
	frameAck    frameType = 5
	frameError  frameType = 0x7f
)

func (t frameType) String() string {
	switch t {
	case frameRead:
		return "READ"
	case frameWait:
		return "WAIT"
	case frameBlocks:
		return "BLOCKS"
	case frameDone:
		return "DONE"
	case frameAck:
		return "ACK"
	case frameError:
		return "ERROR"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// Error codes of ERROR frames.
const (
	xferErrUnknown  uint8 = 1 // no held blocks under that request id / room (never held, read, or expired)
	xferErrEngine   uint8 = 2 // engine_id is not this engine's
	xferErrBlocks   uint8 = 3 // block ids not held by that request
	xferErrTimeout  uint8 = 4 // the room's prefill did not finish in time
	xferErrProtocol uint8 = 5 // malformed or unexpected frame
	xferErrClosed   uint8 = 6 // the prefill engine is shutting down or restarted
)

// ErrSideChannel marks a malformed side-channel frame.
var ErrSideChannel = errors.New("sim: side channel protocol error")

func protoErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrSideChannel, fmt.Sprintf(format, a...))
}

// readFrame reads one frame; body aliases buf when it fits (buf may be nil).
func readFrame(r *bufio.Reader, buf []byte) (frameType, []byte, error) {
	var hdr [6]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 2 || n > MaxSideChannelFrame {
		return 0, nil, protoErr("frame length %d outside [2, %d]", n, MaxSideChannelFrame)
	}
	if _, err := io.ReadFull(r, hdr[4:6]); err != nil {
		return 0, nil, fmt.Errorf("%w: short frame: %w", ErrSideChannel, err)
	}
	if hdr[4] != sideChannelVersion {
		return 0, nil, protoErr("version %d, want %d", hdr[4], sideChannelVersion)
	}
	size := int(n) - 2
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	body := buf[:size]
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("%w: short frame: %w", ErrSideChannel, err)
	}
	return frameType(hdr[5]), body, nil
}

// appendFrame appends a frame of type t with body to dst.
func appendFrame(dst []byte, t frameType, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)+2))
	dst = append(dst, sideChannelVersion, byte(t))
	return append(dst, body...)
}

// bodyReader decodes a frame body; the first error sticks.
type bodyReader struct {
	b   []byte
	err error
}

func (d *bodyReader) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != max(1, (bits.Len64(v)+6)/7) {
		d.err = protoErr("%s: bad or non-minimal uvarint", what) // one encoding per value
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *bodyReader) u64(what string) uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = protoErr("%s: short", what)
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *bodyReader) byte1(what string) uint8 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.err = protoErr("%s: short", what)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *bodyReader) str(what string) string {
	n := d.uvarint(what)
	if d.err != nil {
		return ""
	}
	if n > maxSideString || n > uint64(len(d.b)) {
		d.err = protoErr("%s: length %d", what, n)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	if !utf8.ValidString(s) {
		d.err = protoErr("%s: not UTF-8", what)
		return ""
	}
	return s
}

// count reads a list length, bounded by the bytes left (each element takes
// at least one byte), so a hostile length cannot make us allocate.
func (d *bodyReader) count(what string) int {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = protoErr("%s: %d elements in %d bytes", what, n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *bodyReader) uint32s(what string) []uint32 {
	n := d.count(what)
	if d.err != nil {
		return nil
	}
	out := make([]uint32, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		v := d.uvarint(what)
		if v > 1<<32-1 {
			d.err = protoErr("%s: %d overflows uint32", what, v)
		}
		out = append(out, uint32(v))
	}
	return out
}

func (d *bodyReader) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = protoErr("%d trailing bytes", len(d.b))
	}
	return d.err
}

func appendStr(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendUint32s(dst []byte, v []uint32) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	for _, x := range v {
		dst = binary.AppendUvarint(dst, uint64(x))
	}
	return dst
}

// readMsg is a READ body: which held blocks of which request to read.
type readMsg struct {
	EngineID  string
	RequestID string
	BlockIDs  []uint32
}

func (m *readMsg) appendBody(dst []byte) []byte {
	dst = appendStr(dst, m.EngineID)
	dst = appendStr(dst, m.RequestID)
	return appendUint32s(dst, m.BlockIDs)
}

func decodeReadMsg(b []byte) (readMsg, error) {
	d := bodyReader{b: b}
	m := readMsg{EngineID: d.str("engine_id"), RequestID: d.str("request_id"), BlockIDs: d.uint32s("block ids")}
	return m, d.end()
}

// waitMsg is a WAIT body: SGLang's decode asking for a bootstrap room's KV.
type waitMsg struct {
	Room      uint64
	TimeoutMS uint64
}

func (m *waitMsg) appendBody(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, m.Room)
	return binary.AppendUvarint(dst, m.TimeoutMS)
}

func decodeWaitMsg(b []byte) (waitMsg, error) {
	d := bodyReader{b: b}
	m := waitMsg{Room: d.u64("room"), TimeoutMS: d.uvarint("timeout")}
	return m, d.end()
}

// blocksMsg is a BLOCKS body: the tokens in the blocks read, the stand-in
// for their KV (the decode checks them against its own prompt).
type blocksMsg struct {
	BlockSize int
	Tokens    []uint32
}

func (m *blocksMsg) appendBody(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(m.BlockSize))
	return appendUint32s(dst, m.Tokens)
}

func decodeBlocksMsg(b []byte) (blocksMsg, error) {
	d := bodyReader{b: b}
	bs := d.uvarint("block size")
	if d.err == nil && (bs == 0 || bs > 1024) {
		d.err = protoErr("block size %d outside [1, 1024]", bs)
	}
	m := blocksMsg{BlockSize: int(bs), Tokens: d.uint32s("tokens")}
	return m, d.end()
}

// errorMsg is an ERROR body.
type errorMsg struct {
	Code    uint8
	Message string
}

func (m *errorMsg) appendBody(dst []byte) []byte {
	return appendStr(append(dst, m.Code), truncateUTF8(m.Message, maxSideString))
}

func decodeErrorMsg(b []byte) (errorMsg, error) {
	d := bodyReader{b: b}
	m := errorMsg{Code: d.byte1("code"), Message: d.str("message")}
	return m, d.end()
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// decodeEmpty checks a DONE or ACK body.
func decodeEmpty(b []byte) error {
	if len(b) != 0 {
		return protoErr("%d bytes in an empty frame", len(b))
	}
	return nil
}

// remoteError is an ERROR frame received from the prefill engine.
type remoteError struct{ errorMsg }

func (e *remoteError) Error() string {
	return fmt.Sprintf("prefill engine refused the read (code %d): %s", e.Code, e.Message)
}
