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
	s := passwordServer(t)
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

// No log line of a connection holds a password given in a NATS URL: not
// the warning that NATS is not reachable yet (the pod-start race), nor the
// refused credentials' error, at any level.
func TestNoPasswordInLogs(t *testing.T) {
	s := passwordServer(t)
	down := "nats://kvm:LeakMeDown@" + testutil.NewGate(t).Addr() // never opened
	refused := strings.Replace(s.ClientURL(), "nats://", "nats://u:LeakMeWrong@", 1)
	for _, url := range []string{down, refused} {
		cfg := natsutil.DefaultConfig()
		cfg.URLs = []string{url}
		cfg.WaitForServer = true
		cfg.ReconnectWait = 50 * time.Millisecond
		cfg.Stream.Disabled = true
		var logs testutil.SyncBuffer
		c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		if err != nil {
			t.Fatal(err)
		}
		want := "not reachable yet"
		if url == refused {
			want = "refused this client's credentials"
		}
		testutil.WaitFor(t, 10*time.Second, want, func() bool { return strings.Contains(logs.String(), want) })
		c.Close()
		if strings.Contains(logs.String(), "LeakMe") || !strings.Contains(logs.String(), "redacted@") && url == down {
			t.Fatalf("%s:\n%s", url, logs.String())
		}
	}
}

// passwordServer starts a NATS server that accepts user "u" with password
// "right" only.
func passwordServer(t *testing.T) *server.Server {
	t.Helper()
	return testutil.NATSServer(t, server.Options{Username: "u", Password: "right"})
}

// An async error the server raises for the connection (here a refused
// subscription: max_subscriptions reached) comes with no subscription: it
// is logged as connection-level with the remedy, not with an empty subject.
func TestAsyncErrorWithoutSubscriptionLogged(t *testing.T) {
	srv := testutil.NATSServer(t, server.Options{MaxSubs: 1})
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{srv.ClientURL()}
	cfg.Stream.Disabled = true
	var logs testutil.SyncBuffer
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, subj := range []string{"a", "b"} { // the second is one too many
		if _, err := c.NC.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.NC.Flush()
	testutil.WaitFor(t, 10*time.Second, "the refused subscription logged", func() bool {
		return strings.Contains(logs.String(), "maximum subscriptions exceeded")
	})
	out := logs.String()
	if strings.Contains(out, `subject=""`) {
		t.Errorf("logged with an empty subject:\n%s", out)
	}
	for _, want := range []string{"connection-level", "max_subscriptions"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
