package webhook

import "testing"

func TestParseService(t *testing.T) {
	for in, want := range map[string]struct {
		ns, name string
		port     int32
	}{
		"kvmesh/webhook":      {"kvmesh", "webhook", 443},
		"kvmesh/webhook:8443": {"kvmesh", "webhook", 8443},
	} {
		ns, name, port, err := ParseService(in)
		if err != nil || ns != want.ns || name != want.name || port != want.port {
			t.Errorf("%q: %q %q %d %v, want %v", in, ns, name, port, err, want)
		}
	}
	// An empty name would make certificate hosts like ".ns.svc" (tester
	// h-fuzz F3).
	for _, in := range []string{"ns/:443", "ns/", "/svc", "svc", "ns/svc:0", "ns/svc:65536", "ns/svc:x"} {
		if ns, name, port, err := ParseService(in); err == nil {
			t.Errorf("%q: accepted as %q %q %d", in, ns, name, port)
		}
	}
}
