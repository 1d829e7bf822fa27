package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI (the environment variable CI is
// "true"), where every test must run: a missing tool is a failure there,
// not a reason to skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireTool returns the path of the executable name. When it is not on
// PATH the test is skipped, saying why the test needs it, except in CI
// (InCI), where it fails: a fresh CI machine that lacks the tool would
// otherwise pass the test without running it.
func RequireTool(t testing.TB, name, reason string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Need(t, err, name+" is needed: "+reason)
	}
	return path
}

// Need skips the test when err is not nil (a missing tool, module or
// resource the test cannot run without), except in CI, where it fails.
// what says what is missing and why it is needed.
func Need(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil {
		return
	}
	if InCI() {
		t.Fatalf("%s (%v); CI=true, so this fails instead of skipping", what, err)
		return
	}
	t.Skipf("%s (%v); skipped (it fails when CI=true)", what, err)
}
