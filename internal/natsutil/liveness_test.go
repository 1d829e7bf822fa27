package natsutil_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A path that stays up and carries nothing (the relay frozen) is found by
// the connection's pings and the connection redialed; before, nats.go's
// default 2 min ping interval let it go unnoticed for about 6 minutes.
// Once the path works again the connection is back.
func TestPingsFindDeadPath(t *testing.T) {
	srv := testutil.NATS(t)
	r := testutil.NewRelay(t, srv.URL()[len("nats://"):])
	var logs testutil.SyncBuffer
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{"nats://" + r.Addr()}
	cfg.Stream.Disabled = true
	cfg.PingInterval = 50 * time.Millisecond
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 10*time.Second, "connected through the relay", c.NC.IsConnected)
	r.Freeze()
	testutil.WaitFor(t, 10*time.Second, "the dead path found (connection no longer taken as connected)", func() bool {
		return !c.NC.IsConnected()
	})
	testutil.WaitFor(t, 10*time.Second, "the stale connection logged", func() bool {
		return strings.Contains(logs.String(), "pings unanswered")
	})
	r.Thaw()
	testutil.WaitFor(t, 10*time.Second, "reconnected once the path works", c.NC.IsConnected)
}

// A path that stops taking bytes while the client writes (the relay frozen
// under a stream of publishes) is found as quickly as an idle one. The
// write stuck on the full socket holds the connection's lock, which the
// ping timer needs, so before, only nats.go's 1 min write timeout ended it:
// a hung server held the sidecar's publisher, and its shutdown, that long.
func TestPingsFindDeadPathUnderWrites(t *testing.T) {
	srv := testutil.NATS(t)
	r := testutil.NewRelay(t, srv.URL()[len("nats://"):])
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{"nats://" + r.Addr()}
	cfg.Stream.Disabled = true
	cfg.PingInterval = 50 * time.Millisecond
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 10*time.Second, "connected through the relay", c.Connected)

	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // owned by the test: publishes until stop, then ends (the relay thawed)
		defer close(done)
		payload := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.NC.Publish("flood", payload) // blocks while a write is stuck
		}
	}()
	defer func() { close(stop); r.Thaw(); <-done }()
	r.Freeze()
	testutil.WaitFor(t, 20*time.Second, "the dead path found while writes are stuck", func() bool {
		return !c.Connected()
	})
	r.Thaw()
	testutil.WaitFor(t, 20*time.Second, "reconnected once the path works", c.Connected)
}

// The defaults find a dead path within 20 s, for every component: the
// sidecar's and the ingress's connections are both made by Connect, whose
// options take the ping settings from Auth, zero meaning the default.
func TestDefaultPingsFindDeadPathWithin20s(t *testing.T) {
	var a natsutil.Auth // what an ingress built from its flags or YAML carries
	if got := a.StaleAfter(); got > 20*time.Second || got < 5*time.Second {
		t.Fatalf("a dead path is found after up to %v with the defaults, want 5–20 s", got)
	}
	cfg := natsutil.DefaultConfig()
	cfg.PingInterval = -time.Second
	cfg.MaxPingsOutstanding = -1
	err := cfg.Validate()
	for _, want := range []string{"ping interval", "max pings outstanding"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("negative %s accepted: %v", want, err)
		}
	}
}

// The stream limits rule: an absent stream is created with the sidecar's
// limits; on an existing stream only limits given other than their default
// are applied (and logged old → new), so a sidecar with default flags no
// longer puts back the defaults over another sidecar's explicit limits or an
// operator's `nats stream edit`.
func TestEnsureStreamLimitsRule(t *testing.T) {
	srv := testutil.NATS(t)
	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	info := func() jetstream.StreamConfig {
		t.Helper()
		s, err := js.Stream(ctx, natsutil.Default().Stream())
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}

	explicit := natsutil.DefaultConfig().Stream
	explicit.MaxAge = 20 * time.Minute
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), explicit, log); err != nil {
		t.Fatal(err)
	}
	if c := info(); c.MaxAge != 20*time.Minute || c.MaxBytes != explicit.MaxBytes || c.Subjects[0] != natsutil.Default().DeltaWildcard() {
		t.Fatalf("created with %+v", c)
	}

	// The operator edits the stream (nats stream edit).
	edited := info()
	edited.MaxAge, edited.MaxBytes = 30*time.Minute, 1<<30
	if _, err := js.UpdateStream(ctx, edited); err != nil {
		t.Fatal(err)
	}
	// A sidecar with the default limits leaves them alone.
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
		t.Fatal(err)
	}
	if c := info(); c.MaxAge != 30*time.Minute || c.MaxBytes != 1<<30 {
		t.Fatalf("a sidecar with default limits rewrote the stream: max age %v, max bytes %d", c.MaxAge, c.MaxBytes)
	}
	// One with an explicit max age sets that one only, and says so.
	explicit.MaxAge = 40 * time.Minute
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), explicit, log); err != nil {
		t.Fatal(err)
	}
	if c := info(); c.MaxAge != 40*time.Minute || c.MaxBytes != 1<<30 {
		t.Fatalf("explicit max age: max age %v, max bytes %d (want 40m, the operator's 1 GiB)", c.MaxAge, c.MaxBytes)
	}
	if !strings.Contains(logs.String(), "max_age=\"30m0s → 40m0s\"") {
		t.Fatalf("the change is not logged old → new:\n%s", logs.String())
	}
}

// A stream deleted while NATS stays up is created again once publishes
// report it missing, and each failed publish is reported (the sidecar
// counts them); before, both waited for the next reconnect.
func TestPublishFailureRecreatesDeletedStream(t *testing.T) {
	srv := testutil.NATS(t)
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{srv.URL()}
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var failed atomic.Int64
	c.OnPublishError(func(subject string, err error) {
		if subject == natsutil.Default().DeltaSubject("m", "e") {
			failed.Add(1)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The connection ensures the stream once more after it connected, maybe
	// after a first deletion: delete and publish until a publish fails.
	testutil.WaitFor(t, 20*time.Second, "a publish to the deleted stream failed and was reported", func() bool {
		if failed.Load() > 0 {
			return true
		}
		if _, err := c.JS.Stream(ctx, natsutil.Default().Stream()); err == nil {
			if err := c.JS.DeleteStream(ctx, natsutil.Default().Stream()); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Fatal(err)
			}
			if _, err := c.JS.PublishAsync(natsutil.Default().DeltaSubject("m", "e"), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		return false
	})
	testutil.WaitFor(t, 20*time.Second, "the stream created again", func() bool {
		_, err := c.JS.Stream(ctx, natsutil.Default().Stream())
		return err == nil
	})
}

// Connected follows the connection through its handlers: up once
// connected, down while it is lost and reconnecting, up again once
// reconnected, and down after Close.
func TestConnectedFollowsTheConnection(t *testing.T) {
	srv := testutil.NATS(t)
	gate := testutil.NewGate(t)
	gate.Open(strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{"nats://" + gate.Addr()}
	cfg.Stream.Disabled = true
	cfg.ReconnectWait = 10 * time.Millisecond
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 10*time.Second, "Connected after the first connection", c.Connected)
	gate.Shut()
	testutil.WaitFor(t, 10*time.Second, "not Connected once the connection is lost", func() bool { return !c.Connected() })
	gate.Open(strings.TrimPrefix(srv.URL(), "nats://"))
	testutil.WaitFor(t, 10*time.Second, "Connected after the reconnect", c.Connected)
	c.Close()
	testutil.WaitFor(t, 10*time.Second, "not Connected after Close", func() bool { return !c.Connected() })
}

// MaxPayload follows the server the connection is on: stored when it
// connects and again on a reconnect to a server with another max_payload,
// so what is cut to it (the sidecar's deltas) fits from the first message.
func TestMaxPayloadFollowsReconnects(t *testing.T) {
	start := func(maxPayload int32) *server.Server {
		t.Helper()
		return testutil.NATSServer(t, server.Options{MaxPayload: maxPayload})
	}
	small, large := start(4096), start(8192)
	gate := testutil.NewGate(t) // shut: no server yet
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{"nats://" + gate.Addr()}
	cfg.Stream.Disabled = true
	cfg.WaitForServer = true
	cfg.ReconnectWait = 10 * time.Millisecond
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.MaxPayload(); got != 0 {
		t.Fatalf("MaxPayload %d before any connection", got)
	}
	gate.Open(strings.TrimPrefix(small.ClientURL(), "nats://"))
	testutil.WaitFor(t, 10*time.Second, "MaxPayload of the first server", func() bool { return c.MaxPayload() == 4096 })
	gate.Shut()
	gate.Open(strings.TrimPrefix(large.ClientURL(), "nats://"))
	testutil.WaitFor(t, 10*time.Second, "MaxPayload of the server reconnected to", func() bool { return c.MaxPayload() == 8192 })
}
