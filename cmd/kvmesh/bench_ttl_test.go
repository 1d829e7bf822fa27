package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/loadtest/des"
)

// TestBenchDESSpeculativeTTLIsTheIngresss: the DES's index keeps a routed
// request's keys as cached for as long as a deployed ingress does, so a
// DES number measures the configuration the ingress ships.
func TestBenchDESSpeculativeTTLIsTheIngresss(t *testing.T) {
	var c des.Config
	c.Defaults()
	if want := ingress.DefaultConfig().SpeculativeTTL; c.SpeculativeTTL != want {
		t.Fatalf("the DES's speculative TTL %v, the ingress's default %v", c.SpeculativeTTL, want)
	}
}

// TestBenchSpeculativeTTLFlag: --speculative-ttl reaches the DES's index,
// aggregated and --roles: a TTL short enough that a routed request's keys
// lapse before its engine's events confirm them changes kvmesh's routing
// on a burst sharing prefixes, and a negative one is a usage error.
func TestBenchSpeculativeTTLFlag(t *testing.T) {
	shape := []string{"--groups", "4", "--prompts", "8", "--shared", "2048", "--question", "64", "--output", "32",
		"--policies", "kvmesh", "--json", "--quiet"}
	for _, run := range [][]string{
		{"--engines", "2", "--rate", "40"},
		{"--roles", "prefill=2,decode=2", "--rate", "200"},
	} {
		res := func(extra ...string) string {
			args := slices.Concat([]string{"bench", "--mode", "des"}, run, shape, extra)
			code, out, errOut := benchRunCLI(t, args...)
			if code != 0 {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}
			var rep struct {
				Policies map[string]json.RawMessage `json:"policies"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Policies["kvmesh"] == nil {
				t.Fatalf("%v: %v\n%s", args, err, out)
			}
			return string(rep.Policies["kvmesh"])
		}
		if def, short := res(), res("--speculative-ttl", "1ms"); def == short {
			t.Errorf("%v: --speculative-ttl 1ms ran as the default:\n%s", run, def)
		}
	}
	code, _, errOut := benchRunCLI(t, "bench", "--mode", "des", "--speculative-ttl", "-1s")
	if code != 2 {
		t.Errorf("--speculative-ttl -1s: exit %d (%s), want the usage error's 2", code, errOut)
	}
}
