package chattmpl

import (
	"fmt"
)

// Jinja tests: `x is name(args)`, with Jinja2 3.1's semantics.

func (r *renderer) evalTest(t testExpr) (any, error) {
	v, err := r.eval(t.arg)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(&callExpr{args: t.args})
	if err != nil {
		return nil, err
	}
	if err := r.scan(size(v)); err != nil {
		return nil, err
	}
	ok, err := r.applyTest(t.name, v, args)
	return ok != t.neg, err
}

// applyTest runs the Jinja test name on v: first the type tests, then the
// ones that compare v with an argument.
func (r *renderer) applyTest(name string, v any, args []any) (bool, error) {
	if ok, known := typeTest(name, v); known {
		return ok, nil
	}
	return valueTest(name, v, args)
}

// typeTest answers the tests about v's kind; known is false for others.
func typeTest(name string, v any) (ok, known bool) {
	switch name {
	case "defined":
		return !isUndefined(v), true
	case "undefined":
		return isUndefined(v), true
	case "none":
		return v == nil, true
	case "string":
		_, ok = v.(string)
	case "number": // a bool is a number in Python
		switch v.(type) {
		case int64, float64, bool:
			ok = true
		}
	case "integer":
		_, ok = v.(int64)
	case "float":
		_, ok = v.(float64)
	case "boolean":
		_, ok = v.(bool)
	case "true":
		ok = v == true
	case "false":
		ok = v == false
	case "mapping":
		_, ok = v.(*Dict)
	case "iterable":
		switch v.(type) {
		case []any, tuple, *Dict, string, rangeT, dictView, *undefinedT, *generator:
			ok = true
		}
	case "sequence":
		switch v.(type) {
		case []any, tuple, *Dict, string, rangeT, dictView, *undefinedT:
			ok = true
		}
	case "callable":
		switch v.(type) {
		case builtin, *loopObj: // a LoopContext is callable (loop(items))
			ok = true
		}
	case "escaped":
		ok = false
	case "filter":
		s, isStr := v.(string)
		_, ok = filters[s]
		ok = ok && isStr
	case "test":
		s, isStr := v.(string)
		ok = isStr && knownTests[s]
	default:
		return false, false
	}
	return ok, true
}

var knownTests = map[string]bool{"defined": true, "undefined": true, "none": true, "string": true, "number": true,
	"integer": true, "float": true, "boolean": true, "true": true, "false": true, "mapping": true, "iterable": true,
	"sequence": true, "callable": true, "escaped": true, "filter": true, "test": true, "odd": true, "even": true,
	"divisibleby": true, "eq": true, "equalto": true, "==": true, "sameas": true, "ne": true, "!=": true, "in": true,
	"lower": true, "upper": true, "gt": true, "greaterthan": true, ">": true, "lt": true, "lessthan": true, "<": true,
	"ge": true, ">=": true, "le": true, "<=": true}

// valueTest answers the tests that look at v's value or compare it.
func valueTest(name string, v any, args []any) (bool, error) {
	switch name {
	case "even", "odd", "divisibleby":
		d := any(int64(2))
		if name == "divisibleby" {
			d = firstArg(args)
		}
		m, err := arith("%", v, d)
		if err != nil {
			return false, err
		}
		want := int64(0)
		if name == "odd" {
			want = 1
		}
		return equal(m, want), nil
	case "eq", "equalto", "==":
		return equal(v, firstArg(args)), nil
	case "sameas":
		return sameAs(v, firstArg(args))
	case "ne", "!=":
		return !equal(v, firstArg(args)), nil
	case "in":
		return contains(firstArg(args), v)
	case "lower", "upper":
		s := toStr(v)
		return strPredicate(s, "is"+name), nil
	case "gt", "greaterthan", ">", "lt", "lessthan", "<", "ge", ">=", "le", "<=":
		c, err := compare(v, firstArg(args))
		if err != nil {
			return false, err
		}
		if c == 2 {
			return false, nil
		}
		switch name {
		case "gt", "greaterthan", ">":
			return c > 0, nil
		case "lt", "lessthan", "<":
			return c < 0, nil
		case "ge", ">=":
			return c >= 0, nil
		}
		return c <= 0, nil
	}
	return false, fmt.Errorf("%w: unknown test %q", ErrRender, name)
}

// sameAs is Python's `is` where a template can know it: None, booleans,
// CPython's cached small ints, and the same dict or namespace. Other
// identities depend on how Python built the objects: refused.
func sameAs(a, b any) (bool, error) {
	switch x := a.(type) {
	case nil, bool:
		return a == b, nil
	case int64:
		if y, ok := b.(int64); ok && x >= -5 && x <= 256 && y >= -5 && y <= 256 {
			return x == y, nil
		}
	case *Dict, *Namespace:
		return a == b, nil
	}
	switch b.(type) {
	case nil, bool:
		return false, nil
	}
	return false, fmt.Errorf("%w: 'sameas' on %s and %s depends on Python's object identity", ErrRender, typeName(a), typeName(b))
}
