package chattmpl

import (
	"fmt"
	"strings"
)

// Jinja tests: `x is name(args)`.

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

// applyTest runs the Jinja test name on v: first the type tests, then the
// ones that compare v with an argument.
func applyTest(name string, v any, args []any) (bool, error) {
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
	case "number":
		switch v.(type) {
		case int64, float64:
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
		switch v.(type) {
		case *Dict, *Namespace:
			ok = true
		}
	case "iterable", "sequence":
		switch v.(type) {
		case []any, *Dict, string:
			ok = true
		}
	case "callable":
		_, ok = v.(builtin)
	default:
		return false, false
	}
	return ok, true
}

// valueTest answers the tests that look at v's value or compare it.
func valueTest(name string, v any, args []any) (bool, error) {
	switch name {
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
