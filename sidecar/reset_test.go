package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// SGLang has no /reset_prefix_cache: reset-engine falls back to its
// /flush_cache on a 404 and keeps using it (compat report F4).
func TestResetFallsBackToSGLangFlushCache(t *testing.T) {
	var e *engine
	var vllmPosts, flushPosts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/flush_cache":
			flushPosts.Add(1)
			e.c.clears.Add(1) // SGLang's AllBlocksCleared event, as the event loop counts it
			_, _ = w.Write([]byte("Cache flushed.\n"))
		case r.URL.Path == "/reset_prefix_cache":
			vllmPosts.Add(1)
			http.NotFound(w, r) // FastAPI's 404
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.ResyncPolicy = ResyncResetEngine
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: srv.URL}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e = s.engines[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.resetLoop(ctx, srv.Client()) }()
	defer func() { cancel(); <-done }()

	e.resetCh <- struct{}{}
	testutil.WaitFor(t, 10*time.Second, "a reset through /flush_cache", func() bool { return e.c.engineResets.Load() == 1 })
	e.resetCh <- struct{}{}
	testutil.WaitFor(t, 10*time.Second, "a second reset", func() bool { return e.c.engineResets.Load() == 2 })
	if vllmPosts.Load() != 1 || flushPosts.Load() != 2 || e.c.resetFailures.Load() != 0 {
		t.Fatalf("%d vLLM posts, %d flushes, %d failures; want 1, 2, 0", vllmPosts.Load(), flushPosts.Load(), e.c.resetFailures.Load())
	}
}
