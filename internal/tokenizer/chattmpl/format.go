package chattmpl

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Python's two string formatting languages: printf-style (`'%d items' %
// n`, the format filter) and str.format. What either supports beyond the
// subset here fails the render rather than printing something else.

// percentFormat is Python's `format % args`.
func percentFormat(format string, args any) (string, error) {
	var items []any
	var mapping *Dict
	switch x := args.(type) {
	case tuple:
		items = x
	case *Dict:
		mapping, items = x, []any{x}
	default:
		items = []any{x}
	}
	next := 0
	arg := func() (any, error) {
		if next >= len(items) {
			return nil, fmt.Errorf("%w: not enough arguments for format string", ErrRender)
		}
		next++
		return items[next-1], nil
	}
	var b strings.Builder
	usedMapping := false
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return "", fmt.Errorf("%w: incomplete format", ErrRender)
		}
		var spec fmtSpec
		var v any
		haveArg := false
		if format[i] == '(' {
			end := strings.IndexByte(format[i:], ')')
			if end < 0 || mapping == nil {
				return "", fmt.Errorf("%w: format requires a mapping", ErrRender)
			}
			key := format[i+1 : i+end]
			var ok bool
			if v, ok = mapping.m[key]; !ok {
				return "", fmt.Errorf("%w: KeyError: %q", ErrRender, key)
			}
			haveArg, usedMapping = true, true
			i += end + 1
		}
		for ; i < len(format) && strings.IndexByte("#0- +", format[i]) >= 0; i++ {
			spec.flags += string(format[i])
		}
		readNum := func() (int, error) {
			if i < len(format) && format[i] == '*' {
				i++
				a, err := arg()
				if err != nil {
					return 0, err
				}
				n, ok := intValue(a)
				if !ok {
					return 0, fmt.Errorf("%w: * wants int", ErrRender)
				}
				return int(n), nil
			}
			n := 0
			for ; i < len(format) && format[i] >= '0' && format[i] <= '9'; i++ {
				n = n*10 + int(format[i]-'0')
				if n > maxValue {
					return 0, checkLen(n)
				}
			}
			return n, nil
		}
		var err error
		if spec.width, err = readNum(); err != nil {
			return "", err
		}
		spec.prec = -1
		if i < len(format) && format[i] == '.' {
			i++
			if spec.prec, err = readNum(); err != nil {
				return "", err
			}
		}
		for i < len(format) && strings.IndexByte("hlL", format[i]) >= 0 {
			i++
		}
		if i >= len(format) {
			return "", fmt.Errorf("%w: incomplete format", ErrRender)
		}
		spec.verb = format[i]
		if spec.verb == '%' {
			b.WriteByte('%')
			continue
		}
		if !haveArg {
			if v, err = arg(); err != nil {
				return "", err
			}
		}
		s, err := formatOne(spec, v)
		if err != nil {
			return "", err
		}
		if err := checkLen(b.Len() + len(s)); err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	if next < len(items) && mapping == nil && !usedMapping {
		switch args.(type) {
		case []any, *undefinedT, rangeT: // Python takes them for mappings
		default:
			return "", fmt.Errorf("%w: not all arguments converted during string formatting", ErrRender)
		}
	}
	return b.String(), nil
}

type fmtSpec struct {
	flags       string
	width, prec int
	verb        byte
}

func (s fmtSpec) has(f byte) bool { return strings.IndexByte(s.flags, f) >= 0 }

// formatOne formats one printf-style conversion.
func formatOne(spec fmtSpec, v any) (string, error) {
	var body, sign string
	numeric := true
	switch spec.verb {
	case 's', 'r', 'a':
		numeric = false
		if spec.verb == 's' {
			body = toStr(v)
		} else {
			body = repr(v, true)
		}
		if spec.prec >= 0 && utf8.RuneCountInString(body) > spec.prec {
			body = string([]rune(body)[:spec.prec])
		}
	case 'c':
		numeric = false
		switch x := v.(type) {
		case string:
			if utf8.RuneCountInString(x) != 1 {
				return "", fmt.Errorf("%w: %%c requires int or char", ErrRender)
			}
			body = x
		default:
			n, ok := intValue(v)
			if !ok || n < 0 || n > utf8.MaxRune {
				return "", fmt.Errorf("%w: %%c requires int or char", ErrRender)
			}
			body = string(rune(n))
		}
	case 'd', 'i', 'u', 'x', 'X', 'o':
		n, ok := intValue(v)
		if f, isFloat := v.(float64); isFloat && strings.IndexByte("diu", spec.verb) >= 0 {
			if math.IsInf(f, 0) || math.IsNaN(f) || math.Abs(f) >= 1<<63 {
				return "", errOverflow
			}
			n, ok = int64(f), true
		}
		if !ok {
			return "", fmt.Errorf("%w: %%%c format: a real number is required, not %s", ErrRender, spec.verb, typeName(v))
		}
		if n < 0 {
			sign = "-"
		}
		u := uint64(n)
		if n < 0 {
			u = uint64(-n)
		}
		switch spec.verb {
		case 'x', 'X':
			body = strconv.FormatUint(u, 16)
			if spec.has('#') {
				body = "0x" + body
			}
			if spec.verb == 'X' {
				body = strings.ToUpper(body)
			}
		case 'o':
			body = strconv.FormatUint(u, 8)
			if spec.has('#') {
				body = "0o" + body
			}
		default:
			body = strconv.FormatUint(u, 10)
		}
		if spec.prec >= 0 && len(body) < spec.prec {
			body = strings.Repeat("0", spec.prec-len(body)) + body
		}
	case 'e', 'E', 'f', 'F', 'g', 'G':
		f, ok := num(v)
		if !ok {
			return "", fmt.Errorf("%w: must be real number, not %s", ErrRender, typeName(v))
		}
		if spec.has('#') {
			return "", fmt.Errorf("%w: the # flag on %%%c is not supported", ErrRender, spec.verb)
		}
		prec := spec.prec
		if prec < 0 {
			prec = 6
		}
		if math.Signbit(f) && !math.IsNaN(f) {
			sign, f = "-", -f
		}
		body = formatFloat(f, spec.verb, prec)
	default:
		return "", fmt.Errorf("%w: unsupported format character '%c'", ErrRender, spec.verb)
	}
	if numeric && sign == "" {
		if spec.has('+') {
			sign = "+"
		} else if spec.has(' ') {
			sign = " "
		}
	}
	n := utf8.RuneCountInString(sign + body)
	if spec.width <= n {
		return sign + body, nil
	}
	if err := checkLen(spec.width); err != nil {
		return "", err
	}
	padding := spec.width - n
	switch {
	case spec.has('-'):
		return sign + body + strings.Repeat(" ", padding), nil
	case spec.has('0') && numeric:
		return sign + strings.Repeat("0", padding) + body, nil
	}
	return strings.Repeat(" ", padding) + sign + body, nil
}

// formatFloat formats a non-negative float as C's printf does for verb
// (e, E, f, F, g, G) at precision prec.
func formatFloat(f float64, verb byte, prec int) string {
	upper := verb == 'E' || verb == 'F' || verb == 'G'
	switch {
	case math.IsInf(f, 0):
		if upper {
			return "INF"
		}
		return "inf"
	case math.IsNaN(f):
		if upper {
			return "NAN"
		}
		return "nan"
	}
	var s string
	switch verb {
	case 'e', 'E':
		s = strconv.FormatFloat(f, 'e', prec, 64)
	case 'f', 'F':
		s = strconv.FormatFloat(f, 'f', prec, 64)
	default:
		if prec == 0 {
			prec = 1
		}
		s = strconv.FormatFloat(f, 'g', prec, 64)
	}
	if upper {
		s = strings.ToUpper(s)
	}
	return s
}

// strFormat is Python's str.format for the common replacement fields:
// {}, {0}, {name}, with .attr / [key] lookups, !s / !r and a format spec
// of fill, align, sign, 0, width, grouping, precision and type.
func strFormat(format string, args []any, kw *Dict) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c == '}' {
			if i+1 < len(format) && format[i+1] == '}' {
				i++
				b.WriteByte('}')
				continue
			}
			return "", fmt.Errorf("%w: single '}' encountered in format string", ErrRender)
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(format) && format[i+1] == '{' {
			i++
			b.WriteByte('{')
			continue
		}
		end := strings.IndexByte(format[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("%w: expected '}' before end of string", ErrRender)
		}
		field := format[i+1 : i+end]
		i += end
		if strings.ContainsRune(field, '{') {
			return "", fmt.Errorf("%w: nested replacement fields are not supported", ErrRender)
		}
		field, spec, _ := strings.Cut(field, ":")
		field, conv, hasConv := strings.Cut(field, "!")
		name := field
		rest := ""
		if j := strings.IndexAny(field, ".["); j >= 0 {
			name, rest = field[:j], field[j:]
		}
		var v any
		switch {
		case name == "":
			if auto < 0 {
				return "", fmt.Errorf("%w: cannot switch from manual field specification to automatic field numbering", ErrRender)
			}
			if auto >= len(args) {
				return "", fmt.Errorf("%w: Replacement index %d out of range for positional args tuple", ErrRender, auto)
			}
			v = args[auto]
			auto++
		case name[0] >= '0' && name[0] <= '9':
			n, err := strconv.Atoi(name)
			if err != nil || n >= len(args) {
				return "", fmt.Errorf("%w: Replacement index %s out of range for positional args tuple", ErrRender, name)
			}
			if auto > 0 {
				return "", fmt.Errorf("%w: cannot switch from automatic field numbering to manual field specification", ErrRender)
			}
			auto = -1
			v = args[n]
		default:
			var ok bool
			if kw != nil {
				v, ok = kw.m[name]
			}
			if !ok {
				return "", fmt.Errorf("%w: KeyError: %q", ErrRender, name)
			}
		}
		v, err := formatLookup(v, rest)
		if err != nil {
			return "", err
		}
		if hasConv {
			switch conv {
			case "s":
				v = toStr(v)
			case "r", "a":
				v = repr(v, true)
			default:
				return "", fmt.Errorf("%w: unknown conversion specifier %s", ErrRender, conv)
			}
		}
		s, err := formatSpec(v, spec)
		if err != nil {
			return "", err
		}
		if err := checkLen(b.Len() + len(s)); err != nil {
			return "", err
		}
		b.WriteString(s)
	}
	return b.String(), nil
}

// formatLookup follows a field's .attr and [key] parts.
func formatLookup(v any, rest string) (any, error) {
	for rest != "" {
		var key string
		if rest[0] == '.' {
			rest = rest[1:]
			j := strings.IndexAny(rest, ".[")
			if j < 0 {
				j = len(rest)
			}
			key, rest = rest[:j], rest[j:]
			var err error
			if v, err = getAttr(v, key); err != nil {
				return nil, err
			}
		} else {
			j := strings.IndexByte(rest, ']')
			if j < 0 {
				return nil, fmt.Errorf("%w: missing ']' in format string", ErrRender)
			}
			key, rest = rest[1:j], rest[j+1:]
			var idx any = key
			if n, err := strconv.Atoi(key); err == nil {
				idx = int64(n)
			}
			var err error
			if v, err = getItem(v, idx); err != nil {
				return nil, err
			}
		}
		if isUndefined(v) {
			return nil, fmt.Errorf("%w: format field %q not found", ErrRender, key)
		}
	}
	return v, nil
}

// formatSpec applies a format spec ([[fill]align][sign][0][width][,_]
// [.precision][type]) to one value.
func formatSpec(v any, spec string) (string, error) {
	if spec == "" {
		return toStr(v), nil
	}
	rs := []rune(spec)
	fill, align := ' ', rune(0)
	i := 0
	if len(rs) >= 2 && strings.ContainsRune("<>^=", rs[1]) {
		fill, align, i = rs[0], rs[1], 2
	} else if len(rs) >= 1 && strings.ContainsRune("<>^=", rs[0]) {
		align, i = rs[0], 1
	}
	sign := '-'
	if i < len(rs) && strings.ContainsRune("+- ", rs[i]) {
		sign = rs[i]
		i++
	}
	if i < len(rs) && rs[i] == '0' {
		if align == 0 {
			fill, align = '0', '='
		}
		i++
	}
	width := 0
	for ; i < len(rs) && rs[i] >= '0' && rs[i] <= '9'; i++ {
		width = width*10 + int(rs[i]-'0')
		if width > maxValue {
			return "", checkLen(width)
		}
	}
	group := rune(0)
	if i < len(rs) && (rs[i] == ',' || rs[i] == '_') {
		group = rs[i]
		i++
	}
	prec := -1
	if i < len(rs) && rs[i] == '.' {
		i++
		prec = 0
		for ; i < len(rs) && rs[i] >= '0' && rs[i] <= '9'; i++ {
			prec = prec*10 + int(rs[i]-'0')
			if prec > maxValue {
				return "", checkLen(prec)
			}
		}
	}
	typ := rune(0)
	if i < len(rs) {
		typ = rs[i]
		i++
	}
	if i != len(rs) {
		return "", fmt.Errorf("%w: invalid format specifier %q", ErrRender, spec)
	}
	var body, signStr string
	numeric := false
	switch x := v.(type) {
	case string:
		if typ != 0 && typ != 's' || sign != '-' || group != 0 || align == '=' {
			return "", fmt.Errorf("%w: unsupported format spec %q for str", ErrRender, spec)
		}
		body = x
		if prec >= 0 && utf8.RuneCountInString(body) > prec {
			body = string([]rune(body)[:prec])
		}
		if align == 0 {
			align = '<'
		}
	case int64, float64, bool:
		numeric = true
		f, _ := num(x)
		n, isInt := intValue(x)
		if typ == 'n' || typ == 0 && !isInt && prec >= 0 || prec >= 0 && isInt && !strings.ContainsRune("eEfFgG%", typ) {
			return "", fmt.Errorf("%w: unsupported format spec %q for %s", ErrRender, spec, typeName(x))
		}
		if f < 0 || math.Signbit(f) && !isInt {
			signStr, f, n = "-", -f, -n
		} else if sign == '+' {
			signStr = "+"
		} else if sign == ' ' {
			signStr = " "
		}
		switch {
		case typ == 0 && !isInt:
			body = pyFloat(f)
		case (typ == 0 || typ == 'd') && isInt:
			body = groupDigits(strconv.FormatInt(n, 10), group)
		case strings.ContainsRune("xXob", typ) && isInt:
			base := map[rune]int{'x': 16, 'X': 16, 'o': 8, 'b': 2}[typ]
			body = strconv.FormatInt(n, base)
			if typ == 'X' {
				body = strings.ToUpper(body)
			}
		case strings.ContainsRune("eEfFgG%", typ):
			if prec < 0 {
				prec = 6
			}
			if typ == '%' {
				body = formatFloat(f*100, 'f', prec) + "%"
			} else {
				body = formatFloat(f, byte(typ), prec)
			}
			if group != 0 && (typ == 'f' || typ == 'F' || typ == '%') {
				intPart, frac, _ := strings.Cut(body, ".")
				body = groupDigits(intPart, group)
				if frac != "" {
					body += "." + frac
				}
			}
		default:
			return "", fmt.Errorf("%w: unsupported format spec %q for number", ErrRender, spec)
		}
		if align == 0 {
			align = '>'
		}
	default:
		if typ != 0 || sign != '-' || group != 0 || prec >= 0 {
			return "", fmt.Errorf("%w: unsupported format spec %q for %s", ErrRender, spec, typeName(v))
		}
		body = toStr(v)
		if align == 0 {
			align = '<'
		}
	}
	n := utf8.RuneCountInString(signStr + body)
	if width <= n {
		return signStr + body, nil
	}
	if err := checkLen(width * 4); err != nil {
		return "", err
	}
	pad := width - n
	f := string(fill)
	switch align {
	case '<':
		return signStr + body + strings.Repeat(f, pad), nil
	case '^':
		return strings.Repeat(f, pad/2) + signStr + body + strings.Repeat(f, pad-pad/2), nil
	case '=':
		if !numeric {
			return "", fmt.Errorf("%w: '=' alignment not allowed in string format specifier", ErrRender)
		}
		return signStr + strings.Repeat(f, pad) + body, nil
	}
	return strings.Repeat(f, pad) + signStr + body, nil
}

// groupDigits inserts sep every three digits from the right.
func groupDigits(digits string, sep rune) string {
	if sep == 0 || len(digits) <= 3 {
		return digits
	}
	var b strings.Builder
	lead := len(digits) % 3
	if lead > 0 {
		b.WriteString(digits[:lead])
	}
	for i := lead; i < len(digits); i += 3 {
		if b.Len() > 0 {
			b.WriteRune(sep)
		}
		b.WriteString(digits[i : i+3])
	}
	return b.String()
}
