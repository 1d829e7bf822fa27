package testutil

import (
	"errors"
	"testing"
)

// recorder is a testing.TB that records Skip and Fatal instead of stopping.
type recorder struct {
	testing.TB
	skipped, failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Skipf(string, ...any)  { r.skipped = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true }

func TestNeed(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		var r recorder
		Need(&r, errors.New("missing"), "a tool")
		if r.skipped == (ci == "true") || r.failed != (ci == "true") {
			t.Errorf("CI=%q: skipped %v failed %v", ci, r.skipped, r.failed)
		}
		r = recorder{}
		Need(&r, nil, "a tool")
		if r.skipped || r.failed {
			t.Errorf("CI=%q: nil error skipped or failed", ci)
		}
	}
}

func TestRequireTool(t *testing.T) {
	t.Setenv("CI", "true")
	var r recorder
	if p := RequireTool(&r, "go", "builds"); p == "" || r.failed {
		t.Fatalf("go not found: %q", p)
	}
	RequireTool(&r, "kvmesh-no-such-tool", "tests the miss")
	if !r.failed {
		t.Fatal("a missing tool did not fail in CI")
	}
}
