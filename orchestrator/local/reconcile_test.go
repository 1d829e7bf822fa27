package local

import (
	"context"
	"fmt"
	"strings"
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

// TestEditedPolicyKeepsCooldown: an edit of the policy in the file (only
// decode's maxReplicas 3 -> 4) keeps the runner's state, so decode, scaled
// up 29 s ago and idle since, stays at 3 for the rest of its 300 s
// scale-down cool-down instead of being halved at the first step after the
// edit.
func TestEditedPolicyKeepsCooldown(t *testing.T) {
	doc := strings.Replace(pdSpec, "  target: demo\n", "  target: demo\n  stableWindowSeconds: 10\n  panicWindowSeconds: 5\n  scaleDownCooldownSeconds: 300\n", 1)
	spec, err := ParseSpec([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	md := &spec.Deployments[0]
	o := &Orchestrator{runners: map[string]*policyRunner{}}
	pr, err := o.runnerFor("demo", spec.policyFor("demo"))
	if err != nil {
		t.Fatal(err)
	}
	b := &countBackend{n: map[string]int{"prefill": 1, "decode": 1}}
	busy := stubLoad{{EngineState: gossip.EngineState{ID: "demo-decode-0", Running: 20}}}
	for _, s := range []int64{100, 101} {
		if err := pr.step(context.Background(), time.Unix(s, 0), md, b, busy, nil); err != nil {
			t.Fatal(err)
		}
	}
	if b.n["decode"] != 3 {
		t.Fatalf("decode at %d after the load, want 3", b.n["decode"])
	}
	var idle stubLoad
	for i := range 3 {
		idle = append(idle, gossip.EngineView{EngineState: gossip.EngineState{ID: fmt.Sprintf("demo-decode-%d", i)}})
	}
	if err := pr.step(context.Background(), time.Unix(130, 0), md, b, idle, nil); err != nil {
		t.Fatal(err)
	}
	if b.n["decode"] != 3 {
		t.Fatalf("decode at %d within the cool-down, want 3", b.n["decode"])
	}
	edited, err := ParseSpec([]byte(strings.Replace(doc, "{name: decode, minReplicas: 1, maxReplicas: 3", "{name: decode, minReplicas: 1, maxReplicas: 4", 1)))
	if err != nil {
		t.Fatal(err)
	}
	pr2, err := o.runnerFor("demo", edited.policyFor("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if policyRole(&pr2.ap, "decode").MaxReplicas != 4 {
		t.Fatal("the edit was not taken")
	}
	if err := pr2.step(context.Background(), time.Unix(131, 0), md, b, idle, nil); err != nil {
		t.Fatal(err)
	}
	if d := pr2.last.Roles["decode"]; b.n["decode"] != 3 || d.Reason != "scale-down cool-down" {
		t.Errorf("decode at %d (%+v) right after raising its max, want 3 held by the cool-down", b.n["decode"], d)
	}
}
