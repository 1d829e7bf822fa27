package ingress

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The client watch is pooled with its exited channel (clientwatch.go): a
// watch whose watcher ran, saw its client leave and was stopped serves the
// next request's watch as well, whose watcher runs and is waited for again,
// request after request.
func TestClientWatchReusedAfterItsWatcherRan(t *testing.T) {
	s, hang := startHangIngress(t, false)
	body := `{"model":"m","prompt":[1,2]}`
	for i := int64(1); i <= 5; i++ {
		conn := dialIngress(t, s)
		if _, err := fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: kvmesh\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "the request on the hanging engine", func() bool { return hang.hits.Load() == i })
		conn.Close()
		testutil.WaitFor(t, 10*time.Second, "the engine's request canceled", func() bool { return hang.canceled.Load() == i })
		waitSettled(t, s)
		if got := val(s.m.requests.WithLabelValues("completions", "499")); got != float64(i) {
			t.Fatalf("request %d: 499 count %v", i, got)
		}
		if n := s.ups.nWatched.Load(); n != 0 {
			t.Fatalf("request %d: %d watches left", i, n)
		}
	}
}
