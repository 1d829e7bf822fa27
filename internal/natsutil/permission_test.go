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

// Every permission violation the server reports reaches every watcher, in
// the order the server sent them, however close together: the
// connection's LastError keeps only the newest, so a refused subscription
// followed at once by a refused publish would be lost there. A removed
// watcher hears nothing more.
func TestOnPermissionViolationTellsEveryRefusal(t *testing.T) {
	perms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"ok.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"ok.>", "_INBOX.>"}},
	}
	srv := testutil.NATSServer(t, server.Options{Users: []*server.User{{Username: "u", Password: "pw", Permissions: perms}}})
	cfg := natsutil.DefaultConfig()
	cfg.URLs, cfg.User, cfg.Password = []string{srv.ClientURL()}, "u", "pw"
	cfg.Stream.Disabled = true
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// gone is added first: watchers are told in the order they were added.
	kept, gone := make(chan error, 8), make(chan error, 8)
	remove := c.OnPermissionViolation(func(err error) { gone <- err })
	c.OnPermissionViolation(func(err error) { kept <- err })

	if _, err := c.NC.SubscribeSync("no.sub"); err != nil {
		t.Fatal(err)
	}
	if err := c.NC.Publish("no.pub", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.NC.Publish("ok.fine", nil); err != nil { // allowed: no violation
		t.Fatal(err)
	}
	want := []string{`Subscription to "no.sub"`, `Publish to "no.pub"`}
	for _, w := range want {
		for i, ch := range []chan error{gone, kept} {
			select {
			case err := <-ch:
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("watcher %d: got %v, want the violation naming %s", i, err, w)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("watcher %d: not told of the violation naming %s", i, w)
			}
		}
	}

	remove()
	if err := c.NC.Publish("no.again", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-kept:
		if !strings.Contains(err.Error(), `Publish to "no.again"`) {
			t.Fatalf("got %v, want the violation naming no.again", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the kept watcher was not told of the third violation")
	}
	// Watchers are told in the order they were added: had the removed one
	// still been there, it would have been told before the kept one.
	select {
	case err := <-gone:
		t.Fatalf("a removed watcher was told of %v", err)
	default:
	}
}

// A user whose permissions do not name the stream (a --nats-prefix given
// without the NATS users' names changed) gets no answer to the stream's
// JetStream API, which alone reads as a stream without a leader: the
// permission violation beside it is what the ensure's warning names.
func TestStreamEnsureDeniedNamesPermissions(t *testing.T) {
	perms := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"team-p.>", "$JS.API.INFO"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"team-p.>", "_INBOX.>"}},
	}
	srv := testutil.NATSServer(t, server.Options{JetStream: true, Users: []*server.User{{Username: "u", Password: "pw", Permissions: perms}}})
	cfg := natsutil.DefaultConfig()
	cfg.URLs, cfg.User, cfg.Password, cfg.Prefix = []string{srv.ClientURL()}, "u", "pw", "team-p"
	cfg.WaitForServer = true // as the sidecar connects: the ensure is retried in the background
	logs := &testutil.SyncBuffer{}
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 30*time.Second, "the ensure's warning naming the permissions", func() bool {
		return strings.Contains(logs.String(), "the NATS user may not use the stream's JetStream API")
	})
	if l := logs.String(); !strings.Contains(l, "TEAM-P_DELTAS") {
		t.Fatalf("the warning does not name the stream:\n%s", l)
	}
}
