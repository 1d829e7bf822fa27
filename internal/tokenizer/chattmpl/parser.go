package chattmpl

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	targets []string
	iter    expr
	cond    expr // optional filter: for x in y if cond
	body    []node
	els     []node
}
type setNode struct {
	targets []string // one name, or several for tuple unpacking
	attr    string   // set ns.attr = …
	value   expr     // nil for a block set
	body    []node
}
type macroNode struct {
	name     string
	params   []string
	defaults []expr
	body     []node
}
type loopCtl struct{ brk bool }

// Expressions.
type expr interface{}

type literal struct{ v any }
type nameExpr struct{ name string }
type listExpr struct{ items []expr }
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

// parser walks the segments; exprs are parsed from each tag's tokens.
type parser struct {
	segs []segment
	pos  int
	toks []token
	tp   int
	line int
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

// parseBody parses nodes until a statement it does not own (endif, else,
// …) and returns that statement's keyword ("" at end of input); the tag's
// tokens are left in p.toks after the keyword.
func (p *parser) parseBody() ([]node, string, error) {
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
			e, err := p.parseExpr()
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
	case "break", "continue":
		return loopCtl{brk: kw == "break"}, p.expectEnd()
	case "generation", "filter", "raw":
		// {% generation %} (transformers' assistant mask) just renders its body.
		if kw != "generation" {
			return nil, p.errf("{%% %s %%} is not supported", kw)
		}
		body, end, err := p.parseBody()
		if err != nil {
			return nil, err
		}
		if end != "endgeneration" {
			return nil, p.errf("expected endgeneration")
		}
		return ifNode{conds: []expr{literal{true}}, bodies: [][]node{body}}, nil
	case "endif", "else", "elif", "endfor", "endset", "endmacro", "endgeneration":
		return nil, nil
	}
	return nil, p.errf("unknown statement %q", kw)
}

func (p *parser) parseIf() (node, error) {
	n := ifNode{}
	cond, err := p.parseExpr()
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
			if cond, err = p.parseExpr(); err != nil {
				return nil, err
			}
			continue
		case "else":
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			els, end, err := p.parseBody()
			if err != nil {
				return nil, err
			}
			if end != "endif" {
				return nil, p.errf("expected endif, found %q", end)
			}
			n.els = els
			return n, p.expectEnd()
		case "endif":
			return n, p.expectEnd()
		}
		return nil, p.errf("expected endif, found %q", end)
	}
}

func (p *parser) parseFor() (node, error) {
	n := forNode{}
	for {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, name)
		if !p.accept(",") {
			break
		}
	}
	if err := p.expect("in"); err != nil {
		return nil, err
	}
	var err error
	if n.iter, err = p.parseOr(); err != nil {
		return nil, err
	}
	if p.accept("if") {
		if n.cond, err = p.parseOr(); err != nil {
			return nil, err
		}
	}
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
		if n.value, err = p.parseTuple(); err != nil {
			return nil, err
		}
		return n, p.expectEnd()
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "endset" {
		return nil, p.errf("expected endset, found %q", end)
	}
	n.body = body
	return n, p.expectEnd()
}

func (p *parser) parseMacro() (node, error) {
	n := macroNode{}
	var err error
	if n.name, err = p.expectName(); err != nil {
		return nil, err
	}
	if err := p.expect("("); err != nil {
		return nil, err
	}
	for !p.accept(")") {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		var def expr
		if p.accept("=") {
			if def, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, name)
		n.defaults = append(n.defaults, def)
		if !p.accept(",") {
			if err := p.expect(")"); err != nil {
				return nil, err
			}
			break
		}
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody()
	if err != nil {
		return nil, err
	}
	if end != "endmacro" {
		return nil, p.errf("expected endmacro, found %q", end)
	}
	n.body = body
	return n, p.expectEnd()
}

// parseTuple: a, b (a tuple is a list here).
func (p *parser) parseTuple() (expr, error) {
	e, err := p.parseExpr()
	if err != nil || !p.isOp(",") {
		return e, err
	}
	items := []expr{e}
	for p.accept(",") {
		if p.peek().kind == tkEOF {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return listExpr{items}, nil
}

func (p *parser) parseExpr() (expr, error) {
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if p.accept("if") {
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var no expr = literal{undefined}
		if p.accept("else") {
			if no, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		return condExpr{cond, e, no}, nil
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	for err == nil && p.accept("or") {
		var r expr
		r, err = p.parseAnd()
		l = binExpr{"or", l, r}
	}
	return l, err
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	for err == nil && p.accept("and") {
		var r expr
		r, err = p.parseNot()
		l = binExpr{"and", l, r}
	}
	return l, err
}

func (p *parser) parseNot() (expr, error) {
	if p.accept("not") {
		e, err := p.parseNot()
		return unaryExpr{"not", e}, err
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	l, err := p.parseConcat()
	for err == nil {
		var op string
		switch {
		case p.isOp("==") || p.isOp("!=") || p.isOp("<") || p.isOp("<=") || p.isOp(">") || p.isOp(">="):
			op = p.next().s
		case p.isName("in"):
			p.next()
			op = "in"
		case p.isName("not") && p.peek2().kind == tkName && p.peek2().s == "in":
			p.next()
			p.next()
			op = "not in"
		default:
			return l, nil
		}
		var r expr
		r, err = p.parseConcat()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseAdd()
	for err == nil && p.accept("~") {
		var r expr
		r, err = p.parseAdd()
		l = binExpr{"~", l, r}
	}
	return l, err
}

func (p *parser) parseAdd() (expr, error) {
	l, err := p.parseMul()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		op := p.next().s
		var r expr
		r, err = p.parseMul()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *parser) parseMul() (expr, error) {
	l, err := p.parseUnary()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.next().s
		var r expr
		r, err = p.parseUnary()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *parser) parseUnary() (expr, error) {
	if p.isOp("-") || p.isOp("+") {
		op := p.next().s
		e, err := p.parseUnary()
		return unaryExpr{op, e}, err
	}
	e, err := p.parsePrimary()
	if err != nil {
		return nil, err
	}
	return p.parsePostfix(e)
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.accept("."):
			if t := p.peek(); t.kind == tkInt || t.kind == tkFloat { // foo.0 is foo[0]; foo.0.1 lexes as foo . 0.1
				p.next()
				for _, part := range strings.Split(t.s, ".") {
					n, err := strconv.ParseInt(part, 10, 64)
					if err != nil {
						return nil, p.errf("bad index %q", t.s)
					}
					e = indexExpr{e, literal{n}}
				}
				continue
			}
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			e = attrExpr{e, name}
		case p.accept("["):
			var err error
			if e, err = p.parseSubscript(e); err != nil {
				return nil, err
			}
		case p.isOp("("):
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		case p.accept("|"):
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			f := filterExpr{arg: e, name: name}
			if p.isOp("(") {
				if f.call, err = p.parseCall(nil); err != nil {
					return nil, err
				}
			}
			e = f
		case p.isName("is"):
			p.next()
			t := testExpr{arg: e}
			t.neg = p.accept("not")
			name, err := p.expectName()
			if err != nil {
				return nil, err
			}
			t.name = name
			if p.isOp("(") {
				c, err := p.parseCall(nil)
				if err != nil {
					return nil, err
				}
				t.args = c.args
			} else if k := p.peek().kind; k == tkString || k == tkInt || k == tkFloat || isConstName(p.peek()) {
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			e = t
		default:
			return e, nil
		}
	}
}

func (p *parser) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	n := 0
	isSlice := false
	for {
		if !p.isOp(":") && !p.isOp("]") {
			e, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			parts[n] = e
		}
		if p.accept(":") {
			isSlice = true
			n++
			if n > 2 {
				return nil, p.errf("bad slice")
			}
			continue
		}
		if err := p.expect("]"); err != nil {
			return nil, err
		}
		break
	}
	if !isSlice {
		return indexExpr{obj, parts[0]}, nil
	}
	return sliceExpr{obj, parts[0], parts[1], parts[2]}, nil
}

func (p *parser) parseCall(fn expr) (*callExpr, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	c := &callExpr{fn: fn}
	for !p.accept(")") {
		if p.peek().kind == tkName && p.peek2().kind == tkOp && p.peek2().s == "=" {
			k := p.next().s
			p.next()
			v, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			c.kwKeys = append(c.kwKeys, k)
			c.kwVals = append(c.kwVals, v)
		} else {
			a, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			c.args = append(c.args, a)
		}
		if !p.accept(",") {
			if err := p.expect(")"); err != nil {
				return nil, err
			}
			break
		}
	}
	return c, nil
}

// parsePrimary parses literals, names, parenthesised expressions and tuples,
// lists and dicts. One switch over the token kinds (~85 lines), kept whole so
// the grammar's primary rule reads in one place.
func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tkString:
		s := t.s
		for p.peek().kind == tkString { // adjacent literals concatenate
			s += p.next().s
		}
		return literal{s}, nil
	case tkInt:
		i, err := strconv.ParseInt(t.s, 10, 64)
		if err != nil {
			return nil, p.errf("bad integer %q", t.s)
		}
		return literal{i}, nil
	case tkFloat:
		f, err := strconv.ParseFloat(t.s, 64)
		if err != nil {
			return nil, p.errf("bad float %q", t.s)
		}
		return literal{f}, nil
	case tkName:
		switch t.s {
		case "true", "True":
			return literal{true}, nil
		case "false", "False":
			return literal{false}, nil
		case "none", "None":
			return literal{nil}, nil
		}
		return nameExpr{t.s}, nil
	case tkOp:
		switch t.s {
		case "(":
			if p.accept(")") {
				return listExpr{}, nil
			}
			e, err := p.parseTuple()
			if err != nil {
				return nil, err
			}
			return e, p.expect(")")
		case "[":
			l := listExpr{}
			for !p.accept("]") {
				e, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, e)
				if !p.accept(",") {
					if err := p.expect("]"); err != nil {
						return nil, err
					}
					break
				}
			}
			return l, nil
		case "{":
			d := dictExpr{}
			for !p.accept("}") {
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expect(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys = append(d.keys, k)
				d.vals = append(d.vals, v)
				if !p.accept(",") {
					if err := p.expect("}"); err != nil {
						return nil, err
					}
					break
				}
			}
			return d, nil
		}
	}
	return nil, p.errf("unexpected %q", t.s)
}

func (p *parser) peek2() token {
	if p.tp+1 < len(p.toks) {
		return p.toks[p.tp+1]
	}
	return token{kind: tkEOF}
}

// isConstName: true/false/none may follow a test without parentheses
// (`x is sameas false`).
func isConstName(t token) bool {
	if t.kind != tkName {
		return false
	}
	switch t.s {
	case "true", "True", "false", "False", "none", "None":
		return true
	}
	return false
}
