package sim

// Python renderings of JSON values (str, repr, json.dumps, truthiness), for
// the Messages API conversion (messages_request.go), which reproduces what
// vLLM's Python code makes of a request's values.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
)

// pyStr is Python's str() of a JSON value: a string as it is, anything
// else as its repr.
func pyStr(raw json.RawMessage) string {
	v, err := parsePy(raw)
	if err != nil {
		return string(raw)
	}
	if v.kind == pyString {
		return v.s
	}
	return v.repr()
}

// pyTruthyStr is vLLM's `str(content) if content else ""` for a
// tool_result content (a string or a list of objects).
func pyTruthyStr(raw json.RawMessage) string {
	if !pyTruthy(raw) {
		return ""
	}
	return pyStr(raw)
}

// pyTruthy reports whether a JSON value is true in Python.
func pyTruthy(raw json.RawMessage) bool {
	v, err := parsePy(raw)
	if err != nil {
		return false
	}
	switch v.kind {
	case pyNull:
		return false
	case pyBool:
		return v.b
	case pyString:
		return v.s != ""
	case pyNumber:
		f, err := strconv.ParseFloat(v.s, 64)
		return err != nil || f != 0
	}
	return len(v.elems) > 0
}

// pyKind is the kind of a pyValue.
type pyKind uint8

const (
	pyNull pyKind = iota
	pyBool
	pyNumber
	pyString
	pyList
	pyDict
)

// pyValue is a JSON value as Python's json module (and pydantic) holds it:
// a dict keeps each key at its first position with its last value, a
// number stays an int or a float as written. It renders as json.dumps
// (default separators, ensure_ascii) and as repr.
type pyValue struct {
	kind  pyKind
	s     string // a string's text, a number's literal
	b     bool
	elems []pyValue // list elements; dict values
	keys  []string  // dict keys
}

// parsePy parses one JSON value.
func parsePy(raw []byte) (pyValue, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return readPy(dec)
}

func readPy(dec *json.Decoder) (pyValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return pyValue{}, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return readPyList(dec)
		}
		return readPyDict(dec)
	case string:
		return pyValue{kind: pyString, s: t}, nil
	case json.Number:
		return pyValue{kind: pyNumber, s: string(t)}, nil
	case bool:
		return pyValue{kind: pyBool, b: t}, nil
	}
	return pyValue{kind: pyNull}, nil
}

func readPyList(dec *json.Decoder) (pyValue, error) {
	v := pyValue{kind: pyList}
	for dec.More() {
		e, err := readPy(dec)
		if err != nil {
			return pyValue{}, err
		}
		v.elems = append(v.elems, e)
	}
	_, err := dec.Token() // ]
	return v, err
}

func readPyDict(dec *json.Decoder) (pyValue, error) {
	v := pyValue{kind: pyDict}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return pyValue{}, err
		}
		k, _ := tok.(string)
		e, err := readPy(dec)
		if err != nil {
			return pyValue{}, err
		}
		if i := indexOf(v.keys, k); i >= 0 {
			v.elems[i] = e
			continue
		}
		v.keys, v.elems = append(v.keys, k), append(v.elems, e)
	}
	_, err := dec.Token() // }
	return v, err
}

func indexOf(keys []string, k string) int {
	for i, x := range keys {
		if x == k {
			return i
		}
	}
	return -1
}

// dumps is Python's json.dumps(v).
func (v pyValue) dumps() string {
	var b strings.Builder
	v.write(&b, false)
	return b.String()
}

// repr is Python's repr(v).
func (v pyValue) repr() string {
	var b strings.Builder
	v.write(&b, true)
	return b.String()
}

// write writes v as repr (repr true) or as json.dumps.
func (v pyValue) write(b *strings.Builder, repr bool) {
	switch v.kind {
	case pyNull:
		b.WriteString(pyWord("null", repr))
	case pyBool:
		b.WriteString(pyWord(strconv.FormatBool(v.b), repr))
	case pyNumber:
		b.WriteString(pyNumberText(v.s, repr))
	case pyString:
		if repr {
			writePyRepr(b, v.s)
		} else {
			writePyJSONString(b, v.s)
		}
	case pyList:
		b.WriteByte('[')
		for i, e := range v.elems {
			if i > 0 {
				b.WriteString(", ")
			}
			e.write(b, repr)
		}
		b.WriteByte(']')
	case pyDict:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			pyValue{kind: pyString, s: k}.write(b, repr)
			b.WriteString(": ")
			v.elems[i].write(b, repr)
		}
		b.WriteByte('}')
	}
}

// pyWord is a JSON literal (null, true, false) as json.dumps or repr
// writes it.
func pyWord(lit string, repr bool) string {
	if !repr {
		return lit
	}
	return map[string]string{"null": "None", "true": "True", "false": "False"}[lit]
}

// pyNumberText writes a JSON number literal as Python does: an int (no
// fraction or exponent) in full, a float as float.__repr__ (json.dumps
// writes infinities as Infinity).
func pyNumberText(lit string, repr bool) string {
	if !strings.ContainsAny(lit, ".eE") {
		if n, ok := new(big.Int).SetString(lit, 10); ok {
			return n.String()
		}
		return lit
	}
	f, _ := strconv.ParseFloat(lit, 64) // out of range: ±Inf, as Python's float()
	switch {
	case math.IsInf(f, 0):
		name := "Infinity"
		if repr {
			name = "inf"
		}
		if f < 0 {
			return "-" + name
		}
		return name
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr of a finite float: the shortest digits that
// round-trip, in fixed notation with at least one fractional digit when
// the decimal exponent is in [-4, 16), else as d.ddde±XX.
func pyFloatRepr(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	sign := ""
	if strings.HasPrefix(mant, "-") {
		sign, mant = "-", mant[1:]
	}
	digits := strings.Replace(mant, ".", "", 1)
	switch {
	case exp < -4 || exp >= 16:
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return fmt.Sprintf("%s%se%s%02d", sign, m, es, exp)
	case exp < 0:
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	case len(digits) <= exp+1:
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// writePyJSONString writes s as json.dumps does with ensure_ascii: \" \\
// \n \r \t \b \f, every other character outside ' '..'~' as \uXXXX
// (lower-case hex, astral characters as surrogate pairs).
func writePyJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r >= 0x20 && r <= 0x7e:
				b.WriteRune(r)
			case r < 0x10000:
				fmt.Fprintf(b, `\u%04x`, r)
			default:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, r1, r2)
			}
		}
	}
	b.WriteByte('"')
}

// writePyRepr writes Python's repr of a str: single quotes unless the text
// holds ' and no ", backslash escapes for the quote, \\, \t, \n, \r,
// \xNN / \uNNNN / \UNNNNNNNN for characters that are not printable.
func writePyRepr(b *strings.Builder, s string) {
	q := '\''
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	b.WriteRune(q)
	for _, r := range s {
		switch {
		case r == q || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case unicode.IsPrint(r): // Python's str.isprintable: ' ' and no other separator or control
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteRune(q)
}
