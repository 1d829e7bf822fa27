package ingress

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An ingress runs with a NATS user that may only subscribe to the deltas and
// request snapshots: it never creates or alters the JetStream stream, whose
// retention the sidecars (or the orchestrator) set.
func TestIngressRunsWithoutStreamAdminRights(t *testing.T) {
	dir := t.TempDir()
	reader := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"kvmesh.snap.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"kvmesh.delta.>", "_INBOX.>"}},
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "admin", Password: "admin-pw"}, {Username: "ingress", Password: "ingress-pw", Permissions: reader}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown(); os.RemoveAll(dir) })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	ctx := context.Background()

	// The stream as a sidecar made it, with its own retention.
	admin := natsutil.DefaultConfig()
	admin.URLs, admin.User, admin.Password = []string{srv.ClientURL()}, "admin", "admin-pw"
	admin.Stream.MaxAge = time.Hour
	ac, err := natsutil.Connect(ctx, admin, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()

	// The permissions do bite: managing the stream as "ingress" fails.
	bad := natsutil.DefaultConfig()
	bad.URLs, bad.User, bad.Password = []string{srv.ClientURL()}, "ingress", "ingress-pw"
	bad.ConnectTimeout = time.Second
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if c, err := natsutil.Connect(sctx, bad, quietLog()); err == nil {
		c.Close()
		t.Fatal("the restricted user could manage the stream; the test proves nothing")
	}

	cfg := testConfig()
	cfg.Cluster.NATSURLs = []string{srv.ClientURL()}
	cfg.Cluster.NATSAuth = natsutil.Auth{User: "ingress", Password: "ingress-pw"}
	s := startIngress(t, cfg, Deps{})
	testutil.WaitFor(t, 10*time.Second, "the ingress's NATS connection", func() bool {
		return s.cl.nc != nil && s.cl.nc.NC.Status() == nats.CONNECTED
	})
	st, err := ac.JS.Stream(ctx, natsutil.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != time.Hour {
		t.Fatalf("stream max age %v after the ingress started, want the sidecar's 1h", info.Config.MaxAge)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
