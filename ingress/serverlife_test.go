package ingress

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Close after a Start that failed (the port taken, for the client listener
// or the admin one) returns without panicking, as `defer srv.Close()`
// callers need; the Server does not start again.
func TestCloseAfterFailedStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, c := range []struct{ name, listen, admin string }{
		{"listen", taken.Addr().String(), ""},
		{"admin listen", "127.0.0.1:0", taken.Addr().String()},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
			cfg.Listen, cfg.AdminListen = c.listen, c.admin
			s, err := New(cfg, Deps{Logger: quietLog()})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background()); err == nil {
				s.Close()
				t.Fatal("Start succeeded on a taken port")
			}
			if a := s.Addr(); a != "" {
				t.Errorf("Addr after a failed Start: %q, want none", a)
			}
			if err := s.Close(); err != nil {
				t.Errorf("Close after a failed Start: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if err := s.Start(context.Background()); err == nil {
				t.Error("a failed Server started again")
			}
		})
	}
}

// When Start's context ends, the close it starts is owned: its outcome is
// logged, and Close waits for it and returns the same error. A context
// that cannot end starts no watcher.
func TestStartContextEndCloses(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.Listen = "127.0.0.1:0"
	log, logBuf := syncLog()
	s, err := New(cfg, Deps{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	testutil.WaitFor(t, 10*time.Second, "the close on the context's end, logged", func() bool {
		return strings.Contains(logBuf.String(), "closed on context end")
	})
	if !s.draining.Load() {
		t.Fatal("closed but not draining")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close after the context's close: %v", err)
	}
	select {
	case <-s.ctxDone:
	default:
		t.Fatal("Close returned before the context watcher ended")
	}

	s2 := startIngress(t, cfg, Deps{Logger: quietLog()}) // context.Background
	if s2.ctxDone != nil {
		t.Fatal("a watcher for a context that cannot end")
	}
}

// headMemo keeps one note per request head, however many chunked uploads
// are being read at once: none takes another's (a client with a valid key
// would be answered 401 for its too-large body instead of 413).
func TestHeadMemoManyUploads(t *testing.T) {
	var m headMemo
	m.init(time.Minute, func() time.Duration { return 0 })
	heads := make([]fasthttp.RequestHeader, 2000) // distinct addresses, as fasthttp's connections' heads
	for i := range heads {
		var n headNote
		n.cors = i
		if i%2 == 1 {
			n.authErr = errors.New("bad key")
		}
		m.put(&heads[i], n)
	}
	for i := range heads {
		n := m.take(&heads[i])
		if n.cors != i || (n.authErr == nil) != (i%2 == 0) {
			t.Fatalf("head %d: note %+v, want its own (cors %d)", i, n, i)
		}
	}
	if n := m.take(&heads[0]); n.authErr == nil || n.cors != -1 {
		t.Fatalf("a taken note read again: %+v", n)
	}
	if m.n.Load() != 0 || len(m.m) != 0 {
		t.Fatalf("%d notes left", len(m.m))
	}
}

// Notes of requests that neither failed nor reached the handler go once
// older than the ttl, when the memo grows; newer ones stay, and a note is
// replaced by the next request on its head.
func TestHeadMemoSweep(t *testing.T) {
	var now time.Duration
	var m headMemo
	m.init(time.Minute, func() time.Duration { return now })
	old := make([]fasthttp.RequestHeader, minHeadSweep/2)
	for i := range old {
		m.put(&old[i], headNote{cors: i})
	}
	now = 61 * time.Second
	live := make([]fasthttp.RequestHeader, minHeadSweep)
	for i := range live {
		m.put(&live[i], headNote{cors: i})
	}
	if len(m.m) != len(live) || int(m.n.Load()) != len(live) {
		t.Fatalf("%d notes (counted %d), want the %d newer than the ttl", len(m.m), m.n.Load(), len(live))
	}
	m.put(&live[0], headNote{cors: 7})
	if n := m.take(&live[0]); n.cors != 7 {
		t.Fatalf("replaced note: %+v", n)
	}
	m.forget(&live[1])
	if _, ok := m.m[uintptr(unsafe.Pointer(&live[1]))]; ok {
		t.Fatal("forget left the note")
	}
}

// A chunked request read whole forgets its head's note (the handler sees
// Content-Length -1): the memo does not grow with successful uploads.
func TestChunkedSuccessForgetsNote(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	s := startIngress(t, cfg, Deps{Auth: edgeKeys(t)})
	for range 3 {
		if st, _, body := rawChunked(t, s.Addr(), "/v1/completions", 200, "Authorization: Bearer "+edgeKey+"\r\n"); st != 200 {
			t.Fatalf("%d %.200s", st, body)
		}
	}
	if n := s.heads.n.Load(); n != 0 {
		t.Fatalf("%d notes left after successful chunked requests", n)
	}
}

// The hold's clock is the monotonic time since New, not the wall clock: a
// wall-clock step would otherwise move every engine's estimated prefill
// end (upstream.bufDone) by the step, and held requests would wait for it.
func TestHoldClockMonotonic(t *testing.T) {
	s := holdServer(t)
	s.created = s.created.Add(-time.Hour) // keeps its monotonic reading
	got := time.Duration(s.holdNow())
	if got < time.Hour || got > time.Hour+time.Minute {
		t.Fatalf("hold clock reads %v, want the monotonic time since New (1h)", got)
	}
}
