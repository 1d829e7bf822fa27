package tokenstore

import (
	"context"

	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Reader fetches published tokenizers; it never creates or changes the bucket.
// Safe for concurrent use.
type Reader struct {
	store  jetstream.ObjectStore
	bucket string
	// dir is where fetched files are written, one directory per model and revision.
	dir string
}

// OpenReader binds to the bucket. It fails with jetstream.ErrBucketNotFound
// while no sidecar has published yet; callers retry.
func OpenReader(ctx context.Context, js jetstream.JetStream, bucket, cacheDir string) (*Reader, error) {
	store, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", bucket, err)
	}
	return &Reader{store: store, bucket: bucket, dir: cacheDir}, nil
}

// Manifest returns the model's current manifest (ErrNotFound when none).
func (r *Reader) Manifest(ctx context.Context, model string) (Manifest, error) {
	return current(ctx, r.store, model)
}

// Fetch writes the model's current tokenizer files into a directory of their
// own (laid out as tokenizer.LoadDir expects), verifying every digest, and
// returns it with the manifest. A directory already fetched for that revision
// is reused.
func (r *Reader) Fetch(ctx context.Context, model string) (string, Manifest, error) {
	m, err := r.Manifest(ctx, model)
	if err != nil {
		return "", Manifest{}, err
	}
	dir := filepath.Join(r.dir, safe(model), safe(m.Revision))
	if complete(dir, m) {
		return dir, m, nil
	}
	tmp, err := os.MkdirTemp(r.dir, ".fetch-")
	if err != nil {
		return "", Manifest{}, fmt.Errorf("fetch tokenizer %s: %w", model, err)
	}
	defer os.RemoveAll(tmp)
	for f, want := range m.Files {
		b, err := r.store.GetBytes(ctx, fileName(model, m.Revision, f))
		if err != nil {
			return "", Manifest{}, fmt.Errorf("fetch tokenizer %s: %s: %w", model, f, err)
		}
		if got := digest(b); got != want {
			return "", Manifest{}, fmt.Errorf("%w: %s %s: manifest %s, file %s", ErrDigest, model, f, want, got)
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return "", Manifest{}, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", Manifest{}, err
	}
	if err := os.Rename(tmp, dir); err != nil && !complete(dir, m) {
		return "", Manifest{}, fmt.Errorf("fetch tokenizer %s: %w", model, err)
	}
	return dir, m, nil
}

// complete reports whether dir holds every file of m (written by an earlier Fetch).
func complete(dir string, m Manifest) bool {
	for f := range m.Files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return false
		}
	}
	return true
}

// Watch calls fn with the model name of every manifest put after Watch starts
// (and, first, of every manifest already there), until ctx ends. fn runs on the
// watcher's goroutine, which Watch is: it returns when ctx ends.
func (r *Reader) Watch(ctx context.Context, fn func(model string)) error {
	w, err := r.store.Watch(ctx, jetstream.IncludeHistory())
	if err != nil {
		return fmt.Errorf("watch %s: %w", r.bucket, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case info, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if info == nil || info.Deleted { // nil marks the end of the initial values
				continue
			}
			if model, ok := strings.CutPrefix(info.Name, "manifests/"); ok {
				fn(model)
			}
		}
	}
}

// safe turns a model name or revision into one path element.
func safe(s string) string {
	r := strings.NewReplacer("/", "__", "\\", "_", "..", "_", ":", "_")
	s = r.Replace(s)
	if s == "" || s == "." {
		return "_"
	}
	return s
}
