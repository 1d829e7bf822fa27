package filewatch

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
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

// A rewrite of the same length that keeps the modification time (an API
// key rotated to one as long, within the filesystem's timestamp
// granularity) is a change: of a small file at the next poll, of a large
// one within hashEvery polls. It is reported once.
func TestPollSeesSameSizeSameMtimeRewrite(t *testing.T) {
	mt := time.Unix(1_800_000_000, 0)
	write := func(p string, b []byte) {
		t.Helper()
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	for _, size := range []int{len("alice sk-alice-0001\n"), smallFile + 1} {
		p := filepath.Join(t.TempDir(), "keys")
		old := []byte(strings.Repeat("a", size))
		write(p, old)
		f, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		if changed, err := f.Poll(); changed || err != nil {
			t.Fatalf("size %d: unchanged file: %v %v", size, changed, err)
		}
		rotated := bytes.Clone(old)
		rotated[size/2] = 'b'
		write(p, rotated)
		st, err := os.Stat(p)
		if err != nil || !st.ModTime().Equal(mt) || st.Size() != int64(size) {
			t.Fatalf("setup: %v %v %d", err, st.ModTime(), st.Size())
		}
		seen := 0
		for range hashEvery {
			if changed, err := f.Poll(); err != nil {
				t.Fatal(err)
			} else if changed {
				seen++
			}
		}
		if seen != 1 {
			t.Errorf("size %d: same-size same-mtime rewrite reported %d times in %d polls, want once", size, seen, hashEvery)
		}
		if size <= smallFile {
			write(p, old)
			if changed, _ := f.Poll(); !changed {
				t.Errorf("size %d: rewrite back not seen at the next poll", size)
			}
		}
	}
}
