// Package jsonscan is a small allocation-free JSON scanner: it walks a
// document's members and elements as byte spans, validating the structure
// of everything it skips, for callers that need a few fields of a large
// document rather than a decoded tree — the ingress's request bodies (it
// splices token ids into the prompt's span) and tokenizer.json's vocabulary
// and merges. Malformed input is an *Error wrapping ErrMalformed.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrMalformed is wrapped by every scanner error.
var ErrMalformed = errors.New("malformed JSON")

const maxDepth = 128

// Error is a scanner error: what is wrong and the byte offset where.
type Error struct {
	Msg string
	Off int
}

func (e *Error) Error() string { return "malformed JSON: " + e.Msg }
func (e *Error) Unwrap() error { return ErrMalformed }

func jerr(msg string, off int) error { return &Error{Msg: msg, Off: off} }

// SkipWS returns the index of the first non-whitespace byte at or after i.
func SkipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// SkipValue returns the index just past the JSON value starting at b[i], a
// member or element of an enclosing document.
func SkipValue(b []byte, i int) (int, error) { return skipValue(b, i, 1) }

// skipValue returns the index just past the JSON value starting at b[i].
func skipValue(b []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, jerr("JSON nested too deeply", i)
	}
	if i >= len(b) {
		return 0, jerr("unexpected end of JSON", i)
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := SkipString(b, i)
		return end, err
	case c == '{':
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, nil
		}
		for {
			if i >= len(b) || b[i] != '"' {
				return 0, jerr("expected object key", i)
			}
			var err error
			if i, _, err = SkipString(b, i); err != nil {
				return 0, err
			}
			i = SkipWS(b, i)
			if i >= len(b) || b[i] != ':' {
				return 0, jerr("expected ':' after object key", i)
			}
			if i, err = skipValue(b, SkipWS(b, i+1), depth+1); err != nil {
				return 0, err
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return 0, jerr("unexpected end of JSON in object", i)
			}
			if b[i] == '}' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, jerr("expected ',' or '}' in object", i)
			}
			i = SkipWS(b, i+1)
		}
	case c == '[':
		i = SkipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, nil
		}
		for {
			var err error
			if i, err = skipValue(b, i, depth+1); err != nil {
				return 0, err
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return 0, jerr("unexpected end of JSON in array", i)
			}
			if b[i] == ']' {
				return i + 1, nil
			}
			if b[i] != ',' {
				return 0, jerr("expected ',' or ']' in array", i)
			}
			i = SkipWS(b, i+1)
		}
	case c == '-' || (c >= '0' && c <= '9'):
		return skipNumber(b, i)
	case c == 't':
		return skipLiteral(b, i, "true")
	case c == 'f':
		return skipLiteral(b, i, "false")
	case c == 'n':
		return skipLiteral(b, i, "null")
	}
	return 0, jerr("invalid character in JSON value", i)
}

func skipLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, jerr("invalid literal in JSON", i)
	}
	return i + len(lit), nil
}

// skipNumber follows the JSON number grammar exactly.
func skipNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else {
		j := skipDigits(b, i)
		if j == i {
			return 0, jerr("invalid number in JSON", start)
		}
		i = j
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, jerr("invalid number in JSON", start)
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, jerr("invalid number in JSON", start)
		}
		i = j
	}
	return i, nil
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// SkipString returns the index past the closing quote of the string at b[i]
// and whether it holds escapes. It rejects control characters and bad escapes.
func SkipString(b []byte, i int) (int, bool, error) {
	start := i
	i++
	esc := false
	for i < len(b) {
		for i+8 <= len(b) && !SpecialWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8 // eight plain bytes at a time
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return 0, false, jerr("unterminated string", start)
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
					return 0, false, jerr("invalid \\u escape in string", i)
				}
				i += 6
			default:
				return 0, false, jerr("invalid escape in string", i)
			}
		case c < 0x20:
			return 0, false, jerr("control character in string", i)
		default:
			i++
		}
	}
	return 0, false, jerr("unterminated string", start)
}

// SpecialWord reports whether any of the 8 bytes in w (little-endian) is
// '"', '\\' or a control character: the classic SWAR zero-byte tests, with
// no false negatives (a false positive only sends a scan to its byte loop).
// String scanners skip plain bytes eight at a time with it.
func SpecialWord(w uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	ctl := (w - lo*0x20) & ^w & hi // a byte < 0x20
	q := w ^ (lo * '"')
	bs := w ^ (lo * '\\')
	return (ctl | (q-lo)&^q&hi | (bs-lo)&^bs&hi) != 0
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if HexVal(c) < 0 {
			return false
		}
	}
	return true
}

// HexVal is the value of the hex digit c, or -1.
func HexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// ForEachMember calls fn with every top-level member of the object that is
// the whole of b (only whitespace may follow it); key is the key without
// quotes, decoded when it holds escapes (a copy then; fn must not keep it
// either way); val is the raw value span; keyOff and valOff are the offsets
// of the key's opening quote and of the value in b.
func ForEachMember(b []byte, fn func(key, val []byte, keyOff, valOff int) error) error {
	return ScanMembers(b, nil, fn)
}

// ScanMembers is ForEachMember with a hook: consume, when set, may parse a
// member's value at b[at] itself (returning its end and handled=true) so a
// large value is read once instead of skipped and then parsed.
func ScanMembers(b []byte, consume func(key, b []byte, at int) (end int, handled bool, err error), fn func(key, val []byte, keyOff, valOff int) error) error {
	i := SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return jerr("expected a JSON object", i)
	}
	i = SkipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return Trailing(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return jerr("expected object key", i)
		}
		i0 := i
		kend, kesc, err := SkipString(b, i)
		if err != nil {
			return err
		}
		key := b[i+1 : kend-1]
		if kesc {
			// "mod\u0065l" is "model" to every JSON parser, the engine's
			// included: decoded (rare, so a copy), never skipped.
			key = AppendUnquote(nil, b[i0:kend])
		}
		i = SkipWS(b, kend)
		if i >= len(b) || b[i] != ':' {
			return jerr("expected ':' after object key", i)
		}
		vstart := SkipWS(b, i+1)
		if vstart >= len(b) {
			return jerr("unexpected end of JSON", vstart)
		}
		var vend int
		handled := false
		if consume != nil && key != nil {
			if vend, handled, err = consume(key, b, vstart); err != nil {
				return err
			}
		}
		if !handled {
			if vend, err = skipValue(b, vstart, 1); err != nil {
				return err
			}
		}
		if err := fn(key, b[vstart:vend], i0, vstart); err != nil {
			return err
		}
		i = SkipWS(b, vend)
		if i >= len(b) {
			return jerr("unexpected end of JSON in object", i)
		}
		if b[i] == '}' {
			return Trailing(b, i+1)
		}
		if b[i] != ',' {
			return jerr("expected ',' or '}' in object", i)
		}
		i = SkipWS(b, i+1)
	}
}

// Trailing fails when anything but whitespace follows b[i].
func Trailing(b []byte, i int) error {
	if SkipWS(b, i) != len(b) {
		return jerr("trailing data after JSON object", i)
	}
	return nil
}

// AppendUnquote appends the decoded content of the JSON string literal raw
// (quotes included, already validated by SkipString) to dst.
func AppendUnquote(dst, raw []byte) []byte {
	s := raw[1 : len(raw)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := rune(hex4(s[i+2:]))
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 := rune(hex4(s[i+2:]))
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						dst = utf8.AppendRune(dst, d)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) int {
	return HexVal(b[0])<<12 | HexVal(b[1])<<8 | HexVal(b[2])<<4 | HexVal(b[3])
}

// ParseUint parses a JSON number that must be a non-negative integer <= max.
// A number written with a fraction or an exponent counts when its value is
// a whole number (2.0, 1e3, -0), as vLLM's request models (pydantic, lax)
// read an int field; 2.5 does not.
func ParseUint(raw []byte, max uint64) (uint64, bool) {
	if len(raw) == 0 || len(raw) > 20 {
		return parseWholeFloat(raw, max)
	}
	var v uint64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return parseWholeFloat(raw, max)
		}
		d := uint64(c - '0')
		if v > (max-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// parseWholeFloat is ParseUint's path for a number with a sign, fraction
// or exponent: exact below 2^53, the range of a whole float64.
func parseWholeFloat(raw []byte, max uint64) (uint64, bool) {
	if len(raw) == 0 || len(raw) > 64 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || f < 0 || f >= 1<<53 || f > float64(max) {
		return 0, false
	}
	return uint64(f), true
}

// ForEachElem calls fn with every element of the JSON array raw, a value
// span already validated (by ForEachMember or SkipValue).
func ForEachElem(raw []byte, fn func(elem []byte) error) error {
	if len(raw) == 0 || raw[0] != '[' {
		return jerr("expected an array", 0)
	}
	i := SkipWS(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return nil
	}
	for {
		end, err := skipValue(raw, i, 1)
		if err != nil {
			return err
		}
		if err := fn(raw[i:end]); err != nil {
			return err
		}
		i = SkipWS(raw, end)
		if i >= len(raw) {
			return jerr("unexpected end of array", i)
		}
		if raw[i] == ']' {
			return nil
		}
		i = SkipWS(raw, i+1)
	}
}
