package chattmpl

import (
	"fmt"
	"math"
	"strings"
)

var errOverflow = fmt.Errorf("%w: integer overflow (Python integers beyond 64 bits are not supported)", ErrRender)

// arith is Python's + - * / // % ** on evaluated operands.
func arith(op string, a, b any) (any, error) {
	switch op {
	case "+":
		switch x := a.(type) {
		case string:
			if y, ok := b.(string); ok {
				if err := checkLen(len(x) + len(y)); err != nil {
					return nil, err
				}
				return x + y, nil
			}
		case []any:
			if y, ok := b.([]any); ok {
				if err := checkLen(16 * (len(x) + len(y))); err != nil {
					return nil, err
				}
				return append(append(make([]any, 0, len(x)+len(y)), x...), y...), nil
			}
		case tuple:
			if y, ok := b.(tuple); ok {
				if err := checkLen(16 * (len(x) + len(y))); err != nil {
					return nil, err
				}
				return append(append(make(tuple, 0, len(x)+len(y)), x...), y...), nil
			}
		}
	case "*":
		if v, ok, err := repeat(a, b); ok {
			return v, err
		}
		if v, ok, err := repeat(b, a); ok {
			return v, err
		}
	}
	ia, aInt := intValue(a)
	ib, bInt := intValue(b)
	if aInt && bInt && op != "/" {
		return intArith(op, ia, ib)
	}
	fa, ok1 := num(a)
	fb, ok2 := num(b)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: unsupported operand type(s) for %s: '%s' and '%s'", ErrRender, op, typeName(a), typeName(b))
	}
	return floatArith(op, fa, fb)
}

// repeat is seq * n (Python also accepts n * seq).
func repeat(seq, count any) (any, bool, error) {
	n, isInt := intValue(count)
	switch seq.(type) {
	case string, []any, tuple:
	default:
		return nil, false, nil
	}
	if !isInt {
		return nil, true, fmt.Errorf("%w: can't multiply sequence by non-int of type '%s'", ErrRender, typeName(count))
	}
	n = max(n, 0)
	switch x := seq.(type) {
	case string:
		if n > 0 && int64(len(x)) > int64(maxValue)/n {
			return nil, true, checkLen(maxValue + 1)
		}
		return strings.Repeat(x, int(n)), true, nil
	case []any, tuple:
		items, _ := seqItems(x)
		if n > 0 && int64(16*len(items)) > int64(maxValue)/n {
			return nil, true, checkLen(maxValue + 1)
		}
		out := make([]any, 0, len(items)*int(n))
		for range n {
			out = append(out, items...)
		}
		if _, ok := x.(tuple); ok {
			return tuple(out), true, nil
		}
		return out, true, nil
	}
	return nil, false, nil
}

func intArith(op string, a, b int64) (any, error) {
	switch op {
	case "+":
		s := a + b
		if (s > a) != (b > 0) {
			return nil, errOverflow
		}
		return s, nil
	case "-":
		s := a - b
		if (s < a) != (b > 0) {
			return nil, errOverflow
		}
		return s, nil
	case "*":
		if a == 0 || b == 0 {
			return int64(0), nil
		}
		p := a * b
		if p/b != a || a == -1 && b == math.MinInt64 || b == -1 && a == math.MinInt64 {
			return nil, errOverflow
		}
		return p, nil
	case "//", "%":
		if b == 0 {
			return nil, fmt.Errorf("%w: integer division or modulo by zero", ErrRender)
		}
		if a == math.MinInt64 && b == -1 {
			return nil, errOverflow
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) { // Python floors
			q--
			m += b
		}
		if op == "//" {
			return q, nil
		}
		return m, nil
	case "**":
		if b < 0 {
			return floatArith(op, float64(a), float64(b))
		}
		p := int64(1)
		for range b {
			if p != 0 && (a > math.MaxInt64/abs64(p) || a < -math.MaxInt64/abs64(p)) {
				return nil, errOverflow
			}
			p *= a
			if p == 0 || p == 1 && a == 1 {
				break
			}
			if p == -1 && a == -1 {
				if b%2 == 0 {
					p = 1
				}
				break
			}
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w: unknown operator %s", ErrRender, op)
}

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// floatArith is Python's float arithmetic (floor division and modulo as
// CPython computes them).
func floatArith(op string, a, b float64) (any, error) {
	switch op {
	case "+":
		return a + b, nil
	case "-":
		return a - b, nil
	case "*":
		return a * b, nil
	case "/":
		if b == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return a / b, nil
	case "//", "%":
		if b == 0 {
			return nil, fmt.Errorf("%w: float floor division or modulo by zero", ErrRender)
		}
		mod := math.Mod(a, b)
		div := (a - mod) / b
		if mod != 0 {
			if (b < 0) != (mod < 0) {
				mod += b
				div -= 1
			}
		} else {
			mod = math.Copysign(0, b)
		}
		if op == "%" {
			return mod, nil
		}
		if div == 0 {
			return math.Copysign(0, a/b), nil
		}
		fl := math.Floor(div)
		if div-fl > 0.5 {
			fl++
		}
		return fl, nil
	case "**":
		if a == 0 && b < 0 {
			return nil, fmt.Errorf("%w: 0.0 cannot be raised to a negative power", ErrRender)
		}
		if a < 0 && b != math.Trunc(b) {
			return nil, fmt.Errorf("%w: a negative number to a fractional power is complex", ErrRender)
		}
		p := math.Pow(a, b)
		if math.IsInf(p, 0) && !math.IsInf(a, 0) && !math.IsInf(b, 0) {
			return nil, fmt.Errorf("%w: numerical result out of range", ErrRender)
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w: unknown operator %s", ErrRender, op)
}
