package chattmpl

import (
	"errors"
	"fmt"
)

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("chattmpl: syntax error")

// Nodes of a template.
type node interface{}

type textNode struct{ s string }
type outputNode struct{ e expr }
type ifNode struct {
	conds  []expr
	bodies [][]node
	els    []node
}
type forNode struct {
	targets   []string
	iter      expr
	cond      expr // optional filter: for x in y if cond
	body      []node
	els       []node
	recursive bool
	// keepsScope: the body defines a macro or a call block, whose closure
	// keeps the iteration's scope.
	keepsScope bool
}
type setNode struct {
	targets []string // one name, or several for tuple unpacking
	attr    string   // set ns.attr = …
	value   expr     // nil for a block set
	body    []node
}
type macroNode struct {
	name string
	macroDef
}
type withNode struct {
	targets []string
	values  []expr
	body    []node
}
type filterBlockNode struct {
	filters []filterExpr // applied in order to the body's text
	body    []node
}
type callBlockNode struct {
	call   *callExpr
	caller macroDef
}
type loopCtl struct{ brk bool }

// Expressions.
type expr interface{}

type literal struct{ v any }
type nameExpr struct{ name string }
type listExpr struct {
	items []expr
	tuple bool
}
type dictExpr struct{ keys, vals []expr }
type attrExpr struct {
	obj  expr
	name string
}
type indexExpr struct{ obj, idx expr }
type sliceExpr struct{ obj, lo, hi, step expr }
type callExpr struct {
	fn     expr
	args   []expr
	kwKeys []string
	kwVals []expr
}
type filterExpr struct {
	arg  expr
	name string
	call *callExpr // args beyond the first, may be nil
}
type testExpr struct {
	arg  expr
	name string
	neg  bool
	args []expr
}
type binExpr struct {
	op   string
	l, r expr
}
type unaryExpr struct {
	op string
	e  expr
}
type condExpr struct{ cond, yes, no expr }

// compareExpr is a comparison chain a < b <= c (Python: a < b and b <= c).
type compareExpr struct {
	first expr
	ops   []string
	rest  []expr
}

// parser walks the segments; exprs are parsed from each tag's tokens.
type parser struct {
	segs []segment
	pos  int
	toks []token
	tp   int
	line int
	nest int // open blocks and brackets
}

// parse builds the node list of a whole template.
func parse(src string) ([]node, error) {
	segs, err := splitSegments(src)
	if err != nil {
		return nil, err
	}
	p := &parser{segs: segs}
	nodes, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errf("unexpected {%% %s %%}", end)
	}
	return nodes, nil
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("line %d: %w: %s", p.line, ErrSyntax, fmt.Sprintf(format, args...))
}

// enter counts one more level of nesting (a block, a bracket, an operand);
// leave it with p.nest--.
func (p *parser) enter() error {
	p.nest++
	if p.nest > maxNest {
		return p.errf("nested too deeply")
	}
	return nil
}

// parseBody parses nodes until a statement it does not own (endif, else,
// …) and returns that statement's keyword ("" at end of input); the tag's
// tokens are left in p.toks after the keyword.
func (p *parser) parseBody() ([]node, string, error) {
	if err := p.enter(); err != nil {
		return nil, "", err
	}
	defer func() { p.nest-- }()
	var nodes []node
	for p.pos < len(p.segs) {
		s := p.segs[p.pos]
		p.pos++
		p.line = s.line
		switch s.kind {
		case segText:
			nodes = append(nodes, textNode{s.text})
		case segOutput:
			if err := p.startTag(s); err != nil {
				return nil, "", err
			}
			e, err := p.parseTuple(true)
			if err != nil {
				return nil, "", err
			}
			if err := p.expectEnd(); err != nil {
				return nil, "", err
			}
			nodes = append(nodes, outputNode{e})
		case segStmt:
			if err := p.startTag(s); err != nil {
				return nil, "", err
			}
			kw := p.next()
			if kw.kind != tkName {
				return nil, "", p.errf("expected a statement")
			}
			n, err := p.parseStmt(kw.s)
			if err != nil {
				return nil, "", err
			}
			if n == nil {
				return nodes, kw.s, nil
			}
			nodes = append(nodes, n)
		}
	}
	return nodes, "", nil
}

func (p *parser) startTag(s segment) error {
	toks, err := tokenize(s.text, s.line)
	if err != nil {
		return err
	}
	p.toks, p.tp = toks, 0
	return nil
}

func (p *parser) peek() token { return p.toks[p.tp] }
func (p *parser) next() token {
	t := p.toks[p.tp]
	if t.kind != tkEOF {
		p.tp++
	}
	return t
}
func (p *parser) isOp(s string) bool   { t := p.peek(); return t.kind == tkOp && t.s == s }
func (p *parser) isName(s string) bool { t := p.peek(); return t.kind == tkName && t.s == s }
func (p *parser) accept(s string) bool {
	if p.isOp(s) || p.isName(s) {
		p.next()
		return true
	}
	return false
}
func (p *parser) expect(s string) error {
	if !p.accept(s) {
		return p.errf("expected %q, found %q", s, p.peek().s)
	}
	return nil
}
func (p *parser) expectEnd() error {
	if p.peek().kind != tkEOF {
		return p.errf("unexpected %q", p.peek().s)
	}
	return nil
}
func (p *parser) expectName() (string, error) {
	t := p.next()
	if t.kind != tkName {
		return "", p.errf("expected a name, found %q", t.s)
	}
	return t.s, nil
}

// parseStmt returns nil for keywords that end or split an enclosing block.
func (p *parser) parseStmt(kw string) (node, error) {
	switch kw {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "with":
		return p.parseWith()
	case "filter":
		return p.parseFilterBlock()
	case "call":
		return p.parseCallBlock()
	case "break", "continue":
		return loopCtl{brk: kw == "break"}, p.expectEnd()
	case "generation":
		// {% generation %} (transformers' assistant mask) renders its body
		// (in its own scope, as the call block it is in Jinja2).
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, err := p.parseBlockBody("endgeneration")
		if err != nil {
			return nil, err
		}
		return withNode{body: body}, nil
	case "endif", "else", "elif", "endfor", "endset", "endmacro", "endgeneration", "endwith", "endfilter", "endcall":
		return nil, nil
	}
	return nil, p.errf("unknown statement %q", kw)
}

// parseBlockBody parses a body that must end with {% end %}.
func (p *parser) parseBlockBody(end string) ([]node, error) {
	body, got, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if got != end {
		return nil, p.errf("expected %s, found %q", end, got)
	}
	return body, p.expectEnd()
}

func (p *parser) parseIf() (node, error) {
	n := ifNode{}
	cond, err := p.parseTuple(false)
	if err != nil {
		return nil, err
	}
	for {
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch end {
		case "elif":
			if cond, err = p.parseTuple(false); err != nil {
				return nil, err
			}
			continue
		case "else":
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			if n.els, err = p.parseBlockBody("endif"); err != nil {
				return nil, err
			}
			return n, nil
		case "endif":
			return n, p.expectEnd()
		}
		return nil, p.errf("expected endif, found %q", end)
	}
}

// parseTargets parses assignment names: a, b or (a, b).
func (p *parser) parseTargets() ([]string, error) {
	paren := p.accept("(")
	var names []string
	for {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		names = append(names, name)
		if !p.accept(",") || paren && p.isOp(")") {
			break
		}
	}
	if paren {
		if err := p.expect(")"); err != nil {
			return nil, err
		}
	}
	return names, nil
}

func (p *parser) parseFor() (node, error) {
	n := &forNode{}
	var err error
	if n.targets, err = p.parseTargets(); err != nil {
		return nil, err
	}
	if err := p.expect("in"); err != nil {
		return nil, err
	}
	if n.iter, err = p.parseTuple(false); err != nil {
		return nil, err
	}
	if p.accept("if") {
		if n.cond, err = p.parseExpr(); err != nil {
			return nil, err
		}
	}
	n.recursive = p.accept("recursive")
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	n.body = body
	if end == "else" {
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if n.els, end, err = p.parseBody(); err != nil {
			return nil, err
		}
	}
	if end != "endfor" {
		return nil, p.errf("expected endfor, found %q", end)
	}
	walkNodes(n.body, func(x node) {
		switch x.(type) {
		case macroNode, callBlockNode:
			n.keepsScope = true
		}
	})
	return n, p.expectEnd()
}

func (p *parser) parseSet() (node, error) {
	n := setNode{}
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	n.targets = []string{name}
	if p.accept(".") {
		if n.attr, err = p.expectName(); err != nil {
			return nil, err
		}
	}
	for n.attr == "" && p.accept(",") {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, name)
	}
	if p.accept("=") {
		if n.value, err = p.parseTuple(true); err != nil {
			return nil, err
		}
		return n, p.expectEnd()
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	if n.body, err = p.parseBlockBody("endset"); err != nil {
		return nil, err
	}
	return n, nil
}

// parseSignature parses a macro's or call block's (a, b=default, …).
func (p *parser) parseSignature(d *macroDef) error {
	if err := p.expect("("); err != nil {
		return err
	}
	for !p.accept(")") {
		name, err := p.expectName()
		if err != nil {
			return err
		}
		var def expr
		if p.accept("=") {
			if def, err = p.parseExpr(); err != nil {
				return err
			}
		}
		d.params = append(d.params, name)
		d.defaults = append(d.defaults, def)
		if !p.accept(",") {
			return p.expect(")")
		}
	}
	return nil
}

func (p *parser) parseMacro() (node, error) {
	n := macroNode{}
	var err error
	if n.name, err = p.expectName(); err != nil {
		return nil, err
	}
	if err := p.parseSignature(&n.macroDef); err != nil {
		return nil, err
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	if n.body, err = p.parseBlockBody("endmacro"); err != nil {
		return nil, err
	}
	n.findSpecialNames()
	return n, nil
}

// findSpecialNames notes whether the body uses varargs, kwargs or caller
// (Jinja2's find_undeclared): only then does the macro accept extra
// arguments or a call block.
func (d *macroDef) findSpecialNames() {
	walkExprs(d.body, func(e expr) {
		if n, ok := e.(nameExpr); ok {
			switch n.name {
			case "varargs":
				d.varargs = true
			case "kwargs":
				d.kwargs = true
			case "caller":
				d.caller = true
			}
		}
	})
}

func (p *parser) parseWith() (node, error) {
	n := withNode{}
	for p.peek().kind != tkEOF {
		if len(n.targets) > 0 {
			if err := p.expect(","); err != nil {
				return nil, err
			}
		}
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		if err := p.expect("="); err != nil {
			return nil, err
		}
		v, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		n.targets, n.values = append(n.targets, name), append(n.values, v)
	}
	var err error
	if n.body, err = p.parseBlockBody("endwith"); err != nil {
		return nil, err
	}
	return n, nil
}

func (p *parser) parseFilterBlock() (node, error) {
	n := filterBlockNode{}
	for {
		f, err := p.parseFilterCall(nil)
		if err != nil {
			return nil, err
		}
		n.filters = append(n.filters, f)
		if !p.accept("|") {
			break
		}
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	var err error
	if n.body, err = p.parseBlockBody("endfilter"); err != nil {
		return nil, err
	}
	return n, nil
}

func (p *parser) parseCallBlock() (node, error) {
	n := callBlockNode{}
	if p.isOp("(") {
		if err := p.parseSignature(&n.caller); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	call, ok := e.(*callExpr)
	if !ok {
		return nil, p.errf("expected a call")
	}
	n.call = call
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	if n.caller.body, err = p.parseBlockBody("endcall"); err != nil {
		return nil, err
	}
	n.caller.findSpecialNames()
	return n, nil
}
