package sidecar

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// TestTokenizerDirNotThereYet: a --tokenizer-dir without tokenizer.json
// (a model cache or download that fills it after the sidecar starts) is
// said once, not retried with a warning every backoff; the files are
// published once they appear.
func TestTokenizerDirNotThereYet(t *testing.T) {
	var logs bytes.Buffer
	dir := filepath.Join(t.TempDir(), "model")
	publishes := 0
	p := tokenizerPublisher{dir: dir, log: slog.New(slog.NewTextHandler(&logs, nil)),
		publish: func(context.Context) (tokenstore.Manifest, bool, error) {
			publishes++
			return tokenstore.Manifest{Revision: "r1"}, true, nil
		}}
	ctx := context.Background()
	for range 3 {
		if wait := p.step(ctx); wait != tokenizerCheckInterval {
			t.Fatalf("wait %v with the directory missing; want the check interval %v", wait, tokenizerCheckInterval)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "no tokenizer.json in the tokenizer directory (yet)") {
		t.Fatalf("%d warnings, want 1 saying the file is not there yet: %s", n, logs.String())
	}
	if publishes != 0 {
		t.Fatalf("%d publishes of a missing directory", publishes)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.step(ctx)
	p.step(ctx) // unchanged: not published again
	if publishes != 1 || !strings.Contains(logs.String(), "tokenizer published") {
		t.Fatalf("%d publishes once tokenizer.json appeared, want 1: %s", publishes, logs.String())
	}
}
