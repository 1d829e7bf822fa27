package autoscale

import (
	"strings"
	"testing"
)

// TestValidateSLORoles: the SLO mode's prefill and decode roles must be
// roles the policy scales, as the ratio's must; otherwise the SLO mode
// sizes nothing and says nothing.
func TestValidateSLORoles(t *testing.T) {
	for _, c := range []struct{ prefill, decode string }{{"nosuch", "decode"}, {"prefill", "nosuch"}, {"", ""}} {
		p := DefaultPolicy()
		p.Roles = map[string]RolePolicy{"prefill": {Bounds: Bounds{1, 4}}, "decode": {Bounds: Bounds{1, 4}}}
		p.SLO = &SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, DecodeStreamsPerReplica: 10}
		p.SLOPrefill, p.SLODecode = c.prefill, c.decode
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), "slo:") {
			t.Errorf("prefill %q decode %q: got %v, want an slo error", c.prefill, c.decode, err)
		}
	}
	p := DefaultPolicy()
	p.Roles = map[string]RolePolicy{"prefill": {Bounds: Bounds{1, 4}}, "decode": {Bounds: Bounds{1, 4}}}
	p.SLO = &SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, DecodeStreamsPerReplica: 10}
	p.SLOPrefill, p.SLODecode = "prefill", "decode"
	if err := p.Validate(); err != nil {
		t.Errorf("scaled SLO roles refused: %v", err)
	}
}
