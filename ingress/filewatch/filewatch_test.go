package filewatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPoll: a change of content (size) or modification time is a change
// once; a missing file is reported once until it is back, and coming back
// is a change.
func TestPoll(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	poll := func(wantChanged, wantErr bool) {
		t.Helper()
		changed, err := f.Poll()
		if changed != wantChanged || (err != nil) != wantErr {
			t.Fatalf("Poll: changed %v err %v, want changed %v err %v", changed, err, wantChanged, wantErr)
		}
	}
	poll(false, false)
	if err := os.WriteFile(p, []byte("bb"), 0o600); err != nil {
		t.Fatal(err)
	}
	poll(true, false)
	poll(false, false)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	poll(true, false)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	poll(false, true)
	poll(false, false)
	if err := os.WriteFile(p, []byte("bb"), 0o600); err != nil {
		t.Fatal(err)
	}
	poll(true, false)

	missing, err := New(filepath.Join(t.TempDir(), "none"))
	if err == nil {
		t.Fatal("New of a missing file: no error")
	}
	if changed, err := missing.Poll(); changed || err != nil {
		t.Fatalf("missing file's first Poll: %v %v (already reported by New)", changed, err)
	}
}
