package kvevents

import (
	"encoding/binary"
	"fmt"
)

// The small msgpack subset the kvmesh messages use: unsigned and signed ints,
// str, bin and arrays. Writing reuses the event encoder's helpers (msgpack.go);
// reading checks every length against what is left, so a
// truncated or hostile message is an error, never a panic or a huge allocation.

func deltaAppendKeys(dst []byte, keys []uint64) []byte {
	n := len(keys) * 8
	switch {
	case n <= 0xff:
		dst = append(dst, 0xc4, byte(n))
	case n <= 0xffff:
		dst = append(dst, 0xc5, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	for _, k := range keys {
		dst = binary.LittleEndian.AppendUint64(dst, k)
	}
	return dst
}

type deltaReader struct {
	b   []byte
	off int
}

func (r *deltaReader) errAt(what string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformedDelta, what, r.off)
}

func (r *deltaReader) need(n int) ([]byte, error) {
	if n < 0 || len(r.b)-r.off < n {
		return nil, r.errAt("truncated")
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s, nil
}

func (r *deltaReader) byte1() (byte, error) {
	s, err := r.need(1)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

func (r *deltaReader) arrayHeader() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xf0 == 0x90:
		return int(c & 0x0f), nil
	case c == 0xdc:
		s, err := r.need(2)
		if err != nil {
			return 0, err
		}
		return int(binary.BigEndian.Uint16(s)), nil
	case c == 0xdd:
		s, err := r.need(4)
		if err != nil {
			return 0, err
		}
		n := binary.BigEndian.Uint32(s)
		if int64(n) > int64(len(r.b)-r.off) { // every element takes at least one byte
			return 0, r.errAt("array longer than message")
		}
		return int(n), nil
	default:
		return 0, r.errAt("want array")
	}
}

func (r *deltaReader) uint() (uint64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c < 0x80:
		return uint64(c), nil
	case c == 0xcc:
		n = 1
	case c == 0xcd:
		n = 2
	case c == 0xce:
		n = 4
	case c == 0xcf:
		n = 8
	default:
		return 0, r.errAt("want unsigned int")
	}
	s, err := r.need(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, x := range s {
		v = v<<8 | uint64(x)
	}
	return v, nil
}

func (r *deltaReader) int() (int64, error) {
	if r.off < len(r.b) {
		c := r.b[r.off]
		switch {
		case c >= 0xe0: // negative fixint
			r.off++
			return int64(int8(c)), nil
		case c == 0xd0, c == 0xd1, c == 0xd2, c == 0xd3:
			r.off++
			n := 1 << (c - 0xd0)
			s, err := r.need(n)
			if err != nil {
				return 0, err
			}
			var v uint64
			for _, x := range s {
				v = v<<8 | uint64(x)
			}
			shift := 64 - 8*uint(n)
			return int64(v<<shift) >> shift, nil
		}
	}
	v, err := r.uint()
	return int64(v), err
}

// str reads a str into *dst, keeping *dst when the bytes are unchanged so a
// stream of messages from one engine does not allocate its name each time.
func (r *deltaReader) str(dst *string) error {
	c, err := r.byte1()
	if err != nil {
		return err
	}
	var n int
	switch {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9, c == 0xc4:
		s, err := r.need(1)
		if err != nil {
			return err
		}
		n = int(s[0])
	case c == 0xda, c == 0xc5:
		s, err := r.need(2)
		if err != nil {
			return err
		}
		n = int(binary.BigEndian.Uint16(s))
	case c == 0xdb, c == 0xc6:
		s, err := r.need(4)
		if err != nil {
			return err
		}
		n = int(binary.BigEndian.Uint32(s))
	default:
		return r.errAt("want str")
	}
	if n > deltaMaxNameLen {
		return r.errAt("name too long")
	}
	s, err := r.need(n)
	if err != nil {
		return err
	}
	if string(s) != *dst { // the compiler does not allocate for this comparison
		*dst = string(s)
	}
	return nil
}

func (r *deltaReader) keys(dst []uint64) ([]uint64, error) {
	c, err := r.byte1()
	if err != nil {
		return dst, err
	}
	var n int
	switch c {
	case 0xc4:
		s, err := r.need(1)
		if err != nil {
			return dst, err
		}
		n = int(s[0])
	case 0xc5:
		s, err := r.need(2)
		if err != nil {
			return dst, err
		}
		n = int(binary.BigEndian.Uint16(s))
	case 0xc6:
		s, err := r.need(4)
		if err != nil {
			return dst, err
		}
		n = int(binary.BigEndian.Uint32(s))
	default:
		return dst, r.errAt("want keys bin")
	}
	if n%8 != 0 || n/8 > deltaMaxKeysPerOp {
		return dst, r.errAt("bad keys length")
	}
	s, err := r.need(n)
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i += 8 {
		dst = append(dst, binary.LittleEndian.Uint64(s[i:]))
	}
	return dst, nil
}

// skipRest skips n trailing elements a newer minor writer may add. Only scalar,
// str/bin and nested arrays are understood; anything else is malformed.
func (r *deltaReader) skipRest(n int) error {
	for ; n > 0; n-- {
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func (r *deltaReader) skip(depth int) error {
	if depth > 8 {
		return r.errAt("nesting too deep")
	}
	if r.off >= len(r.b) {
		return r.errAt("truncated")
	}
	c := r.b[r.off]
	switch {
	case c < 0x80 || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case c&0xf0 == 0x90, c == 0xdc, c == 0xdd:
		n, err := r.arrayHeader()
		if err != nil {
			return err
		}
		for ; n > 0; n-- {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c >= 0xcc && c <= 0xcf:
		_, err := r.uint()
		return err
	case c >= 0xd0 && c <= 0xd3:
		_, err := r.int()
		return err
	case c == 0xcb:
		_, err := r.need(9)
		return err
	default:
		var s string
		return r.str(&s)
	}
}
