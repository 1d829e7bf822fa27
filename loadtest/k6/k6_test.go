package k6

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestScriptsParse checks every script with `node --check` (k6 cannot run here). The
// scripts are ES modules, so each is checked under a .mjs name: node treats a .js file
// with import statements leniently and would accept syntax errors.
func TestScriptsParse(t *testing.T) {
	node := testutil.RequireTool(t, "node", "k6 cannot run here, so node --check parses the scripts")
	scripts, err := filepath.Glob("*.js")
	if err != nil || len(scripts) < 4 {
		t.Fatalf("scripts: %v %v", scripts, err)
	}
	dir := t.TempDir()
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, s[:len(s)-len(".js")]+".mjs")
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", dst).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
	}
	// The check must be able to fail.
	bad := filepath.Join(dir, "bad.mjs")
	if err := os.WriteFile(bad, []byte("export default function ( {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(node, "--check", bad).Run(); err == nil {
		t.Fatal("node --check accepted a syntax error")
	}
}
