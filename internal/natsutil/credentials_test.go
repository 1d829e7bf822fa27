package natsutil_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A client whose credentials the server refuses, connecting in the
// background (WaitForServer), is given up by nats.go after the refusals:
// that is logged as an error naming the credentials, not left at "nats not
// reachable yet" while the process runs on without NATS.
func TestRefusedCredentialsLogged(t *testing.T) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Username: "u", Password: "right", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats server not ready")
	}
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{s.ClientURL()}
	cfg.User, cfg.Password = "u", "wrong"
	cfg.WaitForServer = true
	cfg.ReconnectWait = 50 * time.Millisecond
	cfg.Stream.Disabled = true
	var logs testutil.SyncBuffer
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	testutil.WaitFor(t, 10*time.Second, "the refused credentials logged", func() bool {
		return strings.Contains(logs.String(), "refused this client's credentials")
	})
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("logged below error:\n%s", logs.String())
	}
}
