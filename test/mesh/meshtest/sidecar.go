package meshtest

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/sidecar"
)

// StartSidecar runs a sidecar of cfg until the test ends (Close, then Run's
// return). It does not wait for the sidecar to be ready.
func StartSidecar(t testing.TB, cfg sidecar.Config) *sidecar.Sidecar {
	t.Helper()
	s, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() { _ = s.Close(); <-done })
	return s
}
