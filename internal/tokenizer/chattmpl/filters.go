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

// Jinja filters: `x | name(args)`, each with Jinja2 3.1's semantics (and
// transformers' tojson). A filter that is not here fails the render.

// kwArg is keyword argument name, else positional argument pos (pos < 0:
// keyword only).
func kwArg(kw *Dict, args []any, pos int, name string) (any, bool) {
	if kw != nil {
		if v, ok := kw.m[name]; ok {
			return v, true
		}
	}
	if pos >= 0 && pos < len(args) {
		return args[pos], true
	}
	return nil, false
}

// applyFilterExpr applies filter f (with its arguments) to v, charging
// the operands and the result.
func (r *renderer) applyFilterExpr(f filterExpr, v any) (any, error) {
	args, kw, err := r.evalArgs(f.call)
	if err != nil {
		return nil, err
	}
	return r.applyFilter(f.name, v, args, kw)
}

func (r *renderer) applyFilter(name string, v any, args []any, kw *Dict) (any, error) {
	fn, ok := filters[name]
	if !ok {
		return nil, fmt.Errorf("%w: unknown filter %q", ErrRender, name)
	}
	if err := r.scan(size(v)); err != nil {
		return nil, err
	}
	out, err := fn(&caller{r}, name, v, args, kw)
	if err != nil {
		return nil, err
	}
	return out, r.build(out)
}

// lazy makes a filter that Jinja2 writes as a Python generator function:
// it returns a generator at once and does its work (and fails) only when
// the generator is consumed.
func lazy(f filterFunc) filterFunc {
	return func(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
		return &generator{compute: func() ([]any, error) {
			out, err := f(c, name, v, args, kw)
			if err != nil {
				return nil, err
			}
			items := out.([]any)
			return items, c.r.build(items)
		}}, nil
	}
}

// filterFunc implements one Jinja filter; name is the name it was called by
// (several filters share an implementation).
type filterFunc func(c *caller, name string, v any, args []any, kw *Dict) (any, error)

// filters maps filter names to their implementations; filled in init because
// map and sort call back into applyFilter.
var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{}
	for _, f := range []struct {
		names []string
		fn    filterFunc
	}{
		{[]string{"trim"}, filterTrim},
		{[]string{"upper", "lower", "title", "capitalize"}, filterCase},
		{[]string{"string"}, filterString},
		{[]string{"safe", "e", "escape", "forceescape"}, filterSafe},
		{[]string{"tojson"}, filterTojson},
		{[]string{"length", "count"}, filterLength},
		{[]string{"first", "last"}, filterFirst},
		{[]string{"default", "d"}, filterDefault},
		{[]string{"join"}, filterJoin},
		{[]string{"list"}, filterList},
		{[]string{"items"}, lazy(filterItems)},
		{[]string{"int"}, filterInt},
		{[]string{"float"}, filterFloat},
		{[]string{"abs"}, filterAbs},
		{[]string{"round"}, filterRound},
		{[]string{"replace"}, filterReplace},
		{[]string{"reverse"}, filterReverse},
		{[]string{"indent"}, filterIndent},
		{[]string{"map", "selectattr", "rejectattr", "select", "reject"}, lazy(seqFilter)},
		{[]string{"unique"}, lazy(filterUnique)},
		{[]string{"sort"}, filterSort},
		{[]string{"wordcount"}, filterWordcount},
		{[]string{"dictsort"}, filterDictsort},
		{[]string{"sum"}, filterSum},
		{[]string{"min", "max"}, filterMinMax},
		{[]string{"batch", "slice"}, lazy(filterBatch)},
		{[]string{"groupby"}, filterGroupby},
		{[]string{"attr"}, filterAttr},
		{[]string{"center"}, filterCenter},
		{[]string{"truncate"}, filterTruncate},
		{[]string{"format"}, filterFormat},
	} {
		for _, n := range f.names {
			filters[n] = f.fn
		}
	}
}

func filterTrim(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	cut, ok, err := optStr(args, kw, 0, "chars")
	if err != nil {
		return nil, err
	}
	return strStrip(toStr(v), "strip", cut, ok), nil
}

func filterCase(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	s := toStr(v)
	switch name {
	case "upper":
		return pyUpper(s), nil
	case "lower":
		return pyLower(s), nil
	case "capitalize":
		return capitalize(s), nil
	}
	return jinjaTitle(s), nil
}

// jinjaTitle is Jinja2's title filter (not str.title): words start after
// whitespace and any of -({[<, and are upper(first) + lower(rest).
func jinjaTitle(s string) string {
	isSep := func(r rune) bool { return pyIsSpace(r) || strings.ContainsRune("-({[<", r) }
	var sb strings.Builder
	for s != "" {
		i := strings.IndexFunc(s, func(r rune) bool { return !isSep(r) })
		if i < 0 {
			sb.WriteString(s)
			break
		}
		sb.WriteString(s[:i])
		s = s[i:]
		j := strings.IndexFunc(s, isSep)
		if j < 0 {
			j = len(s)
		}
		_, w := utf8.DecodeRuneInString(s)
		sb.WriteString(pyUpper(s[:w]) + pyLower(s[w:j]))
		s = s[j:]
	}
	return sb.String()
}

func filterString(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return toStr(v), nil
}

func filterSafe(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if name == "safe" { // Markup(value): a string
		return toStr(v), nil
	}
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toStr(v)), nil
}

// filterTojson is transformers' tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False): json.dumps with those arguments.
func filterTojson(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	o := jsonOpts{itemSep: ", ", keySep: ": "}
	if x, ok := kwArg(kw, args, 0, "ensure_ascii"); ok {
		o.ensureASCII = truthy(x)
	}
	if x, ok := kwArg(kw, args, 1, "indent"); ok && x != nil {
		o.pretty, o.itemSep = true, ","
		switch n := x.(type) {
		case string:
			o.indent = n
		default:
			k, isInt := intValue(n)
			if !isInt {
				return nil, fmt.Errorf("%w: tojson indent must be an int or a string", ErrRender)
			}
			o.indent = strings.Repeat(" ", int(max(0, min(k, 256))))
		}
	}
	if x, ok := kwArg(kw, args, 2, "separators"); ok && x != nil {
		seps, _ := seqItems(x)
		if len(seps) != 2 {
			return nil, fmt.Errorf("%w: tojson separators must be a pair", ErrRender)
		}
		o.itemSep, o.keySep = toStr(seps[0]), toStr(seps[1])
	}
	if x, ok := kwArg(kw, args, 3, "sort_keys"); ok {
		o.sortKeys = truthy(x)
	}
	return toJSON(v, o)
}

func filterLength(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case string:
		return int64(utf8.RuneCountInString(x)), nil
	case []any:
		return int64(len(x)), nil
	case tuple:
		return int64(len(x)), nil
	case *Dict:
		return int64(len(x.keys)), nil
	case rangeT:
		return x.len(), nil
	case dictView:
		return int64(len(x.items)), nil
	case *undefinedT:
		return int64(0), nil
	}
	return nil, fmt.Errorf("%w: object of type '%s' has no len()", ErrRender, typeName(v))
}

func firstLast(c *caller, name string, v any) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined, nil
	}
	if name == "first" {
		return items[0], nil
	}
	return items[len(items)-1], nil
}

func filterFirst(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	g, isGen := v.(*generator)
	switch {
	case isGen && name == "last":
		return nil, fmt.Errorf("%w: 'generator' object is not reversible", ErrRender)
	case isGen:
		if err := g.force(); err != nil {
			return nil, err
		}
		if g.pos == len(g.items) {
			return undefined, nil
		}
		g.pos++
		return g.items[g.pos-1], nil
	}
	return firstLast(c, name, v)
}

func filterDefault(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, ok := kwArg(kw, args, 0, "default_value")
	if !ok {
		def = ""
	}
	boolean := false
	if x, ok := kwArg(kw, args, 1, "boolean"); ok {
		boolean = truthy(x)
	}
	if isUndefined(v) || boolean && !truthy(v) {
		return def, nil
	}
	return v, nil
}

func filterJoin(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	sep := ""
	if x, ok := kwArg(kw, args, 0, "d"); ok {
		sep = toStr(x)
	}
	attr, hasAttr := kwArg(kw, args, 1, "attribute")
	parts := make([]string, len(items))
	n := 0
	for i, x := range items {
		if hasAttr && attr != nil {
			if x, err = attrGet(x, attr); err != nil {
				return nil, err
			}
		}
		parts[i] = toStr(x)
		if n += len(parts[i]) + len(sep); n > maxValue {
			return nil, checkLen(n)
		}
	}
	return strings.Join(parts, sep), nil
}

func filterList(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	return append([]any{}, items...), err
}

func filterItems(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case *Dict:
		return dictItems(x), nil
	case *undefinedT:
		return []any{}, nil
	}
	return nil, fmt.Errorf("%w: can only get item pairs from a mapping", ErrRender)
}

func dictItems(d *Dict) []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		out[i] = tuple{k, d.m[k]}
	}
	return out
}

// filterInt is Jinja2's int(value, default=0, base=10): int(value, base)
// for strings, int(value) for numbers, else int(float(value)), else the
// default.
func filterInt(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, ok := kwArg(kw, args, 0, "default")
	if !ok {
		def = int64(0)
	}
	base, err := optInt(args, kw, 1, "base", 10)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		n, _ := intValue(x)
		return n, nil
	case float64:
		return truncFloat(x, def)
	case string:
		if n, ok, err := pyParseInt(x, base); ok || err != nil {
			return n, err
		}
		if f, ok := pyParseFloat(x); ok {
			return truncFloat(f, def)
		}
		return def, nil
	case *undefinedT:
		return nil, errUndefined("int()")
	}
	return def, nil
}

func truncFloat(f float64, def any) (any, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return def, nil
	}
	if math.Abs(f) >= 1<<63 {
		return nil, errOverflow
	}
	return int64(f), nil
}

// pyParseInt is Python's int(s, base) (base 0: from the prefix); ok is
// false where Python raises ValueError.
func pyParseInt(s string, base int64) (int64, bool, error) {
	s = strings.TrimFunc(s, pyIsSpace)
	if base != 0 && (base < 2 || base > 36) {
		return 0, false, fmt.Errorf("%w: int() base must be >= 2 and <= 36, or 0", ErrRender)
	}
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if len(s) >= 2 && s[0] == '0' {
		p := map[byte]int64{'x': 16, 'X': 16, 'o': 8, 'O': 8, 'b': 2, 'B': 2}[s[1]]
		if p != 0 && (base == 0 || base == p) {
			s, base = strings.TrimPrefix(s[2:], "_"), p
		}
	}
	if base == 0 {
		if len(s) > 1 && s[0] == '0' && strings.Trim(s, "0_") != "" {
			return 0, false, nil // base 0 refuses leading zeros
		}
		base = 10
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, false, nil
	}
	u, err := strconv.ParseUint(strings.ReplaceAll(s, "_", ""), int(base), 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return 0, false, errOverflow
		}
		return 0, false, nil
	}
	if neg {
		if u > 1<<63 {
			return 0, false, errOverflow
		}
		return -int64(u), true, nil
	}
	if u > math.MaxInt64 {
		return 0, false, errOverflow
	}
	return int64(u), true, nil
}

// pyParseFloat is Python's float(s) for a string.
func pyParseFloat(s string) (float64, bool) {
	s = strings.TrimFunc(s, pyIsSpace)
	t := strings.ToLower(strings.TrimLeft(s, "+-"))
	switch t {
	case "inf", "infinity", "nan":
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	// digits, '.', exponent and underscores between digits only (no hex, no
	// Go-only forms)
	prevDigit := false
	for i := 0; i < len(t); i++ {
		ch := t[i]
		switch {
		case ch >= '0' && ch <= '9':
			prevDigit = true
			continue
		case ch == '_':
			if !prevDigit || i+1 >= len(t) || t[i+1] < '0' || t[i+1] > '9' {
				return 0, false
			}
		case ch == '.' || ch == 'e' || ch == '+' || ch == '-':
		default:
			return 0, false
		}
		prevDigit = false
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return f, true // Python gives inf (or 0) too
		}
		return 0, false
	}
	return f, true
}

func filterFloat(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, ok := kwArg(kw, args, 0, "default")
	if !ok {
		def = 0.0
	}
	switch x := v.(type) {
	case *undefinedT:
		return nil, errUndefined("float()")
	case string:
		if f, ok := pyParseFloat(x); ok {
			return f, nil
		}
		return def, nil
	}
	if f, ok := num(v); ok {
		return f, nil
	}
	return def, nil
}

func filterAbs(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case int64:
		if x == math.MinInt64 {
			return nil, errOverflow
		}
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case bool:
		n, _ := intValue(x)
		return n, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("%w: bad operand type for abs(): '%s'", ErrRender, typeName(v))
}

// filterRound is Jinja2's round(value, precision=0, method='common'):
// Python's round() (correctly rounded, ties to even; an int stays an int),
// or math.ceil/floor at the precision.
func filterRound(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	prec, err := optInt(args, kw, 0, "precision", 0)
	if err != nil {
		return nil, err
	}
	method := "common"
	if x, ok := kwArg(kw, args, 1, "method"); ok {
		method = toStr(x)
	}
	if method != "common" && method != "ceil" && method != "floor" {
		return nil, fmt.Errorf("%w: method must be common, ceil or floor", ErrRender)
	}
	if _, ok := num(v); !ok {
		return nil, fmt.Errorf("%w: type %s doesn't define __round__ method", ErrRender, typeName(v))
	}
	if n, isInt := intValue(v); isInt && method == "common" {
		if prec >= 0 {
			return n, nil
		}
		return nil, fmt.Errorf("%w: round() of an int to negative digits is not supported", ErrRender)
	}
	f, _ := num(v)
	if method != "common" {
		p := math.Pow(10, float64(prec))
		if method == "ceil" {
			return math.Ceil(f*p) / p, nil
		}
		return math.Floor(f*p) / p, nil
	}
	if math.IsInf(f, 0) || math.IsNaN(f) || prec > 300 {
		return f, nil
	}
	if prec < 0 {
		return nil, fmt.Errorf("%w: round() to negative digits is not supported", ErrRender)
	}
	r, err := strconv.ParseFloat(strconv.FormatFloat(f, 'f', int(prec), 64), 64)
	if err != nil {
		return nil, fmt.Errorf("%w: round: %v", ErrRender, err)
	}
	return r, nil
}

func filterReplace(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	n := int64(-1)
	if x, ok := kwArg(kw, args, 2, "count"); ok && x != nil {
		k, isInt := intValue(x)
		if !isInt {
			return nil, fmt.Errorf("%w: replace count must be an int", ErrRender)
		}
		n = k
	}
	old, ok1 := kwArg(kw, args, 0, "old")
	repl, ok2 := kwArg(kw, args, 1, "new")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: replace needs old and new", ErrRender)
	}
	return strReplace(toStr(v), toStr(old), toStr(repl), n)
}

func filterReverse(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if s, ok := v.(string); ok {
		rs := []rune(s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return string(rs), nil
	}
	_, isGen := v.(*generator)
	if v == nil {
		return nil, fmt.Errorf("%w: argument must be iterable", ErrRender)
	}
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(items))
	for i, x := range items {
		out[len(items)-1-i] = x
	}
	if isGen { // reversed() refuses an iterator: Jinja2 reverses a list of it
		return out, nil
	}
	return newGenerator(out), nil
}

// filterIndent is Jinja2's indent(s, width=4, first=False, blank=False).
func filterIndent(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	pad := "    "
	if x, ok := kwArg(kw, args, 0, "width"); ok {
		if s, isStr := x.(string); isStr {
			pad = s
		} else {
			n, isInt := intValue(x)
			if !isInt {
				return nil, fmt.Errorf("%w: indent width must be an int or a string", ErrRender)
			}
			pad = strings.Repeat(" ", int(max(0, min(n, 1000))))
		}
	}
	first, blank := false, false
	if x, ok := kwArg(kw, args, 1, "first"); ok {
		first = truthy(x)
	}
	if x, ok := kwArg(kw, args, 2, "blank"); ok {
		blank = truthy(x)
	}
	s, ok := v.(string)
	if !ok { // Jinja2 appends "\n" to the value: only a string takes it
		return nil, fmt.Errorf("%w: indent of %s", ErrRender, typeName(v))
	}
	if err := checkLen(len(s) + (countLines(s)+1)*(len(pad)+1)); err != nil {
		return nil, err
	}
	lines := splitLines(s+"\n", false)
	var sb strings.Builder
	for i, l := range lines {
		if i > 0 {
			sb.WriteByte('\n')
		}
		if i > 0 && (blank || l != "") || i == 0 && first {
			sb.WriteString(pad)
		}
		sb.WriteString(l)
	}
	return sb.String(), nil
}

// attrParts is Jinja2's attribute path for map/sort/sum/...: "a.b.0".
func attrParts(attr any) []any {
	s, ok := attr.(string)
	if !ok {
		return []any{attr}
	}
	var parts []any
	for _, p := range strings.Split(s, ".") {
		if n, err := strconv.ParseInt(p, 10, 64); err == nil && p[0] >= '0' && p[0] <= '9' {
			parts = append(parts, n)
		} else {
			parts = append(parts, p)
		}
	}
	return parts
}

// attrGet is Jinja2's make_attrgetter: item lookups along the path.
func attrGet(x, attr any) (any, error) {
	for _, p := range attrParts(attr) {
		var err error
		if x, err = getItem(x, p); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func seqFilter(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if !truthy(v) { // Jinja2 iterates only a true value (0 and None give nothing)
		return []any{}, nil
	}
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	out := []any{}
	if name == "map" {
		if a, ok := kwArg(kw, nil, -1, "attribute"); ok && len(args) == 0 {
			def, hasDef := kwArg(kw, nil, -1, "default")
			for _, x := range items {
				y, err := attrGet(x, a)
				if err != nil {
					return nil, err
				}
				if isUndefined(y) && hasDef {
					y = def
				}
				out = append(out, y)
			}
			return out, nil
		}
		if len(args) == 0 {
			return nil, fmt.Errorf("%w: map requires a filter argument", ErrRender)
		}
		for _, x := range items {
			y, err := c.r.applyFilter(toStr(args[0]), x, args[1:], kw)
			if err != nil {
				return nil, err
			}
			out = append(out, y)
		}
		return out, nil
	}
	attr := strings.HasSuffix(name, "attr")
	off := 0
	if attr {
		if len(args) == 0 {
			return nil, fmt.Errorf("%w: missing parameter for attribute name", ErrRender)
		}
		off = 1
	}
	for _, x := range items {
		val := x
		if attr {
			if val, err = attrGet(x, args[0]); err != nil {
				return nil, err
			}
		}
		ok := truthy(val)
		if len(args) > off {
			if ok, err = c.r.applyTest(toStr(args[off]), val, args[off+1:]); err != nil {
				return nil, err
			}
		}
		if ok == strings.HasPrefix(name, "select") {
			out = append(out, x)
		}
	}
	return out, nil
}

// hashKey is a value's identity in a Python set (1, 1.0 and True are one
// key); ok is false for unhashable values.
func hashKey(v any) (any, bool) {
	switch x := v.(type) {
	case nil, string:
		return x, true
	case bool:
		n, _ := intValue(x)
		return n, true
	case int64:
		return x, true
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<63 {
			return int64(x), true
		}
		return x, true
	case tuple:
		parts := make([]string, len(x))
		for i, e := range x {
			k, ok := hashKey(e)
			if !ok {
				return nil, false
			}
			parts[i] = fmt.Sprintf("%T:%v", k, k)
		}
		return "\x00tuple:" + strings.Join(parts, "\x00"), true
	}
	return nil, false
}

// filterUnique is Jinja2's unique(value, case_sensitive=False,
// attribute=None): the first item of each key, strings compared lowercased.
func filterUnique(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	caseSensitive := false
	if x, ok := kwArg(kw, args, 0, "case_sensitive"); ok {
		caseSensitive = truthy(x)
	}
	attr, hasAttr := kwArg(kw, args, 1, "attribute")
	seen := map[any]bool{}
	out := []any{}
	for _, x := range items {
		k := x
		if hasAttr && attr != nil {
			if k, err = attrGet(x, attr); err != nil {
				return nil, err
			}
		}
		if s, ok := k.(string); ok && !caseSensitive {
			k = pyLower(s)
		}
		hk, ok := hashKey(k)
		if !ok {
			return nil, fmt.Errorf("%w: unhashable type: '%s'", ErrRender, typeName(k))
		}
		if !seen[hk] {
			seen[hk] = true
			out = append(out, x)
		}
	}
	return out, nil
}

// sortKey is the key Jinja2's sort, min, max and groupby compare.
func sortKey(x, attr any, hasAttr, caseSensitive bool) (any, error) {
	if hasAttr && attr != nil {
		var err error
		if x, err = attrGet(x, attr); err != nil {
			return nil, err
		}
	}
	if s, ok := x.(string); ok && !caseSensitive {
		return pyLower(s), nil
	}
	return x, nil
}

// sortItems sorts items stably by key (Python's sorted).
func sortItems(items []any, keys []any, reverse bool) error {
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var serr error
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := keys[idx[i]], keys[idx[j]]
		if reverse {
			a, b = b, a
		}
		c, err := compare(a, b)
		if err != nil && serr == nil {
			serr = err
		}
		return c == -1
	})
	sorted := make([]any, len(items))
	for i, k := range idx {
		sorted[i] = items[k]
	}
	copy(items, sorted)
	return serr
}

// filterSort is Jinja2's sort(value, reverse=False, case_sensitive=False,
// attribute=None).
func filterSort(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	reverse, _ := kwArg(kw, args, 0, "reverse")
	caseSensitive, _ := kwArg(kw, args, 1, "case_sensitive")
	attr, hasAttr := kwArg(kw, args, 2, "attribute")
	out := append([]any{}, items...)
	keys := make([]any, len(out))
	for i, x := range out {
		if keys[i], err = sortKey(x, attr, hasAttr, truthy(caseSensitive)); err != nil {
			return nil, err
		}
	}
	return out, sortItems(out, keys, truthy(reverse))
}

// filterWordcount counts runs of word characters (Python's \w+).
func filterWordcount(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	isWord := func(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) }
	n := int64(0)
	in := false
	for _, r := range toStr(v) {
		w := isWord(r)
		if w && !in {
			n++
		}
		in = w
	}
	return n, nil
}

// filterDictsort is Jinja2's dictsort(case_sensitive=False, by='key',
// reverse=False): the (key, value) pairs of a dict, sorted.
func filterDictsort(c *caller, _ string, v any, args []any, kw *Dict) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, fmt.Errorf("%w: dictsort of %s", ErrRender, typeName(v))
	}
	caseSensitive, byValue, reverse := false, false, false
	if x, ok := kwArg(kw, args, 0, "case_sensitive"); ok {
		caseSensitive = truthy(x)
	}
	if x, ok := kwArg(kw, args, 1, "by"); ok {
		switch toStr(x) {
		case "key":
		case "value":
			byValue = true
		default:
			return nil, fmt.Errorf("%w: You can only sort by either \"key\" or \"value\"", ErrRender)
		}
	}
	if x, ok := kwArg(kw, args, 2, "reverse"); ok {
		reverse = truthy(x)
	}
	items := dictItems(d)
	keys := make([]any, len(items))
	for i, p := range items {
		k := p.(tuple)[0]
		if byValue {
			k = p.(tuple)[1]
		}
		keys[i], _ = sortKey(k, nil, false, caseSensitive)
	}
	return items, sortItems(items, keys, reverse)
}

// filterSum is Jinja2's sum(iterable, attribute=None, start=0). A float
// sum must come out the same whether added naively (Python before 3.12)
// or compensated (3.12 on); when the two differ it fails.
func filterSum(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	attr, hasAttr := kwArg(kw, args, 0, "attribute")
	acc, ok := kwArg(kw, args, 1, "start")
	if !ok {
		acc = int64(0)
	}
	var naive, comp, cerr float64
	isFloat := false
	for _, x := range items {
		if hasAttr && attr != nil {
			if x, err = attrGet(x, attr); err != nil {
				return nil, err
			}
		}
		if _, f := x.(float64); f && !isFloat {
			isFloat = true
			a, ok := num(acc)
			if !ok {
				return nil, fmt.Errorf("%w: unsupported operand type(s) for +: '%s' and 'float'", ErrRender, typeName(acc))
			}
			naive, comp = a, a
		}
		if isFloat {
			f, ok := num(x)
			if !ok {
				return nil, fmt.Errorf("%w: unsupported operand type(s) for +: 'float' and '%s'", ErrRender, typeName(x))
			}
			naive += f
			t := comp + f // Neumaier
			if math.Abs(comp) >= math.Abs(f) {
				cerr += (comp - t) + f
			} else {
				cerr += (f - t) + comp
			}
			comp = t
			continue
		}
		if acc, err = arith("+", acc, x); err != nil {
			return nil, err
		}
	}
	if !isFloat {
		return acc, nil
	}
	if naive != comp+cerr && !(math.IsNaN(naive) && math.IsNaN(comp+cerr)) {
		return nil, fmt.Errorf("%w: sum of floats depends on the Python version (%v or %v)", ErrRender, naive, comp+cerr)
	}
	return naive, nil
}

// filterMinMax is Jinja2's min/max(value, case_sensitive=False,
// attribute=None): the first smallest or largest item.
func filterMinMax(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined, nil
	}
	caseSensitive, _ := kwArg(kw, args, 0, "case_sensitive")
	attr, hasAttr := kwArg(kw, args, 1, "attribute")
	best := items[0]
	bestKey, err := sortKey(best, attr, hasAttr, truthy(caseSensitive))
	if err != nil {
		return nil, err
	}
	for _, x := range items[1:] {
		k, err := sortKey(x, attr, hasAttr, truthy(caseSensitive))
		if err != nil {
			return nil, err
		}
		cmp, err := compare(k, bestKey)
		if err != nil {
			return nil, err
		}
		if name == "min" && cmp == -1 || name == "max" && cmp == 1 {
			best, bestKey = x, k
		}
	}
	return best, nil
}

// filterBatch is Jinja2's batch(value, linecount, fill_with=None) and
// slice(value, slices, fill_with=None).
func filterBatch(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	n, err := optInt(args, kw, 0, map[string]string{"batch": "linecount", "slice": "slices"}[name], 0)
	if err != nil {
		return nil, err
	}
	fill, hasFill := kwArg(kw, args, 1, "fill_with")
	hasFill = hasFill && fill != nil
	if n <= 0 {
		return nil, fmt.Errorf("%w: %s needs a positive count", ErrRender, name)
	}
	if n > int64(len(items)) && (name == "slice" || hasFill) {
		if err := checkLen(int(min(n, maxValue) * 16)); err != nil { // n rows, or rows of n
			return nil, err
		}
	}
	out := []any{}
	if name == "batch" {
		for i := 0; i < len(items); i += int(n) {
			row := append([]any{}, items[i:min(len(items), i+int(n))]...)
			for hasFill && len(row) < int(n) {
				row = append(row, fill)
			}
			out = append(out, row)
		}
		return out, nil
	}
	per, extra := len(items)/int(n), len(items)%int(n)
	offset := 0
	for i := range int(n) {
		start := offset + i*per
		if i < extra {
			offset++
		}
		end := offset + (i+1)*per
		row := append([]any{}, items[start:end]...)
		if hasFill && i >= extra {
			row = append(row, fill)
		}
		out = append(out, row)
	}
	return out, nil
}

// filterGroupby is Jinja2's groupby(value, attribute, default=None,
// case_sensitive=False): (grouper, list) pairs in key order.
func filterGroupby(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := c.r.iterate(v)
	if err != nil {
		return nil, err
	}
	attr, ok := kwArg(kw, args, 0, "attribute")
	if !ok {
		return nil, fmt.Errorf("%w: groupby needs an attribute", ErrRender)
	}
	def, hasDef := kwArg(kw, args, 1, "default")
	caseSensitive, _ := kwArg(kw, args, 2, "case_sensitive")
	get := func(x any) (any, error) {
		y, err := attrGet(x, attr)
		if err == nil && isUndefined(y) && hasDef {
			y = def
		}
		return y, err
	}
	sorted := append([]any{}, items...)
	keys := make([]any, len(sorted))
	for i, x := range sorted {
		k, err := get(x)
		if err != nil {
			return nil, err
		}
		keys[i], _ = sortKey(k, nil, false, truthy(caseSensitive))
	}
	if err := sortItemsKeys(sorted, keys); err != nil {
		return nil, err
	}
	out := []any{}
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && equal(keys[j], keys[i]) {
			j++
		}
		grouper, err := get(sorted[i])
		if err != nil {
			return nil, err
		}
		out = append(out, groupTuple(grouper, append([]any{}, sorted[i:j]...)))
		i = j
	}
	return out, nil
}

// groupMarker sits just past the end of a groupby tuple's items (in its
// capacity): it marks the tuple as Jinja2's _GroupTuple, whose attributes
// grouper and list name its items. Slicing or adding it makes a plain
// tuple, as in Python.
var groupMarker = &struct{ byte }{}

func groupTuple(grouper, list any) tuple {
	t := tuple{grouper, list, groupMarker}
	return t[:2]
}

func isGroupTuple(t tuple) bool { return cap(t) == 3 && len(t) == 2 && t[:3][2] == groupMarker }

// sortItemsKeys sorts items and their keys together.
func sortItemsKeys(items, keys []any) error {
	pairs := make([]any, len(items))
	for i := range items {
		pairs[i] = tuple{keys[i], items[i]}
	}
	if err := sortItems(pairs, keys, false); err != nil {
		return err
	}
	for i, p := range pairs {
		keys[i], items[i] = p.(tuple)[0], p.(tuple)[1]
	}
	return nil
}

// filterAttr is Jinja2's attr(obj, name): the attribute only, never an
// item.
func filterAttr(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	n, ok := kwArg(kw, args, 0, "name")
	if !ok {
		return nil, fmt.Errorf("%w: attr needs a name", ErrRender)
	}
	s := toStr(n)
	switch x := v.(type) {
	case *Dict:
		if m := dictMethod(x, s); m != nil {
			return m, nil
		}
		return undefined, nil
	case *undefinedT:
		return undefined, nil
	}
	return getAttr(v, s)
}

func filterCenter(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	w, ok := kwArg(kw, args, 0, "width")
	if !ok {
		w = int64(80)
	}
	return pad(toStr(v), []any{w}, "center")
}

// filterTruncate is Jinja2's truncate(s, length=255, killwords=False,
// end='...', leeway=None) with the default leeway of 5.
func filterTruncate(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	length, err := optInt(args, kw, 0, "length", 255)
	if err != nil {
		return nil, err
	}
	str, ok := v.(string)
	if !ok {
		// Jinja2 returns a value no longer than length+5 as it is, and
		// slices a longer one (strings only here).
		n, err := filterLength(c, "length", v, nil, nil)
		if err == nil && n.(int64) <= length+5 {
			return v, nil
		}
		return nil, fmt.Errorf("%w: truncate of %s", ErrRender, typeName(v))
	}
	s := []rune(str)
	kill, _ := kwArg(kw, args, 1, "killwords")
	end := "..."
	if x, ok := kwArg(kw, args, 2, "end"); ok {
		end = toStr(x)
	}
	leeway, err := optInt(args, kw, 3, "leeway", 5)
	if err != nil {
		return nil, err
	}
	endLen := int64(utf8.RuneCountInString(end))
	if length < endLen || leeway < 0 {
		return nil, fmt.Errorf("%w: truncate: expected length >= %d and leeway >= 0", ErrRender, endLen)
	}
	if int64(len(s)) <= length+leeway {
		return string(s), nil
	}
	cut := string(s[:length-endLen])
	if truthy(kill) {
		return cut + end, nil
	}
	if i := strings.LastIndex(cut, " "); i >= 0 {
		cut = cut[:i]
	}
	return cut + end, nil
}

// filterFormat is Jinja2's format(value, *args, **kwargs): value % args.
func filterFormat(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if len(args) > 0 && kw != nil {
		return nil, fmt.Errorf("%w: can't handle positional and keyword arguments at the same time", ErrRender)
	}
	if kw != nil {
		return percentFormat(toStr(v), kw)
	}
	return percentFormat(toStr(v), tuple(args))
}
