package mesh

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// natsServer is an embedded NATS server that can be restarted with the same
// JetStream store, behind one address: clients reach it through a gate that
// holds the port (a restart on the same port would race every other socket
// on the machine for it).
type natsServer struct {
	t     testing.TB
	e     *natsutil.Embedded
	gate  *testutil.Gate
	store string
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	s := &natsServer{t: t, gate: testutil.NewGate(t), store: t.TempDir()}
	s.start()
	t.Cleanup(func() { s.e.Shutdown() })
	return s
}

func (s *natsServer) start() {
	e, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Host: "127.0.0.1", Port: -1, StoreDir: s.store})
	if err != nil {
		s.t.Fatal(err)
	}
	s.e = e
	s.gate.Open(fmt.Sprintf("127.0.0.1:%d", e.Port()))
}

func (s *natsServer) restart() {
	s.e.Shutdown()
	s.start()
}

func (s *natsServer) url() string { return "nats://" + s.gate.Addr() }

// directURL is the running server's own address, without the gate's hop
// (for benchmarks; it changes on restart).
func (s *natsServer) directURL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.e.Port()) }

func natsConfig(url string) natsutil.Config {
	c := natsutil.DefaultConfig()
	c.URLs = []string{url}
	c.ReconnectWait = 100 * time.Millisecond
	c.Stream.Memory = false
	return c
}

func gossipConfig(name, role string, key []byte, join ...string) *gossip.Config {
	c := gossip.DefaultConfig()
	c.Name = name
	c.Profile = "local"
	c.SecretKey = key
	c.BroadcastInterval = 50 * time.Millisecond
	c.PushPullInterval = 500 * time.Millisecond
	c.RejoinInterval = 200 * time.Millisecond
	c.Meta = gossip.NodeMeta{Role: role, ID: name}
	c.Join = join
	return &c
}

// runningSidecar is a sidecar with its Run goroutine.
type runningSidecar struct {
	*sidecar.Sidecar
	done chan error
}

func startSidecar(t *testing.T, cfg sidecar.Config) *runningSidecar {
	t.Helper()
	s, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &runningSidecar{Sidecar: s, done: make(chan error, 1)}
	go func() { r.done <- s.Run(context.Background()) }()
	t.Cleanup(func() { r.stop(t) })
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	return r
}

func (r *runningSidecar) stop(t *testing.T) {
	_ = r.Close()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("sidecar run: %v", err)
		}
	default:
	}
}

// ingress is one materializer with its own NATS connection, gossip member
// and exact index.
type ingress struct {
	name   string
	idx    *meshtest.MapIndex
	real   *index.Index // the scheduler's index, fed the same writes
	m      *materialize.Materializer
	conn   *natsutil.Conn
	node   *gossip.Node
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startIngress(t *testing.T, name, natsURL string, gossipCfg *gossip.Config) *ingress {
	t.Helper()
	conn, err := natsutil.Connect(context.Background(), natsConfig(natsURL), nil)
	if err != nil {
		t.Fatal(err)
	}
	in := &ingress{name: name, idx: meshtest.NewMapIndex(), conn: conn, done: make(chan error, 1)}
	if in.real, err = index.New(index.Config{}); err != nil {
		t.Fatal(err)
	}
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index = conn.NC, tee{in.idx, in.real}
	cfg.CheckInterval = 50 * time.Millisecond
	cfg.SnapshotTimeout = 2 * time.Second
	if gossipCfg != nil {
		if in.node, err = gossip.New(*gossipCfg); err != nil {
			t.Fatal(err)
		}
		cfg.Membership = in.node
	}
	if in.m, err = materialize.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() { in.done <- in.m.Run(ctx) }()
	t.Cleanup(in.stop)
	return in
}

func (in *ingress) stop() {
	in.once.Do(func() {
		in.cancel()
		<-in.done
		if in.node != nil {
			_ = in.node.Close()
		}
		in.conn.Close()
	})
}

// The scheduler's index is what the ingress wires into the materializer.
var _ materialize.Index = (*index.Index)(nil)

// tee writes to the exact map index and to the real index.
type tee struct {
	a, b materialize.Index
}

func (t tee) Store(e string, tier kvevents.Tier, keys []uint64) {
	t.a.Store(e, tier, keys)
	t.b.Store(e, tier, keys)
}

func (t tee) Remove(e string, tier kvevents.Tier, keys []uint64) {
	t.a.Remove(e, tier, keys)
	t.b.Remove(e, tier, keys)
}

func (t tee) ClearEngine(e string) {
	t.a.ClearEngine(e)
	t.b.ClearEngine(e)
}

// truthFunc returns an engine's own cache per tier, sorted.
type truthFunc func() [kvevents.NumTiers][]uint64

// converged reports the first difference between an ingress's index and the
// engines' truth, or "" when they are equal.
func converged(in *ingress, truths map[string]truthFunc) string {
	if p := in.idx.Problems(); len(p) > 0 {
		return fmt.Sprintf("%s: index contract broken: %v", in.name, p[:min(len(p), 3)])
	}
	for engine, truth := range truths {
		want := truth()
		for tier := range want {
			got := in.idx.Keys(engine, kvevents.Tier(tier))
			if !slices.Equal(meshtest.Sorted(got), meshtest.Sorted(want[tier])) {
				return fmt.Sprintf("%s: engine %s tier %s: index has %d keys, engine %d", in.name, engine, kvevents.Tier(tier), len(got), len(want[tier]))
			}
			if n := in.real.KeyCount(engine, kvevents.Tier(tier)); n != len(want[tier]) {
				return fmt.Sprintf("%s: engine %s tier %s: scheduler index has %d keys, engine %d", in.name, engine, kvevents.Tier(tier), n, len(want[tier]))
			}
		}
	}
	return ""
}

// waitConverged waits until every ingress equals the truth exactly.
func waitConverged(t *testing.T, what string, ins []*ingress, truths map[string]truthFunc) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		diff := ""
		for _, in := range ins {
			if diff = converged(in, truths); diff != "" {
				break
			}
		}
		if diff == "" {
			t.Logf("%s: converged in %v", what, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not converged after 20s: %s", what, diff)
		}
		<-tick.C
	}
}
