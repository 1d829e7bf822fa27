package natsutil

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// DefaultPrefix is the subject prefix of an installation that sets none
// (--nats-prefix): its subjects and stream are those of every release
// before the prefix existed (kvmesh.delta.>, KVMESH_DELTAS).
const DefaultPrefix = "kvmesh"

// MaxPrefixLen bounds a prefix: it starts every subject kvmesh publishes.
const MaxPrefixLen = 64

// Subjects are the subject and stream names of one installation (DESIGN.md
// Contract 2), all derived from its prefix P:
//
//	P.delta.<model>.<engine>  deltas, captured by the stream Stream()
//	P.snap.<model>.<engine>   snapshot requests
//	P.state.<member>          the state lane (core NATS, no stream)
//
// Stream() is P upper-cased with each '.' made '_', then "_DELTAS":
// "kvmesh" gives KVMESH_DELTAS, "team-a.kvmesh" TEAM-A_KVMESH_DELTAS. A
// prefix holds no upper-case letter and no '_' (ValidatePrefix), so two
// prefixes never share a stream. Build one with NewSubjects; the zero value
// is Default(). Every method is allocation-free except the ones that build
// a subject for a name.
type Subjects struct {
	prefix, deltaPrefix, snapPrefix, statePrefix string
	deltaWildcard, stateWildcard, stream         string
	tokenizers                                   string
}

var defaultSubjects = func() Subjects {
	s, err := NewSubjects(DefaultPrefix)
	if err != nil {
		panic(err)
	}
	return s
}()

// Default is the subjects of DefaultPrefix.
func Default() Subjects { return defaultSubjects }

// NewSubjects validates prefix (ValidatePrefix; "" is DefaultPrefix) and
// derives its subjects and stream name.
func NewSubjects(prefix string) (Subjects, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := ValidatePrefix(prefix); err != nil {
		return Subjects{}, err
	}
	return Subjects{
		prefix:        prefix,
		deltaPrefix:   prefix + ".delta.",
		snapPrefix:    prefix + ".snap.",
		statePrefix:   prefix + ".state.",
		deltaWildcard: prefix + ".delta.>",
		stateWildcard: prefix + ".state.>",
		stream:        StreamNameFor(prefix),
		tokenizers:    strings.TrimSuffix(StreamNameFor(prefix), "_DELTAS") + "_TOKENIZERS",
	}, nil
}

// ErrPrefix is wrapped by every error of ValidatePrefix.
var ErrPrefix = errors.New("invalid nats prefix")

// ValidatePrefix reports whether p can prefix kvmesh's subjects: one or
// more NATS subject tokens separated by '.', each made of lower-case ASCII
// letters, digits and '-', at most MaxPrefixLen bytes in all. Wildcards
// ('*', '>'), whitespace, empty tokens and '$' (the server's own subjects)
// are out by the first rule; upper case and '_' so that the stream name
// (StreamNameFor) is one prefix's alone. The tokens delta, snap and state
// are out too: with them one prefix's wildcards would capture another's
// subjects ("a" takes a.delta.> and with it everything of "a.delta").
func ValidatePrefix(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty", ErrPrefix)
	}
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrPrefix, len(p), MaxPrefixLen)
	}
	tokenStart := true
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '.':
			if tokenStart {
				return fmt.Errorf("%w: %q has an empty token (want tokens separated by single dots, such as team-a.kvmesh)", ErrPrefix, p)
			}
			tokenStart = true
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-':
			tokenStart = false
		default:
			r, _ := utf8.DecodeRuneInString(p[i:]) // the character, not its first byte ("é", not "Ã")
			return fmt.Errorf("%w: %q: %q at byte %d: want lower-case letters, digits, '-' and '.' between tokens", ErrPrefix, p, r, i)
		}
	}
	if tokenStart {
		return fmt.Errorf("%w: %q ends with a dot", ErrPrefix, p)
	}
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "delta" || tok == "snap" || tok == "state" {
			return fmt.Errorf("%w: %q: the token %q is reserved (another prefix's subjects would overlap)", ErrPrefix, p, tok)
		}
	}
	return nil
}

// StreamNameFor is the delta stream's name for a valid prefix: upper case,
// '.' made '_', then "_DELTAS" (JetStream stream names hold no '.', '*',
// '>' or whitespace).
func StreamNameFor(prefix string) string {
	b := []byte(strings.ToUpper(prefix))
	for i, c := range b {
		if c == '.' {
			b[i] = '_'
		}
	}
	return string(b) + "_DELTAS"
}

// or is s, or Default() for the zero value.
func (s *Subjects) or() *Subjects {
	if s.prefix == "" {
		return &defaultSubjects
	}
	return s
}

// Prefix is the prefix the subjects derive from.
func (s Subjects) Prefix() string { return s.or().prefix }

// DeltaWildcard() captures every delta (P.delta.>).
func (s Subjects) DeltaWildcard() string { return s.or().deltaWildcard }

// StateWildcard() captures every state-lane message (P.state.>).
func (s Subjects) StateWildcard() string { return s.or().stateWildcard }

// StatePrefix() starts every state-lane subject (P.state.).
func (s Subjects) StatePrefix() string { return s.or().statePrefix }

// Stream is the JetStream stream capturing DeltaWildcard().
func (s Subjects) Stream() string { return s.or().stream }

// TokenizerBucket is the installation's tokenizer object store
// (internal/tokenstore): Stream() with "_TOKENIZERS" for "_DELTAS", so
// "kvmesh" gives KVMESH_TOKENIZERS, "team-a.kvmesh" TEAM-A_KVMESH_TOKENIZERS.
func (s Subjects) TokenizerBucket() string { return s.or().tokenizers }

// StateSubject is the subject a gossip member publishes its own entries on.
func (s Subjects) StateSubject(member string) string {
	return s.or().statePrefix + EscapeToken(member)
}

// ParseStateSubject returns the (unescaped) member name of a state subject.
func (s Subjects) ParseStateSubject(subject string) (member string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.or().statePrefix)
	if !found || strings.Contains(rest, ".") {
		return "", false
	}
	return UnescapeToken(rest)
}

// DeltaSubject is the subject one engine's deltas are published on.
func (s Subjects) DeltaSubject(model, engine string) string {
	return s.or().deltaPrefix + EscapeToken(model) + "." + EscapeToken(engine)
}

// SnapSubject is the request subject one engine's sidecar answers snapshots on.
func (s Subjects) SnapSubject(model, engine string) string {
	return s.or().snapPrefix + EscapeToken(model) + "." + EscapeToken(engine)
}

// ParseDeltaSubject returns the (unescaped) model and engine of a delta subject.
func (s Subjects) ParseDeltaSubject(subject string) (model, engine string, ok bool) {
	rest, found := strings.CutPrefix(subject, s.or().deltaPrefix)
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
func (s Subjects) IsDeltaSubject(subject, model, engine string) bool {
	rest, ok := strings.CutPrefix(subject, s.or().deltaPrefix)
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
