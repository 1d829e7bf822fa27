package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrBadPayload is wrapped by every DecodeBatch error: the payload is not a
// KVEventBatch in any known form. Callers count and skip such payloads.
var ErrBadPayload = errors.New("malformed kv event payload")

// reader is a minimal, allocation-free msgpack reader over one payload, shared
// by the KV event decoder and the kvmesh delta/snapshot decoder. It reads only
// the types those messages use and skips everything else; strings and bins are
// returned as sub-slices of the payload (valid until it is reused).
type reader struct {
	b   []byte
	off int
	bad error // wrapped by every error; ErrBadPayload when nil
}

func (r *reader) errf(format string, args ...any) error {
	bad := r.bad
	if bad == nil {
		bad = ErrBadPayload
	}
	return fmt.Errorf("%w: offset %d: %s", bad, r.off, fmt.Sprintf(format, args...))
}

func (r *reader) remaining() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, r.errf("unexpected end of payload")
	}
	return r.b[r.off], nil
}

// take consumes n bytes.
func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, r.errf("need %d bytes, have %d", n, len(r.b)-r.off)
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	default:
		return binary.BigEndian.Uint64(s), nil
	}
}

// nextNil consumes a nil and reports whether there was one.
func (r *reader) nextNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

func isArray(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }
func isMap(c byte) bool   { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// arrayLen reads an array header. The length is checked against the bytes
// left (every element takes at least one), so a lying header cannot make a
// caller loop or allocate far beyond the payload.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xdc:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdd:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, r.errf("want array, got type byte 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.remaining()) {
		return 0, r.errf("array of %d elements in %d bytes", n, r.remaining())
	}
	return int(n), nil
}

// mapLen reads a map header (pairs), bounded like arrayLen.
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xde:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdf:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, r.errf("want map, got type byte 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	if 2*n > uint64(r.remaining()) {
		return 0, r.errf("map of %d pairs in %d bytes", n, r.remaining())
	}
	return int(n), nil
}

// str reads a str (or, leniently, a bin) and returns its bytes without copying.
func (r *reader) str() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		r.off++
		n = uint64(c & 0x1f)
	case c == 0xd9, c == 0xc4:
		r.off++
		n, err = r.uintN(1)
	case c == 0xda, c == 0xc5:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdb, c == 0xc6:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, r.errf("want string, got type byte 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.remaining()) {
		return nil, r.errf("string of %d bytes in %d", n, r.remaining())
	}
	return r.take(int(n))
}

// bin reads a bin (not a str) and returns its bytes without copying.
func (r *reader) bin() ([]byte, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var w int
	switch c {
	case 0xc4:
		w = 1
	case 0xc5:
		w = 2
	case 0xc6:
		w = 4
	default:
		return nil, r.errf("want bin, got type byte 0x%02x", c)
	}
	r.off++
	n, err := r.uintN(w)
	if err != nil {
		return nil, err
	}
	if n > uint64(r.remaining()) {
		return nil, r.errf("bin of %d bytes in %d", n, r.remaining())
	}
	return r.take(int(n))
}

// uint reads an int in one of the unsigned encodings (positive fixint or
// uint 8/16/32/64); the signed encodings are an error even for values >= 0.
func (r *reader) uint() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c > 0x7f && (c < 0xcc || c > 0xcf) {
		return 0, r.errf("want unsigned integer, got type byte 0x%02x", c)
	}
	v, _, err := r.integer()
	return v, err
}

// integer reads any msgpack int. neg reports a negative value, whose two's
// complement is in v; otherwise v is the unsigned value.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		r.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	r.off++
	switch c {
	case 0xcc:
		v, err = r.uintN(1)
	case 0xcd:
		v, err = r.uintN(2)
	case 0xce:
		v, err = r.uintN(4)
	case 0xcf:
		v, err = r.uintN(8)
	case 0xd0:
		v, err = r.uintN(1)
		v = uint64(int64(int8(v)))
	case 0xd1:
		v, err = r.uintN(2)
		v = uint64(int64(int16(v)))
	case 0xd2:
		v, err = r.uintN(4)
		v = uint64(int64(int32(v)))
	case 0xd3:
		v, err = r.uintN(8)
	default:
		r.off--
		return 0, false, r.errf("want integer, got type byte 0x%02x", c)
	}
	return v, int64(v) < 0 && c >= 0xd0, err
}

// int64v reads an integer that must fit in int64.
func (r *reader) int64v(field string) (int64, error) {
	v, neg, err := r.integer()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	if !neg && v > math.MaxInt64 {
		return 0, r.errf("%s: %d overflows int64", field, v)
	}
	return int64(v), nil
}

// hash reads an engine block hash: an int of any width and sign (two's
// complement), or a bin/str digest folded to its last 8 bytes big-endian.
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3) {
		v, _, err := r.integer()
		return v, err
	}
	b, err := r.str()
	if err != nil {
		return 0, fmt.Errorf("block hash: %w", err)
	}
	return foldDigest(b), nil
}

// foldDigest is spec §2's fold: BigEndian.Uint64 of the last 8 bytes (shorter
// digests are read as if left-padded with zeros).
func foldDigest(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

// float reads a float64, float32 or (leniently) an integer as float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xcb:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	case 0xca:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// skip consumes one complete value of any type, iteratively (no recursion,
// so deeply nested garbage cannot exhaust the stack).
func (r *reader) skip() error {
	for pending := 1; pending > 0; pending-- {
		if pending > r.remaining() {
			return r.errf("%d values announced, %d bytes left", pending, r.remaining())
		}
		c, err := r.peek()
		if err != nil {
			return err
		}
		r.off++
		n, more, err := r.extent(c)
		if err != nil {
			return err
		}
		pending += more
		if n > 0 {
			if _, err := r.take(n); err != nil {
				return err
			}
		}
	}
	return nil
}

// fixedExtent is the payload size after each type byte whose value has a
// fixed size (numbers, fixext); -1 for every other type byte.
var fixedExtent = func() (t [256]int8) {
	for c := range t {
		t[c] = -1
	}
	for c := 0; c <= 0x7f; c++ {
		t[c] = 0 // positive fixint
	}
	for c := 0xe0; c <= 0xff; c++ {
		t[c] = 0 // negative fixint
	}
	for c, n := range map[int]int8{0xc0: 0, 0xc2: 0, 0xc3: 0, 0xcc: 1, 0xd0: 1, 0xcd: 2, 0xd1: 2, 0xce: 4, 0xd2: 4,
		0xca: 4, 0xcf: 8, 0xd3: 8, 0xcb: 8, 0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17} {
		t[c] = n
	}
	return t
}()

// extent says what follows type byte c (already consumed): n bytes of
// payload, then more values (the elements of an array, the keys and values
// of a map) that skip must consume too.
func (r *reader) extent(c byte) (n, more int, err error) {
	switch {
	case fixedExtent[c] >= 0:
		return int(fixedExtent[c]), 0, nil
	case c&0xf0 == 0x80:
		return 0, 2 * int(c&0x0f), nil
	case c&0xf0 == 0x90:
		return 0, int(c & 0x0f), nil
	case c&0xe0 == 0xa0:
		return int(c & 0x1f), 0, nil
	case c == 0xc4, c == 0xd9, c == 0xc7: // bin 8, str 8, ext 8
		return r.lengthPrefixed(1, c == 0xc7)
	case c == 0xc5, c == 0xda, c == 0xc8: // 16-bit lengths
		return r.lengthPrefixed(2, c == 0xc8)
	case c == 0xc6, c == 0xdb, c == 0xc9: // 32-bit lengths
		return r.lengthPrefixed(4, c == 0xc9)
	case c == 0xdc, c == 0xdd:
		r.off--
		l, err := r.arrayLen()
		return 0, l, err
	case c == 0xde, c == 0xdf:
		r.off--
		l, err := r.mapLen()
		return 0, 2 * l, err
	default: // 0xc1 is never used
		r.off--
		return 0, 0, r.errf("invalid type byte 0x%02x", c)
	}
}

// lengthPrefixed reads a size-byte length; an ext also has a type byte.
func (r *reader) lengthPrefixed(size int, ext bool) (n, more int, err error) {
	l, err := r.uintN(size)
	if err != nil {
		return 0, 0, err
	}
	if size == 4 && l > uint64(r.remaining()) {
		return 0, 0, r.errf("value of %d bytes in %d", l, r.remaining())
	}
	n = int(l)
	if ext {
		n++ // ext type byte
	}
	return n, 0, nil
}
