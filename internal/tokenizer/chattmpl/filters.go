package chattmpl

import (
	"fmt"
	"strings"
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
