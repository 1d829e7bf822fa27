package testutil

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// NPMPackages returns a directory holding node_modules with the pinned npm
// packages pkgs ("name@version") and the files given (name → content, e.g. a
// script node runs there), installing them on first use under the user cache
// directory, in kvmesh-test/<name>-<digest of pkgs and files> (a changed list
// or script installs afresh instead of reusing a stale copy). Concurrent test binaries install into
// private temporary directories and rename; the loser discards its copy. A
// missing node or npm skips the test, except in CI (Need). why says what the
// packages are for.
func NPMPackages(tb testing.TB, name, why string, pkgs []string, files map[string]string) string {
	tb.Helper()
	_, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	Need(tb, errors.Join(errNode, errNpm), "node and npm (Node.js 20+) are needed: "+why)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "kvmesh-test", name+"-"+installDigest(pkgs, files))
	marker := filepath.Join(dir, ".installed")
	if _, err := os.Stat(marker); err == nil {
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		tb.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "install-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(tmp) // no-op after a successful rename
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := append([]string{"install", "--no-audit", "--no-fund", "--loglevel=error"}, pkgs...)
	cmd := exec.CommandContext(ctx, npm, args...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("npm install %v: %v\n%s", pkgs, err, out)
	}
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, f), []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".installed"), nil, 0o644); err != nil {
		tb.Fatal(err)
	}
	err = os.Rename(tmp, dir)
	if _, statErr := os.Stat(marker); err != nil && statErr != nil {
		// Only complete installs are renamed into place, so a directory
		// without the marker predates it: replace it.
		if rmErr := os.RemoveAll(dir); rmErr == nil {
			err = os.Rename(tmp, dir)
		}
	}
	if _, statErr := os.Stat(marker); statErr != nil {
		tb.Fatal(fmt.Errorf("install %v: %v", pkgs, err))
	}
	return dir
}

// installDigest names an install by what it holds: the packages and the
// files, in a stable order.
func installDigest(pkgs []string, files map[string]string) string {
	h := sha256.New()
	for _, p := range pkgs {
		fmt.Fprintf(h, "pkg %q\n", p)
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		fmt.Fprintf(h, "file %q %q\n", f, files[f])
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// RunNode runs node script (a file in dir) with args and then the path of a
// JSON file holding in, and decodes what it prints (one JSON value) into
// out; any failure fails tb.
func RunNode(tb testing.TB, dir, script string, args []string, in, out any, timeout time.Duration) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "in.json")
	b, err := json.Marshal(in)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append(append([]string{filepath.Join(dir, script)}, args...), path)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		tb.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		tb.Fatalf("node %s printed %.200q: %v", script, stdout, err)
	}
}
