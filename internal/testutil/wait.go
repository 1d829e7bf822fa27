// Package testutil holds helpers shared by kvmesh's tests. Test code only:
// nothing outside *_test.go files and test-support packages may import it.
package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every 5 ms until it holds and fails t when timeout
// passes first. Tests wait on conditions with a deadline, never on fixed
// sleeps, so they are as fast as the machine allows and bounded when it is slow.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}
