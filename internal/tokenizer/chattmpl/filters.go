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
