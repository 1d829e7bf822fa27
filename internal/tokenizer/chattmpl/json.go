package chattmpl

import (
	"encoding/binary"
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// FromJSON decodes JSON into template values, keeping object key order:
// objects become *Dict, arrays []any, numbers int64 when they parse as one
// (else float64), strings, bools and nil. Strings decode as encoding/json
// decodes them (invalid UTF-8 and lone surrogates become U+FFFD).
//
// It is a single pass over b without encoding/json's token stream (which
// cost a chat request's ~600-word system message more than rendering it): a
// string without escapes is one copy, an array or object one allocation
// beyond its elements. Syntax is JSON's exactly (RFC 8259, one value,
// whitespace around it); nesting deeper than 10,000 is refused as
// encoding/json refuses it. FuzzFromJSON holds it to the encoding/json
// decoder it replaced.
func FromJSON(b []byte) (any, error) {
	d := jsonDecoder{b: b}
	d.ws()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.ws()
	if d.i != len(b) {
		return nil, errTrailing
	}
	return v, nil
}

var (
	errTrailing = errors.New("chattmpl: trailing data after JSON value")
	errJSONEnd  = errors.New("chattmpl: unexpected end of JSON input")
	errJSONDeep = errors.New("chattmpl: JSON nested too deeply")
)

const maxJSONDepth = 10000 // encoding/json's limit

type jsonDecoder struct {
	b []byte
	i int
}

func (d *jsonDecoder) syntax(what string) error {
	if d.i >= len(d.b) {
		return errJSONEnd
	}
	return errors.New("chattmpl: invalid JSON: " + what + " at offset " + strconv.Itoa(d.i))
}

func (d *jsonDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (any, error) {
	if d.i >= len(d.b) {
		return nil, errJSONEnd
	}
	switch c := d.b[d.i]; {
	case c == '"':
		return d.str()
	case c == '{':
		if depth >= maxJSONDepth {
			return nil, errJSONDeep
		}
		return d.object(depth + 1)
	case c == '[':
		if depth >= maxJSONDepth {
			return nil, errJSONDeep
		}
		return d.array(depth + 1)
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	}
	return nil, d.syntax("invalid character")
}

func (d *jsonDecoder) literal(lit string) error {
	if len(d.b)-d.i < len(lit) || string(d.b[d.i:d.i+len(lit)]) != lit {
		for k := 0; k < len(lit) && d.i < len(d.b) && d.b[d.i] == lit[k]; k++ {
			d.i++
		}
		return d.syntax("invalid literal")
	}
	d.i += len(lit)
	return nil
}

func (d *jsonDecoder) object(depth int) (any, error) {
	d.i++ // '{'
	d.ws()
	m := &Dict{m: map[string]any{}}
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return m, nil
	}
	for {
		if d.i >= len(d.b) || d.b[d.i] != '"' {
			return nil, d.syntax("expected object key")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.ws()
		if d.i >= len(d.b) || d.b[d.i] != ':' {
			return nil, d.syntax("expected ':' after object key")
		}
		d.i++
		d.ws()
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		m.Set(k.(string), v)
		d.ws()
		if d.i >= len(d.b) {
			return nil, errJSONEnd
		}
		switch d.b[d.i] {
		case '}':
			d.i++
			return m, nil
		case ',':
			d.i++
			d.ws()
		default:
			return nil, d.syntax("expected ',' or '}' in object")
		}
	}
}

func (d *jsonDecoder) array(depth int) (any, error) {
	d.i++ // '['
	d.ws()
	l := []any{}
	if d.i < len(d.b) && d.b[d.i] == ']' {
		d.i++
		return l, nil
	}
	for {
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		l = append(l, v)
		d.ws()
		if d.i >= len(d.b) {
			return nil, errJSONEnd
		}
		switch d.b[d.i] {
		case ']':
			d.i++
			return l, nil
		case ',':
			d.i++
			d.ws()
		default:
			return nil, d.syntax("expected ',' or ']' in array")
		}
	}
}

// number follows JSON's number grammar, then converts as
// json.Number.Int64, else json.Number.Float64.
func (d *jsonDecoder) number() (any, error) {
	b, start := d.b, d.i
	i := d.i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		d.i = i
		return nil, d.syntax("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		if i+1 >= len(b) || b[i+1] < '0' || b[i+1] > '9' {
			d.i = i + 1
			return nil, d.syntax("invalid number")
		}
		i = digits(b, i+1)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			d.i = i
			return nil, d.syntax("invalid number")
		}
		i = digits(b, i)
	}
	d.i = i
	s := string(b[start:i])
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// str decodes the string literal at d.i. The common case — no escapes,
// valid UTF-8 — is one copy.
func (d *jsonDecoder) str() (any, error) {
	b := d.b
	start := d.i + 1
	i := start
	for i+8 <= len(b) && !specialWord(binary.LittleEndian.Uint64(b[i:])) {
		i += 8 // eight plain ASCII bytes at a time
	}
	for i < len(b) {
		c := b[i]
		if c == '"' {
			d.i = i + 1
			return string(b[start:i]), nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		i++
	}
	// Escapes, control characters or non-ASCII: find the end, then decode.
	for i < len(b) {
		switch c := b[i]; {
		case c == '"':
			d.i = i + 1
			return jsonUnquote(b[start:i]), nil
		case c == '\\':
			if i+1 >= len(b) {
				d.i = len(b)
				return nil, errJSONEnd
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := i + 2; k < i+6; k++ {
					if k >= len(b) {
						d.i = len(b)
						return nil, errJSONEnd
					}
					if hexDigit(b[k]) < 0 {
						d.i = k
						return nil, d.syntax("invalid \\u escape in string")
					}
				}
				i += 6
			default:
				d.i = i + 1
				return nil, d.syntax("invalid escape in string")
			}
		case c < 0x20:
			d.i = i
			return nil, d.syntax("control character in string")
		default:
			i++
		}
	}
	d.i = len(b)
	return nil, errJSONEnd
}

// unquote decodes a validated string body as encoding/json does.
func jsonUnquote(s []byte) string {
	if utf8.Valid(s) && !hasBackslash(s) {
		return string(s)
	}
	out := make([]byte, 0, len(s)+2*utf8.UTFMax)
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			switch s[i+1] {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := hex4At(s, i+2)
				i += 6
				if utf16.IsSurrogate(r) {
					if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, hex4At(s, i+2)); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // '"', '\\', '/'
				out = append(out, s[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, s[i:i+size]...)
			}
			i += size
		}
	}
	return string(out)
}

// specialWord reports whether any of the 8 bytes in w is '"', '\\', a
// control character or non-ASCII.
func specialWord(w uint64) bool {
	return jsonscan.SpecialWord(w) || w&0x8080808080808080 != 0
}

func hasBackslash(s []byte) bool {
	for _, c := range s {
		if c == '\\' {
			return true
		}
	}
	return false
}

func hexDigit(c byte) rune { return rune(jsonscan.HexVal(c)) }

// hex4At is the \u escape's value at s[i:i+4] (validated hex digits).
func hex4At(s []byte, i int) rune {
	if i+4 > len(s) {
		return -1
	}
	var r rune
	for _, c := range s[i : i+4] {
		h := hexDigit(c)
		if h < 0 {
			return -1
		}
		r = r<<4 | h
	}
	return r
}
