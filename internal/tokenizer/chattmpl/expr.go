package chattmpl

import (
	"fmt"
	"math"
	"strings"
)

// eval evaluates an expression. It is one type switch over every expression
// kind: kept whole on purpose, so the evaluator's dispatch reads in one
// place; each non-trivial kind has its own function.
func (r *renderer) eval(e expr) (any, error) {
	if err := r.step(); err != nil {
		return nil, err
	}
	switch e := e.(type) {
	case literal:
		return e.v, nil
	case nameExpr:
		return r.lookup(e.name), nil
	case listExpr:
		out, err := r.evalList(e.items)
		if err != nil {
			return nil, err
		}
		if e.tuple {
			return tuple(out), r.build(out)
		}
		return out, r.build(out)
	case dictExpr:
		return r.evalDict(e)
	case attrExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name)
	case indexExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		idx, err := r.eval(e.idx)
		if err != nil {
			return nil, err
		}
		return getItem(obj, idx)
	case sliceExpr:
		return r.evalSlice(e)
	case *callExpr:
		return r.evalCall(e)
	case filterExpr:
		v, err := r.eval(e.arg)
		if err != nil {
			return nil, err
		}
		return r.applyFilterExpr(e, v)
	case testExpr:
		return r.evalTest(e)
	case unaryExpr:
		return r.evalUnary(e)
	case condExpr:
		c, err := r.eval(e.cond)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.yes)
		}
		return r.eval(e.no)
	case binExpr:
		return r.evalBin(e)
	case compareExpr:
		return r.evalCompare(e)
	}
	return nil, fmt.Errorf("%w: unknown expression %T", ErrRender, e)
}

func (r *renderer) evalList(items []expr) ([]any, error) {
	out := make([]any, len(items))
	for i, it := range items {
		v, err := r.eval(it)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (r *renderer) evalDict(e dictExpr) (any, error) {
	d := NewDict()
	for i := range e.keys {
		k, err := r.eval(e.keys[i])
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			// Dicts here are keyed by strings (as JSON's are); a literal
			// with other keys would behave differently from Python's.
			return nil, fmt.Errorf("%w: dict keys other than strings are not supported (got %s)", ErrRender, typeName(k))
		}
		v, err := r.eval(e.vals[i])
		if err != nil {
			return nil, err
		}
		d.Set(ks, v)
	}
	return d, r.build(d)
}

func (r *renderer) evalUnary(e unaryExpr) (any, error) {
	v, err := r.eval(e.e)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "not":
		return !truthy(v), nil
	case "-":
		switch x := v.(type) {
		case int64:
			if x == math.MinInt64 {
				return nil, errOverflow
			}
			return -x, nil
		case bool:
			if x {
				return int64(-1), nil
			}
			return int64(0), nil
		case float64:
			return -x, nil
		}
		return nil, fmt.Errorf("%w: bad operand type for unary -: '%s'", ErrRender, typeName(v))
	}
	switch x := v.(type) { // unary +
	case int64, float64:
		return x, nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	}
	return nil, fmt.Errorf("%w: bad operand type for unary +: '%s'", ErrRender, typeName(v))
}

func (r *renderer) evalBin(e binExpr) (any, error) {
	if l, ok := e.l.(binExpr); ok && e.op == "+" && l.op == "+" && joinSums {
		return r.evalSum(e)
	}
	l, err := r.eval(e.l)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r)
	}
	rv, err := r.eval(e.r)
	if err != nil {
		return nil, err
	}
	return r.binOp(e.op, l, rv)
}

// binOp applies a binary operator to evaluated operands, charging them
// and the result.
func (r *renderer) binOp(op string, l, rv any) (any, error) {
	if err := r.scan(size(l) + size(rv)); err != nil {
		return nil, err
	}
	var v any
	var err error
	switch op {
	case "==":
		return equal(l, rv), nil
	case "!=":
		return !equal(l, rv), nil
	case "in":
		return contains(rv, l)
	case "not in":
		b, err := contains(rv, l)
		return !b, err
	case "~":
		ls, rs := toStr(l), toStr(rv)
		if err := checkLen(len(ls) + len(rs)); err != nil {
			return nil, err
		}
		v = ls + rs
	case "<", "<=", ">", ">=":
		c, err := compare(l, rv)
		if err != nil {
			return nil, err
		}
		if c == 2 { // NaN
			return false, nil
		}
		switch op {
		case "<":
			return c < 0, nil
		case "<=":
			return c <= 0, nil
		case ">":
			return c > 0, nil
		}
		return c >= 0, nil
	case "%":
		if s, ok := l.(string); ok {
			if v, err = percentFormat(s, rv); err != nil {
				return nil, err
			}
			break
		}
		if v, err = arith(op, l, rv); err != nil {
			return nil, err
		}
	default:
		if v, err = arith(op, l, rv); err != nil {
			return nil, err
		}
	}
	return v, r.build(v)
}

// evalCompare is a comparison chain: a < b < c is a < b and b < c, each
// operand evaluated once, stopping at the first false comparison.
func (r *renderer) evalCompare(e compareExpr) (any, error) {
	l, err := r.eval(e.first)
	if err != nil {
		return nil, err
	}
	for i, op := range e.ops {
		rv, err := r.eval(e.rest[i])
		if err != nil {
			return nil, err
		}
		ok, err := r.binOp(op, l, rv)
		if err != nil {
			return nil, err
		}
		if !truthy(ok) {
			return false, nil
		}
		l = rv
	}
	return true, nil
}

// evalSum is a chain a + b + c + … (parsed ((a + b) + c) + …) evaluated as
// evalBin would — the same steps, operands left to right, the same errors —
// except that a run of strings is joined once at the end instead of copied
// at every "+": templates build a message as header + content + footer, and
// the content is the long part (BenchmarkSum).
func (r *renderer) evalSum(e binExpr) (any, error) {
	var buf [8]expr
	operands := append(buf[:0], e.r) // right to left
	x := e.l
	for {
		b, ok := x.(binExpr)
		if !ok || b.op != "+" {
			break
		}
		if err := r.step(); err != nil { // eval's step for the inner "+"
			return nil, err
		}
		operands = append(operands, b.r)
		x = b.l
	}
	operands = append(operands, x)
	var (
		acc   any
		strs  []string // acc is their concatenation while len(strs) > 0
		total int
	)
	for i := len(operands) - 1; i >= 0; i-- {
		v, err := r.eval(operands[i])
		if err != nil {
			return nil, err
		}
		if i == len(operands)-1 {
			acc = v
			if s, ok := v.(string); ok {
				strs, total = append(strs, s), len(s)
			}
			continue
		}
		if s, ok := v.(string); ok && len(strs) > 0 {
			if err := r.scan(total + len(s)); err != nil {
				return nil, err
			}
			if err := checkLen(total + len(s)); err != nil {
				return nil, err
			}
			strs, total = append(strs, s), total+len(s)
			continue
		}
		if len(strs) > 0 {
			acc, strs = joinStrings(strs, total), nil
		}
		if acc, err = r.binOp("+", acc, v); err != nil {
			return nil, err
		}
		if s, ok := acc.(string); ok {
			strs, total = append(strs, s), len(s)
		}
	}
	if len(strs) > 0 {
		s := joinStrings(strs, total)
		return s, r.build(s)
	}
	return acc, nil
}

// joinSums turns evalSum on; tests turn it off for the reference.
var joinSums = true

func joinStrings(strs []string, total int) string {
	if len(strs) == 1 {
		return strs[0]
	}
	var b strings.Builder
	b.Grow(total)
	for _, s := range strs {
		b.WriteString(s)
	}
	return b.String()
}

// contains is Python's `item in container`.
func contains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("%w: 'in <string>' requires string as left operand, not %s", ErrRender, typeName(item))
		}
		return strings.Contains(c, s), nil
	case []any, tuple, dictView, *generator:
		items, _ := seqItems(c)
		switch x := c.(type) {
		case dictView:
			items = x.items
		case *generator:
			if err := x.force(); err != nil {
				return false, err
			}
			items = x.items[x.pos:]
		}
		work := 0
		for i, x := range items {
			if equalN(x, item, &work) {
				if g, ok := c.(*generator); ok {
					g.pos += i + 1 // consumed up to the match
				}
				return true, nil
			}
		}
		if g, ok := c.(*generator); ok {
			g.pos = len(g.items)
		}
		return false, nil
	case rangeT:
		n, ok := intValue(item)
		if f, isFloat := item.(float64); isFloat && f == math.Trunc(f) && math.Abs(f) < 1<<62 {
			n, ok = int64(f), true
		}
		if !ok || c.len() == 0 {
			return false, nil
		}
		if c.step > 0 && (n < c.start || n >= c.stop) || c.step < 0 && (n > c.start || n <= c.stop) {
			return false, nil
		}
		return (n-c.start)%c.step == 0, nil
	case *Dict:
		s, ok := item.(string)
		if !ok {
			if _, hashable := hashKey(item); !hashable {
				return false, fmt.Errorf("%w: unhashable type: '%s'", ErrRender, typeName(item))
			}
			return false, nil
		}
		_, found := c.m[s]
		return found, nil
	case *undefinedT:
		return false, nil
	}
	return false, fmt.Errorf("%w: argument of type '%s' is not iterable", ErrRender, typeName(container))
}

func (r *renderer) evalSlice(e sliceExpr) (any, error) {
	obj, err := r.eval(e.obj)
	if err != nil {
		return nil, err
	}
	var b [3]*int64
	for i, x := range []expr{e.lo, e.hi, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := intValue(v)
		if !ok {
			return nil, fmt.Errorf("%w: slice indices must be integers or None", ErrRender)
		}
		b[i] = &n
	}
	if b[2] != nil && *b[2] == 0 {
		return nil, fmt.Errorf("%w: slice step cannot be zero", ErrRender)
	}
	var out any
	switch x := obj.(type) {
	case []any:
		out = pySlice(x, b[0], b[1], b[2])
	case tuple:
		out = tuple(pySlice(x, b[0], b[1], b[2]))
	case string:
		if isASCII(x) {
			var sb strings.Builder
			for _, i := range sliceIndices(len(x), b[0], b[1], b[2]) {
				sb.WriteByte(x[i])
			}
			out = sb.String()
			break
		}
		rs := []rune(x)
		idx := sliceIndices(len(rs), b[0], b[1], b[2])
		sel := make([]rune, len(idx))
		for j, i := range idx {
			sel[j] = rs[i]
		}
		out = string(sel)
	case rangeT:
		items, _ := r.iterate(x)
		out = pySlice(items, b[0], b[1], b[2])
	case *undefinedT:
		return nil, errUndefined("slice")
	default: // Jinja2's getitem gives Undefined when Python refuses the slice
		return undefined, nil
	}
	return out, r.build(out)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func pySlice(items []any, lo, hi, st *int64) []any {
	idx := sliceIndices(len(items), lo, hi, st)
	out := make([]any, len(idx))
	for j, i := range idx {
		out[j] = items[i]
	}
	return out
}

// sliceIndices are the indices a Python slice [lo:hi:st] selects from n
// items (st is not 0).
func sliceIndices(length int, lo, hi, st *int64) []int {
	n := int64(length)
	step := int64(1)
	if st != nil {
		step = *st
	}
	norm := func(p *int64, def int64, minV, maxV int64) int64 {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += n
		}
		return max(minV, min(v, maxV))
	}
	var out []int
	if step > 0 {
		start, stop := norm(lo, 0, 0, n), norm(hi, n, 0, n)
		for i := start; i < stop; i += step {
			out = append(out, int(i))
		}
	} else {
		start, stop := norm(lo, n-1, -1, n-1), norm(hi, -1, -1, n-1)
		for i := start; i > stop; i += step {
			out = append(out, int(i))
		}
	}
	return out
}
