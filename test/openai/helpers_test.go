package openai

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startEngines starts n simulated engines serving model (mod adjusts each
// config) and returns them as static engines "sima", "simb", ….
func startEngines(t *testing.T, ctx context.Context, n int, model string, mod func(*sim.Config)) []ingress.StaticEngine {
	t.Helper()
	var out []ingress.StaticEngine
	for i := 0; i < n; i++ {
		cfg := sim.Config{Model: model, TimeScale: 200, Seed: uint64(i + 1), Logger: quiet}
		if mod != nil {
			mod(&cfg)
		}
		s, err := sim.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, ingress.StaticEngine{ID: "sim" + string(rune('a'+i)), Model: model, URL: s.URL()})
	}
	return out
}

// keyStore writes the test's API key into dir and loads it.
func keyStore(t *testing.T, dir string) *auth.Store {
	t.Helper()
	keys := filepath.Join(dir, "keys.txt")
	if err := os.WriteFile(keys, []byte("e2e "+testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(auth.Config{KeysFile: keys, EnvVar: "-"})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// startIngress starts an ingress on a free loopback port; it closes when the
// test ends.
func startIngress(t *testing.T, ctx context.Context, cfg ingress.Config, deps ingress.Deps) *ingress.Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	deps.Logger, deps.AccessLog = quiet, quiet
	srv, err := ingress.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// runScript runs a script with interpreter (node, python3) in dir with env
// added and decodes the one JSON object it prints into out.
func runScript(t *testing.T, ctx context.Context, interpreter, dir, script string, out any, env ...string) {
	t.Helper()
	run := exec.CommandContext(ctx, interpreter, script)
	run.Dir = dir
	run.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	run.Stderr = &stderr
	b, err := run.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s\nstdout:\n%s", filepath.Base(interpreter), script, err, stderr.String(), b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s output %q: %v", script, b, err)
	}
}

// results is what a client script printed: one object per check.
type results map[string]map[string]any

// ok returns check name's result, failing the test if the check failed.
func (r results) ok(t *testing.T, name string) map[string]any {
	t.Helper()
	v := r[name]
	if v == nil || v["error"] == true {
		t.Fatalf("%s failed: %v", name, v)
	}
	return v
}

// num reads a JSON number as an int (0 when it is not one).
func num(v any) int { f, _ := v.(float64); return int(f) }

// usage is a result's "usage" object.
func usage(r map[string]any) map[string]any { u, _ := r["usage"].(map[string]any); return u }

// nodeWork installs pkgs (pinned npm packages, cached under name) and
// returns a working directory of the test's own with scripts and
// harness.mjs (their shared helpers) in it, its node_modules linking to the
// shared install (which stays as npm left it).
func nodeWork(t *testing.T, name, why string, pkgs []string, scripts ...string) string {
	t.Helper()
	dir := testutil.NPMPackages(t, name, why, pkgs, nil)
	work := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "package.json"), []byte(`{"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, script := range append(scripts, "harness.mjs") {
		src, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, script), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return work
}
