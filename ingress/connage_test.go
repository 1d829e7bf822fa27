package ingress

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// startCountingEngine starts an engine answering completions (the fault
// engine's well-formed answer) that counts the connections it accepted.
func startCountingEngine(t *testing.T) (url string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	fe := &faultEngine{}
	srv := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			fe.answer(w, false, body)
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				accepted.Add(1)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), accepted
}

// startAgedIngress is startIngress with upstream connections reused for
// age at most (set before Start, so no request races the field).
func startAgedIngress(t *testing.T, cfg Config, age time.Duration) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	s, err := New(cfg, Deps{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	s.ups.connAge = age
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// An upstream connection past its age carries no new request: the next
// one is dialled, and with it the engine's host name resolved again, so
// traffic follows a Service name that moved to another address while the
// old one still accepts (F6). Before, a busy pool kept its connections,
// and the old address, for good. Here the age is 1 ns: every connection is
// past it at its first request, which it carries to the end (a connection
// in use is never cut) and then closes. With the default age the pool
// reuses one connection.
func TestUpstreamConnectionsAreNotReusedPastTheirAge(t *testing.T) {
	for _, tc := range []struct {
		age  time.Duration
		want int64
	}{{time.Nanosecond, 4}, {0, 1}} {
		url, accepted := startCountingEngine(t)
		s := startAgedIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: url}), tc.age)
		for i := range 4 {
			body := `{"model":"m","prompt":[` + strconv.Itoa(i+1) + `,2,3],"max_tokens":2}`
			if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body); st != 200 {
				t.Fatalf("age %v, request %d: %d %s", tc.age, i, st, b)
			}
		}
		if got := accepted.Load(); got != tc.want {
			t.Fatalf("age %v: the engine accepted %d connections for 4 requests in a row, want %d", tc.age, got, tc.want)
		}
	}
}
