package natsutil

import (
	"strings"
)

// Subject names of DESIGN.md Contract 2.
const (
	DeltaPrefix   = "kvmesh.delta."
	SnapPrefix    = "kvmesh.snap."
	DeltaWildcard = "kvmesh.delta.>"
	// StreamName is the JetStream stream that captures DeltaWildcard.
	StreamName = "KVMESH_DELTAS"
	// StatePrefix and StateWildcard: the state lane (core NATS, no
	// stream). Each gossip member publishes its own changed gossip entries
	// on StateSubject(its member name); ingresses subscribe to all.
	StatePrefix   = "kvmesh.state."
	StateWildcard = "kvmesh.state.>"
)

// StateSubject is the subject a gossip member publishes its own entries on.
func StateSubject(member string) string { return StatePrefix + EscapeToken(member) }

// ParseStateSubject returns the (unescaped) member name of a state subject.
func ParseStateSubject(subject string) (member string, ok bool) {
	rest, found := strings.CutPrefix(subject, StatePrefix)
	if !found || strings.Contains(rest, ".") {
		return "", false
	}
	return UnescapeToken(rest)
}

// DeltaSubject is the subject one engine's deltas are published on.
func DeltaSubject(model, engine string) string {
	return DeltaPrefix + EscapeToken(model) + "." + EscapeToken(engine)
}

// SnapSubject is the request subject one engine's sidecar answers snapshots on.
func SnapSubject(model, engine string) string {
	return SnapPrefix + EscapeToken(model) + "." + EscapeToken(engine)
}

// ParseDeltaSubject returns the (unescaped) model and engine of a delta subject.
func ParseDeltaSubject(subject string) (model, engine string, ok bool) {
	rest, found := strings.CutPrefix(subject, DeltaPrefix)
	if !found {
		return "", "", false
	}
	m, e, found := strings.Cut(rest, ".")
	if !found || strings.Contains(e, ".") {
		return "", "", false
	}
	if model, ok = UnescapeToken(m); !ok {
		return "", "", false
	}
	if engine, ok = UnescapeToken(e); !ok {
		return "", "", false
	}
	return model, engine, true
}

// IsDeltaSubject reports whether subject is DeltaSubject(model, engine),
// without allocating (it runs for every delta an ingress receives). Escaping
// is canonical, so it is true exactly when ParseDeltaSubject(subject) gives
// model and engine.
func IsDeltaSubject(subject, model, engine string) bool {
	rest, ok := strings.CutPrefix(subject, DeltaPrefix)
	if !ok {
		return false
	}
	if rest, ok = cutEscaped(rest, model); !ok {
		return false
	}
	if rest, ok = strings.CutPrefix(rest, "."); !ok {
		return false
	}
	rest, ok = cutEscaped(rest, engine)
	return ok && rest == ""
}

// cutEscaped returns s after its prefix EscapeToken(name); ok is false
// when s does not start with it.
func cutEscaped(s, name string) (rest string, ok bool) {
	if name == "" {
		return strings.CutPrefix(s, "~")
	}
	const hex = "0123456789ABCDEF"
	j := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		if tokenSafe(c) {
			if j >= len(s) || s[j] != c {
				return "", false
			}
			j++
			continue
		}
		if j+2 >= len(s) || s[j] != '~' || s[j+1] != hex[c>>4] || s[j+2] != hex[c&15] {
			return "", false
		}
		j += 3
	}
	return s[j:], true
}

// EscapeToken makes s one NATS subject token that any tool accepts: ASCII
// letters, digits, '-' and '_' pass through; every other byte (including '.',
// '*', '>', '/', spaces and '~' itself) becomes "~XX" (hex). The result is
// reversible, never empty ("" becomes "~"), and stable across releases because
// subjects are the contract with operators' nats CLI commands.
func EscapeToken(s string) string {
	if s == "" {
		return "~"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !tokenSafe(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if tokenSafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('~')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// UnescapeToken reverses EscapeToken; ok is false for a token EscapeToken
// cannot have produced.
func UnescapeToken(t string) (string, bool) {
	if t == "~" {
		return "", true
	}
	if !strings.Contains(t, "~") {
		for i := 0; i < len(t); i++ {
			if !tokenSafe(t[i]) {
				return "", false
			}
		}
		return t, t != ""
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c != '~' {
			if !tokenSafe(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(t) {
			return "", false
		}
		hi, ok1 := unhex(t[i+1])
		lo, ok2 := unhex(t[i+2])
		if !ok1 || !ok2 || tokenSafe(hi<<4|lo) {
			return "", false // escaping a safe byte is not canonical: two names for one engine
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), true
}

func tokenSafe(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	default:
		return 0, false
	}
}
