package policies

import (
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// TestPoliciesForgetEngines: every policy that keeps a record per engine
// (routed histories, Dynamo's active blocks) drops a departed engine's
// through the scheduler's Forget, and keeps the others'.
func TestPoliciesForgetEngines(t *testing.T) {
	llmd, err := NewLLMDApproximate(DefaultLLMDWeights())
	if err != nil {
		t.Fatal(err)
	}
	dyn := NewDynamo()
	for _, tc := range []struct {
		name  string
		p     scheduler.Policy
		count func() int
	}{
		{"sglang", NewSGLang(), nil},
		{"ray", NewRay(), nil},
		{"kthena", NewKthena(), nil},
		{"llmd-approximate", llmd, llmd.History.Engines},
		{"dynamo", dyn, dyn.Active.Workers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			count := tc.count
			if count == nil {
				count = historyOf(tc.p).Engines
			}
			s, err := scheduler.New(nil, tc.p, nil, scheduler.Options{})
			if err != nil {
				t.Fatal(err)
			}
			es := []scheduler.Engine{eng("a"), eng("b")}
			r := req(4)
			for i := range r.Keys {
				r.Keys[i] = uint64(i + 1)
			}
			// Each engine in turn is the only candidate: both get a record.
			for i := range es {
				if got, _ := pick(t, tc.p, r, es[i:i+1], []index.Match{{}}); got != es[i].ID {
					t.Fatalf("picked %s", got)
				}
			}
			if n := count(); n != 2 {
				t.Fatalf("%d engines recorded, want 2", n)
			}
			s.Forget("a")
			s.Forget("gone-before") // never seen: nothing happens
			if n := count(); n != 1 {
				t.Fatalf("%d engines recorded after forgetting a, want 1", n)
			}
		})
	}
}

func historyOf(p scheduler.Policy) *History {
	switch p := p.(type) {
	case SGLang:
		return p.History
	case Ray:
		return p.History
	case Kthena:
		return p.History
	}
	return nil
}
