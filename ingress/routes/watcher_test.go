package routes

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

	"github.com/kvmesh/kvmesh/internal/testutil"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// write replaces the file and moves its mtime forward so a same-second,
// same-size rewrite is still seen.
func write(t *testing.T, path, data string, gen int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1_800_000_000+int64(gen), 0)
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

func routeYAML(model string) string {
	return "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: r, match: {model: x}, backends: [{model: " + model + "}]}]\n"
}

func pickOf(t *testing.T, w *Watcher) string {
	r, ok := w.Table().Match("x", "/v1/completions", func(string) []byte { return nil })
	if !ok {
		t.Fatal("no route")
	}
	return r.Pick(0)
}

func TestWatcherReloadsAndKeepsOldTableOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	write(t, path, routeYAML("a"), 0)
	reg := prometheus.NewRegistry()
	w, err := NewWatcher(WatcherConfig{Path: path, Logger: quiet(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if pickOf(t, w) != "a" {
		t.Fatal("initial table")
	}
	old := w.Table()

	write(t, path, routeYAML("b"), 1)
	w.Check()
	if pickOf(t, w) != "b" {
		t.Fatal("not reloaded")
	}
	if r, _ := old.Match("x", "/", func(string) []byte { return nil }); r.Pick(0) != "a" {
		t.Fatal("the old table changed under its holder")
	}

	write(t, path, strings.Replace(routeYAML("c"), "backends", "backendz", 1), 2)
	w.Check()
	if pickOf(t, w) != "b" || w.ReloadErrors() != 1 {
		t.Fatalf("bad file: pick %q errors %v, want b and 1", pickOf(t, w), w.ReloadErrors())
	}
	w.Check() // unchanged bad file: not counted again
	if w.ReloadErrors() != 1 {
		t.Fatalf("errors %v after an unchanged check", w.ReloadErrors())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w.Check()
	if pickOf(t, w) != "b" || w.ReloadErrors() != 2 {
		t.Fatal("a missing file must keep the old table and count once")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_ingress_route_reload_errors_total" {
			found = mf.GetMetric()[0].GetCounter().GetValue() == 2
		}
	}
	if !found {
		t.Fatal("kvmesh_ingress_route_reload_errors_total not 2 in the registry")
	}
}

func TestWatcherRunPicksUpChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	write(t, path, routeYAML("a"), 0)
	w, err := NewWatcher(WatcherConfig{Path: path, Logger: quiet(), Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { w.Run(stop); close(done) }()
	write(t, path, routeYAML("b"), 1)
	testutil.WaitFor(t, 10*time.Second, "reload", func() bool { return pickOf(t, w) == "b" })
	close(stop)
	<-done
}

func TestNewWatcherRejectsBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	write(t, path, "kind: nope\n", 0)
	if _, err := NewWatcher(WatcherConfig{Path: path, Logger: quiet()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	// One line, naming the file: errors.Join put a newline after
	// "invalid route config".
	if _, err := NewWatcher(WatcherConfig{Path: path + ".missing", Logger: quiet()}); !errors.Is(err, ErrConfig) ||
		strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), path+".missing") {
		t.Fatalf("missing file: err = %q", err)
	}
}

// TestWatcherOptional: with Optional a missing file is no routes (not an
// error, not a counted reload failure) until it appears; an existing invalid
// file still fails at start, and without Optional a missing one does.
func TestWatcherOptional(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if _, err := NewWatcher(WatcherConfig{Path: path, Logger: quiet()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("missing file without Optional: %v", err)
	}
	w, err := NewWatcher(WatcherConfig{Path: path, Optional: true, Logger: quiet(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := w.Table().Match("x", "/v1/completions", func(string) []byte { return nil }); ok || w.Table().Len() != 0 {
		t.Fatal("routes before the file exists")
	}
	w.Check()
	if w.ReloadErrors() != 0 {
		t.Fatalf("a file not there yet counted as a reload error")
	}
	write(t, path, routeYAML("a"), 0)
	w.Check()
	if pickOf(t, w) != "a" {
		t.Fatal("the file that appeared was not loaded")
	}
	write(t, path, "routes: [", 1)
	if _, err := NewWatcher(WatcherConfig{Path: path, Optional: true, Logger: quiet()}); !errors.Is(err, ErrConfig) {
		t.Fatalf("invalid file with Optional: %v", err)
	}
}
