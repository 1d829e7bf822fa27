package chattmpl

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// builtinGlobals are the functions Jinja2 and transformers provide to chat
// templates; read-only and shared by every render.
var builtinGlobals = globals()

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
			ints := make([]int64, len(args))
			for i, a := range args {
				n, ok := intValue(a)
				if !ok {
					return nil, fmt.Errorf("%w: '%s' object cannot be interpreted as an integer", ErrRender, typeName(a))
				}
				ints[i] = n
			}
			rg := rangeT{step: 1}
			switch len(ints) {
			case 1:
				rg.stop = ints[0]
			case 2:
				rg.start, rg.stop = ints[0], ints[1]
			case 3:
				rg.start, rg.stop, rg.step = ints[0], ints[1], ints[2]
			default:
				return nil, fmt.Errorf("%w: range expected 1 to 3 arguments, got %d", ErrRender, len(ints))
			}
			if rg.step == 0 {
				return nil, fmt.Errorf("%w: range() arg 3 must not be zero", ErrRender)
			}
			if rg.len() > maxRange {
				return nil, fmt.Errorf("%w: range too big: the sandbox blocks ranges larger than %d", ErrRender, maxRange)
			}
			return rg, nil
		}),
		"dict": builtin(func(_ *caller, args []any, kw *Dict) (any, error) {
			if len(args) > 0 {
				return nil, fmt.Errorf("%w: dict() with positional arguments is not supported", ErrRender)
			}
			d := NewDict()
			if kw != nil {
				for _, k := range kw.keys {
					d.Set(k, kw.m[k])
				}
			}
			return d, nil
		}),
		"joiner": builtin(func(_ *caller, args []any, kw *Dict) (any, error) {
			sep := ", "
			if v, ok := kwArg(kw, args, 0, "sep"); ok {
				sep = toStr(v)
			}
			used := false
			return builtin(func(*caller, []any, *Dict) (any, error) {
				if !used {
					used = true
					return "", nil
				}
				return sep, nil
			}), nil
		}),
		"strftime_now": builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: strftime_now(format)", ErrRender)
			}
			return strftime(time.Now(), toStr(args[0]))
		}),
	}
}

// strftime is Python's datetime.strftime for the C library's directives
// (glibc's %-d style flags included); an unknown directive is an error.
func strftime(t time.Time, f string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		noPad := false
		if f[i] == '-' && i+1 < len(f) {
			noPad = true
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			for !noPad && len(s) < width {
				s = "0" + s
			}
			b.WriteString(s)
		}
		switch f[i] {
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'b', 'h':
			b.WriteString(t.Format("Jan"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'd':
			num(t.Day(), 2)
		case 'e':
			s := strconv.Itoa(t.Day())
			if len(s) < 2 && !noPad {
				s = " " + s
			}
			b.WriteString(s)
		case 'm':
			num(int(t.Month()), 2)
		case 'y':
			num(t.Year()%100, 2)
		case 'Y':
			num(t.Year(), 1)
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num((t.Hour()+11)%12+1, 2)
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			num(t.Nanosecond()/1000, 6)
		case 'j':
			num(t.YearDay(), 3)
		case 'w':
			num(int(t.Weekday()), 1)
		case 'u':
			num((int(t.Weekday())+6)%7+1, 1)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'Z':
			b.WriteString(t.Format("MST"))
		case 'D':
			b.WriteString(t.Format("01/02/06"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case 'R':
			b.WriteString(t.Format("15:04"))
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("%w: strftime directive %%%c is not supported", ErrRender, f[i])
		}
	}
	return b.String(), nil
}

func errUndefined(what string) error {
	return fmt.Errorf("%w: UndefinedError: %s of an undefined value", ErrRender, what)
}

// unsafeDictAttr: the dict methods Jinja2's immutable sandbox hides (they
// modify the dict): the attribute is undefined even when the dict has such
// a key.
func unsafeDictAttr(name string) bool {
	switch name {
	case "update", "pop", "popitem", "setdefault", "clear":
		return true
	}
	return false
}

// getAttr is Jinja2's sandboxed obj.name: a Python attribute (a method)
// first, then the item.
func getAttr(obj any, name string) (any, error) {
	switch x := obj.(type) {
	case *undefinedT:
		return nil, errUndefined(fmt.Sprintf("attribute %q", name))
	case *Dict:
		if m := dictMethod(x, name); m != nil {
			return m, nil
		}
		if unsafeDictAttr(name) {
			return undefined, nil
		}
		if v, ok := x.m[name]; ok {
			return v, nil
		}
	case *Namespace:
		if v, ok := x.d.m[name]; ok {
			return v, nil
		}
	case *loopObj:
		return x.attr(name), nil
	case string:
		if m := stringMethod(x, name); m != nil {
			return m, nil
		}
	case []any:
		if m := listMethod(x, name); m != nil {
			return m, nil
		}
	case tuple:
		if name == "index" || name == "count" {
			return listMethod(x, name), nil
		}
		if isGroupTuple(x) && (name == "grouper" || name == "list") {
			return x[map[string]int{"grouper": 0, "list": 1}[name]], nil
		}
	}
	return undefined, nil
}

// getItem is Jinja2's obj[idx]: the item first, then (for a string index)
// the attribute.
func getItem(obj, idx any) (any, error) {
	switch x := obj.(type) {
	case *undefinedT:
		return nil, errUndefined("item")
	case *Dict:
		if k, ok := idx.(string); ok {
			if v, ok := x.m[k]; ok {
				return v, nil
			}
		}
	case []any, tuple:
		items, _ := seqItems(x)
		if i, ok := intValue(idx); ok {
			if i < 0 {
				i += int64(len(items))
			}
			if i >= 0 && i < int64(len(items)) {
				return items[i], nil
			}
			return undefined, nil
		}
	case string:
		if i, ok := intValue(idx); ok {
			if isASCII(x) {
				if i < 0 {
					i += int64(len(x))
				}
				if i >= 0 && i < int64(len(x)) {
					return x[i : i+1], nil
				}
				return undefined, nil
			}
			rs := []rune(x)
			if i < 0 {
				i += int64(len(rs))
			}
			if i >= 0 && i < int64(len(rs)) {
				return string(rs[i]), nil
			}
			return undefined, nil
		}
	case rangeT:
		if i, ok := intValue(idx); ok {
			n := x.len()
			if i < 0 {
				i += n
			}
			if i >= 0 && i < n {
				return x.at(i), nil
			}
			return undefined, nil
		}
	}
	if k, ok := idx.(string); ok {
		return getAttr(obj, k)
	}
	return undefined, nil
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
	n := 0
	for _, a := range args {
		n += size(a)
	}
	return args, kw, r.scan(n)
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
	var v any
	switch f := fn.(type) {
	case builtin:
		v, err = f(&caller{r}, args, kw)
	case *loopObj:
		if f.recurse == nil {
			return nil, fmt.Errorf("%w: the loop is not recursive", ErrRender)
		}
		v, err = f.recurse(&caller{r}, args, kw)
	case *undefinedT:
		return nil, fmt.Errorf("%w: UndefinedError: %s is undefined", ErrRender, describe(c.fn))
	default:
		return nil, fmt.Errorf("%w: %s is not callable", ErrRender, describe(c.fn))
	}
	if err != nil {
		return nil, err
	}
	return v, r.build(v)
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
