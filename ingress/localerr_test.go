package ingress

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// startDialFaultIngress starts a Server whose engine dials go through dial
// (set before Start, so no request races the field).
func startDialFaultIngress(t *testing.T, cfg Config, deps Deps, dial func(addr string) (net.Conn, error)) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if deps.Logger == nil {
		deps.Logger = quietLog()
	}
	if deps.AccessLog == nil {
		deps.AccessLog = deps.Logger
	}
	s, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	s.ups.dialFault = dial
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A dial that fails for want of the ingress's own resources (here a fake
// EMFILE from socket(), as when the process is out of file descriptors) is
// not the engine's failure: no engine is ejected, no other engine is tried
// (it would fail the same way), and the client gets a 503 with Retry-After
// that says the ingress is out of resources, counted as local_error.
func TestLocalDialErrorIsNotTheEngines(t *testing.T) {
	fe1, fe2 := startFaultEngine(t, faultOK), startFaultEngine(t, faultOK)
	var dials atomic.Int32
	fakeEMFILE := func(addr string) (net.Conn, error) {
		dials.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	s := startDialFaultIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe1.url()}, StaticEngine{ID: "e2", Model: "m", URL: fe2.url()}),
		Deps{}, fakeEMFILE)
	st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
	if st != 503 || hdr.Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q: %s; want 503 with Retry-After 1", st, hdr.Get("Retry-After"), body)
	}
	for _, want := range []string{`"code":"ingress_resource_exhausted"`, "the ingress", "too many open files"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("body %s does not say %q", body, want)
		}
	}
	if e := hdr.Get(engineHeader); e != "" {
		t.Errorf("%s %q on an answer no engine gave (tester h-limits 3)", engineHeader, e)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: another engine fails the same way", n)
	}
	for _, id := range []string{"e1", "e2"} {
		if !s.health.allowed(id) {
			t.Errorf("engine %s ejected for the ingress's own resource error", id)
		}
	}
	if n := val(s.m.attempts.WithLabelValues("local_error")); n != 1 {
		t.Errorf("attempts{result=local_error} = %v, want 1", n)
	}
	if n := val(s.m.attempts.WithLabelValues("connect_error")); n != 0 {
		t.Errorf("attempts{result=connect_error} = %v, want 0", n)
	}
}

// A P/D leg that fails for want of the ingress's own resources is not its
// engine's failure either: legFailure labels it local_error and neither
// counts it on the engine nor ejects it, as attemptFailed does for whole
// requests.
func TestPDLegLocalErrorIsNotTheEngines(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "p0", Model: "m", URL: fe.url()}), Deps{})
	up, err := s.ups.get("p0", fe.url())
	if err != nil {
		t.Fatal(err)
	}
	emfile := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	if why := s.legFailure(up, emfile); why != "local_error" {
		t.Fatalf("legFailure(EMFILE) = %q, want local_error", why)
	}
	if n := up.failures.Load(); n != 0 {
		t.Errorf("the engine's failures = %d after a local error, want 0", n)
	}
	if !s.health.allowed("p0") {
		t.Error("a local error ejected the engine")
	}
}
