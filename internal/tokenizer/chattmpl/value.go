package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Values are Go values: nil (None), bool, int64, float64, string, []any,
// *Dict (insertion-ordered, like a Python dict), *Namespace, *loopObj,
// *macro, builtin (a Go function) and undefined.

// Dict is an insertion-ordered string-keyed map, so items and tojson keep
// the order of the input as Python does.
type Dict struct {
	keys []string
	m    map[string]any
}

// NewDict returns an empty Dict.
func NewDict() *Dict { return &Dict{m: map[string]any{}} }

// Set adds or replaces a key, keeping first-insertion order.
func (d *Dict) Set(k string, v any) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

// Get returns the value of k.
func (d *Dict) Get(k string) (any, bool) {
	v, ok := d.m[k]
	return v, ok
}

// Keys returns the keys in order.
func (d *Dict) Keys() []string { return d.keys }

// Namespace is the mutable object made by namespace().
type Namespace struct{ d *Dict }

type undefinedT struct{}

// undefined renders as "" and is falsy, like Jinja's default Undefined.
var undefined = &undefinedT{}

func isUndefined(v any) bool { _, ok := v.(*undefinedT); return ok }

type builtin func(c *caller, args []any, kw *Dict) (any, error)

// truthy is Python truthiness.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil, *undefinedT:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case *Dict:
		return len(x.keys) > 0
	}
	return true
}

// toStr is Python's str() as Jinja prints values.
func toStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case *undefinedT:
		return ""
	}
	return repr(v, false)
}

// repr is Python's repr (quoted strings) or str at top level.
func repr(v any, quote bool) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case *undefinedT:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	case string:
		if quote {
			return pyQuote(x)
		}
		return x
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = repr(e, true)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *Dict:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = pyQuote(k) + ": " + repr(x.m[k], true)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case *Namespace:
		return "<Namespace " + repr(x.d, true) + ">"
	}
	return fmt.Sprintf("<%T>", v)
}

func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e16 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func pyQuote(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	var sb strings.Builder
	sb.WriteString(q)
	for _, r := range s {
		switch {
		case r == '\\':
			sb.WriteString(`\\`)
		case string(r) == q:
			sb.WriteString(`\` + q)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteString(q)
	return sb.String()
}

// jsonOpts are the json.dumps options transformers' tojson filter exposes.
type jsonOpts struct {
	indent      int
	sortKeys    bool
	ensureASCII bool
	itemSep     string // default ", " (or "," with indent)
	keySep      string // default ": "
}

// toJSON is Python's json.dumps as transformers' tojson filter calls it
// (ensure_ascii=False unless asked).
func toJSON(v any, o jsonOpts) string {
	var sb strings.Builder
	writeJSON(&sb, v, o, 0)
	return sb.String()
}

func writeJSON(sb *strings.Builder, v any, o jsonOpts, depth int) {
	nl := func(d int) {
		if o.indent > 0 {
			sb.WriteByte('\n')
			sb.WriteString(strings.Repeat(" ", o.indent*d))
		}
	}
	switch x := v.(type) {
	case nil, *undefinedT:
		sb.WriteString("null")
	case bool:
		if x {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case int64:
		sb.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			sb.WriteString("NaN")
		case math.IsInf(x, 1):
			sb.WriteString("Infinity")
		case math.IsInf(x, -1):
			sb.WriteString("-Infinity")
		default:
			sb.WriteString(pyFloat(x))
		}
	case string:
		writeJSONString(sb, x, o.ensureASCII)
	case []any:
		if len(x) == 0 {
			sb.WriteString("[]")
			return
		}
		sb.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			nl(depth + 1)
			writeJSON(sb, e, o, depth+1)
		}
		nl(depth)
		sb.WriteByte(']')
	case *Dict:
		if len(x.keys) == 0 {
			sb.WriteString("{}")
			return
		}
		keys := x.keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			nl(depth + 1)
			writeJSONString(sb, k, o.ensureASCII)
			sb.WriteString(o.keySep)
			writeJSON(sb, x.m[k], o, depth+1)
		}
		nl(depth)
		sb.WriteByte('}')
	case *Namespace:
		writeJSON(sb, x.d, o, depth)
	default:
		writeJSONString(sb, toStr(v), o.ensureASCII)
	}
}

func writeJSONString(sb *strings.Builder, s string, ensureASCII bool) {
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || ensureASCII && r > 0x7e && r <= 0xffff:
				fmt.Fprintf(sb, `\u%04x`, r)
			case ensureASCII && r > 0xffff:
				r -= 0x10000 // UTF-16 surrogate pair, as Python writes it
				fmt.Fprintf(sb, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

// equal is Python ==.
func equal(a, b any) bool {
	if fa, ok := num(a); ok {
		if fb, ok := num(b); ok {
			return fa == fb
		}
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case *undefinedT:
		return isUndefined(b)
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for _, k := range x.keys {
			if yv, ok := y.m[k]; !ok || !equal(x.m[k], yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

// num converts bool/int/float to float64 for arithmetic and comparison.
func num(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}
