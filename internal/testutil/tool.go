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

// Python returns a Python 3 for which the code probe runs (e.g. an import
// of the modules the test needs): python3 on PATH, else /usr/bin/python3,
// where make deps installs Debian's python3-* packages when no python3 on
// PATH has them. Otherwise it is Need's: skip, or fail in CI; what says
// what is missing and why it is needed.
func Python(t testing.TB, probe, what string) string {
	t.Helper()
	var err error
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		path, lerr := exec.LookPath(py)
		if lerr != nil {
			err = lerr
			continue
		}
		if err = exec.Command(path, "-c", probe).Run(); err == nil {
			return path
		}
	}
	Need(t, err, what)
	return ""
}
