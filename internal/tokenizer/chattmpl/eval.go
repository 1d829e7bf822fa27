package chattmpl

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Template is a parsed template. It is immutable; Render may be called
// concurrently.
type Template struct {
	nodes []node
}

// Errors from rendering.
var (
	// ErrRender is wrapped by every rendering error (type errors, unknown
	// filters, limits).
	ErrRender = errors.New("chattmpl: render error")
	// ErrRaised is wrapped by errors from the template's raise_exception().
	ErrRaised = errors.New("chattmpl: template raised")
)

// Limits that keep a hostile template from exhausting the process.
const (
	maxOutput = 16 << 20
	maxDepth  = 64
	maxSteps  = 2_000_000
)

// Parse compiles template source.
func Parse(src string) (*Template, error) {
	nodes, err := parse(src)
	if err != nil {
		return nil, err
	}
	return &Template{nodes: nodes}, nil
}

// Render executes the template with the given variables (values as made by
// FromJSON or Go strings, bools, int64, float64, []any, *Dict).
func (t *Template) Render(vars map[string]any) (string, error) {
	r := &renderer{}
	// Scopes are only written at the top, so the shared globals and the
	// caller's vars are never modified.
	r.scopes = []map[string]any{builtinGlobals, vars, {}}
	if err := r.exec(t.nodes); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", fmt.Errorf("%w: break or continue outside a loop", ErrRender)
		}
		return "", err
	}
	return r.out.String(), nil
}

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

type renderer struct {
	out    strings.Builder
	scopes []map[string]any
	depth  int
	steps  int
}

// caller is what builtins see.
type caller struct{ r *renderer }

func (r *renderer) lookup(name string) any {
	for i := len(r.scopes) - 1; i >= 0; i-- {
		if v, ok := r.scopes[i][name]; ok {
			return v
		}
	}
	return undefined
}

func (r *renderer) set(name string, v any) { r.scopes[len(r.scopes)-1][name] = v }

func (r *renderer) step() error {
	r.steps++
	if r.steps > maxSteps {
		return fmt.Errorf("%w: step limit exceeded", ErrRender)
	}
	if r.out.Len() > maxOutput {
		return fmt.Errorf("%w: output limit exceeded", ErrRender)
	}
	return nil
}

func (r *renderer) exec(nodes []node) error {
	for _, n := range nodes {
		if err := r.step(); err != nil {
			return err
		}
		switch n := n.(type) {
		case textNode:
			r.out.WriteString(n.s)
		case outputNode:
			v, err := r.eval(n.e)
			if err != nil {
				return err
			}
			r.out.WriteString(toStr(v))
		case ifNode:
			done := false
			for i, c := range n.conds {
				v, err := r.eval(c)
				if err != nil {
					return err
				}
				if truthy(v) {
					if err := r.exec(n.bodies[i]); err != nil {
						return err
					}
					done = true
					break
				}
			}
			if !done && n.els != nil {
				if err := r.exec(n.els); err != nil {
					return err
				}
			}
		case forNode:
			if err := r.execFor(n); err != nil {
				return err
			}
		case setNode:
			if err := r.execSet(n); err != nil {
				return err
			}
		case macroNode:
			r.set(n.name, r.makeMacro(n))
		case loopCtl:
			if n.brk {
				return errBreak
			}
			return errContinue
		}
	}
	return nil
}

func (r *renderer) execSet(n setNode) error {
	var v any
	if n.value != nil {
		var err error
		if v, err = r.eval(n.value); err != nil {
			return err
		}
	} else {
		saved := r.out
		r.out = strings.Builder{}
		err := r.exec(n.body)
		v = r.out.String()
		r.out = saved
		if err != nil {
			return err
		}
	}
	if n.attr != "" {
		ns, ok := r.lookup(n.targets[0]).(*Namespace)
		if !ok {
			return fmt.Errorf("%w: cannot set attribute on %s", ErrRender, n.targets[0])
		}
		ns.d.Set(n.attr, v)
		return nil
	}
	if len(n.targets) == 1 {
		r.set(n.targets[0], v)
		return nil
	}
	items, err := iterate(v)
	if err != nil || len(items) != len(n.targets) {
		return fmt.Errorf("%w: cannot unpack into %d names", ErrRender, len(n.targets))
	}
	for i, t := range n.targets {
		r.set(t, items[i])
	}
	return nil
}

// loopObj is the loop variable.
type loopObj struct {
	index, length int
	items         []any
}

func (l *loopObj) attr(name string) any {
	switch name {
	case "index":
		return int64(l.index + 1)
	case "index0":
		return int64(l.index)
	case "revindex":
		return int64(l.length - l.index)
	case "revindex0":
		return int64(l.length - l.index - 1)
	case "first":
		return l.index == 0
	case "last":
		return l.index == l.length-1
	case "length":
		return int64(l.length)
	case "previtem":
		if l.index > 0 {
			return l.items[l.index-1]
		}
	case "nextitem":
		if l.index+1 < l.length {
			return l.items[l.index+1]
		}
	case "cycle":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: cycle() needs arguments", ErrRender)
			}
			return args[l.index%len(args)], nil
		})
	}
	return undefined
}

func (r *renderer) execFor(n forNode) error {
	v, err := r.eval(n.iter)
	if err != nil {
		return err
	}
	items, err := iterate(v)
	if err != nil {
		return err
	}
	r.scopes = append(r.scopes, map[string]any{})
	defer func() { r.scopes = r.scopes[:len(r.scopes)-1] }()
	if n.cond != nil {
		var kept []any
		for _, it := range items {
			if err := r.bind(n.targets, it); err != nil {
				return err
			}
			c, err := r.eval(n.cond)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.exec(n.els)
	}
	loop := &loopObj{length: len(items), items: items}
	for i, it := range items {
		loop.index = i
		r.set("loop", loop)
		if err := r.bind(n.targets, it); err != nil {
			return err
		}
		err := r.exec(n.body)
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

func (r *renderer) bind(targets []string, it any) error {
	if len(targets) == 1 {
		r.set(targets[0], it)
		return nil
	}
	parts, err := iterate(it)
	if err != nil || len(parts) != len(targets) {
		return fmt.Errorf("%w: cannot unpack %s into %d names", ErrRender, repr(it, true), len(targets))
	}
	for i, t := range targets {
		r.set(t, parts[i])
	}
	return nil
}

// iterate lists the items of a sequence (dict: its keys; string: its runes).
func iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		var out []any
		for _, c := range x {
			out = append(out, string(c))
		}
		return out, nil
	case nil, *undefinedT:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: %s is not iterable", ErrRender, repr(v, true))
}

func (r *renderer) makeMacro(n macroNode) builtin {
	return func(c *caller, args []any, kw *Dict) (any, error) {
		if r.depth >= maxDepth {
			return nil, fmt.Errorf("%w: macro recursion too deep", ErrRender)
		}
		r.depth++
		defer func() { r.depth-- }()
		scope := map[string]any{}
		for i, p := range n.params {
			switch {
			case i < len(args):
				scope[p] = args[i]
			case kw != nil && kw.m[p] != nil:
				scope[p] = kw.m[p]
			case n.defaults[i] != nil:
				v, err := r.eval(n.defaults[i])
				if err != nil {
					return nil, err
				}
				scope[p] = v
			default:
				scope[p] = undefined
			}
		}
		saved := r.out
		r.out = strings.Builder{}
		r.scopes = append(r.scopes, scope)
		err := r.exec(n.body)
		r.scopes = r.scopes[:len(r.scopes)-1]
		s := r.out.String()
		r.out = saved
		return s, err
	}
}

// eval evaluates an expression. It is one type switch over every expression
// kind (~90 lines): kept whole on purpose, so the evaluator's dispatch reads
// in one place; each non-trivial kind already has its own function.
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
		out := make([]any, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case dictExpr:
		d := NewDict()
		for i := range e.keys {
			k, err := r.eval(e.keys[i])
			if err != nil {
				return nil, err
			}
			v, err := r.eval(e.vals[i])
			if err != nil {
				return nil, err
			}
			d.Set(toStr(k), v)
		}
		return d, nil
	case attrExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.name), nil
	case indexExpr:
		obj, err := r.eval(e.obj)
		if err != nil {
			return nil, err
		}
		idx, err := r.eval(e.idx)
		if err != nil {
			return nil, err
		}
		return getItem(obj, idx), nil
	case sliceExpr:
		return r.evalSlice(e)
	case callExpr:
		return r.evalCall(&e)
	case *callExpr:
		return r.evalCall(e)
	case filterExpr:
		return r.evalFilter(e)
	case testExpr:
		return r.evalTest(e)
	case unaryExpr:
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
				return -x, nil
			case float64:
				return -x, nil
			}
			return nil, fmt.Errorf("%w: bad operand for unary -", ErrRender)
		}
		return v, nil
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
	}
	return nil, fmt.Errorf("%w: unknown expression %T", ErrRender, e)
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
	switch e.op {
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
		return toStr(l) + toStr(rv), nil
	case "<", "<=", ">", ">=":
		c, err := compare(l, rv)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "<":
			return c < 0, nil
		case "<=":
			return c <= 0, nil
		case ">":
			return c > 0, nil
		}
		return c >= 0, nil
	}
	return arith(e.op, l, rv)
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
			strs, total = append(strs, s), total+len(s)
			continue
		}
		if len(strs) > 0 {
			acc, strs = joinStrings(strs, total), nil
		}
		if acc, err = arith("+", acc, v); err != nil {
			return nil, err
		}
		if s, ok := acc.(string); ok {
			strs, total = append(strs, s), len(s)
		}
	}
	if len(strs) > 0 {
		return joinStrings(strs, total), nil
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

func compare(a, b any) (int, error) {
	if fa, ok := num(a); ok {
		if fb, ok := num(b); ok {
			switch {
			case fa < fb:
				return -1, nil
			case fa > fb:
				return 1, nil
			}
			return 0, nil
		}
	}
	sa, ok1 := a.(string)
	sb, ok2 := b.(string)
	if ok1 && ok2 {
		return strings.Compare(sa, sb), nil
	}
	return 0, fmt.Errorf("%w: cannot compare %s and %s", ErrRender, repr(a, true), repr(b, true))
}

func contains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("%w: 'in <string>' needs a string", ErrRender)
		}
		return strings.Contains(c, s), nil
	case []any:
		for _, x := range c {
			if equal(x, item) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := item.(string)
		if !ok {
			return false, nil
		}
		_, found := c.m[s]
		return found, nil
	case *Namespace:
		return contains(c.d, item)
	case nil, *undefinedT:
		return false, nil
	}
	return false, fmt.Errorf("%w: 'in' on %s", ErrRender, repr(container, true))
}

func arith(op string, a, b any) (any, error) {
	if op == "+" {
		switch x := a.(type) {
		case string:
			if y, ok := b.(string); ok {
				return x + y, nil
			}
		case []any:
			if y, ok := b.([]any); ok {
				out := append(append([]any{}, x...), y...)
				return out, nil
			}
		}
	}
	if op == "*" {
		if s, ok := a.(string); ok {
			if n, ok := b.(int64); ok && n >= 0 && int64(len(s))*n <= maxOutput {
				return strings.Repeat(s, int(n)), nil
			}
		}
	}
	ia, aInt := a.(int64)
	ib, bInt := b.(int64)
	if aInt && bInt {
		switch op {
		case "+":
			return ia + ib, nil
		case "-":
			return ia - ib, nil
		case "*":
			return ia * ib, nil
		case "//", "%":
			if ib == 0 {
				return nil, fmt.Errorf("%w: division by zero", ErrRender)
			}
			q, m := ia/ib, ia%ib
			if m != 0 && (m < 0) != (ib < 0) { // Python floors
				q--
				m += ib
			}
			if op == "//" {
				return q, nil
			}
			return m, nil
		}
	}
	fa, ok1 := num(a)
	fb, ok2 := num(b)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: unsupported operands for %s: %s and %s", ErrRender, op, repr(a, true), repr(b, true))
	}
	switch op {
	case "+":
		return fa + fb, nil
	case "-":
		return fa - fb, nil
	case "*":
		return fa * fb, nil
	case "/":
		if fb == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return fa / fb, nil
	case "//":
		if fb == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return math.Floor(fa / fb), nil
	case "%":
		if fb == 0 {
			return nil, fmt.Errorf("%w: division by zero", ErrRender)
		}
		return fa - fb*math.Floor(fa/fb), nil
	}
	return nil, fmt.Errorf("%w: unknown operator %s", ErrRender, op)
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
		n, ok := v.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: slice indices must be integers", ErrRender)
		}
		b[i] = &n
	}
	var items []any
	isStr := false
	switch x := obj.(type) {
	case []any:
		items = x
	case string:
		isStr = true
		for _, c := range x {
			items = append(items, string(c))
		}
	default:
		return nil, fmt.Errorf("%w: cannot slice %s", ErrRender, repr(obj, true))
	}
	out := pySlice(items, b[0], b[1], b[2])
	if isStr {
		var sb strings.Builder
		for _, c := range out {
			sb.WriteString(c.(string))
		}
		return sb.String(), nil
	}
	return out, nil
}

func pySlice(items []any, lo, hi, st *int64) []any {
	n := int64(len(items))
	step := int64(1)
	if st != nil && *st != 0 {
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
	out := []any{}
	if step > 0 {
		start, stop := norm(lo, 0, 0, n), norm(hi, n, 0, n)
		for i := start; i < stop; i += step {
			out = append(out, items[i])
		}
	} else {
		start, stop := norm(lo, n-1, -1, n-1), norm(hi, -1, -1, n-1)
		if hi != nil && *hi < 0 && *hi+n < 0 {
			stop = -1
		}
		for i := start; i > stop; i += step {
			out = append(out, items[i])
		}
	}
	return out
}
