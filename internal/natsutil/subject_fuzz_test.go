package natsutil

import (
	"strings"
	"testing"
)

// FuzzParseStateSubject: a state-lane subject names one member in exactly
// one way: any member round-trips through StateSubject, and a subject that
// parses is the one StateSubject writes for its member (no second spelling,
// such as lower-case hex or an escaped safe byte, names the same member).
func FuzzParseStateSubject(f *testing.F) {
	for _, s := range []string{
		"kvmesh.state.ingress-0", "kvmesh.state.ing~2E1", "kvmesh.state.~", "kvmesh.state.",
		"kvmesh.state.a.b", "kvmesh.state.~2e", "kvmesh.state.~41", "kvmesh.state.~7E", "kvmesh.state.~4",
		"kvmesh.delta.m.e", "kvmesh.state.>", "kvmesh.state.*", "KVMESH.STATE.x", "kvmesh.state.~C3~A9",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// s as a member name.
		subj := StateSubject(s)
		if !strings.HasPrefix(subj, StatePrefix) || strings.ContainsAny(subj[len(StatePrefix):], ".*> \t\r\n") {
			t.Fatalf("StateSubject(%q) = %q is not one safe token", s, subj)
		}
		if m, ok := ParseStateSubject(subj); !ok || m != s {
			t.Fatalf("round trip of %q: %q, %v", s, m, ok)
		}
		// s as a subject from the wire.
		m, ok := ParseStateSubject(s)
		if !ok {
			if m != "" {
				t.Fatalf("refused %q but returned %q", s, m)
			}
			return
		}
		if StateSubject(m) != s {
			t.Fatalf("%q parses as member %q, whose subject is %q: two subjects for one member", s, m, StateSubject(m))
		}
	})
}
