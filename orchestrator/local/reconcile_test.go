package local

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
)

// countBackend is a Backend of named replicas that records Scale calls.
type countBackend struct{ n map[string]int }

func (b *countBackend) Replicas(md, role string) []string {
	var out []string
	for i := range b.n[role] {
		out = append(out, fmt.Sprintf("%s-%s-%d", md, role, i))
	}
	return out
}

func (b *countBackend) Scale(_ context.Context, _, role string, n int) error {
	b.n[role] = n
	return nil
}

// TestPolicyRunnerAppliesAutoscale: the gossiped load of a role's replicas
// feeds autoscale; its decision (rate-limited, ratio-repaired) is what the
// backend is scaled to.
func TestPolicyRunnerAppliesAutoscale(t *testing.T) {
	spec, err := ParseSpec([]byte(pdSpec))
	if err != nil {
		t.Fatal(err)
	}
	md := &spec.Deployments[0]
	pr, err := newPolicyRunner(*spec.policyFor("demo"))
	if err != nil {
		t.Fatal(err)
	}
	b := &countBackend{n: map[string]int{"prefill": 1, "decode": 1}}
	// decode runs 20 streams (target 8 per replica), prefill is idle.
	load := stubLoad{
		{EngineState: gossip.EngineState{ID: "demo-decode-0", Running: 20}},
		{EngineState: gossip.EngineState{ID: "demo-prefill-0"}},
		{EngineState: gossip.EngineState{ID: "other-decode-0", Running: 500}}, // not this deployment's
	}
	if err := pr.step(context.Background(), time.Unix(100, 0), md, b, load, nil); err != nil {
		t.Fatal(err)
	}
	// Panic (20/8 ≥ 2 × 1) doubles decode at most: 2; prefill 1 keeps the
	// ratio 0.5 inside [0.5, 2].
	if b.n["decode"] != 2 || b.n["prefill"] != 1 {
		t.Fatalf("scaled to %v, want decode 2 prefill 1", b.n)
	}
	if err := pr.step(context.Background(), time.Unix(101, 0), md, b, load, nil); err != nil {
		t.Fatal(err)
	}
	if b.n["decode"] != 3 || b.n["prefill"] != 2 {
		t.Fatalf("second step scaled to %v, want decode 3 (ceil 20/8) and prefill raised to 2 by the band", b.n)
	}
	if pr.last.Ratio == nil || !pr.last.Ratio.Adjusted {
		t.Errorf("ratio result %+v: want the band's repair", pr.last.Ratio)
	}
}
