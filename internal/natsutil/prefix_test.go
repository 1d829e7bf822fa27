package natsutil

import (
	"errors"
	"strings"
	"testing"
)

// TestDefaultPrefixKeepsTodaysNames: an installation that sets no prefix
// uses exactly the subjects and stream of every release before the prefix
// (an upgrade changes nothing on the wire), and "" means the default.
func TestDefaultPrefixKeepsTodaysNames(t *testing.T) {
	for _, s := range []Subjects{Default(), {}, must(t, ""), must(t, "kvmesh")} {
		for got, want := range map[string]string{
			s.Prefix():                         "kvmesh",
			s.Stream():                         "KVMESH_DELTAS",
			s.TokenizerBucket():                "KVMESH_TOKENIZERS",
			s.DeltaWildcard():                  "kvmesh.delta.>",
			s.StateWildcard():                  "kvmesh.state.>",
			s.StatePrefix():                    "kvmesh.state.",
			s.DeltaSubject("m", "127.0.0.1:1"): "kvmesh.delta.m.127~2E0~2E0~2E1~3A1",
			s.SnapSubject("m", "e1"):           "kvmesh.snap.m.e1",
			s.StateSubject("ingress-0"):        "kvmesh.state.ingress-0",
		} {
			if got != want {
				t.Errorf("got %q, want %q", got, want)
			}
		}
	}
}

func must(t *testing.T, prefix string) Subjects {
	t.Helper()
	s, err := NewSubjects(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPrefixNamesEverything: a prefix P gives P.delta, P.snap, P.state and
// its own stream, and the subjects of another prefix do not parse.
func TestPrefixNamesEverything(t *testing.T) {
	a, b := must(t, "team-a.kvmesh"), must(t, "team-b")
	if a.Stream() != "TEAM-A_KVMESH_DELTAS" || b.Stream() != "TEAM-B_DELTAS" {
		t.Fatalf("streams %q, %q", a.Stream(), b.Stream())
	}
	if a.TokenizerBucket() != "TEAM-A_KVMESH_TOKENIZERS" || b.TokenizerBucket() != "TEAM-B_TOKENIZERS" {
		t.Fatalf("tokenizer buckets %q, %q", a.TokenizerBucket(), b.TokenizerBucket())
	}
	if got := a.DeltaSubject("m", "e1"); got != "team-a.kvmesh.delta.m.e1" {
		t.Fatalf("delta subject %q", got)
	}
	if got := b.SnapSubject("m", "e1"); got != "team-b.snap.m.e1" {
		t.Fatalf("snap subject %q", got)
	}
	if got := b.StateSubject("i0"); got != "team-b.state.i0" || b.StateWildcard() != "team-b.state.>" || b.DeltaWildcard() != "team-b.delta.>" {
		t.Fatalf("state subject %q, wildcards %q %q", got, b.StateWildcard(), b.DeltaWildcard())
	}
	for _, s := range []Subjects{a, Default()} {
		if _, _, ok := s.ParseDeltaSubject(b.DeltaSubject("m", "e1")); ok {
			t.Errorf("%s parses %s's delta subject", s.Prefix(), b.Prefix())
		}
		if s.IsDeltaSubject(b.DeltaSubject("m", "e1"), "m", "e1") {
			t.Errorf("%s takes %s's delta subject", s.Prefix(), b.Prefix())
		}
		if _, ok := s.ParseStateSubject(b.StateSubject("i0")); ok {
			t.Errorf("%s parses %s's state subject", s.Prefix(), b.Prefix())
		}
	}
	if m, e, ok := b.ParseDeltaSubject("team-b.delta.m.e1"); !ok || m != "m" || e != "e1" {
		t.Fatalf("parse: %q %q %v", m, e, ok)
	}
}

// TestInvalidPrefixRefused: a prefix that is not dot-separated tokens of
// [a-z0-9-] is refused by NewSubjects and by Config.Validate (so every
// component refuses it at start), naming the problem.
func TestInvalidPrefixRefused(t *testing.T) {
	for _, p := range []string{".", "a.", ".a", "a..b", "a.*", "a.>", ">", "a b", "a\tb", "Team", "team_a", "$sys", "a/b", "é", "a.delta", "snap", "x.state.y", strings.Repeat("a", MaxPrefixLen+1)} {
		if _, err := NewSubjects(p); !errors.Is(err, ErrPrefix) {
			t.Errorf("NewSubjects(%q) = %v, want ErrPrefix", p, err)
		}
		c := DefaultConfig()
		c.Prefix = p
		if err := c.Validate(); !errors.Is(err, ErrConfig) || !errors.Is(err, ErrPrefix) || !strings.Contains(err.Error(), "prefix") {
			t.Errorf("Validate with prefix %q = %v", p, err)
		}
	}
	// The refusal names the character, not its first byte.
	if _, err := NewSubjects("caf\u00e9"); err == nil || !strings.Contains(err.Error(), "'\u00e9' at byte 3") {
		t.Errorf("NewSubjects(café) = %v, want the character named", err)
	}
	c := DefaultConfig()
	c.Prefix = "team-a.kvmesh"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestIsDeltaSubjectAllocatesNothing: the per-delta check stays
// allocation-free with a prefix, as with the default.
func TestIsDeltaSubjectAllocatesNothing(t *testing.T) {
	for _, s := range []Subjects{{}, must(t, "team-a.kvmesh")} {
		subject := s.DeltaSubject("m", "127.0.0.1:45001")
		if n := testing.AllocsPerRun(100, func() {
			if !s.IsDeltaSubject(subject, "m", "127.0.0.1:45001") {
				t.Fatal("refused")
			}
		}); n != 0 {
			t.Fatalf("prefix %q: %v allocations", s.Prefix(), n)
		}
	}
}

// FuzzPrefix: any prefix is refused or gives subjects that are valid NATS
// subjects and a valid JetStream stream name that no other prefix has, and
// its subjects round-trip.
func FuzzPrefix(f *testing.F) {
	for _, p := range []string{"kvmesh", "team-a.kvmesh", "a", "A", "a_b", "a.b", "a..b", "a.*", "", " ", "a-b.c-d", "0"} {
		f.Add(p, "a.b")
	}
	f.Fuzz(func(t *testing.T, p, q string) {
		s, err := NewSubjects(p)
		if err != nil {
			if !errors.Is(err, ErrPrefix) {
				t.Fatalf("NewSubjects(%q): %v is not ErrPrefix", p, err)
			}
			return
		}
		if p != "" && s.Prefix() != p {
			t.Fatalf("prefix %q became %q", p, s.Prefix())
		}
		name := s.Stream()
		if name == "" || strings.ContainsAny(name, ".*> \t\r\n/\\") || len(name) > 255 {
			t.Fatalf("prefix %q: invalid stream name %q", p, name)
		}
		// An object store's name: letters, digits, '-' and '_' only.
		if b := s.TokenizerBucket(); b == "" || strings.Trim(b, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" || b == name {
			t.Fatalf("prefix %q: invalid tokenizer bucket %q", p, b)
		}
		for _, subj := range []string{s.DeltaWildcard(), s.StateWildcard(), s.DeltaSubject("m", "e"), s.SnapSubject("m", "e")} {
			for _, tok := range strings.Split(strings.TrimSuffix(subj, ".>"), ".") {
				if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
					t.Fatalf("prefix %q: invalid subject %q", p, subj)
				}
			}
		}
		if m, e, ok := s.ParseDeltaSubject(s.DeltaSubject("m.x", "e")); !ok || m != "m.x" || e != "e" {
			t.Fatalf("prefix %q: delta round trip %q %q %v", p, m, e, ok)
		}
		if r, err := NewSubjects(q); err == nil && r.Prefix() != s.Prefix() {
			if r.Stream() == s.Stream() || r.TokenizerBucket() == s.TokenizerBucket() {
				t.Fatalf("prefixes %q and %q share the stream %q or the bucket %q", p, q, s.Stream(), s.TokenizerBucket())
			}
			for _, other := range []string{r.DeltaSubject("m", "e"), r.SnapSubject("m", "e"), r.StateSubject("i")} {
				for _, mine := range []string{s.deltaPrefix, s.snapPrefix, s.statePrefix} {
					if strings.HasPrefix(other, mine) {
						t.Fatalf("prefix %q's %q captures %q's subject %q", p, mine, q, other)
					}
				}
			}
		}
	})
}
