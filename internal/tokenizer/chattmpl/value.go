package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Values are Go values: nil (None), bool, int64, float64, string, []any (a
// list), tuple (a Python tuple), *Dict (insertion-ordered, like a Python
// dict), rangeT (a range object), dictView (keys()/values()/items()),
// *Namespace, *loopObj, builtin (a Go function or a macro) and undefined.
// Python ints beyond int64 are not supported: an operation that would
// overflow fails instead of wrapping.

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

// tuple is a Python tuple: it prints as (a, b) and never equals a list.
type tuple []any

// rangeT is a Python range object (the sandbox caps its length at
// maxRange, as Jinja2's sandbox does).
type rangeT struct{ start, stop, step int64 }

func (r rangeT) len() int64 {
	var span, step uint64 // in uint64: stop - start may not fit an int64
	switch {
	case r.step > 0 && r.start < r.stop:
		span, step = uint64(r.stop)-uint64(r.start), uint64(r.step)
	case r.step < 0 && r.start > r.stop:
		span, step = uint64(r.start)-uint64(r.stop), -uint64(r.step)
	default:
		return 0
	}
	n := span / step
	if span%step != 0 {
		n++
	}
	return int64(min(n, math.MaxInt64))
}

func (r rangeT) at(i int64) int64 { return r.start + i*r.step }

// dictView is what dict.keys(), .values() and .items() return.
type dictView struct {
	kind  string // "keys", "values" or "items"
	items []any
}

// generator is a Python iterator, what map, select, unique, batch, items
// and reverse return in Jinja2: always true, no length, printed as an
// object address (refused here), used up by iterating it, and (but for
// reverse's) computed only when first consumed.
type generator struct {
	items   []any
	pos     int
	compute func() ([]any, error) // nil once computed
}

func newGenerator(items []any) *generator { return &generator{items: items} }

// force computes the items on first use.
func (g *generator) force() error {
	if g.compute == nil {
		return nil
	}
	items, err := g.compute()
	g.compute, g.items = nil, items
	return err
}

// rest consumes the items not yet taken.
func (g *generator) rest() ([]any, error) {
	if err := g.force(); err != nil {
		return nil, err
	}
	out := g.items[g.pos:]
	g.pos = len(g.items)
	return out, nil
}

type undefinedT struct{}

// undefined renders as "" and is falsy, like Jinja's default Undefined.
var undefined = &undefinedT{}

func isUndefined(v any) bool { _, ok := v.(*undefinedT); return ok }

// builtin is a callable: a Go function, a bound method or a macro.
type builtin func(c *caller, args []any, kw *Dict) (any, error)

// seqItems returns the items of a list or a tuple.
func seqItems(v any) ([]any, bool) {
	switch x := v.(type) {
	case []any:
		return x, true
	case tuple:
		return x, true
	}
	return nil, false
}

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
	case tuple:
		return len(x) > 0
	case *Dict:
		return len(x.keys) > 0
	case rangeT:
		return x.len() > 0
	case dictView:
		return len(x.items) > 0
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
	var b limitedBuilder
	writeRepr(&b, v, false)
	return b.String()
}

// repr is Python's repr (quoted strings) or str at top level.
func repr(v any, quote bool) string {
	var b limitedBuilder
	writeRepr(&b, v, quote)
	return b.String()
}

// limitedBuilder is a strings.Builder that stops a rendering (budgetPanic)
// when one value's text would pass maxValue: a list holding itself twice
// at every level is small in memory but its repr is exponential.
type limitedBuilder struct{ strings.Builder }

func (b *limitedBuilder) check(n int) {
	if b.Len()+n > maxValue {
		panic(budgetPanic{fmt.Errorf("%w: a value is larger than %d bytes", ErrRender, maxValue)})
	}
}

func (b *limitedBuilder) WriteString(s string) (int, error) {
	b.check(len(s))
	return b.Builder.WriteString(s)
}

func (b *limitedBuilder) WriteByte(c byte) error {
	b.check(1)
	return b.Builder.WriteByte(c)
}

func (b *limitedBuilder) WriteRune(r rune) (int, error) {
	b.check(4)
	return b.Builder.WriteRune(r)
}

// budgetPanic carries a limit error out of helpers that have no error
// result; Template.Render recovers it.
type budgetPanic struct{ err error }

func writeRepr(b *limitedBuilder, v any, quote bool) {
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case *undefinedT:
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyFloat(x))
	case string:
		if quote {
			writePyQuote(b, x)
		} else {
			b.WriteString(x)
		}
	case []any:
		writeSeq(b, "[", "]", x)
	case tuple:
		if len(x) == 1 {
			b.WriteString("(")
			writeRepr(b, x[0], true)
			b.WriteString(",)")
			return
		}
		writeSeq(b, "(", ")", x)
	case *Dict:
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writePyQuote(b, k)
			b.WriteString(": ")
			writeRepr(b, x.m[k], true)
		}
		b.WriteByte('}')
	case rangeT:
		if x.step == 1 {
			fmt.Fprintf(b, "range(%d, %d)", x.start, x.stop)
		} else {
			fmt.Fprintf(b, "range(%d, %d, %d)", x.start, x.stop, x.step)
		}
	case dictView:
		b.WriteString("dict_" + x.kind + "(")
		writeSeq(b, "[", "]", x.items)
		b.WriteString(")")
	case *Namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, x.d, true)
		b.WriteString(">")
	case *loopObj:
		fmt.Fprintf(b, "<LoopContext %d/%d>", x.index+1, x.length)
	default:
		// Functions print with their address in Python: nothing to match.
		panic(budgetPanic{fmt.Errorf("%w: cannot print %T (Python prints an object address)", ErrRender, v)})
	}
}

func writeSeq(b *limitedBuilder, open, closing string, items []any) {
	b.WriteString(open)
	for i, e := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		writeRepr(b, e, true)
	}
	b.WriteString(closing)
}

// pyFloat is Python's repr of a float: the shortest digits that read back,
// in positional notation for exponents from -4 to 15, else scientific.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±xx, as Python writes the exponent
	_, exps, _ := strings.Cut(e, "e")
	if exp, _ := strconv.Atoi(exps); exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// pyPrintable is Python's str.isprintable for one character: what repr
// leaves unescaped.
func pyPrintable(r rune) bool { return unicode.IsPrint(r) }

// writePyQuote writes Python's repr of a string.
func writePyQuote(sb *limitedBuilder, s string) {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
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
			fmt.Fprintf(sb, `\x%02x`, r)
		case r >= 0x80 && !pyPrintable(r):
			switch {
			case r <= 0xff:
				fmt.Fprintf(sb, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(sb, `\u%04x`, r)
			default:
				fmt.Fprintf(sb, `\U%08x`, r)
			}
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteString(q)
}

// jsonOpts are the json.dumps options transformers' tojson filter exposes.
type jsonOpts struct {
	pretty      bool   // indent given (json.dumps indent is not None)
	indent      string // one level of indentation
	sortKeys    bool
	ensureASCII bool
	itemSep     string // default ", " (or "," with indent)
	keySep      string // default ": "
}

// toJSON is Python's json.dumps as transformers' tojson filter calls it
// (ensure_ascii=False unless asked).
func toJSON(v any, o jsonOpts) (string, error) {
	var sb limitedBuilder
	if err := writeJSON(&sb, v, o, 0); err != nil {
		return "", err
	}
	return sb.String(), nil
}

func writeJSON(sb *limitedBuilder, v any, o jsonOpts, depth int) error {
	if depth > maxNest {
		return fmt.Errorf("%w: tojson: value nested too deeply", ErrRender)
	}
	nl := func(d int) {
		if o.pretty {
			sb.WriteByte('\n')
			for range d {
				sb.WriteString(o.indent)
			}
		}
	}
	switch x := v.(type) {
	case nil:
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
	case []any, tuple:
		items, _ := seqItems(x)
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, e := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			nl(depth + 1)
			if err := writeJSON(sb, e, o, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		sb.WriteByte(']')
	case *Dict:
		if len(x.keys) == 0 {
			sb.WriteString("{}")
			return nil
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
			if err := writeJSON(sb, x.m[k], o, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		sb.WriteByte('}')
	default:
		return fmt.Errorf("%w: tojson: %s is not JSON serializable", ErrRender, typeName(v))
	}
	return nil
}

func writeJSONString(sb *limitedBuilder, s string, ensureASCII bool) {
	sb.check(len(s) + 2)
	sb.Builder.WriteByte('"')
	start := 0 // s[start:i] needs no escaping
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (c != 0x7f || !ensureASCII) {
				i++
				continue
			}
		} else if !ensureASCII {
			if r, w := utf8.DecodeRuneInString(s[i:]); r != utf8.RuneError || w != 1 {
				i += w
				continue
			}
		}
		sb.WriteString(s[start:i])
		r, w := utf8.DecodeRuneInString(s[i:])
		i += w
		start = i
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
	sb.WriteString(s[start:])
	sb.WriteByte('"')
}

// typeName is the Python type name of a value, for error messages.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case *undefinedT:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case rangeT:
		return "range"
	case dictView:
		return "dict view"
	case *Namespace:
		return "Namespace"
	case *loopObj:
		return "LoopContext"
	case *generator:
		return "generator"
	}
	return "function"
}

// equal is Python ==. Nested values are compared with a bounded amount of
// work (a list that holds itself twice at every level is exponential).
func equal(a, b any) bool {
	work := 0
	return equalN(a, b, &work)
}

func equalN(a, b any, work *int) bool {
	*work++
	if *work > maxEqualWork {
		panic(budgetPanic{fmt.Errorf("%w: comparison too large", ErrRender)})
	}
	if fa, ok := num(a); ok {
		if fb, ok := num(b); ok {
			ia, aInt := intValue(a)
			ib, bInt := intValue(b)
			if aInt && bInt {
				return ia == ib
			}
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
		return ok && equalSeq(x, y, work)
	case tuple:
		y, ok := b.(tuple)
		return ok && equalSeq(x, y, work)
	case rangeT:
		y, ok := b.(rangeT)
		if !ok {
			return false
		}
		n := x.len()
		return n == y.len() && (n == 0 || x.start == y.start && (n == 1 || x.step == y.step))
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for _, k := range x.keys {
			if yv, ok := y.m[k]; !ok || !equalN(x.m[k], yv, work) {
				return false
			}
		}
		return true
	case *Namespace, *loopObj, *generator:
		return a == b
	}
	return false
}

func equalSeq(x, y []any, work *int) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !equalN(x[i], y[i], work) {
			return false
		}
	}
	return true
}

// intValue is a bool or int as an int64.
func intValue(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
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

// compare is Python's ordering (<, >): numbers, strings, and lists or
// tuples (of the same kind) item by item.
func compare(a, b any) (int, error) {
	if fa, ok := num(a); ok {
		if fb, ok := num(b); ok {
			ia, aInt := intValue(a)
			ib, bInt := intValue(b)
			switch {
			case aInt && bInt:
				return cmpOrdered(ia, ib), nil
			case math.IsNaN(fa) || math.IsNaN(fb):
				return 2, nil // unordered: every comparison is False
			}
			return cmpOrdered(fa, fb), nil
		}
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil // UTF-8 byte order is code point order
		}
	case []any:
		if y, ok := b.([]any); ok {
			return compareSeq(x, y)
		}
	case tuple:
		if y, ok := b.(tuple); ok {
			return compareSeq(x, y)
		}
	}
	return 0, fmt.Errorf("%w: '<' not supported between instances of '%s' and '%s'", ErrRender, typeName(a), typeName(b))
}

func cmpOrdered[T int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareSeq(x, y []any) (int, error) {
	for i := 0; i < len(x) && i < len(y); i++ {
		if equal(x[i], y[i]) {
			continue
		}
		return compare(x[i], y[i])
	}
	return cmpOrdered(int64(len(x)), int64(len(y))), nil
}

// size is what building a value costs against the render's budget: a
// string's bytes, 16 bytes per list or tuple item, 32 per dict entry.
func size(v any) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case []any:
		return 16 * len(x)
	case tuple:
		return 16 * len(x)
	case *Dict:
		return 32 * len(x.keys)
	case dictView:
		return 16 * len(x.items)
	case *generator:
		return 16 * len(x.items)
	}
	return 8
}
