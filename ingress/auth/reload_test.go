package auth

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	kvtest "github.com/kvmesh/kvmesh/internal/testutil"
)

// writeKeys replaces the keys file and moves its mtime forward, so a
// same-second, same-size rewrite is still seen.
func writeKeys(t *testing.T, path, data string, gen int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1_800_000_000+int64(gen), 0)
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

// A keys file given, or a $KVMESH_API_KEYS set, that holds no key is a
// configuration error with Required (what the ingress sets when either is
// named), not an open ingress; each source is checked on its own.
func TestLoadRequiredRefusesEmptySources(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("# keys go here\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(dir, "full")
	if err := os.WriteFile(full, []byte("alice sk-alice-0001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_KVMESH_BLANK", " ")
	t.Setenv("TEST_KVMESH_ONE", "bob sk-bob-00000002")
	for _, c := range []struct {
		name string
		cfg  Config
		want string // "" accepted
	}{
		{"comments-only file", Config{KeysFile: empty, EnvVar: "-", Required: true}, "holds no key"},
		{"comments-only file, keys in env", Config{KeysFile: empty, EnvVar: "TEST_KVMESH_ONE", Required: true}, "holds no key"},
		{"blank env", Config{EnvVar: "TEST_KVMESH_BLANK", Required: true}, "TEST_KVMESH_BLANK is set but holds no key"},
		{"blank env, keys in file", Config{KeysFile: full, EnvVar: "TEST_KVMESH_BLANK", Required: true}, "holds no key"},
		{"file and env", Config{KeysFile: full, EnvVar: "TEST_KVMESH_ONE", Required: true}, ""},
		{"unset env", Config{KeysFile: full, EnvVar: "TEST_KVMESH_UNSET", Required: true}, ""},
		{"not required", Config{KeysFile: empty, EnvVar: "TEST_KVMESH_BLANK"}, ""},
	} {
		_, err := Load(c.cfg)
		if c.want == "" && err != nil || c.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if got := (Config{KeysFile: full, EnvVar: "TEST_KVMESH_BLANK"}).Sources(); len(got) != 2 || got[1] != "$TEST_KVMESH_BLANK" {
		t.Errorf("sources %q", got)
	}
	if got := (Config{EnvVar: "TEST_KVMESH_UNSET"}).Sources(); len(got) != 0 {
		t.Errorf("sources of an unset variable: %q", got)
	}
}

// The keys file is re-read when it changes: a revoked key stops working and
// a new one works without a restart; a broken or empty file, or a missing
// one, keeps the keys in force and is counted once per change.
func TestKeysReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, path, "alice sk-alice-0001\nbob sk-bob-00000002\n", 0)
	reg := prometheus.NewRegistry()
	k, err := WatchKeys(Config{KeysFile: path, EnvVar: "-"}, WatchConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	is := func(key, want string) {
		t.Helper()
		got, err := k.Check([]byte("Bearer " + key))
		if want == "" {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("%s: %q %v, want refused", key, got, err)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("%s: %q %v, want %s", key, got, err, want)
		}
	}
	is("sk-alice-0001", "alice")
	is("sk-bob-00000002", "bob")

	writeKeys(t, path, "alice sk-alice-0001\ncarol sk-carol-0003\n", 1) // bob's key leaked: revoked
	k.Poll()
	is("sk-bob-00000002", "")
	is("sk-carol-0003", "carol")

	for gen, bad := range []string{"alice short\n", "# every key removed by mistake\n"} {
		writeKeys(t, path, bad, 2+gen)
		k.Poll()
		is("sk-alice-0001", "alice")
		is("sk-carol-0003", "carol")
		if got := testutil.ToFloat64(k.errs); got != float64(gen+1) {
			t.Fatalf("%q: %v reload errors, want %d", bad, got, gen+1)
		}
	}
	k.Poll() // unchanged bad file: not counted again
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	k.Poll()
	k.Poll()
	is("sk-carol-0003", "carol")
	if got := testutil.ToFloat64(k.errs); got != 3 {
		t.Fatalf("%v reload errors, want 3", got)
	}
	writeKeys(t, path, "dave sk-dave-00000004\n", 9)
	k.Poll()
	is("sk-dave-00000004", "dave")
	is("sk-alice-0001", "")
	if got := testutil.ToFloat64(k.oks); got != 3 {
		t.Fatalf("%v loads, want 3", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kvmesh_ingress_api_keys_reload_errors_total", "kvmesh_ingress_api_keys_reloads_total"); err != nil || n != 2 {
		t.Fatalf("registered series %d %v", n, err)
	}

	// Run stops when its stop channel closes.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { k.Run(stop); close(done) }()
	close(stop)
	<-done

	if _, err := WatchKeys(Config{KeysFile: path + ".missing"}, WatchConfig{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("missing file at start: %v", err)
	}
	writeKeys(t, path, "# none\n", 10)
	if _, err := WatchKeys(Config{KeysFile: path, EnvVar: "-"}, WatchConfig{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("empty file at start: %v", err)
	}
}

// Run picks up a change by itself.
func TestKeysRunReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, path, "alice sk-alice-0001\n", 0)
	k, err := WatchKeys(Config{KeysFile: path, EnvVar: "-"}, WatchConfig{Interval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { Chain{Keys: k}.Run(stop); close(done) }() // through a Chain, as the ingress runs it
	writeKeys(t, path, "bob sk-bob-00000002\n", 1)
	kvtest.WaitFor(t, 10*time.Second, "the reload", func() bool {
		id, err := k.Check([]byte("Bearer sk-bob-00000002"))
		return err == nil && id == "bob"
	})
	close(stop)
	<-done
}

// Keys.Check and a Chain over it allocate nothing (the request path).
func TestKeysCheckAllocatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, path, "alice sk-alice-0001\n", 0)
	k, err := WatchKeys(Config{KeysFile: path, EnvVar: "-"}, WatchConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hdr := []byte("Bearer sk-alice-0001")
	var c Authenticator = Chain{Keys: k}
	if n := testing.AllocsPerRun(200, func() {
		if _, err := c.Check(hdr); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
	if id, err := (Chain{}).Check(nil); err != nil || id != Anonymous {
		t.Fatalf("a Chain without keys: %q %v", id, err)
	}
}

// Authenticator is the ingress's interface (ingress.Authenticator).
type Authenticator interface {
	Check(authorization []byte) (string, error)
}
