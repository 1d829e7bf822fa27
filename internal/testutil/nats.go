package testutil

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// NATS starts an embedded NATS server with JetStream on a free loopback port
// and a temporary store; it shuts down when tb's test ends.
func NATS(tb testing.TB) *natsutil.Embedded {
	tb.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Port: -1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	return srv
}
