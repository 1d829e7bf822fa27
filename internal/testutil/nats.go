package testutil

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// NATSServer starts a nats-server with opts (users, permissions, limits)
// on a free loopback port, without logs or signal handling, and with a
// temporary store when it runs JetStream; it shuts down when tb's test
// ends. NATS is the plain embedded server for a test that needs no options.
func NATSServer(tb testing.TB, opts server.Options) *server.Server {
	tb.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	if opts.JetStream && opts.StoreDir == "" {
		opts.StoreDir = tb.TempDir()
	}
	srv, err := server.NewServer(&opts)
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Start() // owned by srv: Shutdown stops it
	tb.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats-server not ready")
	}
	return srv
}

// JetStream connects to the NATS server at url with opts (the connection
// closes when tb's test ends) and returns the connection and its
// JetStream context.
func JetStream(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}
