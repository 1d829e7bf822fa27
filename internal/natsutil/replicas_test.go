package natsutil_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// ensureReplicas ensures the stream as cfg asks and returns its replicas;
// requests a cluster lost are retried (testutil.RetryLost).
func ensureReplicas(ctx context.Context, t *testing.T, js jetstream.JetStream, cfg natsutil.StreamConfig, log *slog.Logger) int {
	t.Helper()
	if err := testutil.RetryLost(ctx, func(ctx context.Context) error {
		_, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), cfg, log)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return testutil.StreamReplicas(ctx, t, js, natsutil.Default().Stream())
}

// On the single-machine default, one server that is not clustered, auto
// replicas make the stream with 1 and say nothing above info: nothing is
// wrong there.
func TestAutoReplicasSingleServerQuiet(t *testing.T) {
	srv := testutil.NATS(t)
	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for range 2 { // created, then ensured again (a reconnect)
		if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
			t.Fatal(err)
		}
	}
	if n := testutil.StreamReplicas(ctx, t, js, natsutil.Default().Stream()); n != 1 {
		t.Fatalf("single server: %d replicas, want 1", n)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("single server warned:\n%s", logs.String())
	}
}

// On a three-server JetStream cluster (the shipped install's NATS), the
// default makes the stream with 3 replicas, raises one an older install made
// with 1, and never lowers 3: the stream survives losing a server.
func TestAutoReplicasThreeServerCluster(t *testing.T) {
	srvs := testutil.NATSCluster(t, 3)
	_, js := testutil.JetStream(t, testutil.ClientURLs(srvs))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	auto := natsutil.DefaultConfig().Stream
	if n := ensureReplicas(ctx, t, js, auto, log); n != 3 {
		t.Fatalf("created with %d replicas on a 3-server cluster, want 3\n%s", n, logs.String())
	}

	// An older install's stream, made with 1: raised.
	if err := testutil.RetryLost(ctx, func(ctx context.Context) error {
		err := js.DeleteStream(ctx, natsutil.Default().Stream())
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil // a try whose answer was lost deleted it
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	one := auto
	one.Replicas = 1
	if n := ensureReplicas(ctx, t, js, one, log); n != 1 {
		t.Fatalf("explicit 1: %d replicas", n)
	}
	if n := ensureReplicas(ctx, t, js, auto, log); n != 3 {
		t.Fatalf("auto left an R1 stream at %d replicas, want 3", n)
	}
	if !strings.Contains(logs.String(), `replicas="1 → 3"`) {
		t.Fatalf("the raise is not logged old → new:\n%s", logs.String())
	}
	// Ensured again with auto (a reconnect): still 3, nothing changed.
	if n := ensureReplicas(ctx, t, js, auto, log); n != 3 {
		t.Fatalf("auto changed an R3 stream to %d replicas", n)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("warned on a cluster that places 3:\n%s", logs.String())
	}
}

// A cluster that cannot place 3 replicas (two servers here) still gets its
// stream, with 1 replica and one warning that names the cause.
func TestAutoReplicasClusterTooSmallWarnsOnce(t *testing.T) {
	srvs := testutil.NATSCluster(t, 2)
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{testutil.ClientURLs(srvs)}
	var logs testutil.SyncBuffer
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n := testutil.StreamReplicas(ctx, t, c.JS, natsutil.Default().Stream()); n != 1 {
		t.Fatalf("two servers: %d replicas, want the fallback 1", n)
	}
	if got := strings.Count(logs.String(), "cannot place the delta stream's replicas"); got != 1 {
		t.Fatalf("%d warnings about the replicas, want 1:\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "wanted=3") {
		t.Fatalf("the warning does not say what was wanted:\n%s", logs.String())
	}
}

// When the stream's JetStream does not answer (here a server without
// JetStream; in production a stream with no leader during an election, whose
// requests time out), the sidecar's stream check says so and what it costs,
// instead of a bare "context deadline exceeded".
func TestEnsureStreamUnansweredSaysWhatIsLost(t *testing.T) {
	srv := testutil.NATSServer(t, server.Options{}) // no JetStream
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{srv.ClientURL()}
	cfg.WaitForServer = true // as the sidecar: run, and ensure in the background
	var logs testutil.SyncBuffer
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testutil.WaitFor(t, 20*time.Second, "the stream check's warning", func() bool {
		return strings.Contains(logs.String(), "ensure delta stream")
	})
	for _, want := range []string{"the stream does not answer", "deltas still reach running ingresses over plain NATS", "kvmesh inspect stream"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("the warning does not say %q:\n%s", want, logs.String())
		}
	}
}

// The README's NATS (Debian's nats-server, 2.9) as a single server: it
// accepts a stream of 3 replicas that a newer server refuses, so auto
// cannot lean on the refusal. The connection's INFO says the server is not
// clustered, and auto asks for 1 there: created with 1 and, ensured again,
// left at 1, without the "changed … replicas" line a raise would log.
func TestAutoReplicasDebianNATSSingleServer(t *testing.T) {
	testutil.RequireTool(t, "nats-server", "the README's install path is Debian's nats-server")
	url, _ := testutil.SystemNATS(t, t.TempDir(), 0)
	nc, js := testutil.JetStream(t, url)
	if name := nc.ConnectedClusterName(); name != "" {
		t.Fatalf("a single server reports cluster %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for range 2 { // created, then ensured again (a reconnect)
		if n := ensureReplicas(ctx, t, js, natsutil.DefaultConfig().Stream, log); n != 1 {
			t.Fatalf("single server: %d replicas, want 1\n%s", n, logs.String())
		}
	}
	if strings.Contains(logs.String(), "level=WARN") || strings.Contains(logs.String(), "changed the delta stream") {
		t.Fatalf("single server warned or changed the stream:\n%s", logs.String())
	}
}
