package chattmpl

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// builtinGlobals are the functions transformers provides to chat templates;
// read-only and shared by every render.
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
