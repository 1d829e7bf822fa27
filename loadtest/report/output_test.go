package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckWritable: a report path is checked before a run, without
// writing it: an existing file keeps its content, a new one is not
// created, and a missing directory, a directory and an unwritable file
// are refused naming the flag.
func TestCheckWritable(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.html")
	if err := os.WriteFile(old, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "new.html")
	for _, p := range []string{old, fresh} {
		if err := CheckWritable("--html", p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if b, _ := os.ReadFile(old); string(b) != "keep" {
		t.Errorf("existing file changed to %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the check left files behind: %v", ents)
	}
	ro := filepath.Join(dir, "ro.csv")
	if err := os.WriteFile(ro, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{filepath.Join(dir, "missing", "x.html"): "cannot create the file", dir: "not a regular file"}
	if os.Geteuid() != 0 { // root may write a read-only file
		bad[ro] = "permission denied"
	}
	for p, want := range bad {
		if err := CheckWritable("--requests-csv", p); err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "--requests-csv") {
			t.Errorf("%s: %v, want an error naming the flag and saying %q", p, err, want)
		}
	}
}
