package registry

import (
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// TestExampleMatchesDefaults: the example file spells out the policies'
// built-in defaults; building from it must give the same policies.
func TestExampleMatchesDefaults(t *testing.T) {
	cfg, err := scheduler.LoadConfig("../testdata/scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]scheduler.Policy{
		"kvmesh": policies.NewKVMesh(), "sglang": policies.NewSGLang(), "ray": policies.NewRay(),
		"dynamo": policies.NewDynamo(), "kthena": policies.NewKthena(),
	}
	for name, w := range want {
		cfg.Policy = name
		p, err := Policy(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p != w {
			t.Errorf("%s from the example = %+v, built-in default %+v", name, p, w)
		}
	}
}

func TestUnknownScorer(t *testing.T) {
	cfg := scheduler.DefaultConfig()
	cfg.Policy = "weighted"
	cfg.Weighted = []scheduler.ScorerConfig{{Name: "nope", Weight: 1}}
	if _, err := New(cfg, nil, nil); err == nil {
		t.Fatal("unknown scorer accepted")
	}
	for _, name := range scheduler.ScorerNames {
		if _, ok := scorerTable[name]; !ok {
			t.Errorf("scorer %s listed in the config but not registered", name)
		}
	}
}
