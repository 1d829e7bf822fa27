package bench

import (
	"errors"
	"strings"
	"testing"
)

func TestPrepare(t *testing.T) {
	o := DefaultOptions()
	cfg, names, err := o.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Engines != 8 || cfg.Engine.Profile.Name != DefaultProfile || len(names) != len(DefaultPolicies()) {
		t.Fatalf("%+v %v", cfg, names)
	}
	for _, p := range names {
		if p == "weighted" {
			t.Fatal("weighted among the defaults without a config")
		}
	}
	o.Engines, o.Policies, o.Workload = 0, []string{"kvmesh", "nope"}, "trace"
	_, _, err = o.Prepare()
	if !errors.Is(err, ErrUsage) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("want one usage line: %v", err)
	}
	for _, w := range []string{"--engines 0", `unknown policy "nope"`, "--workload trace needs --trace"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v does not name %q", err, w)
		}
	}
}
