package chattmpl

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// globals are the functions transformers provides to chat templates.
func globals() map[string]any {
	return map[string]any{
		"raise_exception": builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			msg := ""
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			return nil, fmt.Errorf("%w: %s", ErrRaised, msg)
		}),
		"namespace": builtin(func(_ *caller, args []any, kw *Dict) (any, error) {
			d := NewDict()
			if len(args) > 0 {
				if src, ok := args[0].(*Dict); ok {
					for _, k := range src.keys {
						d.Set(k, src.m[k])
					}
				}
			}
			if kw != nil {
				for _, k := range kw.keys {
					d.Set(k, kw.m[k])
				}
			}
			return &Namespace{d}, nil
		}),
		"range": builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			var b [3]int64
			b[2] = 1
			ints := make([]int64, len(args))
			for i, a := range args {
				n, ok := a.(int64)
				if !ok {
					return nil, fmt.Errorf("%w: range() needs integers", ErrRender)
				}
				ints[i] = n
			}
			switch len(ints) {
			case 1:
				b[1] = ints[0]
			case 2, 3:
				copy(b[:], ints)
			default:
				return nil, fmt.Errorf("%w: range() takes 1 to 3 arguments", ErrRender)
			}
			if b[2] == 0 {
				return nil, fmt.Errorf("%w: range() step 0", ErrRender)
			}
			out := []any{}
			for i := b[0]; (b[2] > 0 && i < b[1]) || (b[2] < 0 && i > b[1]); i += b[2] {
				if len(out) >= 1_000_000 {
					return nil, fmt.Errorf("%w: range too long", ErrRender)
				}
				out = append(out, i)
			}
			return out, nil
		}),
		"dict": builtin(func(_ *caller, _ []any, kw *Dict) (any, error) {
			if kw == nil {
				return NewDict(), nil
			}
			return kw, nil
		}),
		"strftime_now": builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: strftime_now(format)", ErrRender)
			}
			return strftime(time.Now(), toStr(args[0])), nil
		}),
	}
}

func strftime(t time.Time, f string) string {
	r := strings.NewReplacer("%Y", t.Format("2006"), "%m", t.Format("01"), "%d", t.Format("02"),
		"%B", t.Format("January"), "%b", t.Format("Jan"), "%H", t.Format("15"), "%M", t.Format("04"),
		"%S", t.Format("05"), "%A", t.Format("Monday"), "%a", t.Format("Mon"), "%y", t.Format("06"),
		"%-d", strconv.Itoa(t.Day()), "%%", "%")
	return r.Replace(f)
}

func getAttr(obj any, name string) any {
	switch x := obj.(type) {
	case *Dict:
		if v, ok := x.m[name]; ok {
			return v
		}
		return dictMethod(x, name)
	case *Namespace:
		if v, ok := x.d.m[name]; ok {
			return v
		}
	case *loopObj:
		return x.attr(name)
	case string:
		return stringMethod(x, name)
	case []any:
		return listMethod(x, name)
	}
	return undefined
}

func getItem(obj, idx any) any {
	switch x := obj.(type) {
	case *Dict:
		if k, ok := idx.(string); ok {
			if v, ok := x.m[k]; ok {
				return v
			}
			return undefined
		}
		if v, ok := x.m[toStr(idx)]; ok {
			return v
		}
	case []any:
		if i, ok := idx.(int64); ok {
			if i < 0 {
				i += int64(len(x))
			}
			if i >= 0 && i < int64(len(x)) {
				return x[i]
			}
		}
	case string:
		if i, ok := idx.(int64); ok {
			rs := []rune(x)
			if i < 0 {
				i += int64(len(rs))
			}
			if i >= 0 && i < int64(len(rs)) {
				return string(rs[i])
			}
		}
		if k, ok := idx.(string); ok {
			return stringMethod(x, k)
		}
	case *Namespace, *loopObj:
		if k, ok := idx.(string); ok {
			return getAttr(x, k)
		}
	}
	return undefined
}

func dictMethod(d *Dict, name string) any {
	switch name {
	case "get":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: get() needs a key", ErrRender)
			}
			if v, ok := d.m[toStr(args[0])]; ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		})
	case "items":
		return builtin(func(*caller, []any, *Dict) (any, error) { return dictItems(d), nil })
	case "keys":
		return builtin(func(*caller, []any, *Dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				out[i] = k
			}
			return out, nil
		})
	case "values":
		return builtin(func(*caller, []any, *Dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				out[i] = d.m[k]
			}
			return out, nil
		})
	}
	return undefined
}

func dictItems(d *Dict) []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		out[i] = []any{k, d.m[k]}
	}
	return out
}

func listMethod(l []any, name string) any {
	switch name {
	case "index":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			for i, x := range l {
				if len(args) > 0 && equal(x, args[0]) {
					return int64(i), nil
				}
			}
			return nil, fmt.Errorf("%w: value not in list", ErrRender)
		})
	case "count":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			n := int64(0)
			for _, x := range l {
				if len(args) > 0 && equal(x, args[0]) {
					n++
				}
			}
			return n, nil
		})
	}
	return undefined
}

func strArg(args []any, i int, def string) string {
	if i < len(args) && args[i] != nil && !isUndefined(args[i]) {
		return toStr(args[i])
	}
	return def
}

func stringMethod(s, name string) any {
	m := func(f func(args []any) (any, error)) builtin {
		return func(_ *caller, args []any, _ *Dict) (any, error) { return f(args) }
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return m(func(args []any) (any, error) {
			cut := strArg(args, 0, "")
			trim := func(r rune) bool {
				if cut == "" {
					return unicode.IsSpace(r)
				}
				return strings.ContainsRune(cut, r)
			}
			switch name {
			case "lstrip":
				return strings.TrimLeftFunc(s, trim), nil
			case "rstrip":
				return strings.TrimRightFunc(s, trim), nil
			}
			return strings.TrimFunc(s, trim), nil
		})
	case "upper":
		return m(func([]any) (any, error) { return strings.ToUpper(s), nil })
	case "lower":
		return m(func([]any) (any, error) { return strings.ToLower(s), nil })
	case "title":
		return m(func([]any) (any, error) { return pyTitle(s), nil })
	case "capitalize":
		return m(func([]any) (any, error) { return capitalize(s), nil })
	case "startswith", "endswith":
		return m(func(args []any) (any, error) {
			var cands []any
			if l, ok := firstArg(args).([]any); ok {
				cands = l
			} else {
				cands = []any{firstArg(args)}
			}
			for _, c := range cands {
				p := toStr(c)
				if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split", "rsplit":
		return m(func(args []any) (any, error) {
			var parts []string
			sep := strArg(args, 0, "")
			limit := -1
			if len(args) > 1 {
				if n, ok := args[1].(int64); ok && n >= 0 {
					limit = int(n) + 1
				}
			}
			switch {
			case sep == "":
				parts = strings.Fields(s)
			case name == "rsplit" && limit > 0:
				parts = rsplitN(s, sep, limit)
			default:
				parts = strings.SplitN(s, sep, limit)
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		})
	case "replace":
		return m(func(args []any) (any, error) {
			n := -1
			if len(args) > 2 {
				if c, ok := args[2].(int64); ok {
					n = int(c)
				}
			}
			return strings.Replace(s, strArg(args, 0, ""), strArg(args, 1, ""), n), nil
		})
	case "find":
		return m(func(args []any) (any, error) { return int64(strings.Index(s, strArg(args, 0, ""))), nil })
	case "count":
		return m(func(args []any) (any, error) { return int64(strings.Count(s, strArg(args, 0, ""))), nil })
	case "join":
		return m(func(args []any) (any, error) {
			items, err := iterate(firstArg(args))
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, x := range items {
				parts[i] = toStr(x)
			}
			return strings.Join(parts, s), nil
		})
	case "isdigit", "isalpha", "isspace", "isupper", "islower":
		return m(func([]any) (any, error) { return strPredicate(s, name), nil })
	}
	return undefined
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for len(out) < n-1 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append([]string{s[i+len(sep):]}, out...)
		s = s[:i]
	}
	return append([]string{s}, out...)
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isspace":
			if !unicode.IsSpace(r) {
				return false
			}
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

func firstArg(args []any) any {
	if len(args) == 0 {
		return undefined
	}
	return args[0]
}

func pyTitle(s string) string {
	var sb strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			sb.WriteRune(unicode.ToLower(r))
		} else {
			sb.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return sb.String()
}

func capitalize(s string) string {
	for i, r := range s {
		return string(unicode.ToUpper(r)) + strings.ToLower(s[i+len(string(r)):])
	}
	return s
}

func (r *renderer) evalArgs(c *callExpr) ([]any, *Dict, error) {
	if c == nil {
		return nil, nil, nil
	}
	args := make([]any, 0, len(c.args))
	for _, a := range c.args {
		v, err := r.eval(a)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, v)
	}
	var kw *Dict
	if len(c.kwKeys) > 0 {
		kw = NewDict()
		for i, k := range c.kwKeys {
			v, err := r.eval(c.kwVals[i])
			if err != nil {
				return nil, nil, err
			}
			kw.Set(k, v)
		}
	}
	return args, kw, nil
}

func (r *renderer) evalCall(c *callExpr) (any, error) {
	fn, err := r.eval(c.fn)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(c)
	if err != nil {
		return nil, err
	}
	f, ok := fn.(builtin)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not callable", ErrRender, describe(c.fn))
	}
	return f(&caller{r}, args, kw)
}

func describe(e expr) string {
	switch e := e.(type) {
	case nameExpr:
		return e.name
	case attrExpr:
		return describe(e.obj) + "." + e.name
	}
	return "expression"
}

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

func applyFilter(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch name {
	case "trim":
		return strings.TrimFunc(toStr(v), unicode.IsSpace), nil
	case "upper":
		return strings.ToUpper(toStr(v)), nil
	case "lower":
		return strings.ToLower(toStr(v)), nil
	case "title":
		return pyTitle(toStr(v)), nil
	case "capitalize":
		return capitalize(toStr(v)), nil
	case "string":
		return toStr(v), nil
	case "safe", "e", "escape", "forceescape":
		if name == "safe" {
			return v, nil
		}
		return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;").Replace(toStr(v)), nil
	case "tojson":
		indent := 0
		if x, ok := kwArg(kw, args, 0, "indent"); ok {
			if n, ok := x.(int64); ok {
				indent = int(n)
			}
		}
		sortKeys := false
		if x, ok := kwArg(kw, nil, 0, "sort_keys"); ok {
			sortKeys = truthy(x)
		}
		return toJSON(v, indent, sortKeys), nil
	case "length", "count":
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
	case "first", "last":
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
	case "default", "d":
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
	case "join":
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
	case "list":
		items, err := iterate(v)
		return append([]any{}, items...), err
	case "items":
		if d, ok := v.(*Dict); ok {
			return dictItems(d), nil
		}
		if v == nil || isUndefined(v) {
			return []any{}, nil
		}
		return nil, fmt.Errorf("%w: items of %s", ErrRender, repr(v, true))
	case "int":
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
	case "float":
		if f, ok := num(v); ok {
			return f, nil
		}
		if s, ok := v.(string); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
				return f, nil
			}
		}
		return 0.0, nil
	case "abs":
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
	case "round":
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
	case "replace":
		n := -1
		if len(args) > 2 {
			if c, ok := args[2].(int64); ok {
				n = int(c)
			}
		}
		return strings.Replace(toStr(v), strArg(args, 0, ""), strArg(args, 1, ""), n), nil
	case "reverse":
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
	case "indent":
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
	case "map", "selectattr", "rejectattr", "select", "reject":
		return seqFilter(c, name, v, args, kw)
	case "unique":
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
	case "sort":
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
	case "wordcount":
		return int64(len(strings.Fields(toStr(v)))), nil
	}
	return nil, fmt.Errorf("%w: unknown filter %q", ErrRender, name)
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

func (r *renderer) evalTest(t testExpr) (any, error) {
	v, err := r.eval(t.arg)
	if err != nil {
		return nil, err
	}
	args := make([]any, 0, len(t.args))
	for _, a := range t.args {
		x, err := r.eval(a)
		if err != nil {
			return nil, err
		}
		args = append(args, x)
	}
	ok, err := applyTest(t.name, v, args)
	return ok != t.neg, err
}

func applyTest(name string, v any, args []any) (bool, error) {
	switch name {
	case "defined":
		return !isUndefined(v), nil
	case "undefined":
		return isUndefined(v), nil
	case "none":
		return v == nil, nil
	case "string":
		_, ok := v.(string)
		return ok, nil
	case "number":
		switch v.(type) {
		case int64, float64:
			return true, nil
		}
		return false, nil
	case "integer":
		_, ok := v.(int64)
		return ok, nil
	case "float":
		_, ok := v.(float64)
		return ok, nil
	case "boolean":
		_, ok := v.(bool)
		return ok, nil
	case "true":
		return v == true, nil
	case "false":
		return v == false, nil
	case "mapping":
		switch v.(type) {
		case *Dict, *Namespace:
			return true, nil
		}
		return false, nil
	case "iterable", "sequence":
		switch v.(type) {
		case []any, *Dict, string:
			return true, nil
		}
		return false, nil
	case "callable":
		_, ok := v.(builtin)
		return ok, nil
	case "even", "odd":
		n, ok := v.(int64)
		if !ok {
			return false, fmt.Errorf("%w: %s test needs an integer", ErrRender, name)
		}
		return (n%2 == 0) == (name == "even"), nil
	case "divisibleby":
		n, ok1 := v.(int64)
		d, ok2 := firstArg(args).(int64)
		if !ok1 || !ok2 || d == 0 {
			return false, fmt.Errorf("%w: divisibleby needs integers", ErrRender)
		}
		return n%d == 0, nil
	case "eq", "equalto", "==", "sameas":
		return equal(v, firstArg(args)), nil
	case "ne", "!=":
		return !equal(v, firstArg(args)), nil
	case "in":
		return contains(firstArg(args), v)
	case "lower":
		s, ok := v.(string)
		return ok && strings.ToLower(s) == s, nil
	case "upper":
		s, ok := v.(string)
		return ok && strings.ToUpper(s) == s, nil
	case "gt", "greaterthan", "lt", "lessthan", "ge", "le":
		c, err := compare(v, firstArg(args))
		if err != nil {
			return false, err
		}
		switch name {
		case "gt", "greaterthan":
			return c > 0, nil
		case "lt", "lessthan":
			return c < 0, nil
		case "ge":
			return c >= 0, nil
		}
		return c <= 0, nil
	}
	return false, fmt.Errorf("%w: unknown test %q", ErrRender, name)
}
