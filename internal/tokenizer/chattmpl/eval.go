package chattmpl

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
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

// Limits that keep a hostile template from exhausting the process: every
// rendering ends within maxSteps steps (a node run, an expression
// evaluated, a loop iteration), builds at most maxBuilt bytes of values
// (strings, lists and dicts made by operators, filters, methods and
// literals, each at most maxValue) and reads at most maxScanned bytes of
// operands, or fails with ErrRender.
const (
	maxOutput    = 16 << 20
	maxValue     = maxOutput
	maxBuilt     = 8 * maxOutput
	maxScanned   = 64 * maxOutput
	maxDepth     = 64
	maxSteps     = 2_000_000
	maxRange     = 100_000 // Jinja2's sandbox refuses longer ranges
	maxNest      = 500     // nesting of blocks and brackets in the source
	maxEqualWork = 1 << 20 // items compared by one ==
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
func (t *Template) Render(vars map[string]any) (out string, err error) {
	r := &renderer{}
	// Scopes are only written at the top, so the shared globals and the
	// caller's vars are never modified.
	r.scopes = []map[string]any{builtinGlobals, vars, {}}
	defer func() {
		if p := recover(); p != nil {
			bp, ok := p.(budgetPanic)
			if !ok {
				panic(p)
			}
			out, err = "", bp.err
		}
	}()
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
	out     strings.Builder
	scopes  []map[string]any
	depth   int
	steps   int
	built   int // bytes of values built (see size)
	scanned int // bytes of operands read
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

func (r *renderer) push(scope map[string]any) { r.scopes = append(r.scopes, scope) }
func (r *renderer) pop()                      { r.scopes = r.scopes[:len(r.scopes)-1] }

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

// build charges a value just built against the budget.
func (r *renderer) build(v any) error {
	r.built += size(v)
	if r.built > maxBuilt {
		return fmt.Errorf("%w: the template built more than %d bytes of values", ErrRender, maxBuilt)
	}
	return nil
}

// scan charges n bytes of operands read.
func (r *renderer) scan(n int) error {
	r.scanned += n
	if r.scanned > maxScanned {
		return fmt.Errorf("%w: the template read more than %d bytes of values", ErrRender, maxScanned)
	}
	return nil
}

// checkLen refuses to build a value of n bytes (before building it).
func checkLen(n int) error {
	if n > maxValue || n < 0 {
		return fmt.Errorf("%w: a value is larger than %d bytes", ErrRender, maxValue)
	}
	return nil
}

func (r *renderer) exec(nodes []node) error {
	for _, n := range nodes {
		if err := r.step(); err != nil {
			return err
		}
		if err := r.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) execNode(n node) error {
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
		for i, c := range n.conds {
			v, err := r.eval(c)
			if err != nil {
				return err
			}
			if truthy(v) {
				return r.exec(n.bodies[i])
			}
		}
		return r.exec(n.els)
	case *forNode:
		return r.execFor(n, nil, 1)
	case setNode:
		return r.execSet(n)
	case macroNode:
		r.set(n.name, r.makeMacro(&n.macroDef, n.name))
	case withNode:
		scope := make(map[string]any, len(n.targets))
		for i, t := range n.targets { // values see the enclosing scope only
			v, err := r.eval(n.values[i])
			if err != nil {
				return err
			}
			scope[t] = v
		}
		r.push(scope)
		defer r.pop()
		return r.exec(n.body)
	case filterBlockNode:
		s, err := r.capture(n.body)
		if err != nil {
			return err
		}
		var v any = s
		for _, f := range n.filters {
			if v, err = r.applyFilterExpr(f, v); err != nil {
				return err
			}
		}
		r.out.WriteString(toStr(v))
	case callBlockNode:
		v, err := r.evalCallBlock(n)
		if err != nil {
			return err
		}
		r.out.WriteString(toStr(v))
	case loopCtl:
		if n.brk {
			return errBreak
		}
		return errContinue
	}
	return nil
}

// capture renders body in its own scope and returns its text.
func (r *renderer) capture(body []node) (string, error) {
	saved := r.out
	r.out = strings.Builder{}
	r.push(map[string]any{})
	err := r.exec(body)
	r.pop()
	s := r.out.String()
	r.out = saved
	if err == nil {
		err = r.build(s)
	}
	return s, err
}

func (r *renderer) execSet(n setNode) error {
	var v any
	var err error
	if n.value != nil {
		v, err = r.eval(n.value)
	} else {
		v, err = r.capture(n.body)
	}
	if err != nil {
		return err
	}
	if n.attr != "" {
		ns, ok := r.lookup(n.targets[0]).(*Namespace)
		if !ok {
			return fmt.Errorf("%w: cannot assign attribute on non-namespace object %s", ErrRender, n.targets[0])
		}
		ns.d.Set(n.attr, v)
		return nil
	}
	return r.bind(n.targets, v)
}

// loopObj is the loop variable.
type loopObj struct {
	index, length int
	at            func(int) any
	depth         int
	changed       []any // the last loop.changed arguments
	hasChanged    bool
	recurse       builtin // loop(items) in a recursive loop
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
	case "depth":
		return int64(l.depth)
	case "depth0":
		return int64(l.depth - 1)
	case "previtem":
		if l.index > 0 {
			return l.at(l.index - 1)
		}
	case "nextitem":
		if l.index+1 < l.length {
			return l.at(l.index + 1)
		}
	case "cycle":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: no items for cycling given", ErrRender)
			}
			return args[l.index%len(args)], nil
		})
	case "changed":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if l.hasChanged && equal(tuple(args), tuple(l.changed)) {
				return false, nil
			}
			l.changed, l.hasChanged = args, true
			return true, nil
		})
	}
	return undefined
}

// execFor runs a for loop over n.iter, or over items for a recursive
// loop's loop(items) call at the given depth.
func (r *renderer) execFor(n *forNode, items any, depth int) error {
	if items == nil {
		v, err := r.eval(n.iter)
		if err != nil {
			return err
		}
		items = v
	}
	var at func(int) any
	length := 0
	if rg, ok := items.(rangeT); ok { // not materialised: range(100000) in a loop stays cheap
		length = int(rg.len())
		at = func(i int) any { return rg.at(int64(i)) }
	} else {
		list, err := r.iterate(items)
		if err != nil {
			return err
		}
		length = len(list)
		at = func(i int) any { return list[i] }
	}
	if n.cond != nil {
		var kept []any
		for i := range length {
			if err := r.step(); err != nil {
				return err
			}
			it := at(i)
			r.push(map[string]any{})
			err := r.bind(n.targets, it)
			var c any
			if err == nil {
				c, err = r.eval(n.cond)
			}
			r.pop()
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		if err := r.build(kept); err != nil {
			return err
		}
		length = len(kept)
		at = func(i int) any { return kept[i] }
	}
	if length == 0 {
		r.push(map[string]any{})
		defer r.pop()
		return r.exec(n.els)
	}
	loop := &loopObj{length: length, at: at, depth: depth}
	if n.recursive {
		loop.recurse = func(c *caller, args []any, _ *Dict) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: loop() takes one argument", ErrRender)
			}
			if r.depth >= maxDepth {
				return nil, fmt.Errorf("%w: recursion too deep", ErrRender)
			}
			r.depth++
			defer func() { r.depth-- }()
			saved, scopes := r.out, r.scopes
			r.out = strings.Builder{}
			r.scopes = r.scopes[: len(r.scopes)-1 : len(r.scopes)-1] // the loop's enclosing scopes
			err := r.execFor(n, args[0], depth+1)
			s := r.out.String()
			r.out, r.scopes = saved, scopes
			if err == nil {
				err = r.build(s)
			}
			return s, err
		}
	}
	var scope map[string]any
	for i := range length {
		if err := r.step(); err != nil {
			return err
		}
		loop.index = i
		// Each iteration has its own scope: a set in the body does not
		// carry over to the next iteration (Jinja2's loop frames). The map
		// is reused unless a macro defined in the body may keep it.
		if scope == nil || n.keepsScope {
			scope = map[string]any{}
		} else {
			clear(scope)
		}
		scope["loop"] = loop
		r.push(scope)
		err := r.bind(n.targets, at(i))
		if err == nil {
			err = r.exec(n.body)
		}
		r.pop()
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

// bind assigns v to one name, or unpacks it into several.
func (r *renderer) bind(targets []string, v any) error {
	if len(targets) == 1 {
		r.set(targets[0], v)
		return nil
	}
	parts, err := r.iterate(v)
	if err != nil || len(parts) != len(targets) {
		return fmt.Errorf("%w: cannot unpack %s into %d names", ErrRender, typeName(v), len(targets))
	}
	for i, t := range targets {
		r.set(t, parts[i])
	}
	return nil
}

// iterate lists the items of an iterable (dict: its keys; string: its
// characters), charging what it builds. None is not iterable; Undefined
// is empty.
func (r *renderer) iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case tuple:
		return x, nil
	case dictView:
		return x.items, nil
	case *generator:
		return x.rest()
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, r.build(out)
	case string:
		n := utf8.RuneCountInString(x)
		r.built += 16 * n
		if err := r.build(x); err != nil {
			return nil, err
		}
		out := make([]any, 0, n)
		for _, c := range x {
			out = append(out, string(c))
		}
		return out, nil
	case rangeT:
		n := x.len()
		out := make([]any, n)
		for i := range n {
			out[i] = x.at(i)
		}
		return out, r.build(out)
	case *undefinedT:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: '%s' object is not iterable", ErrRender, typeName(v))
}

// macroDef is a macro's signature and body (also a call block's caller).
type macroDef struct {
	params   []string
	defaults []expr
	body     []node
	// the undeclared names varargs, kwargs and caller that the body uses:
	// only then does the macro take extra arguments or a caller.
	varargs, kwargs, caller bool
}

// makeMacro makes a macro callable. Macros are lexically scoped: the body
// sees the scopes where the macro was defined (as they are when it is
// called), not the caller's.
func (r *renderer) makeMacro(n *macroDef, name string) builtin {
	defScopes := r.scopes[:len(r.scopes):len(r.scopes)]
	return func(c *caller, args []any, kw *Dict) (any, error) {
		if r.depth >= maxDepth {
			return nil, fmt.Errorf("%w: macro recursion too deep", ErrRender)
		}
		scope := map[string]any{}
		if len(args) > len(n.params) {
			if !n.varargs {
				return nil, fmt.Errorf("%w: macro '%s' takes not more than %d argument(s)", ErrRender, name, len(n.params))
			}
			scope["varargs"] = tuple(args[len(n.params):])
		} else if n.varargs {
			scope["varargs"] = tuple{}
		}
		extra := NewDict()
		if kw != nil {
			for _, k := range kw.keys {
				switch {
				case indexOf(n.params, k) >= 0:
					if indexOf(n.params, k) < len(args) {
						return nil, fmt.Errorf("%w: macro '%s' got multiple values for argument '%s'", ErrRender, name, k)
					}
				case k == "caller" && n.caller:
					scope["caller"] = kw.m[k]
				case n.kwargs:
					extra.Set(k, kw.m[k])
				default:
					return nil, fmt.Errorf("%w: macro '%s' takes no keyword argument '%s'", ErrRender, name, k)
				}
			}
		}
		if n.kwargs {
			scope["kwargs"] = extra
		}
		r.depth++
		saved, scopes := r.out, r.scopes
		r.out = strings.Builder{}
		r.scopes = append(defScopes, scope)
		err := r.bindParams(n, scope, args, kw)
		if err == nil {
			err = r.exec(n.body)
		}
		s := r.out.String()
		r.out, r.scopes = saved, scopes
		r.depth--
		if err == nil {
			err = r.build(s)
		}
		return s, err
	}
}

// bindParams fills a macro's parameters: positional, then keyword, then
// the default (evaluated in the macro's scope), else undefined.
func (r *renderer) bindParams(n *macroDef, scope map[string]any, args []any, kw *Dict) error {
	for i, p := range n.params {
		if i < len(args) {
			scope[p] = args[i]
			continue
		}
		if kw != nil {
			if v, ok := kw.m[p]; ok {
				scope[p] = v
				continue
			}
		}
		if n.defaults[i] == nil {
			scope[p] = undefined
			continue
		}
		v, err := r.eval(n.defaults[i])
		if err != nil {
			return err
		}
		scope[p] = v
	}
	return nil
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// evalCallBlock runs {% call(params) macro(args) %}body{% endcall %}: the
// macro gets the body as caller().
func (r *renderer) evalCallBlock(n callBlockNode) (any, error) {
	fn, err := r.eval(n.call.fn)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(n.call)
	if err != nil {
		return nil, err
	}
	f, ok := fn.(builtin)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not callable", ErrRender, describe(n.call.fn))
	}
	if kw == nil {
		kw = NewDict()
	}
	kw.Set("caller", r.makeMacro(&n.caller, "caller"))
	return f(&caller{r}, args, kw)
}

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
