package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// NATS starts an embedded NATS server with JetStream on a free loopback port
// and a temporary store; it shuts down when tb's test ends.
func NATS(tb testing.TB) *natsutil.Embedded {
	tb.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Port: -1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	return srv
}

// NATSServer starts a nats-server with opts (users, permissions, limits)
// on a free loopback port, without logs or signal handling, and with a
// temporary store when it runs JetStream; it shuts down when tb's test
// ends. NATS is the plain embedded server for a test that needs no options.
func NATSServer(tb testing.TB, opts server.Options) *server.Server {
	tb.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	if opts.JetStream && opts.StoreDir == "" {
		opts.StoreDir = tb.TempDir()
	}
	srv, err := server.NewServer(&opts)
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Start() // owned by srv: Shutdown stops it
	tb.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats-server not ready")
	}
	return srv
}

// JetStream connects to the NATS server at url with opts (the connection
// closes when tb's test ends) and returns the connection and its
// JetStream context.
func JetStream(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return nc, js
}

// NATSCluster starts n nats-servers with JetStream in one cluster on
// loopback (random client and route ports, temporary stores; they shut down
// when tb's test ends) and waits until every one is ready and the
// JetStream meta group has a leader and all n peers, so streams can be
// placed. ClientURLs joins their URLs for a client.
func NATSCluster(tb testing.TB, n int) []*server.Server {
	tb.Helper()
	// JetStream clustering refuses a server with no configured routes, so
	// every server gets all the route ports, picked before any starts.
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	var srvs []*server.Server
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
			JetStream: true, StoreDir: tb.TempDir(),
			Cluster: server.ClusterOpts{Name: "kvmesh-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")), // its own is recognized and skipped
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			tb.Fatal(err)
		}
		go srv.Start() // owned by srv: Shutdown stops it
		tb.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
		srvs = append(srvs, srv)
	}
	WaitFor(tb, 30*time.Second, "a JetStream cluster of every server, agreeing on its leader", func() bool {
		leaders := map[string]bool{}
		for _, s := range srvs {
			leader, size := metaGroup(s)
			if !s.ReadyForConnections(10*time.Millisecond) || !s.JetStreamIsCurrent() || size != n {
				return false
			}
			leaders[leader] = true
		}
		return len(leaders) == 1
	})
	return srvs
}

// metaGroup is the leader srv's JetStream meta group follows ("" for none)
// and the number of servers the group knows (0 without a leader).
func metaGroup(srv *server.Server) (leader string, size int) {
	jsz, err := srv.Jsz(&server.JSzOptions{})
	if err != nil || jsz.Meta == nil || jsz.Meta.Leader == "" {
		return "", 0
	}
	return jsz.Meta.Leader, jsz.Meta.Size
}

// lostRequestWait is how long RetryLost gives one JetStream API request.
const lostRequestWait = 10 * time.Second

// RetryLost runs fn, JetStream API requests, with a fresh deadline per try
// until it ends with anything but that deadline, or ctx ends. A JetStream
// cluster drops a request that arrives while its meta group changes
// leaders, which its client sees only as its deadline passing; the sidecar
// retries such a request (each of its requests has nats.go's 5 s default),
// and a test on a cluster does the same rather than spend its whole
// deadline on one lost request. fn must be safe to repeat.
func RetryLost(ctx context.Context, fn func(context.Context) error) error {
	for {
		try, cancel := context.WithTimeout(ctx, lostRequestWait)
		err := fn(try)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return err
		}
	}
}

// ClientURLs joins srvs' client URLs for nats.Connect.
func ClientURLs(srvs []*server.Server) string {
	urls := make([]string, len(srvs))
	for i, s := range srvs {
		urls[i] = s.ClientURL()
	}
	return strings.Join(urls, ",")
}

// SystemNATS starts the nats-server on PATH (the README's install path,
// Debian's package) with JetStream stored under dir, on loopback port
// (0: a random one), and returns its client URL and a stop that kills it
// (also run when tb's test ends). The caller checks the tool first
// (RequireTool).
func SystemNATS(tb testing.TB, dir string, port int) (url string, stop func()) {
	tb.Helper()
	p := "-1"
	if port > 0 {
		p = strconv.Itoa(port)
	}
	ports := tb.TempDir()
	cmd := exec.Command("nats-server", "-js", "-a", "127.0.0.1", "-p", p, "-sd", dir, "--ports_file_dir", ports)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	tb.Cleanup(stop)
	WaitFor(tb, 30*time.Second, "nats-server's ports file", func() bool {
		files, _ := filepath.Glob(filepath.Join(ports, "*.ports"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			var pf struct {
				NATS []string `json:"nats"`
			}
			if err == nil && json.Unmarshal(b, &pf) == nil && len(pf.NATS) > 0 {
				url = pf.NATS[0]
				return true
			}
		}
		return false
	})
	return url, stop
}
