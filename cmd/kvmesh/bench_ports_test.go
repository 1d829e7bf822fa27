package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/loadtest/demo"
)

// TestPortBaseUsage: --port-base is 0 or a base whose ports (NATS, 4 per
// engine, 2 per ingress; the P/D demo's 2 per engine and its ingress) all
// fit under 65535, read by live bench runs and the aggregated and P/D demos
// (the P/D demo refused it); anything else is a usage error saying why.
func TestPortBaseUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--mode", "live", "--engines", "2", "--ingresses", "1", "--port-base", "65529"},
			"--port-base: port base 65529: NATS, 2 engines with their sidecars and 1 ingresses take 11 ports, 65529..65539, past 65535 (want a base ≤ 65525)"},
		{[]string{"bench", "--mode", "live", "--port-base", "-5"}, "--port-base: port base -5: want 1..65535, or 0 for ephemeral ports"},
		{[]string{"bench", "--mode", "live", "--port-base", "70000"}, "want 1..65535"},
		{[]string{"bench", "--mode", "des", "--port-base", "30000"}, "--port-base is not read by a --mode des run"},
		{[]string{"demo", "--port-base", "65530"}, "port base 65530: NATS, 4 engines with their sidecars and 2 ingresses take 21 ports, 65530..65550, past 65535"},
		{[]string{"demo", "--engines", "64", "--ingresses", "16", "--port-base", "65300"}, "take 289 ports"},
		{[]string{"demo", "--pd", "--port-base", "65530"}, "port base 65530: the P/D demo's engines and ingress take 9 ports, 65530..65538, past 65535"},
		{[]string{"demo", "--autoscale", "--port-base", "30000"}, "--port-base is not read by a --autoscale run"},
	} {
		code, _, errOut := benchRunCLI(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// TestBenchLivePortBase runs a small live benchmark at a probed port base:
// it runs and says where it listened (TestClusterPortBase in loadtest/demo
// checks each listener is at its documented port).
func TestBenchLivePortBase(t *testing.T) {
	n := demo.MeshPorts(2, 1)
	for attempt := 0; ; attempt++ {
		base := testutil.FreePortBase(t, n)
		code, out, errOut := benchRunCLI(t, "bench", "--mode", "live", "--engines", "2", "--ingresses", "1", "--policies", "random",
			"--groups", "2", "--prompts", "2", "--shared", "64", "--question", "16", "--output", "4", "--quiet", "--port-base", fmt.Sprint(base))
		if code != 0 && attempt < 4 && strings.Contains(errOut, "address already in use") {
			continue // taken since probed
		}
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if want := fmt.Sprintf("live: listening on 127.0.0.1 ports %d..%d (--port-base)", base, base+n-1); !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
		return
	}
}
