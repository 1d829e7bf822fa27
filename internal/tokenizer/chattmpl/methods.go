package chattmpl

import (
	"fmt"
	"strings"
	"unicode"
)

// Methods of strings, dicts and lists that templates call.

func dictMethod(d *Dict, name string) any {
	switch name {
	case "get":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: get() needs a key", ErrRender)
			}
			if v, ok := d.m[toStr(args[0])]; ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		})
	case "items":
		return builtin(func(*caller, []any, *Dict) (any, error) { return dictItems(d), nil })
	case "keys":
		return builtin(func(*caller, []any, *Dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				out[i] = k
			}
			return out, nil
		})
	case "values":
		return builtin(func(*caller, []any, *Dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				out[i] = d.m[k]
			}
			return out, nil
		})
	}
	return undefined
}

func dictItems(d *Dict) []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		out[i] = []any{k, d.m[k]}
	}
	return out
}

func listMethod(l []any, name string) any {
	switch name {
	case "index":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			for i, x := range l {
				if len(args) > 0 && equal(x, args[0]) {
					return int64(i), nil
				}
			}
			return nil, fmt.Errorf("%w: value not in list", ErrRender)
		})
	case "count":
		return builtin(func(_ *caller, args []any, _ *Dict) (any, error) {
			n := int64(0)
			for _, x := range l {
				if len(args) > 0 && equal(x, args[0]) {
					n++
				}
			}
			return n, nil
		})
	}
	return undefined
}

func strArg(args []any, i int, def string) string {
	if i < len(args) && args[i] != nil && !isUndefined(args[i]) {
		return toStr(args[i])
	}
	return def
}

// stringMethod returns the bound Python str method name of s (undefined
// when there is none).
func stringMethod(s, name string) any {
	m := func(f func(args []any) (any, error)) builtin {
		return func(_ *caller, args []any, _ *Dict) (any, error) { return f(args) }
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return m(func(args []any) (any, error) { return strStrip(s, name, strArg(args, 0, "")), nil })
	case "upper":
		return m(func([]any) (any, error) { return strings.ToUpper(s), nil })
	case "lower":
		return m(func([]any) (any, error) { return strings.ToLower(s), nil })
	case "title":
		return m(func([]any) (any, error) { return pyTitle(s), nil })
	case "capitalize":
		return m(func([]any) (any, error) { return capitalize(s), nil })
	case "startswith", "endswith":
		return m(func(args []any) (any, error) { return strAffix(s, name, firstArg(args)), nil })
	case "split", "rsplit":
		return m(func(args []any) (any, error) { return strSplit(s, name, args), nil })
	case "replace":
		return m(func(args []any) (any, error) {
			n := -1
			if len(args) > 2 {
				if c, ok := args[2].(int64); ok {
					n = int(c)
				}
			}
			return strings.Replace(s, strArg(args, 0, ""), strArg(args, 1, ""), n), nil
		})
	case "find":
		return m(func(args []any) (any, error) { return int64(strings.Index(s, strArg(args, 0, ""))), nil })
	case "count":
		return m(func(args []any) (any, error) { return int64(strings.Count(s, strArg(args, 0, ""))), nil })
	case "join":
		return m(func(args []any) (any, error) {
			items, err := iterate(firstArg(args))
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, x := range items {
				parts[i] = toStr(x)
			}
			return strings.Join(parts, s), nil
		})
	case "isdigit", "isalpha", "isspace", "isupper", "islower":
		return m(func([]any) (any, error) { return strPredicate(s, name), nil })
	}
	return undefined
}

// strStrip is str.strip/lstrip/rstrip(cut): whitespace when cut is "".
func strStrip(s, name, cut string) string {
	trim := func(r rune) bool {
		if cut == "" {
			return unicode.IsSpace(r)
		}
		return strings.ContainsRune(cut, r)
	}
	switch name {
	case "lstrip":
		return strings.TrimLeftFunc(s, trim)
	case "rstrip":
		return strings.TrimRightFunc(s, trim)
	}
	return strings.TrimFunc(s, trim)
}

// strAffix is str.startswith/endswith(arg), arg a string or a tuple of them.
func strAffix(s, name string, arg any) bool {
	cands, ok := arg.([]any)
	if !ok {
		cands = []any{arg}
	}
	for _, c := range cands {
		p := toStr(c)
		if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
			return true
		}
	}
	return false
}

// strSplit is str.split/rsplit(sep, maxsplit).
func strSplit(s, name string, args []any) []any {
	var parts []string
	sep := strArg(args, 0, "")
	limit := -1
	if len(args) > 1 {
		if n, ok := args[1].(int64); ok && n >= 0 {
			limit = int(n) + 1
		}
	}
	switch {
	case sep == "":
		parts = strings.Fields(s)
	case name == "rsplit" && limit > 0:
		parts = rsplitN(s, sep, limit)
	default:
		parts = strings.SplitN(s, sep, limit)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for len(out) < n-1 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append([]string{s[i+len(sep):]}, out...)
		s = s[:i]
	}
	return append([]string{s}, out...)
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isspace":
			if !unicode.IsSpace(r) {
				return false
			}
		case "isupper":
			if unicode.IsLower(r) {
				return false
			}
			cased = cased || unicode.IsUpper(r)
		case "islower":
			if unicode.IsUpper(r) {
				return false
			}
			cased = cased || unicode.IsLower(r)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

func firstArg(args []any) any {
	if len(args) == 0 {
		return undefined
	}
	return args[0]
}

func pyTitle(s string) string {
	var sb strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			sb.WriteRune(unicode.ToLower(r))
		} else {
			sb.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return sb.String()
}

func capitalize(s string) string {
	for i, r := range s {
		return string(unicode.ToUpper(r)) + strings.ToLower(s[i+len(string(r)):])
	}
	return s
}
