package logutil

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestNew(t *testing.T) {
	var b bytes.Buffer
	New(&b, JSON, slog.LevelInfo).Info("hello", "k", 1, "took", 1500*time.Millisecond, slog.Group("g", "wait", 2*time.Minute))
	New(&b, JSON, slog.LevelInfo).Debug("not written")
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil || m["msg"] != "hello" || m["k"] != 1.0 {
		t.Fatalf("json log %q: %v", b.String(), err)
	}
	// Durations read as in the text format, not integer nanoseconds.
	if g, _ := m["g"].(map[string]any); m["took"] != "1.5s" || g["wait"] != "2m0s" {
		t.Fatalf("json log durations %q", b.String())
	}
	b.Reset()
	New(&b, Text, slog.LevelDebug).Debug("hello", "k", 1)
	if s := b.String(); !strings.Contains(s, "level=DEBUG") || !strings.Contains(s, "msg=hello k=1") {
		t.Fatalf("text log %q", s)
	}
	for _, f := range []string{JSON, Text, "TEXT", "Json"} { // any case, as --log-level's names
		if err := CheckFormat(f); err != nil {
			t.Error(err)
		}
	}
	b.Reset()
	New(&b, "TEXT", slog.LevelInfo).Info("hello")
	if s := b.String(); !strings.HasPrefix(s, "time=") {
		t.Fatalf("--log-format TEXT wrote %q, want the text format", s)
	}
	if err := CheckFormat("logfmt"); err == nil {
		t.Error("logfmt accepted")
	}
}
