package chattmpl

import (
	"errors"
	"fmt"
	"strings"
	"time"
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
	// ErrDeadline: Bound.Deadline passed before the rendering ended. It
	// does not wrap ErrRender: the template is not at fault.
	ErrDeadline = errors.New("chattmpl: render deadline passed")
	// ErrStopped is wrapped, with the Stopper's error, by a rendering its
	// Bound.Stop stopped. It does not wrap ErrRender either.
	ErrStopped = errors.New("chattmpl: rendering stopped")
)

// Bound limits one rendering (RenderBounded) in time, on top of the fixed
// limits below, so a caller that has given up on a request does not pay
// for all of it. The zero value bounds nothing. The rendering checks the
// deadline and Stop every pollWork units of work (a step, or 64 bytes of
// values built or read), so it ends within about a millisecond of either.
type Bound struct {
	// Deadline, when not zero, stops the rendering with ErrDeadline once
	// passed.
	Deadline time.Time
	// Stop, when not nil, is polled as often as the deadline; a non-nil
	// error stops the rendering with ErrStopped wrapping it (a client that
	// left).
	Stop Stopper
}

// Stopper is polled by a bounded rendering on its goroutine. Stopped must
// be cheap and must not block. (tokenizer.Stopper has the same method.)
type Stopper interface {
	Stopped() error
}

// pollWork is the work between two polls of a Bound: time.Now costs some
// 50 ns, a step at least some 100.
const pollWork = 1024

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
	return t.RenderBounded(vars, Bound{})
}

// RenderBounded is Render within b: it fails with ErrDeadline, or
// ErrStopped, once either stops it.
func (t *Template) RenderBounded(vars map[string]any, b Bound) (out string, err error) {
	r := &renderer{deadline: b.Deadline, stop: b.Stop, bounded: !b.Deadline.IsZero() || b.Stop != nil}
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

	// The Bound in force (RenderBounded); work counts toward its next poll.
	bounded  bool
	deadline time.Time
	stop     Stopper
	work     int // since the last poll; pollWork once the Bound stopped the rendering
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
	return r.worked(1)
}

// build charges a value just built against the budget.
func (r *renderer) build(v any) error {
	n := size(v)
	r.built += n
	if r.built > maxBuilt {
		return fmt.Errorf("%w: the template built more than %d bytes of values", ErrRender, maxBuilt)
	}
	return r.worked(n >> 6)
}

// scan charges n bytes of operands read.
func (r *renderer) scan(n int) error {
	r.scanned += n
	if r.scanned > maxScanned {
		return fmt.Errorf("%w: the template read more than %d bytes of values", ErrRender, maxScanned)
	}
	return r.worked(n >> 6)
}

// worked counts w units of work toward the Bound's next poll, and polls
// its deadline and Stop every pollWork units.
func (r *renderer) worked(w int) error {
	if !r.bounded {
		return nil
	}
	if r.work += w; r.work < pollWork {
		return nil
	}
	r.work = pollWork // stays due: a stop is reported again to a caller that ignored it
	if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
		return ErrDeadline
	}
	if r.stop != nil {
		if err := r.stop.Stopped(); err != nil {
			return fmt.Errorf("%w: %w", ErrStopped, err)
		}
	}
	r.work = 0
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
