package chattmpl

// IteratesContent reports whether the template loops over a message's
// content (`for part in message['content']` inside `for message in
// messages`), the test vLLM uses to pick the "openai" content format (content
// as a list of parts) over the "string" one (text parts joined with "\n").
// Like vLLM's detector it follows names assigned from messages
// (`set loop_messages = messages[1:]`) and sees through filters, tests and
// slices.
func (t *Template) IteratesContent() bool {
	var sets []setNode
	var fors []*forNode
	walkNodes(t.nodes, func(n node) {
		switch x := n.(type) {
		case setNode:
			sets = append(sets, x)
		case *forNode:
			fors = append(fors, x)
		}
	})
	msgVars := map[string]bool{"messages": true}
	for changed := true; changed; {
		changed = false
		for _, s := range sets {
			if len(s.targets) == 1 && s.attr == "" && s.value != nil && !msgVars[s.targets[0]] && accessesAny(s.value, msgVars, "") {
				msgVars[s.targets[0]], changed = true, true
			}
		}
	}
	itemVars := map[string]bool{}
	for _, f := range fors {
		if len(f.targets) == 1 && accessesAny(f.iter, msgVars, "") {
			itemVars[f.targets[0]] = true
		}
	}
	for _, f := range fors {
		if accessesAny(f.iter, itemVars, "content") {
			return true
		}
	}
	return false
}

// accessesAny: e is one of vars (key ""), or vars[key] / vars.key, possibly
// under filters, tests and slices.
func accessesAny(e expr, vars map[string]bool, key string) bool {
	switch x := e.(type) {
	case filterExpr:
		return accessesAny(x.arg, vars, key)
	case testExpr:
		return accessesAny(x.arg, vars, key)
	case sliceExpr:
		return accessesAny(x.obj, vars, key)
	case nameExpr:
		return key == "" && vars[x.name]
	case attrExpr:
		n, ok := x.obj.(nameExpr)
		return key != "" && ok && vars[n.name] && x.name == key
	case indexExpr:
		n, ok := x.obj.(nameExpr)
		lit, isLit := x.idx.(literal)
		return key != "" && ok && isLit && vars[n.name] && lit.v == key
	}
	return false
}

func walkNodes(nodes []node, fn func(node)) {
	for _, n := range nodes {
		fn(n)
		switch x := n.(type) {
		case ifNode:
			for _, b := range x.bodies {
				walkNodes(b, fn)
			}
			walkNodes(x.els, fn)
		case *forNode:
			walkNodes(x.body, fn)
			walkNodes(x.els, fn)
		case setNode:
			walkNodes(x.body, fn)
		case macroNode:
			walkNodes(x.body, fn)
		case withNode:
			walkNodes(x.body, fn)
		case filterBlockNode:
			walkNodes(x.body, fn)
		case callBlockNode:
			walkNodes(x.caller.body, fn)
		}
	}
}
