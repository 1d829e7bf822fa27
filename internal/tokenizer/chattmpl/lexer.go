package chattmpl

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Lexing happens in two steps: split the source into text, output ({{ }})
// and statement ({% %}) segments applying whitespace control, then tokenize
// the inside of each tag.

type segKind uint8

const (
	segText segKind = iota
	segOutput
	segStmt
)

type segment struct {
	kind segKind
	text string // raw text, or the inside of the tag
	line int
}

// newlineRe is Jinja2's newline_re: every line ending counts as one.
var newlineRe = regexp.MustCompile(`\r\n|\r|\n`)

// endRawRe finds a raw block's end tag: {% endraw %} with its whitespace
// control ("-" on either side, "+" on the right).
var endRawRe = regexp.MustCompile(`\{%([-+]?)\s*endraw\s*([-+]?)%\}`)

// splitSegments applies Jinja's whitespace control with transformers'
// settings (trim_blocks and lstrip_blocks on): "-" strips all whitespace on
// that side; a statement or comment tag swallows one newline after it and the
// spaces and tabs before it on its line ("+" disables the latter). As
// Jinja2's lexer does, it first makes every line ending "\n" and drops one
// trailing newline (keep_trailing_newline is off), and it reads {% raw %}
// blocks as text. It is one scanning loop with its whitespace state, kept
// whole because the trim rules depend on both neighbours of every tag.
func splitSegments(src string) ([]segment, error) {
	if strings.ContainsRune(src, '\r') {
		src = newlineRe.ReplaceAllLiteralString(src, "\n")
	}
	src = strings.TrimSuffix(src, "\n")
	var segs []segment
	line := 1
	trimNextNewline := false
	stripNextSpace := false
	atStart := true
	for len(src) > 0 {
		i := indexTagStart(src)
		text := src
		if i >= 0 {
			text = src[:i]
		}
		if stripNextSpace {
			text = strings.TrimLeftFunc(text, pyIsSpace)
		} else if trimNextNewline {
			text = strings.TrimPrefix(text, "\n")
		}
		trimNextNewline, stripNextSpace = false, false
		if i < 0 {
			if text != "" {
				segs = append(segs, segment{segText, text, line})
			}
			break
		}
		open := src[i : i+2]
		rest := src[i+2:]
		leftStrip := strings.HasPrefix(rest, "-")
		leftKeep := strings.HasPrefix(rest, "+")
		if leftStrip || leftKeep {
			rest = rest[1:]
		}
		if leftStrip {
			text = strings.TrimRightFunc(text, pyIsSpace)
		} else if open != "{{" && !leftKeep {
			text = lstripBlock(text, src[:i], atStart)
		}
		atStart = false
		if text != "" {
			segs = append(segs, segment{segText, text, line})
		}
		line += strings.Count(src[:i], "\n")
		var closeTok string
		switch open {
		case "{{":
			closeTok = "}}"
		case "{%":
			closeTok = "%}"
		default:
			closeTok = "#}"
		}
		end := findClose(rest, closeTok, open == "{#")
		if end < 0 {
			return nil, fmt.Errorf("line %d: %w: unclosed %s", line, ErrSyntax, open)
		}
		inner := rest[:end]
		after := rest[end+2:]
		rightStrip := false
		if strings.HasSuffix(inner, "-") {
			inner = inner[:len(inner)-1]
			stripNextSpace, rightStrip = true, true
		} else if strings.HasSuffix(inner, "+") {
			inner = inner[:len(inner)-1]
		} else if open != "{{" {
			trimNextNewline = true
		}
		line += strings.Count(src[i:len(src)-len(after)], "\n")
		switch {
		case open == "{{":
			segs = append(segs, segment{segOutput, inner, line})
		case open == "{%" && strings.TrimSpace(inner) == "raw":
			// {% raw %}…{% endraw %}: text as written. The newline after
			// {% raw %} stays (Jinja2 applies trim_blocks to the end tag only).
			trimNextNewline, stripNextSpace = false, false
			m := endRawRe.FindStringSubmatchIndex(after)
			if m == nil {
				return nil, fmt.Errorf("line %d: %w: missing {%% endraw %%}", line, ErrSyntax)
			}
			body := after[:m[0]]
			if rightStrip {
				body = strings.TrimLeftFunc(body, pyIsSpace)
			}
			switch after[m[2]:m[3]] {
			case "-":
				body = strings.TrimRightFunc(body, pyIsSpace)
			case "":
				if j := strings.LastIndexByte(body, '\n'); j >= 0 && strings.Trim(body[j+1:], " \t") == "" {
					body = body[:j+1]
				}
			}
			if body != "" {
				segs = append(segs, segment{segText, body, line})
			}
			switch after[m[4]:m[5]] {
			case "-":
				stripNextSpace = true
			case "":
				trimNextNewline = true
			}
			line += strings.Count(after[:m[1]], "\n")
			after = after[m[1]:]
		case open == "{%":
			segs = append(segs, segment{segStmt, inner, line})
		}
		src = after
	}
	return segs, nil
}

// lstripBlock is lstrip_blocks: the spaces and tabs between the start of
// the line and a block tag go, judged on the source as written.
func lstripBlock(text, before string, atStart bool) string {
	j := strings.LastIndexByte(before, '\n')
	if strings.Trim(before[j+1:], " \t") == "" && (j >= 0 || atStart) {
		return strings.TrimRight(text, " \t")
	}
	return text
}

func indexTagStart(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findClose finds the closing delimiter, skipping string literals in tags
// and, as Jinja2's lexer does, any inside open brackets: `{{ {'a': {}} }}`
// ends at the last "}}".
func findClose(s, closeTok string, comment bool) int {
	if comment {
		return strings.Index(s, closeTok)
	}
	var quote byte
	depth := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quote != 0 {
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
			continue
		}
		if depth == 0 && strings.HasPrefix(s[i:], closeTok) {
			return i
		}
		switch c {
		case '\'', '"':
			quote = c
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return -1
}

type tokKind uint8

const (
	tkName tokKind = iota
	tkString
	tkInt
	tkFloat
	tkOp
	tkEOF
)

type token struct {
	kind tokKind
	s    string
}

var ops3 = []string{"**", "//", "==", "!=", "<=", ">="}

// Jinja2's number literals: floats (tried first) and integers with
// underscores and 0b/0o/0x prefixes.
var (
	floatRe = regexp.MustCompile(`^(?:\d+_)*\d+(?:(?:\.(?:\d+_)*\d+)?[eE][+\-]?(?:\d+_)*\d+|\.(?:\d+_)*\d+)`)
	intRe   = regexp.MustCompile(`^(?:0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0[xX](?:_?[0-9a-fA-F])+|[1-9](?:_?\d)*|0(?:_?0)*)`)
)

func tokenize(src string, line int) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(src) && (src[j] == '_' || src[j] >= 'a' && src[j] <= 'z' || src[j] >= 'A' && src[j] <= 'Z' || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			toks = append(toks, token{tkName, src[i:j]})
			i = j
		case c >= '0' && c <= '9':
			// (?<!\.): after a dot (foo.0.1) a float is not read
			if m := floatRe.FindString(src[i:]); m != "" && (i == 0 || src[i-1] != '.') {
				toks = append(toks, token{tkFloat, strings.ReplaceAll(m, "_", "")})
				i += len(m)
				continue
			}
			m := intRe.FindString(src[i:])
			if m == "" {
				return nil, fmt.Errorf("line %d: %w: bad number", line, ErrSyntax)
			}
			toks = append(toks, token{tkInt, strings.ReplaceAll(m, "_", "")})
			i += len(m)
		case c == '\'' || c == '"':
			s, n, err := unquote(src[i:])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			toks = append(toks, token{tkString, s})
			i += n
		default:
			op := string(c)
			for _, o := range ops3 {
				if strings.HasPrefix(src[i:], o) {
					op = o
					break
				}
			}
			if !strings.Contains("+-*/%~|.,:()[]{}=<>!", string(c)) || op == "!" {
				return nil, fmt.Errorf("line %d: %w: unexpected %q", line, ErrSyntax, c)
			}
			toks = append(toks, token{tkOp, op})
			i += len(op)
		}
	}
	return append(toks, token{kind: tkEOF}), nil
}

// unquote reads a string literal at the start of s and decodes it as
// Jinja2 does (Python's unicode-escape codec).
func unquote(s string) (string, int, error) {
	q := s[0]
	var sb strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			return sb.String(), i + 1, nil
		}
		if c != '\\' || i+1 >= len(s) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case '\n':
			// a line continuation
		case '\\', '\'', '"':
			sb.WriteByte(e)
		case 'a':
			sb.WriteByte('\a')
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'v':
			sb.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i
			for j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(s[i:j], 8, 32)
			sb.WriteRune(rune(v))
			i = j - 1
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("%w: truncated \\%c escape", ErrSyntax, e)
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil || v > 0x10ffff {
				return "", 0, fmt.Errorf("%w: bad \\%c escape", ErrSyntax, e)
			}
			sb.WriteRune(rune(v))
			i += n
		case 'N':
			return "", 0, fmt.Errorf("%w: \\N{...} escapes are not supported", ErrSyntax)
		default:
			sb.WriteByte('\\')
			sb.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
}
