package chattmpl

import (
	"errors"
	"strconv"
	"strings"
)

// parseTuple parses an expression or a tuple of them (a, b); withCond
// allows conditional expressions (not in a for loop's iterable or an if).
func (p *parser) parseTuple(withCond bool) (expr, error) {
	parseOne := p.parseExpr
	if !withCond {
		parseOne = p.parseOr
	}
	e, err := parseOne()
	if err != nil || !p.isOp(",") {
		return e, err
	}
	items := []expr{e}
	for p.accept(",") {
		if k := p.peek(); k.kind == tkEOF || k.kind == tkOp && k.s == ")" || k.kind == tkName && (k.s == "if" || k.s == "recursive") {
			break
		}
		e, err := parseOne()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return listExpr{items: items, tuple: true}, nil
}

func (p *parser) parseExpr() (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.nest-- }()
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
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer func() { p.nest-- }()
		e, err := p.parseNot()
		return unaryExpr{"not", e}, err
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	l, err := p.parseAdd()
	if err != nil {
		return nil, err
	}
	c := compareExpr{first: l}
	for {
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
		}
		if op == "" {
			break
		}
		r, err := p.parseAdd()
		if err != nil {
			return nil, err
		}
		c.ops, c.rest = append(c.ops, op), append(c.rest, r)
	}
	switch len(c.ops) {
	case 0:
		return l, nil
	case 1:
		return binExpr{c.ops[0], l, c.rest[0]}, nil
	}
	return c, nil
}

// Jinja2's precedence, loosest first: + and -, then ~, then * / // %,
// then **, then unary - and +, then filters and tests.
func (p *parser) parseAdd() (expr, error) {
	l, err := p.parseConcat()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		op := p.next().s
		var r expr
		r, err = p.parseConcat()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *parser) parseConcat() (expr, error) {
	l, err := p.parseMul()
	for err == nil && p.accept("~") {
		var r expr
		r, err = p.parseMul()
		l = binExpr{"~", l, r}
	}
	return l, err
}

func (p *parser) parseMul() (expr, error) {
	l, err := p.parsePow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.next().s
		var r expr
		r, err = p.parsePow()
		l = binExpr{op, l, r}
	}
	return l, err
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	for err == nil && p.accept("**") {
		var r expr
		r, err = p.parseUnary(true)
		l = binExpr{"**", l, r}
	}
	return l, err
}

// parseUnary is Jinja2's: a sign applies to the operand before any
// filter, so -x|abs is abs(-x).
func (p *parser) parseUnary(withFilter bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.nest-- }()
	var e expr
	var err error
	if p.isOp("-") || p.isOp("+") {
		op := p.next().s
		var inner expr
		if inner, err = p.parseUnary(false); err != nil {
			return nil, err
		}
		e = unaryExpr{op, inner}
	} else if e, err = p.parsePrimary(); err != nil {
		return nil, err
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

// parsePostfix parses .attr, [index] and calls.
func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.accept("."):
			if t := p.peek(); t.kind == tkInt || t.kind == tkFloat { // foo.0 is foo[0]
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
		default:
			return e, nil
		}
	}
}

// parseFilterExpr parses filters, tests and calls after an operand.
func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		switch {
		case p.accept("|"):
			f, err := p.parseFilterCall(e)
			if err != nil {
				return nil, err
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
			for p.accept(".") { // dotted test names
				part, err := p.expectName()
				if err != nil {
					return nil, err
				}
				name += "." + part
			}
			t.name = name
			if p.isOp("(") {
				c, err := p.parseCall(nil)
				if err != nil {
					return nil, err
				}
				t.args = c.args
			} else if p.testArgFollows() {
				a, err := p.parsePrimary()
				if err != nil {
					return nil, err
				}
				if a, err = p.parsePostfix(a); err != nil {
					return nil, err
				}
				t.args = []expr{a}
			}
			e = t
		case p.isOp("("):
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}

// testArgFollows: `x is divisibleby 3`, `x is sameas false`, `x is eq y`:
// a test takes one argument without parentheses when a name (but else, or,
// and), a literal or a bracket follows.
func (p *parser) testArgFollows() bool {
	t := p.peek()
	switch t.kind {
	case tkString, tkInt, tkFloat:
		return true
	case tkName:
		return t.s != "else" && t.s != "or" && t.s != "and"
	case tkOp:
		return t.s == "[" || t.s == "{"
	}
	return false
}

// parseFilterCall parses name(args) after a "|" (arg nil in a filter block).
func (p *parser) parseFilterCall(arg expr) (filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return filterExpr{}, err
	}
	for p.accept(".") {
		part, err := p.expectName()
		if err != nil {
			return filterExpr{}, err
		}
		name += "." + part
	}
	f := filterExpr{arg: arg, name: name}
	if p.isOp("(") {
		if f.call, err = p.parseCall(nil); err != nil {
			return filterExpr{}, err
		}
	}
	return f, nil
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
		if parts[0] == nil {
			return nil, p.errf("expected an index")
		}
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
		if p.isOp("*") || p.isOp("**") {
			return nil, p.errf("*args and **kwargs in calls are not supported")
		}
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
			if len(c.kwKeys) > 0 {
				return nil, p.errf("positional argument after keyword argument")
			}
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
// lists and dicts. One switch over the token kinds, kept whole so the
// grammar's primary rule reads in one place.
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
		i, err := strconv.ParseInt(t.s, 0, 64)
		if err != nil {
			if strings.HasPrefix(t.s, "0") && len(t.s) > 1 && strings.Trim(t.s, "0") == "" {
				return literal{int64(0)}, nil
			}
			return nil, p.errf("bad integer %q (integers beyond 64 bits are not supported)", t.s)
		}
		return literal{i}, nil
	case tkFloat:
		f, err := strconv.ParseFloat(t.s, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
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
				return listExpr{tuple: true}, nil
			}
			e, err := p.parseTuple(true)
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

// walkExprs calls fn on every expression in nodes, nested ones included
// (macro bodies too).
func walkExprs(nodes []node, fn func(expr)) {
	walkNodes(nodes, func(n node) {
		var es []expr
		switch x := n.(type) {
		case outputNode:
			es = []expr{x.e}
		case ifNode:
			es = x.conds
		case *forNode:
			es = []expr{x.iter, x.cond}
		case setNode:
			es = []expr{x.value}
		case macroNode:
			es = x.defaults
		case withNode:
			es = x.values
		case filterBlockNode:
			for _, f := range x.filters {
				es = append(es, f)
			}
		case callBlockNode:
			es = append([]expr{x.call}, x.caller.defaults...)
		}
		for _, e := range es {
			walkExpr(e, fn)
		}
	})
}

func walkExpr(e expr, fn func(expr)) {
	if e == nil {
		return
	}
	fn(e)
	var kids []expr
	switch x := e.(type) {
	case listExpr:
		kids = x.items
	case dictExpr:
		kids = append(append(kids, x.keys...), x.vals...)
	case attrExpr:
		kids = []expr{x.obj}
	case indexExpr:
		kids = []expr{x.obj, x.idx}
	case sliceExpr:
		kids = []expr{x.obj, x.lo, x.hi, x.step}
	case *callExpr:
		kids = append(append([]expr{x.fn}, x.args...), x.kwVals...)
	case filterExpr:
		kids = []expr{x.arg}
		if x.call != nil {
			kids = append(append(kids, x.call.args...), x.call.kwVals...)
		}
	case testExpr:
		kids = append([]expr{x.arg}, x.args...)
	case binExpr:
		kids = []expr{x.l, x.r}
	case unaryExpr:
		kids = []expr{x.e}
	case condExpr:
		kids = []expr{x.cond, x.yes, x.no}
	case compareExpr:
		kids = append([]expr{x.first}, x.rest...)
	}
	for _, k := range kids {
		walkExpr(k, fn)
	}
}
