package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Sequence filters: attribute lookups, select/reject/map, unique, sort,
// dictsort, sum, min/max, batch and groupby.

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
