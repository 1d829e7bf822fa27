package ingress

import (
	"bytes"
	"math"
	"strconv"
	"unicode"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// pyInt reads the JSON value val of an int field as vLLM does: the body
// decoded by Python's json, then validated by pydantic v2 in lax mode. So
// an integer, a float with no fraction (1e3, 64.0), a boolean (1 or 0) and
// a string pydantic reads as an integer ("64", " 64 ", "+064", "64.00",
// "1_000") are that integer; anything else (null included: the caller
// decides what null means) is not an int (ok false), which vLLM answers
// with a 400. Integers beyond int64, which Python keeps exactly, saturate.
// It allocates nothing unless a string holds escapes and is long.
func pyInt(val []byte) (v int64, ok bool) {
	if len(val) == 0 {
		return 0, false
	}
	switch val[0] {
	case 't':
		return 1, string(val) == "true"
	case 'f':
		return 0, string(val) == "false"
	case '"':
		s := val[1 : len(val)-1]
		if bytes.IndexByte(s, '\\') >= 0 {
			var buf [64]byte
			s = jsonscan.AppendUnquote(buf[:0], val)
		}
		return pyStrInt(s)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		if v, ok := jsonInt(val); ok {
			return v, true
		}
		// A float: Python's float(), then pydantic's float_as_int (finite,
		// no fraction, strictly inside int64's range).
		f, err := strconv.ParseFloat(string(val), 64)
		if err != nil || math.IsInf(f, 0) || f != math.Trunc(f) || f <= math.MinInt64 || f >= math.MaxInt64 {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// jsonInt parses s when it is exactly a JSON integer (-?(0|[1-9][0-9]*)),
// saturating beyond int64 (Python's int is exact there).
func jsonInt(s []byte) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	if len(s) == 0 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	var u uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = addDigit(u, c)
	}
	return signed(u, neg), true
}

// addDigit is u·10 + the digit c, saturating at MaxUint64.
func addDigit(u uint64, c byte) uint64 {
	if u > (math.MaxUint64-9)/10 {
		return math.MaxUint64
	}
	return u*10 + uint64(c-'0')
}

// signed is the magnitude u with its sign, saturating to int64.
func signed(u uint64, neg bool) int64 {
	switch {
	case neg && u >= 1<<63:
		return math.MinInt64
	case neg:
		return -int64(u)
	case u > math.MaxInt64:
		return math.MaxInt64
	}
	return int64(u)
}

// pyStrInt is pydantic-core's str_as_int: the string as a JSON integer, or
// else as clean_int_str leaves it (surrounding Unicode whitespace trimmed,
// one leading '+' or '-', leading zeros, an all-zero fraction and single
// underscores between digits dropped), when that changed anything. Its
// bound: at most 4300 bytes, as CPython's int().
func pyStrInt(s []byte) (int64, bool) {
	if len(s) > 4300 {
		return 0, false
	}
	if v, ok := jsonInt(s); ok {
		return v, true
	}
	before := len(s)
	s = bytes.TrimFunc(s, unicode.IsSpace) // Rust's str::trim: the White_Space property
	if len(s) > 0 && s[0] == '+' {
		if len(s) > 1 && s[1] == '-' {
			return 0, false
		}
		s = s[1:]
	}
	neg := false
	if len(s) > 0 && s[0] == '-' {
		if len(s) > 1 && (s[1] == '-' || s[1] == '+') {
			return 0, false
		}
		neg, s = true, s[1:]
	}
	s, ok := stripLeadingZeros(s)
	if !ok {
		return 0, false
	}
	if i := bytes.IndexByte(s, '.'); i >= 0 && i+1 < len(s) && allZeros(s[i+1:]) {
		s = s[:i]
	}
	under := bytes.IndexByte(s, '_') >= 0
	if under && (s[0] == '_' || s[len(s)-1] == '_' || bytes.Contains(s, []byte("__"))) {
		under = false // not stripped: the parse below fails on the '_'
	}
	if !under && len(s) == before {
		return 0, false // nothing cleaned: it stays what failed above
	}
	// The cleaned text, its underscores left out, parsed as a JSON integer
	// (with the sign put back).
	var u uint64
	digits := 0
	for _, c := range s {
		switch {
		case c == '_' && under:
			continue
		case c == '-' && digits == 0 && !neg:
			// clean_int_str's leading-zero step can leave a '-' first
			// ("0-1" → "-1"), which the final parse reads as a sign.
			neg = true
			continue
		case c < '0' || c > '9':
			return 0, false
		case digits == 1 && u == 0:
			return 0, false // a leading zero the JSON grammar refuses ("0_1" is stripped to "01")
		}
		digits++
		u = addDigit(u, c)
	}
	if digits == 0 {
		return 0, false
	}
	return signed(u, neg), true
}

// stripLeadingZeros is pydantic-core's strip_leading_zeros: zeros (and
// underscores among them) before the first other digit go, but one zero
// stays before a '.' or when nothing else follows; a first byte that is
// neither a digit nor '-' fails.
func stripLeadingZeros(s []byte) ([]byte, bool) {
	if len(s) == 0 {
		return nil, false
	}
	switch c := s[0]; {
	case c == '0':
	case c >= '1' && c <= '9' || c == '-':
		return s, true
	default:
		return nil, false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '0' || c == '_':
		case c >= '1' && c <= '9' || c == '-':
			return s[i:], true
		case c == '.':
			return s[i-1:], true
		default:
			return nil, false
		}
	}
	return s[len(s)-1:], true
}

func allZeros(s []byte) bool {
	for _, c := range s {
		if c != '0' {
			return false
		}
	}
	return true
}

// pyBool reads the JSON value val of a bool field as vLLM does (pydantic v2,
// lax): true and false, the integers 0 and 1, the floats 0.0 and 1.0, and a
// string that is, in lower case, one of "0" "off" "f" "false" "n" "no" or
// "1" "on" "t" "true" "y" "yes". Anything else (null included: the caller
// decides what null means) is not a bool (ok false).
func pyBool(val []byte) (v, ok bool) {
	if len(val) == 0 {
		return false, false
	}
	switch val[0] {
	case 't':
		return true, string(val) == "true"
	case 'f':
		return false, string(val) == "false"
	case '"':
		s := val[1 : len(val)-1]
		if bytes.IndexByte(s, '\\') >= 0 {
			var buf [16]byte
			s = jsonscan.AppendUnquote(buf[:0], val)
		}
		if len(s) > len("false") {
			return false, false
		}
		var low [5]byte
		for i, c := range s {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			low[i] = c
		}
		switch string(low[:len(s)]) {
		case "0", "off", "f", "false", "n", "no":
			return false, true
		case "1", "on", "t", "true", "y", "yes":
			return true, true
		}
		return false, false
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		f, err := strconv.ParseFloat(string(val), 64)
		switch {
		case err != nil:
			return false, false
		case f == 0:
			return false, true
		case f == 1:
			return true, true
		}
	}
	return false, false
}
