package loadgen

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func progressAt(s float64, done int, final bool) Progress {
	return Progress{Total: 10, Completed: done, Elapsed: time.Duration(s * float64(time.Second)), Final: final}
}

// TestProgressPlain: off a terminal, the progress callback writes one plain
// line per period (however often it is called) and one at the end, with
// no carriage return.
func TestProgressPlain(t *testing.T) {
	var b bytes.Buffer
	f := progressWriter(&b, "kvmesh ", false, 10*time.Second)
	for _, s := range []float64{0.5, 1, 9.9, 10, 10.5, 15, 19.99, 35, 36} {
		f(progressAt(s, int(s/4), false))
	}
	f(progressAt(37, 10, true))
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	// 10 s, 35 s (20 and 30 passed unseen: one line, not three), final.
	if len(lines) != 3 || strings.Contains(b.String(), "\r") {
		t.Fatalf("got %d lines %q", len(lines), b.String())
	}
	for i, want := range []string{" 10s ", " 35s ", "10/10 done"} {
		if !strings.HasPrefix(lines[i], "kvmesh ") || !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q: want prefix and %q", i, lines[i], want)
		}
	}
}

// TestProgressTerminal: on a terminal every call redraws the line in place
// and the final call ends it.
func TestProgressTerminal(t *testing.T) {
	var b bytes.Buffer
	f := progressWriter(&b, "", true, 10*time.Second)
	f(progressAt(0.5, 1, false))
	f(progressAt(1, 2, false))
	f(progressAt(1.5, 10, true))
	out := b.String()
	if strings.Count(out, "\r") != 3 || strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		t.Fatalf("%q", out)
	}
}

// TestIsTerminal: buffers and regular files are not terminals, so
// ProgressLine writes plain lines to them.
func TestIsTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "progress")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(&bytes.Buffer{}) || IsTerminal(f) {
		t.Fatal("a buffer or a regular file taken for a terminal")
	}
	cb := ProgressLine(f, "")
	cb(progressAt(1, 1, false))
	cb(progressAt(2, 10, true))
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if s := string(data); strings.Contains(s, "\r") || strings.Count(s, "\n") != 1 {
		t.Fatalf("file got %q", s)
	}
}

// TestProgressHitUndefined: before any usage is counted the line's hit
// rate is n/a, not "hit 0.0%" (a measured miss); with usage it is the
// share cached.
func TestProgressHitUndefined(t *testing.T) {
	if s := (Progress{Total: 3, Failed: 3}).status(); !strings.HasSuffix(s, "hit n/a") {
		t.Errorf("no usage: %q", s)
	}
	if s := (Progress{Total: 3, Completed: 1, PromptTokens: 8, CachedTokens: 2}).status(); !strings.HasSuffix(s, "hit 25.0%") {
		t.Errorf("with usage: %q", s)
	}
}
