package ingress

import (
	"context"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// /debug/* (pprof included) and, with an admin listener, /metrics are 404 on
// the client port; the admin listener serves them behind its token, and
// /debug/config shows no secret.
func TestDebugOnlyOnAdminListener(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: "http://user:engine-secret@" + fe.ln.Addr().String()})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminToken = "admin-secret"
	cfg.Cluster.GossipKey = []byte("gossip-secret-16")
	cfg.Cluster.NATSAuth.Password = "nats-secret"
	cfg.EngineAPIKey = "engine-api-secret"
	s := startIngress(t, cfg, Deps{})
	client, admin := "http://"+s.Addr(), "http://"+s.AdminAddr()
	for _, p := range []string{"/debug/config", "/debug/engines", "/debug/index", "/debug/health", "/debug/tokenizers", "/debug/pprof/", "/debug/pprof/cmdline", "/metrics"} {
		if st, body, _ := get(client + p); st != http.StatusNotFound {
			t.Errorf("client port %s: %d %.80s, want 404", p, st, body)
		}
		if st, _ := getAuth(t, admin+p, ""); st != http.StatusUnauthorized {
			t.Errorf("admin %s without token: %d, want 401", p, st)
		}
		if st, _ := getAuth(t, admin+p, "wrong"); st != http.StatusUnauthorized {
			t.Errorf("admin %s with a wrong token: %d, want 401", p, st)
		}
		if st, body := getAuth(t, admin+p, "admin-secret"); st != http.StatusOK {
			t.Errorf("admin %s: %d %.80s", p, st, body)
		}
	}
	if _, eng := getAuth(t, admin+"/debug/engines", "admin-secret"); strings.Contains(eng, "engine-secret") {
		t.Errorf("/debug/engines shows the engine URL's password: %s", eng)
	}
	_, body := getAuth(t, admin+"/debug/config", "admin-secret")
	for _, secret := range []string{"admin-secret", "engine-secret", "nats-secret", "gossip-secret", "engine-api-secret"} {
		if strings.Contains(body, secret) {
			t.Errorf("/debug/config shows %q: %s", secret, body)
		}
	}
	if !strings.Contains(body, "redacted") {
		t.Errorf("/debug/config redacted nothing: %s", body)
	}
	if st, _, _ := get(client + "/health"); st != http.StatusOK {
		t.Errorf("client /health: %d", st)
	}
}

func getAuth(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

// Start fails when the admin port is taken, and leaves nothing running: the
// gossip node, the NATS connection and the materializer it had started stop.
func TestStartFailureLeaksNothing(t *testing.T) {
	nats := testutil.NATS(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	before := runtime.NumGoroutine()
	cfg := testConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = taken.Addr().String()
	cfg.Cluster.GossipBind, cfg.Cluster.GossipProfile = "127.0.0.1:0", "local"
	cfg.Cluster.NATSURLs = []string{nats.URL()}
	s, err := New(cfg, Deps{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil {
		s.Close()
		t.Fatal("Start succeeded on a taken admin port")
	}
	testutil.WaitFor(t, 10*time.Second, "the started cluster goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
	if s.cl.nc != nil && !s.cl.nc.NC.IsClosed() {
		t.Fatal("NATS connection left open")
	}
}

// An admin client that sends requests and never reads the answers is cut
// by the send timeout, as on the client port: its connection closes.
// Before, a blocked write was bound by neither the admin ReadTimeout nor
// its IdleTimeout, and the connection (its fd and megabytes of kernel send
// buffer) stayed for as long as the client kept it.
func TestAdminSendTimeoutCutsAClientThatStopsReading(t *testing.T) {
	cfg := testConfig()
	cfg.AdminListen = "127.0.0.1:0"
	cfg.SendTimeout = 200 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	conn := dialNoReadAddr(t, s.AdminAddr())
	// Far more answers than the kernel's buffers hold (each /metrics answer
	// is kilobytes), so the server's write blocks.
	req := strings.Repeat("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 2000)
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the admin connection to open", func() bool { return s.admin.GetOpenConnectionsCount() == 1 })
	testutil.WaitFor(t, 30*time.Second, "the admin connection closed by the send timeout", func() bool { return s.admin.GetOpenConnectionsCount() == 0 })
}

// blockingCollector's Collect waits until release is closed, counting the
// renders waiting in it.
type blockingCollector struct {
	in      atomic.Int32
	release chan struct{}
}

func (c *blockingCollector) Describe(chan<- *prometheus.Desc) {}
func (c *blockingCollector) Collect(chan<- prometheus.Metric) {
	c.in.Add(1)
	<-c.release
}

// /metrics renders run at most maxMetricsInFlight at a time: one more gets
// a 503 at once, and /health is answered meanwhile. Before, a /metrics
// flood on the admin port rendered without bound and took the cores the
// client port routes with.
func TestMetricsRendersAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	bc := &blockingCollector{release: make(chan struct{})}
	reg.MustRegister(bc)
	cfg := testConfig()
	cfg.AdminListen = "127.0.0.1:0"
	s := startIngress(t, cfg, Deps{Registry: reg})
	admin := "http://" + s.AdminAddr()
	var wg sync.WaitGroup
	defer wg.Wait()
	released := false
	release := func() {
		if !released {
			released = true
			close(bc.release)
		}
	}
	defer release()
	for range maxMetricsInFlight {
		wg.Go(func() {
			if resp, err := http.Get(admin + "/metrics"); err == nil {
				resp.Body.Close()
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, "the renders to block", func() bool { return bc.in.Load() == maxMetricsInFlight })
	// Bounded: without the limit this render would wait for release too.
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(admin + "/metrics")
	if err != nil {
		t.Fatalf("/metrics beyond the limit: %v, want a 503 at once", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/metrics beyond the limit: %d, want 503", resp.StatusCode)
	}
	if st, _ := getAuth(t, admin+"/health", ""); st != http.StatusOK {
		t.Errorf("/health while renders are blocked: %d", st)
	}
	release()
	wg.Wait()
	if st, _ := getAuth(t, admin+"/metrics", ""); st != http.StatusOK {
		t.Errorf("/metrics after the renders ended: %d", st)
	}
}
