package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Jinja filters: `x | name(args)`.

func kwArg(kw *Dict, args []any, pos int, name string) (any, bool) {
	if kw != nil {
		if v, ok := kw.m[name]; ok {
			return v, true
		}
	}
	if pos < len(args) {
		return args[pos], true
	}
	return nil, false
}

func (r *renderer) evalFilter(f filterExpr) (any, error) {
	v, err := r.eval(f.arg)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(f.call)
	if err != nil {
		return nil, err
	}
	return applyFilter(&caller{r}, f.name, v, args, kw)
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
		{[]string{"upper"}, filterUpper},
		{[]string{"lower"}, filterLower},
		{[]string{"title"}, filterTitle},
		{[]string{"capitalize"}, filterCapitalize},
		{[]string{"string"}, filterString},
		{[]string{"safe", "e", "escape", "forceescape"}, filterSafe},
		{[]string{"tojson"}, filterTojson},
		{[]string{"length", "count"}, filterLength},
		{[]string{"first", "last"}, filterFirst},
		{[]string{"default", "d"}, filterDefault},
		{[]string{"join"}, filterJoin},
		{[]string{"list"}, filterList},
		{[]string{"items"}, filterItems},
		{[]string{"int"}, filterInt},
		{[]string{"float"}, filterFloat},
		{[]string{"abs"}, filterAbs},
		{[]string{"round"}, filterRound},
		{[]string{"replace"}, filterReplace},
		{[]string{"reverse"}, filterReverse},
		{[]string{"indent"}, filterIndent},
		{[]string{"map", "selectattr", "rejectattr", "select", "reject"}, filterMap},
		{[]string{"unique"}, filterUnique},
		{[]string{"sort"}, filterSort},
		{[]string{"wordcount"}, filterWordcount},
		{[]string{"dictsort"}, filterDictsort},
	} {
		for _, n := range f.names {
			filters[n] = f.fn
		}
	}
}

func applyFilter(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if f, ok := filters[name]; ok {
		return f(c, name, v, args, kw)
	}
	return nil, fmt.Errorf("%w: unknown filter %q", ErrRender, name)
}

func filterTrim(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return strings.TrimFunc(toStr(v), unicode.IsSpace), nil
}

func filterUpper(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return strings.ToUpper(toStr(v)), nil
}

func filterLower(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return strings.ToLower(toStr(v)), nil
}

func filterTitle(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return pyTitle(toStr(v)), nil
}

func filterCapitalize(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return capitalize(toStr(v)), nil
}

func filterString(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return toStr(v), nil
}

func filterSafe(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if name == "safe" {
		return v, nil
	}
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toStr(v)), nil
}

func filterTojson(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	o := jsonOpts{itemSep: ", ", keySep: ": "}
	if x, ok := kwArg(kw, args, 0, "indent"); ok {
		if n, ok := x.(int64); ok && n > 0 {
			o.indent = int(min(n, 64))
			o.itemSep = ","
		}
	}
	if x, ok := kwArg(kw, nil, 0, "sort_keys"); ok {
		o.sortKeys = truthy(x)
	}
	if x, ok := kwArg(kw, nil, 0, "ensure_ascii"); ok {
		o.ensureASCII = truthy(x)
	}
	if x, ok := kwArg(kw, nil, 0, "separators"); ok {
		if seps, ok := x.([]any); ok && len(seps) == 2 {
			o.itemSep, o.keySep = toStr(seps[0]), toStr(seps[1])
		}
	}
	return toJSON(v, o), nil
}

func filterLength(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case string:
		return int64(len([]rune(x))), nil
	case []any:
		return int64(len(x)), nil
	case *Dict:
		return int64(len(x.keys)), nil
	case nil, *undefinedT:
		return int64(0), nil
	}
	return nil, fmt.Errorf("%w: length of %s", ErrRender, repr(v, true))
}

func filterFirst(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
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

func filterDefault(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, _ := kwArg(kw, args, 0, "default_value")
	boolean := false
	if x, ok := kwArg(kw, args, 1, "boolean"); ok {
		boolean = truthy(x)
	}
	if isUndefined(v) || boolean && !truthy(v) {
		if def == nil && len(args) == 0 {
			return "", nil
		}
		return def, nil
	}
	return v, nil
}

func filterJoin(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	sep := strArg(args, 0, "")
	attr, hasAttr := kwArg(kw, args, 1, "attribute")
	parts := make([]string, len(items))
	for i, x := range items {
		if hasAttr {
			x = getAttr(x, toStr(attr))
		}
		parts[i] = toStr(x)
	}
	return strings.Join(parts, sep), nil
}

func filterList(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	return append([]any{}, items...), err
}

func filterItems(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if d, ok := v.(*Dict); ok {
		return dictItems(d), nil
	}
	if v == nil || isUndefined(v) {
		return []any{}, nil
	}
	return nil, fmt.Errorf("%w: items of %s", ErrRender, repr(v, true))
}

func filterInt(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case float64:
		return int64(x), nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	case string:
		if n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
			return n, nil
		}
	}
	return int64(0), nil
}

func filterFloat(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if f, ok := num(v); ok {
		return f, nil
	}
	if s, ok := v.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			return f, nil
		}
	}
	return 0.0, nil
}

func filterAbs(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("%w: abs of %s", ErrRender, repr(v, true))
}

func filterRound(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	f, ok := num(v)
	if !ok {
		return nil, fmt.Errorf("%w: round of %s", ErrRender, repr(v, true))
	}
	prec := int64(0)
	if x, ok := kwArg(kw, args, 0, "precision"); ok {
		prec, _ = x.(int64)
	}
	p := math.Pow(10, float64(prec))
	return math.RoundToEven(f*p) / p, nil
}

func filterReplace(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	n := -1
	if len(args) > 2 {
		if c, ok := args[2].(int64); ok {
			n = int(c)
		}
	}
	return strings.Replace(toStr(v), strArg(args, 0, ""), strArg(args, 1, ""), n), nil
}

func filterReverse(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	if s, ok := v.(string); ok {
		rs := []rune(s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return string(rs), nil
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(items))
	for i, x := range items {
		out[len(items)-1-i] = x
	}
	return out, nil
}

func filterIndent(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	width := int64(4)
	if x, ok := kwArg(kw, args, 0, "width"); ok {
		width, _ = x.(int64)
	}
	first := false
	if x, ok := kwArg(kw, args, 1, "first"); ok {
		first = truthy(x)
	}
	pad := strings.Repeat(" ", int(max(0, min(width, 1000))))
	lines := strings.Split(toStr(v), "\n")
	for i := range lines {
		if (i > 0 || first) && lines[i] != "" {
			lines[i] = pad + lines[i]
		}
	}
	return strings.Join(lines, "\n"), nil
}

func filterMap(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return seqFilter(c, name, v, args, kw)
}

func filterUnique(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	var out []any
	for _, x := range items {
		dup := false
		for _, y := range out {
			if equal(x, y) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, x)
		}
	}
	return out, nil
}

func filterSort(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := append([]any{}, items...)
	attr, hasAttr := kwArg(kw, nil, 0, "attribute")
	reverse, _ := kwArg(kw, nil, 0, "reverse")
	var serr error
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if hasAttr {
			a, b = getAttr(a, toStr(attr)), getAttr(b, toStr(attr))
		}
		c, err := compare(a, b)
		if err != nil {
			serr = err
		}
		if truthy(reverse) {
			return c > 0
		}
		return c < 0
	})
	return out, serr
}

func filterWordcount(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	return int64(len(strings.Fields(toStr(v)))), nil
}

func seqFilter(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := []any{}
	for _, x := range items {
		switch name {
		case "map":
			if a, ok := kwArg(kw, nil, 0, "attribute"); ok {
				y := getAttr(x, toStr(a))
				if isUndefined(y) {
					if d, ok := kwArg(kw, nil, 0, "default"); ok {
						y = d
					}
				}
				out = append(out, y)
				continue
			}
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: map needs a filter or attribute", ErrRender)
			}
			y, err := applyFilter(c, toStr(args[0]), x, args[1:], nil)
			if err != nil {
				return nil, err
			}
			out = append(out, y)
		case "selectattr", "rejectattr":
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: %s needs an attribute", ErrRender, name)
			}
			val := getAttr(x, toStr(args[0]))
			ok := truthy(val)
			if len(args) > 1 {
				ok, err = applyTest(toStr(args[1]), val, args[2:])
				if err != nil {
					return nil, err
				}
			}
			if ok == (name == "selectattr") {
				out = append(out, x)
			}
		case "select", "reject":
			ok := truthy(x)
			if len(args) > 0 {
				ok, err = applyTest(toStr(args[0]), x, args[1:])
				if err != nil {
					return nil, err
				}
			}
			if ok == (name == "select") {
				out = append(out, x)
			}
		}
	}
	return out, nil
}

// filterDictsort is Jinja2's dictsort(case_sensitive=False, by='key',
// reverse=False): the (key, value) pairs of a dict, sorted.
func filterDictsort(_ *caller, _ string, v any, args []any, kw *Dict) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, fmt.Errorf("%w: dictsort of %s", ErrRender, repr(v, true))
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
			return nil, fmt.Errorf("%w: dictsort by must be 'key' or 'value'", ErrRender)
		}
	}
	if x, ok := kwArg(kw, args, 2, "reverse"); ok {
		reverse = truthy(x)
	}
	items := dictItems(d)
	sortKey := func(p any) any {
		k := p.([]any)[0]
		if byValue {
			k = p.([]any)[1]
		}
		if s, ok := k.(string); ok && !caseSensitive {
			return strings.ToLower(s)
		}
		return k
	}
	var serr error
	sort.SliceStable(items, func(i, j int) bool {
		c, err := compare(sortKey(items[i]), sortKey(items[j]))
		if err != nil {
			serr = err
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	return items, serr
}
