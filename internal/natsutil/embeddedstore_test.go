package natsutil_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestEmbeddedOnAPortKeepsItsStore (gossip tester F4): an embedded server
// on a given port (the sidecar's --embedded-nats-port: DefaultConfig) keeps its JetStream store in the
// port's own directory, which the next server on the port takes up: a
// restarted sidecar keeps the delta stream, and a crash (no Shutdown)
// leaves that directory only, not one more per start. A second server on
// the port while the first runs is refused before it touches the store.
func TestEmbeddedOnAPortKeepsItsStore(t *testing.T) {
	port := testutil.FreePortBase(t, 1)
	dir := natsutil.StableStoreDir(port)
	_ = os.RemoveAll(dir)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := natsutil.DefaultConfig()
	cfg.Embedded.Port = port

	c, err := natsutil.Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Embedded.StoreDir(); got != dir {
		t.Fatalf("store %s, want the port's %s", got, dir)
	}
	if _, err := natsutil.StartEmbedded(cfg.Embedded); err == nil {
		t.Fatal("a second server on the port started")
	}
	if _, err := c.JS.Publish(ctx, natsutil.Default().DeltaSubject("m", "e"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	c.Close()                                                                                  // a clean stop keeps the store
	tmp, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Host: "127.0.0.1", Port: port}) // without PortStore: a temporary one
	if err != nil {
		t.Fatal(err)
	}
	if tmp.StoreDir() == dir {
		t.Fatal("a server without PortStore took the port's store")
	}
	tmpDir := tmp.StoreDir()
	tmp.Shutdown()
	if _, err := os.Stat(tmpDir); !os.IsNotExist(err) {
		t.Fatalf("temporary store %s left after Shutdown: %v", tmpDir, err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("store gone after a clean stop: %v", err)
	}

	c, err = natsutil.Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.JS.Stream(ctx, natsutil.Default().Stream())
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 || c.Embedded.StoreDir() != dir {
		t.Fatalf("after a restart on the port: %d deltas in the stream (want 1), store %s", n, c.Embedded.StoreDir())
	}
}

// A port's store directory that another user made (0700 is not enough:
// in a shared /tmp anyone can make it first, then swap in a store of its
// own for the next start to load) is refused, naming its owner
// (regression tester 1 F4). Making a directory another user's takes root.
func TestEmbeddedStoreOfAnotherUserRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown to another user needs root")
	}
	port := testutil.FreePortBase(t, 1)
	dir := natsutil.StableStoreDir(port)
	_ = os.RemoveAll(dir)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cfg := natsutil.DefaultConfig()
	cfg.Embedded.Port = port
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := natsutil.Connect(ctx, cfg, nil)
	if err == nil {
		c.Close()
		t.Fatal("a store directory of uid 65534 taken up")
	}
	if !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("refused, but saying %v", err)
	}
}
