package natsutil

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEscapeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"engine-0", "engine-0"},
		{"meta-llama/Llama-3.1-8B", "meta-llama~2FLlama-3~2E1-8B"},
		{"a.b*c>d e~", "a~2Eb~2Ac~3Ed~20e~7E"},
		{"", "~"},
	} {
		got := EscapeToken(tc.in)
		if got != tc.want {
			t.Errorf("EscapeToken(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back, ok := UnescapeToken(got)
		if !ok || back != tc.in {
			t.Errorf("UnescapeToken(%q) = %q, %v", got, back, ok)
		}
	}
	for _, bad := range []string{"", "a.b", "~4", "~zz", "a b", "~41"} {
		if _, ok := UnescapeToken(bad); ok {
			t.Errorf("UnescapeToken(%q) accepted", bad)
		}
	}
}

func TestParseDeltaSubject(t *testing.T) {
	s := Default().DeltaSubject("org/model.v1", "node-1:8000")
	m, e, ok := Default().ParseDeltaSubject(s)
	if !ok || m != "org/model.v1" || e != "node-1:8000" {
		t.Fatalf("Default().ParseDeltaSubject(%q) = %q %q %v", s, m, e, ok)
	}
	if !strings.HasPrefix(Default().SnapSubject("m", "e"), Default().snapPrefix) {
		t.Fatal("snap subject prefix")
	}
	for _, bad := range []string{"kvmesh.delta.m", "kvmesh.delta.m.e.x", "kvmesh.snap.m.e", "kvmesh.delta.m.a~"} {
		if _, _, ok := Default().ParseDeltaSubject(bad); ok {
			t.Errorf("accepted %q", bad)
		}
	}
}

func FuzzUnescapeToken(f *testing.F) {
	f.Add("meta-llama~2FLlama")
	f.Add("~")
	f.Add("~7")
	f.Fuzz(func(t *testing.T, s string) {
		// Escaping is canonical: a token that unescapes must be the escape of its
		// result, otherwise two subjects would name the same engine.
		if u, ok := UnescapeToken(s); ok && EscapeToken(u) != s {
			t.Fatalf("UnescapeToken(%q) = %q which escapes to %q", s, u, EscapeToken(u))
		}
		_, _, _ = Default().ParseDeltaSubject(Default().deltaPrefix + s)
	})
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := DefaultConfig()
	c.URLs = []string{"localhost:4222"}
	c.Token = "t"
	c.CredsFile = "x.creds"
	c.TLSCertFile = "c.pem"
	c.Stream.MaxAge = 0
	c.Stream.Replicas = 9
	err := c.Validate()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("want ErrConfig, got %v", err)
	}
	for _, want := range []string{"no scheme", "at most one", "cert and key", "max age", "replicas"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func TestConnectEmbeddedEnsuresStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.Stream.MaxAge = time.Minute
	c, err := Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Embedded == nil || c.JS == nil {
		t.Fatal("no embedded server or jetstream")
	}
	s, err := c.JS.Stream(ctx, Default().Stream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAge != time.Minute || info.Config.MaxBytes != cfg.Stream.MaxBytes || info.Config.Subjects[0] != Default().DeltaWildcard() {
		t.Fatalf("stream config %+v", info.Config)
	}
	// The stream captures deltas.
	if _, err := c.JS.Publish(ctx, Default().DeltaSubject("m", "e"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Updating limits on an existing stream works (a second process with other limits).
	cfg.Stream.MaxAge = 2 * time.Minute
	s2, err := EnsureStream(ctx, c.JS, Default(), cfg.Stream, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s2.CachedInfo().Config.MaxAge != 2*time.Minute || s2.CachedInfo().State.Msgs != 1 {
		t.Fatalf("after update: %+v", s2.CachedInfo())
	}
	store := c.Embedded.StoreDir()
	c.Close()
	c.Close() // idempotent
	if c.NC.Status() != nats.CLOSED {
		t.Fatalf("connection not closed: %v", c.NC.Status())
	}
	if store == "" {
		t.Fatal("no store dir")
	}
}

// A stream created with the default retention has JetStream's 2 min
// de-duplication window; a sidecar asking for a retention below it gets
// it, the window shrinking with it. JetStream refuses a window longer than
// the retention, and the update was refused for ever (warned about every
// second, the stream's retention left as it was).
func TestLowerMaxAgeShrinksDuplicates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Connect(ctx, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.JS.Stream(ctx, Default().Stream())
	if err != nil {
		t.Fatal(err)
	}
	if d := s.CachedInfo().Config.Duplicates; d <= time.Minute {
		t.Fatalf("created with a de-duplication window of %v; the test needs one above 1m", d)
	}
	sc := DefaultConfig().Stream
	sc.MaxAge = time.Minute
	up, err := EnsureStream(ctx, c.JS, Default(), sc, nil)
	if err != nil {
		t.Fatalf("a max age below the de-duplication window: %v", err)
	}
	if got := up.CachedInfo().Config; got.MaxAge != time.Minute || got.Duplicates > time.Minute {
		t.Fatalf("after lowering the max age to 1m: max age %v, duplicates %v", got.MaxAge, got.Duplicates)
	}
}

func TestConnectUserPassword(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Username: "kv", Password: "secret", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.URLs = []string{srv.ClientURL()}
	cfg.Stream.Disabled = true // no JetStream on this server
	cfg.MaxReconnects = 0
	cfg.User, cfg.Password = "kv", "wrong"
	if _, err := Connect(ctx, cfg, nil); err == nil {
		t.Fatal("wrong password accepted")
	}
	cfg.Password = "secret"
	c, err := Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// A server whose JetStream storage is smaller than the stream's max_bytes
// refuses the stream ("insufficient storage resources available"); the
// error names what to change: --stream-max-bytes or the server's storage.
func TestStreamTooLargeForServerNamesRemedy(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 2 << 20, JetStreamMaxMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start() // owned by srv: Shutdown stops it
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	cfg := DefaultConfig()
	cfg.URLs = []string{srv.ClientURL()}
	cfg.Stream.Disabled = true // EnsureStream by hand below
	c, err := Connect(ctx, cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	js, err := jetstream.New(c.NC)
	if err != nil {
		t.Fatal(err)
	}
	sc := DefaultConfig().Stream // 256 MiB: more than the server has
	_, err = EnsureStream(ctx, js, Default(), sc, quiet)
	if err == nil {
		t.Fatal("a stream larger than the server's storage was created")
	}
	for _, want := range []string{"insufficient storage", "max_bytes=268435456", "--stream-max-bytes", "max_file_store"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	sc.MaxBytes = 1 << 20 // fits: the remedy works
	if _, err := EnsureStream(ctx, js, Default(), sc, quiet); err != nil {
		t.Fatalf("a stream within the server's storage: %v", err)
	}
}
