package kvevents

import "encoding/binary"

// The small msgpack subset the kvmesh messages use: unsigned and signed ints,
// str, bin and arrays. Reading and writing reuse the event codec's reader and
// helpers (msgpack.go), which check every length against what is left, so a
// truncated or hostile message is an error, never a panic or a huge allocation.
// This file holds only what is particular to the kvmesh messages.

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

// deltaStr reads a str (or bin) into *dst, keeping *dst when the bytes are
// unchanged so a stream of messages from one engine does not allocate its name
// each time.
func deltaStr(r *reader, dst *string) error {
	s, err := r.str()
	if err != nil {
		return err
	}
	if len(s) > deltaMaxNameLen {
		return r.errf("name of %d bytes too long", len(s))
	}
	if string(s) != *dst { // the compiler does not allocate for this comparison
		*dst = string(s)
	}
	return nil
}

// deltaKeys appends the keys of a packed keys bin to dst.
func deltaKeys(r *reader, dst []uint64) ([]uint64, error) {
	s, err := r.bin()
	if err != nil {
		return dst, err
	}
	if len(s)%8 != 0 || len(s)/8 > deltaMaxKeysPerOp {
		return dst, r.errf("bad keys length %d", len(s))
	}
	for i := 0; i < len(s); i += 8 {
		dst = append(dst, binary.LittleEndian.Uint64(s[i:]))
	}
	return dst, nil
}

// deltaSkipRest skips n trailing elements a newer minor writer may add. It is
// stricter than reader.skip on purpose: only scalars, str/bin of at most
// deltaMaxNameLen bytes and arrays nested at most 8 deep are understood;
// anything else is malformed.
func deltaSkipRest(r *reader, n int) error {
	for ; n > 0; n-- {
		if err := deltaSkip(r, 0); err != nil {
			return err
		}
	}
	return nil
}

func deltaSkip(r *reader, depth int) error {
	if depth > 8 {
		return r.errf("nesting too deep")
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c == 0xc0, c == 0xc2, c == 0xc3:
		r.off++
		return nil
	case c <= 0x7f, c >= 0xe0, c >= 0xcc && c <= 0xd3:
		_, _, err := r.integer()
		return err
	case c == 0xcb:
		_, err := r.float()
		return err
	case isArray(c):
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for ; n > 0; n-- {
			if err := deltaSkip(r, depth+1); err != nil {
				return err
			}
		}
		return nil
	default:
		var s string
		return deltaStr(r, &s)
	}
}
