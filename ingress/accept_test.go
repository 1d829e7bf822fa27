package ingress

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeAcceptErrors is a listener whose first n Accepts fail with err (as
// the kernel's accept4 would), then accepts for real: the fault injection
// for accept errors that cannot be caused on demand.
type fakeAcceptErrors struct {
	net.Listener
	n   atomic.Int32
	err error
}

func (l *fakeAcceptErrors) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", l.err)}
	}
	return l.Listener.Accept()
}

// startFaultyIngress starts a Server (with an admin listener) whose raw
// listeners fail their first n Accepts with errno.
func startFaultyIngress(t *testing.T, n int32, errno syscall.Errno) *Server {
	t.Helper()
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	s, err := New(cfg, Deps{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	s.acceptFault = func(ln net.Listener) net.Listener {
		f := &fakeAcceptErrors{Listener: ln, err: errno}
		f.n.Store(n)
		return f
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// getOrFail GETs url and returns its status, or fails t when s reports a
// listener stopped first (a request to a dead listener would hang in the
// kernel's backlog).
func getOrFail(t *testing.T, s *Server, url string) int {
	t.Helper()
	type result struct {
		status int
		err    error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			got <- result{err: err}
			return
		}
		resp.Body.Close()
		got <- result{status: resp.StatusCode}
	}()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("GET %s: %v", url, r.err)
		}
		return r.status
	case err := <-s.Failed():
		t.Fatalf("GET %s: the server failed first: %v", url, err)
	}
	return 0
}

// EMFILE on accept (out of file descriptors) is waited out, on the client
// and the admin listener alike: both serve once it passes, the errors are
// counted by listener and errno, and the Server does not fail.
func TestAcceptRetriesTemporaryErrors(t *testing.T) {
	s := startFaultyIngress(t, 3, syscall.EMFILE)
	if st := getOrFail(t, s, "http://"+s.Addr()+"/health"); st != 200 {
		t.Fatalf("client /health after EMFILE: %d", st)
	}
	if st := getOrFail(t, s, "http://"+s.AdminAddr()+"/health"); st != 200 {
		t.Fatalf("admin /health after EMFILE: %d", st)
	}
	for _, l := range []string{"client", "admin"} {
		if n := val(s.m.acceptErrors.WithLabelValues(l, "EMFILE")); n != 3 {
			t.Errorf("%s accept errors counted: %v, want 3", l, n)
		}
	}
	select {
	case err := <-s.Failed():
		t.Fatalf("server failed: %v", err)
	default:
	}
}

// An accept error that waiting does not cure ends Serve; the Server then
// says it failed (Run exits on it) instead of living on without a listener.
func TestListenerStopFailsServer(t *testing.T) {
	s := startFaultyIngress(t, 1, syscall.EINVAL)
	for range 2 { // client and admin
		err := <-s.Failed()
		if err == nil || !strings.Contains(err.Error(), "listener stopped") || !strings.Contains(err.Error(), "invalid argument") {
			t.Fatalf("Failed: %v", err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close after a failed listener: %v", err)
	}
}

// A real EMFILE: a child process (this test, re-run) serves with its soft
// RLIMIT_NOFILE a few fds above what it has open; the parent opens more
// connections than that, holds them until the child logs the failed
// accept, closes them, and is served again.
func TestAcceptRealEMFILE(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts fds in /proc/self/fd")
	}
	if os.Getenv("KVMESH_TEST_EMFILE_CHILD") == "1" {
		emfileChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptRealEMFILE$")
	cmd.Env = append(os.Environ(), "KVMESH_TEST_EMFILE_CHILD=1")
	stdin, err := cmd.StdinPipe() // the child serves until it closes
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child's address: %v", err)
	}
	addr = strings.TrimSpace(addr)
	go io.Copy(io.Discard, stdout) //nolint:errcheck // drains the test's output
	warned := make(chan bool, 1)   // true: the child logged a failed accept; false: its stderr ended first
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "accept failed") && strings.Contains(sc.Text(), "too many open files") {
				warned <- true
				io.Copy(io.Discard, stderr) //nolint:errcheck
				return
			}
		}
		warned <- false
	}()
	var held []net.Conn
	for range 16 { // the child has 3 fds to spare: the kernel queues the rest
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if !<-warned {
		t.Fatal("the child stopped without logging a failed accept")
	}
	for _, c := range held {
		c.Close()
	}
	c := &http.Client{Timeout: time.Minute} // a bound for a dead listener, not a timing assertion
	resp, err := c.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("after EMFILE: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after EMFILE: %d", resp.StatusCode)
	}
}

// emfileChild is TestAcceptRealEMFILE's child: it serves on a free port,
// lowers its fd limit, prints the address and serves until stdin closes.
func emfileChild() {
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Listen = "127.0.0.1:0"
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		panic(err)
	}
	if err := s.Start(context.Background()); err != nil {
		panic(err)
	}
	fds, err := os.ReadDir("/proc/self/fd") // its own fd is closed by now
	if err != nil {
		panic(err)
	}
	lim := syscall.Rlimit{Cur: uint64(len(fds) + 3)}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		panic(err)
	}
	lim.Max = old.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		panic(err)
	}
	os.Stdout.WriteString(s.Addr() + "\n") // after the limit: no connection is accepted under the old one
	go func() {
		<-s.Failed() // the listener died: exit now rather than leave the parent's request hanging
		os.Exit(3)
	}()
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // until the parent closes it
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		panic(err)
	}
	s.Close()
}

// Every accept-error series exists at 0 before the first error, so the
// documented alert, rate(kvmesh_ingress_accept_errors_total{errno=~
// "EMFILE|ENFILE"}[5m]) > 0, fires on the first episode (a series born at
// its first increment shows no rate for it).
func TestAcceptErrorSeriesExistBeforeTheFirst(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(), Deps{Logger: quietLog(), Registry: reg})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "kvmesh_ingress_accept_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var l, e string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "listener":
					l = lp.GetValue()
				case "errno":
					e = lp.GetValue()
				}
			}
			seen[l+" "+e] = m.GetCounter().GetValue()
		}
	}
	listeners := []string{"client"}
	if s.AdminAddr() != "" {
		listeners = append(listeners, "admin")
	}
	for _, l := range listeners {
		for _, e := range []string{"EMFILE", "ENFILE"} {
			if v, ok := seen[l+" "+e]; !ok || v != 0 {
				t.Errorf("accept_errors_total{listener=%q,errno=%q}: %v (present %v), want 0 before any error", l, e, v, ok)
			}
		}
	}
}
