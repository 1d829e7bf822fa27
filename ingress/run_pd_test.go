package ingress

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestRunWarnsOfPDWithoutPrefill: a P/D policy with static engines none of
// which can prefill (the positional --engine form is always mixed) is
// warned of at start, naming why and how to give a role; it ran without a
// word and never disaggregated a request.
func TestRunWarnsOfPDWithoutPrefill(t *testing.T) {
	for _, c := range []struct {
		name    string
		engines []StaticEngine
		policy  string
		warn    bool
	}{
		{"mixed only", []StaticEngine{{ID: "a", Model: "m", URL: "http://127.0.0.1:1"}}, "kvmesh", true},
		{"a prefill engine", []StaticEngine{{ID: "a", Model: "m", URL: "http://127.0.0.1:1", Role: "prefill"},
			{ID: "b", Model: "m", URL: "http://127.0.0.1:2", Role: "decode"}}, "kvmesh", false},
		{"no P/D", []StaticEngine{{ID: "a", Model: "m", URL: "http://127.0.0.1:1"}}, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Config.Listen, o.Config.Engines, o.Config.PD.Policy = "127.0.0.1:0", c.engines, c.policy
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // Run starts, then drains at once
			var stderr testutil.SyncBuffer
			if err := Run(ctx, o, io.Discard, &stderr); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(stderr.String(), "no engine can prefill")
			if warned != c.warn || warned && !strings.Contains(stderr.String(), "role=prefill") {
				t.Errorf("warned %v, want %v: %s", warned, c.warn, stderr.String())
			}
		})
	}
}
