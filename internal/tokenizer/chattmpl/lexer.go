package chattmpl

import (
	"fmt"
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

// splitSegments applies Jinja's whitespace control with transformers'
// settings (trim_blocks and lstrip_blocks on): "-" strips all whitespace on
// that side; a statement or comment tag swallows one newline after it and the
// spaces and tabs before it on its line ("+" disables the latter). It is one
// scanning loop with its whitespace state (~85 lines), kept whole because
// the trim rules depend on both neighbours of every tag.
func splitSegments(src string) ([]segment, error) {
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
			text = strings.TrimLeft(text, " \t\r\n")
		} else if trimNextNewline {
			if strings.HasPrefix(text, "\r\n") {
				text = text[2:]
			} else if strings.HasPrefix(text, "\n") {
				text = text[1:]
			}
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
			text = strings.TrimRight(text, " \t\r\n")
		} else if open != "{{" && !leftKeep {
			// lstrip_blocks: drop spaces/tabs between line start and the tag,
			// judged on the source as written.
			orig := src[:i]
			j := strings.LastIndexByte(orig, '\n')
			if strings.Trim(orig[j+1:], " \t") == "" && (j >= 0 || atStart) {
				text = strings.TrimRight(text, " \t")
			}
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
		if strings.HasSuffix(inner, "-") {
			inner = inner[:len(inner)-1]
			stripNextSpace = true
		} else if strings.HasSuffix(inner, "+") {
			inner = inner[:len(inner)-1]
		} else if open != "{{" {
			trimNextNewline = true
		}
		switch open {
		case "{{":
			segs = append(segs, segment{segOutput, inner, line})
		case "{%":
			segs = append(segs, segment{segStmt, inner, line})
		}
		line += strings.Count(src[i:len(src)-len(after)], "\n")
		src = after
	}
	return segs, nil
}

func indexTagStart(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '{' && (s[i+1] == '{' || s[i+1] == '%' || s[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findClose finds the closing delimiter, skipping string literals in tags.
func findClose(s, closeTok string, comment bool) int {
	if comment {
		return strings.Index(s, closeTok)
	}
	var quote byte
	for i := 0; i+1 < len(s); i++ {
		c := s[i]
		if quote != 0 {
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
			continue
		}
		if c == '\'' || c == '"' {
			quote = c
			continue
		}
		if s[i:i+2] == closeTok {
			return i
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
			j := i
			isFloat := false
			for j < len(src) && (src[j] >= '0' && src[j] <= '9' || src[j] == '_' ||
				src[j] == '.' && !isFloat && j+1 < len(src) && src[j+1] >= '0' && src[j+1] <= '9') {
				if src[j] == '.' {
					isFloat = true
				}
				j++
			}
			k := tkInt
			if isFloat {
				k = tkFloat
			}
			toks = append(toks, token{k, strings.ReplaceAll(src[i:j], "_", "")})
			i = j
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
			if !strings.Contains("+-*/%~|.,:()[]{}=<>!", string(c)) {
				return nil, fmt.Errorf("line %d: %w: unexpected %q", line, ErrSyntax, c)
			}
			toks = append(toks, token{tkOp, op})
			i += len(op)
		}
	}
	return append(toks, token{kind: tkEOF}), nil
}

// unquote reads a Python string literal at the start of s.
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
		switch s[i] {
		case 'n':
			sb.WriteByte('\n')
		case 't':
			sb.WriteByte('\t')
		case 'r':
			sb.WriteByte('\r')
		case '\\', '\'', '"':
			sb.WriteByte(s[i])
		case 'u', 'x':
			n := 4
			if s[i] == 'x' {
				n = 2
			}
			if i+n < len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32); err == nil {
					sb.WriteRune(rune(v))
					i += n
					continue
				}
			}
			sb.WriteByte('\\')
			sb.WriteByte(s[i])
		default:
			sb.WriteByte('\\')
			sb.WriteByte(s[i])
		}
	}
	return "", 0, fmt.Errorf("%w: unterminated string", ErrSyntax)
}
