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
		subj := Default().StateSubject(s)
		if !strings.HasPrefix(subj, Default().StatePrefix()) || strings.ContainsAny(subj[len(Default().StatePrefix()):], ".*> \t\r\n") {
			t.Fatalf("Default().StateSubject(%q) = %q is not one safe token", s, subj)
		}
		if m, ok := Default().ParseStateSubject(subj); !ok || m != s {
			t.Fatalf("round trip of %q: %q, %v", s, m, ok)
		}
		// s as a subject from the wire.
		m, ok := Default().ParseStateSubject(s)
		if !ok {
			if m != "" {
				t.Fatalf("refused %q but returned %q", s, m)
			}
			return
		}
		if Default().StateSubject(m) != s {
			t.Fatalf("%q parses as member %q, whose subject is %q: two subjects for one member", s, m, Default().StateSubject(m))
		}
	})
}

// FuzzIsDeltaSubject: IsDeltaSubject, the ingress's allocation-free check
// that a delta's body names the engine and model of its subject, agrees
// with DeltaSubject and ParseDeltaSubject for any subject, model and engine.
func FuzzIsDeltaSubject(f *testing.F) {
	f.Add("kvmesh.delta.m.e1", "m", "e1")
	f.Add("kvmesh.delta.m.127~2E0~2E0~2E1~3A45001", "m", "127.0.0.1:45001")
	f.Add("kvmesh.delta.attacker.whatever", "m", "127.0.0.1:45001")
	f.Add("kvmesh.delta.~.~", "", "")
	f.Add("kvmesh.delta.m.e1.x", "m", "e1")
	f.Add("kvmesh.delta.m.~65", "m", "e")
	f.Fuzz(func(t *testing.T, subject, model, engine string) {
		if !Default().IsDeltaSubject(Default().DeltaSubject(model, engine), model, engine) {
			t.Fatalf("Default().DeltaSubject(%q, %q) = %q refused", model, engine, Default().DeltaSubject(model, engine))
		}
		pm, pe, ok := Default().ParseDeltaSubject(subject)
		want := ok && pm == model && pe == engine
		if got := Default().IsDeltaSubject(subject, model, engine); got != want {
			t.Fatalf("Default().IsDeltaSubject(%q, %q, %q) = %v; ParseDeltaSubject gives %q, %q, %v", subject, model, engine, got, pm, pe, ok)
		}
	})
}
