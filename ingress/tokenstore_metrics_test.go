package ingress

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// cacheSeries gathers reg's kvmesh_tokenizer_cache_tokens series for model:
// how many there are and the value of the last.
func cacheSeries(t *testing.T, reg *prometheus.Registry, model string) (n int, tokens float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvmesh_tokenizer_cache_tokens" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					n++
					tokens = m.GetGauge().GetValue()
				}
			}
		}
	}
	return n, tokens
}

// TestStoreTokenizerCacheMetrics: a tokenizer the ingress takes from the
// sidecars' store registers its prefix cache's kvmesh_tokenizer_cache_*
// series, as one loaded from --tokenizer does; a new revision's tokenizer
// takes the series over (one series, the new cache's), where registering
// it beside the old one's would fail. Before, store tokenizers had none.
func TestStoreTokenizerCacheMetrics(t *testing.T) {
	llama(t) // locates the tokenizer files
	tok, err := os.ReadFile(filepath.Join(llamaDir, "bert-base-uncased.json"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, bucket := tokenBucket(ctx, t)
	const model = "published/model"
	publish := func(config string) {
		t.Helper()
		dir := t.TempDir()
		for name, b := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": []byte(config)} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := tokenstore.Publish(ctx, bucket, model, "", dir); err != nil {
			t.Fatal(err)
		}
	}
	publish(`{"bos_token":"[CLS]"}`)

	reg := prometheus.NewRegistry()
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Registry: reg, Logger: quietLog()})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, nc) }()
	defer func() { cancel(); <-done }()

	var first Tokenizer
	testutil.WaitFor(t, 20*time.Second, "the published tokenizer loaded", func() bool {
		var ok bool
		first, ok = store.For(model)
		return ok
	})
	text := []byte(strings.Repeat("the prefix cache keeps the ids of every chunk of this text. ", 100))
	if _, err := first.Encode(nil, text); err != nil {
		t.Fatal(err)
	}
	if n, v := cacheSeries(t, reg, model); n != 1 || v <= 0 {
		t.Fatalf("%d kvmesh_tokenizer_cache_tokens series for the store's tokenizer (value %v); want one, counting the text encoded", n, v)
	}

	publish(`{"bos_token":"[CLS]","eos_token":"[SEP]"}`) // a new revision
	var next Tokenizer
	testutil.WaitFor(t, 20*time.Second, "the new revision loaded", func() bool {
		next, _ = store.For(model)
		return next != first
	})
	if n, v := cacheSeries(t, reg, model); n != 1 || v != 0 {
		t.Fatalf("after a new revision: %d series, value %v; want one, the new (empty) cache's", n, v)
	}
	if _, err := next.Encode(nil, text); err != nil {
		t.Fatal(err)
	}
	if n, v := cacheSeries(t, reg, model); n != 1 || v <= 0 {
		t.Fatalf("after encoding with the new revision: %d series, value %v; want one, counting it", n, v)
	}
}
