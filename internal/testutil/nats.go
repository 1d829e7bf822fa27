package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
// when tb's test ends) and waits until every one is ready, the JetStream
// meta group has a leader and all n peers, and a stream of n replicas can
// be placed. ClientURLs joins their URLs for a client.
func NATSCluster(tb testing.TB, n int) []*server.Server {
	tb.Helper()
	// JetStream clustering refuses a server with no configured routes, so
	// every server gets all the route ports, picked before any starts:
	// below the kernel's ephemeral range, which an outgoing connection
	// could take between the pick and the server's bind (a server that
	// never became ready, seen under a busy machine's connection churn).
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		ports[i] = unephemeralPort(tb, ports[:i])
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
	// The leader places a stream only on peers it sees online and
	// current; right after an election it may still count one offline
	// (a create refused with "peer offline").
	WaitFor(tb, 30*time.Second, "a JetStream cluster of every server, agreeing on a leader that sees every peer current", func() bool {
		leaders := map[string]bool{}
		peersCurrent := false
		for _, s := range srvs {
			jsz, err := s.Jsz(&server.JSzOptions{})
			if err != nil || jsz.Meta == nil || jsz.Meta.Leader == "" || jsz.Meta.Size != n ||
				!s.ReadyForConnections(10*time.Millisecond) || !s.JetStreamIsCurrent() {
				return false
			}
			leaders[jsz.Meta.Leader] = true
			if jsz.Meta.Leader == s.Name() {
				peersCurrent = len(jsz.Meta.Replicas) == n-1
				for _, r := range jsz.Meta.Replicas {
					peersCurrent = peersCurrent && r.Current && !r.Offline
				}
			}
		}
		return len(leaders) == 1 && peersCurrent
	})
	// That is not yet what placement asks: the leader places a stream only
	// on peers whose statsz (JetStream config and stats) it has received,
	// sent a while after each server starts and then at doubling
	// intervals, and until then refuses with "no suitable peers for
	// placement, peer offline" (nats-server's selectPeerGroup), seen 1 in
	// about 10 shuffled runs on a busy machine. So place a stream of n
	// replicas, as the tests will, until it is accepted.
	nc, js := JetStream(tb, ClientURLs(srvs))
	defer nc.Close()
	probe := jetstream.StreamConfig{Name: "KVMESH_TEST_PLACEMENT", Subjects: []string{"kvmesh.test.placement"},
		Storage: jetstream.MemoryStorage, Replicas: n}
	WaitFor(tb, 30*time.Second, "a stream of every server's replicas placed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, probe)
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := RetryLost(ctx, func(ctx context.Context) error { return js.DeleteStream(ctx, probe.Name) }); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		tb.Fatal(err)
	}
	return srvs
}

// unephemeralPort is a loopback port below Linux's ephemeral range (32768
// and up), free when probed and not in taken: no outgoing connection is
// given it between the probe and the server's bind.
func unephemeralPort(tb testing.TB, taken []int) int {
	tb.Helper()
	for range 100 {
		p := 20000 + rand.IntN(32768-20000)
		if slices.Contains(taken, p) {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			_ = ln.Close()
			return p
		}
	}
	tb.Fatal("no free loopback port below the ephemeral range")
	return 0
}

// StreamReplicas is stream's replica count as the server has it; the
// request is retried when a cluster lost it (RetryLost).
func StreamReplicas(ctx context.Context, tb testing.TB, js jetstream.JetStream, stream string) int {
	tb.Helper()
	var n int
	err := RetryLost(ctx, func(ctx context.Context) error {
		s, err := js.Stream(ctx, stream)
		if err == nil {
			n = s.CachedInfo().Config.Replicas
		}
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
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
