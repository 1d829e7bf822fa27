package natsrelay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func gossipConfig(name, role string, join ...string) gossip.Config {
	c := gossip.DefaultConfig()
	c.Name = name
	c.Profile = "local"
	c.BroadcastInterval = 50 * time.Millisecond
	c.PushPullInterval = time.Hour // gossip's full sync never runs within the test
	c.RejoinInterval = 200 * time.Millisecond
	c.Meta = gossip.NodeMeta{Role: role, ID: name}
	c.Join = join
	return c
}

func startNode(t *testing.T, c gossip.Config) *gossip.Node {
	t.Helper()
	n, err := gossip.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// tooBigForGossip is an adapter list that makes an engine's entry larger
// than a broadcast packet: gossip carries it only by push/pull, which runs
// once an hour here.
func tooBigForGossip() string {
	names := make([]string, 40)
	for i := range names {
		names[i] = fmt.Sprintf("customer-adapter-finetune-v2-%03d", i)
	}
	return gossip.JoinLoRAs(names)
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricValue(t, g, name).GetCounter().GetValue()
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricValue(t, g, name).GetGauge().GetValue()
}

// metricValue is the first series of metric name in g.
func metricValue(t *testing.T, g prometheus.Gatherer, name string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// startSubscribedIngress starts an ingress-role gossip member named
// ingress-1 whose entries come over the lane on NATS url too, with the
// node's and the subscription's counters on its registry.
func startSubscribedIngress(t *testing.T, url string) (*gossip.Node, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ic := gossipConfig("ingress-1", gossip.RoleIngress)
	ic.Registerer = reg
	in := startNode(t, ic)
	sub, err := Subscribe(connect(t, url), natsutil.Default(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if _, err := sub.Register(reg); err != nil {
		t.Fatal(err)
	}
	return in, reg
}

func TestIngressGetsLoadOverNATSWhenGossipCannot(t *testing.T) {
	srv := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	in, inReg := startSubscribedIngress(t, srv.URL())

	pub := NewPublisher(natsutil.Default(), nil)
	sc := gossipConfig("sidecar.1*", gossip.RoleSidecar, in.Addr()) // a name that is no subject token as it is
	sc.Relay = pub
	s := startNode(t, sc)
	pnc := connect(t, srv.URL())
	wg.Go(func() { pub.Run(ctx, pnc) })
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })

	loras := tooBigForGossip()
	for _, running := range []int{3, 9, 4} {
		s.SetEngine(gossip.EngineState{ID: "e1", Model: "m", LoRAs: loras, Running: running, KVUsage: 0.5})
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("the ingress sees running=%d", running), func() bool {
			v, ok := in.Engine("e1")
			return ok && v.Running == running && v.LoRAs == loras && v.Node == "sidecar.1*"
		})
	}
	if got := counterValue(t, inReg, "kvmesh_gossip_relay_received_total"); got < 3 {
		t.Fatalf("relay_received = %v, want >= 3", got)
	}

	// A malformed message, one claiming another member's entry and one on
	// a subject that names no member: counted and rejected.
	raw := connect(t, srv.URL())
	for subj, data := range map[string][]byte{
		natsutil.Default().StateSubject("sidecar.1*"): []byte("\x01{not json"),
		natsutil.Default().StateSubject("ingress-1"):  []byte(`{}`),
		"kvmesh.state.a.b":                            []byte("x"),
		"kvmesh.state.~41":                            []byte("x"), // a safe byte escaped: not canonical
	} {
		if err := raw.Publish(subj, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the bad messages counted", func() bool {
		return counterValue(t, inReg, "kvmesh_gossip_malformed_total") == 2 && counterValue(t, inReg, "kvmesh_gossip_nats_rejected_total") == 2
	})
	if v, _ := in.Engine("e1"); v.Running != 4 {
		t.Fatalf("running = %d after bad messages; want 4", v.Running)
	}
}

// A message older than what the ingress has (NATS and gossip both
// delivered; one arrives late) does not overwrite it.
func TestOlderRelayedEntryDoesNotOverwrite(t *testing.T) {
	srv := testutil.NATS(t)
	in := startNode(t, gossipConfig("ingress-1", gossip.RoleIngress))
	sub, err := Subscribe(connect(t, srv.URL()), natsutil.Default(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	rec := &recorder{}
	sc := gossipConfig("sidecar-1", gossip.RoleSidecar, in.Addr())
	sc.Relay = rec
	s := startNode(t, sc)
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 })

	big := tooBigForGossip()
	for i, st := range []gossip.EngineState{
		{ID: "e1", Model: "m", LoRAs: big, Running: 1},
		{ID: "e1", Model: "m", LoRAs: big, Running: 2},
		{ID: "marker", Model: "m", LoRAs: big},
	} {
		s.SetEngine(st)
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("state %d recorded", i), func() bool { return rec.len() == i+1 })
	}
	// Newest first, then the older one late, then the marker: one
	// connection, one subscription, so they are merged in this order.
	nc := connect(t, srv.URL())
	for _, i := range []int{1, 0, 2} {
		if err := nc.Publish(natsutil.Default().StateSubject("sidecar-1"), rec.msg(i)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "the marker merged", func() bool {
		_, ok := in.Engine("marker")
		return ok
	})
	if v, _ := in.Engine("e1"); v.Running != 2 {
		t.Fatalf("running = %d: an older relayed state overwrote the newer", v.Running)
	}
}

// The publisher keeps the newest message per key and publishes on the
// member's escaped subject.
func TestPublisherKeepsNewestPerKey(t *testing.T) {
	srv := testutil.NATS(t)
	nc := connect(t, srv.URL())
	msgs := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(natsutil.Default().StateWildcard(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := NewPublisher(natsutil.Default(), nil)
	p.Relay("a.b>", "k", []byte("old"))
	p.Relay("a.b>", "k", []byte("new"))
	p.Relay("a.b>", "j", []byte("other"))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx, nc) })
	defer func() { cancel(); wg.Wait() }()
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case m := <-msgs:
			if m.Subject != "kvmesh.state.a~2Eb~3E" {
				t.Fatalf("subject %q", m.Subject)
			}
			got[string(m.Data)] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("got %v", got)
		}
	}
	if got["old"] || !got["new"] || !got["other"] {
		t.Fatalf("published %v; want the newest per key", got)
	}
}

type recorder struct {
	mu   sync.Mutex
	msgs [][]byte
}

func (r *recorder) Relay(_, _ string, msg []byte) {
	r.mu.Lock()
	r.msgs = append(r.msgs, msg)
	r.mu.Unlock()
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

func (r *recorder) msg(i int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.msgs[i]
}

// A NATS user whose permissions predate the lane: the publisher stops
// after the first refusal instead of drawing a NATS error per publish. Each
// refused lane publish is followed at once by a refused publish elsewhere
// (an ingress's JetStream requests under the same user), which would hide
// the lane's from a look at the connection's last error.
func TestPublisherStopsWhenTheSubjectIsRefused(t *testing.T) {
	srv := testutil.NATSServer(t, server.Options{Users: []*server.User{{Username: "old", Password: "pw", Permissions: &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{"kvmesh.delta.>"}}}}}})
	p := NewPublisher(natsutil.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	var laneErrs atomic.Int64
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("old", "pw"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if strings.Contains(err.Error(), natsutil.Default().StatePrefix()) {
				laneErrs.Add(1)
			}
			p.PermissionViolation(err) // what natsutil.Conn's OnPermissionViolation does
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { defer close(done); p.Run(ctx, nc) }() // owned by the test: ends by itself, or with cancel
	stopped := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	for i := 0; !stopped(); i++ {
		if i > 2000 {
			t.Fatal("the publisher kept publishing on a refused subject")
		}
		p.Relay("m", "k", []byte{byte(i)})
		testutil.WaitFor(t, 5*time.Second, "the message handed to NATS", func() bool { return p.published.Load()+p.failed.Load() > uint64(i) || stopped() })
		if err := nc.Publish("$JS.API.STREAM.INFO.KVMESH_DELTAS", nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := laneErrs.Load(); n > 5 {
		t.Fatalf("%d lane publishes refused before the publisher stopped", n)
	}
	if p.publishing.Load() {
		t.Fatal("the publisher says it publishes after it stopped")
	}
}

// laneRig is a publisher whose NATS connection goes through a gate the
// test can cut, and an ingress-side connection that subscribes to the lane
// directly (never cut).
type laneRig struct {
	t    *testing.T
	port int
	gate *testutil.Gate
	sub  *nats.Conn
	msgs chan *nats.Msg
	pnc  *nats.Conn
	p    *Publisher
	reg  *prometheus.Registry
	stop func() // ends Run and waits for it
}

func startLaneRig(t *testing.T) *laneRig {
	t.Helper()
	t.Cleanup(func(d time.Duration) func() { return func() { resendCheck = d } }(resendCheck)) // after Run has ended (cleanups run last first)
	resendCheck = 20 * time.Millisecond
	srv := testutil.NATS(t)
	r := &laneRig{t: t, port: srv.Port(), gate: testutil.NewGate(t), sub: connect(t, srv.URL()), msgs: make(chan *nats.Msg, 16),
		p: NewPublisher(natsutil.Default(), nil), reg: prometheus.NewRegistry()}
	r.gate.Open(fmt.Sprintf("127.0.0.1:%d", r.port))
	pnc, err := nats.Connect("nats://"+r.gate.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pnc.Close)
	r.pnc = pnc
	if _, err := r.p.Register(r.reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.p.Run(ctx, pnc) })
	testutil.WaitFor(t, 5*time.Second, "the publisher running", func() bool { return r.p.publishing.Load() })
	r.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(r.stop)
	return r
}

// subscribe subscribes the ingress side to the lane; once it returns the
// server has the interest.
func (r *laneRig) subscribe() *nats.Subscription {
	r.t.Helper()
	s, err := r.sub.ChanSubscribe(natsutil.Default().StateWildcard(), r.msgs)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.sub.Flush(); err != nil {
		r.t.Fatal(err)
	}
	return s
}

// receive waits until every message of want has arrived (others are
// passed over).
func (r *laneRig) receive(want ...string) {
	r.t.Helper()
	missing := map[string]bool{}
	for _, w := range want {
		missing[w] = true
	}
	for len(missing) > 0 {
		select {
		case m := <-r.msgs:
			delete(missing, string(m.Data))
		case <-time.After(10 * time.Second):
			r.t.Fatalf("%v never arrived (reconnects %d, resent %d, failed %d, connected %v)", missing, r.pnc.Stats().Reconnects, r.p.resent.Load(), r.p.failed.Load(), r.pnc.IsConnected())
		}
	}
}

func (r *laneRig) reopen() { r.gate.Open(fmt.Sprintf("127.0.0.1:%d", r.port)) }

// The lane carries an entry only when it changes: one dropped while NATS
// was unreachable is published again once NATS is back, without a new
// change (an idle engine's state would otherwise never reach the lane).
func TestPublisherSendsAgainAfterNATSReturns(t *testing.T) {
	r := startLaneRig(t)
	s := r.subscribe()
	defer func() { _ = s.Unsubscribe() }()

	r.p.Relay("m", "k", []byte("v1"))
	r.receive("v1")
	if got := gaugeValue(t, r.reg, "kvmesh_gossip_nats_publishing"); got != 1 {
		t.Fatalf("publishing gauge %v while Run runs", got)
	}

	r.gate.Shut()
	testutil.WaitFor(t, 10*time.Second, "the publisher disconnected", func() bool { return !r.pnc.IsConnected() })
	r.p.Relay("m", "k", []byte("v2"))
	r.p.Relay("m", "j", []byte("other")) // a key that never reached NATS before
	testutil.WaitFor(t, 5*time.Second, "the publishes dropped", func() bool { return r.p.failed.Load() >= 2 })

	r.reopen()
	r.receive("v2", "other")
	if got := counterValue(t, r.reg, "kvmesh_gossip_nats_republished_total"); got < 1 {
		t.Fatalf("republished_total = %v", got)
	}
	r.stop()
	if got := gaugeValue(t, r.reg, "kvmesh_gossip_nats_publishing"); got != 0 {
		t.Fatalf("publishing gauge %v after Run returned", got)
	}
}

// A publish into a connection nats.go does not know broken (a hung or
// partitioned server, up to its stale-connection limit) returns no error
// and is lost all the same: after a reconnect the publisher sends every
// key's newest again although no publish failed. Here v2 is published
// without error while no ingress listens (lost, as into a dead socket),
// then the publisher's connection is cut and comes back: v2 arrives with
// no new change and nothing counted as failed. Before, only a failed
// publish brought a resend, and v2 stayed off the lane.
func TestPublisherSendsAgainAfterReconnect(t *testing.T) {
	r := startLaneRig(t)
	s := r.subscribe()
	r.p.Relay("m", "k", []byte("v1"))
	r.receive("v1")

	if err := s.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := r.sub.Flush(); err != nil { // the server has no interest left: v2 goes nowhere
		t.Fatal(err)
	}
	r.p.Relay("m", "k", []byte("v2"))
	testutil.WaitFor(t, 5*time.Second, "v2 published", func() bool { return r.p.published.Load() == 2 })
	if err := r.pnc.Flush(); err != nil { // the server had v2, and dropped it
		t.Fatal(err)
	}
	s = r.subscribe()
	defer func() { _ = s.Unsubscribe() }()

	r.gate.Shut()
	r.reopen()
	r.receive("v2")
	if got := counterValue(t, r.reg, "kvmesh_gossip_nats_republished_total"); got < 1 {
		t.Fatalf("republished_total = %v", got)
	}
	if got := r.p.failed.Load(); got != 0 {
		t.Fatalf("%d publishes failed: the resend was not for a reconnect alone", got)
	}
	if got := r.pnc.Stats().Reconnects; got < 1 {
		t.Fatalf("reconnects = %d", got)
	}
}

// A member's entry on the lane versioned more than gossip.MaxRelayAhead ahead
// of the ingress's clock (that member's clock minutes ahead) is counted in
// kvmesh_gossip_relay_future_total, not as malformed: a real entry of the
// sidecar, taken off the lane, sent again with its version 10 min ahead.
func TestFutureEntryOverNATSCounted(t *testing.T) {
	srv := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	in, inReg := startSubscribedIngress(t, srv.URL())
	raw, seen := laneTap(t, srv.URL(), "sidecar-1")
	pub := NewPublisher(natsutil.Default(), nil)
	sc := gossipConfig("sidecar-1", gossip.RoleSidecar, in.Addr())
	sc.Relay = pub
	s := startNode(t, sc)
	pnc := connect(t, srv.URL())
	wg.Go(func() { pub.Run(ctx, pnc) })
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })
	s.SetEngine(gossip.EngineState{ID: "e1", Model: "m", Running: 3})
	msg, err := seen.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A broadcast is a type byte and the entry's JSON, its version in "v".
	var e map[string]json.RawMessage
	if err := json.Unmarshal(msg.Data[1:], &e); err != nil {
		t.Fatal(err)
	}
	e["v"] = json.RawMessage(fmt.Sprint(time.Now().Add(10 * time.Minute).UnixNano()))
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	malformed0 := counterValue(t, inReg, "kvmesh_gossip_malformed_total")
	if err := raw.Publish(msg.Subject, append([]byte{msg.Data[0]}, b...)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the entry ahead counted", func() bool {
		return counterValue(t, inReg, "kvmesh_gossip_relay_future_total") == 1
	})
	if got := counterValue(t, inReg, "kvmesh_gossip_malformed_total"); got != malformed0 {
		t.Fatalf("malformed %v → %v for a well-formed entry ahead", malformed0, got)
	}
}

// An entry larger than the NATS server's max_payload (an engine with many
// adapters, a server configured small) is not handed to NATS: it is
// counted in kvmesh_gossip_nats_oversize_total (not as a failed publish)
// and logged at error once per key with its size and the limit, the lane
// keeps carrying the member's other entries, and gossip's push/pull
// carries the large one. Before, nats.go refused it with ErrMaxPayload,
// counted only as kvmesh_gossip_nats_publish_failed_total, with no word
// of which entry or why.
func TestEntryOverMaxPayloadCountedLoggedOnce(t *testing.T) {
	const maxPayload = 1024
	srv := testutil.NATSServer(t, server.Options{MaxPayload: maxPayload})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	in, _ := startSubscribedIngress(t, srv.ClientURL())
	raw := connect(t, srv.ClientURL())
	seen, err := raw.SubscribeSync(natsutil.Default().StateSubject("sidecar-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	pub := NewPublisher(natsutil.Default(), slog.New(slog.NewTextHandler(&logs, nil)))
	reg := prometheus.NewRegistry()
	if _, err := pub.Register(reg); err != nil {
		t.Fatal(err)
	}
	sc := gossipConfig("sidecar-1", gossip.RoleSidecar, in.Addr())
	sc.PushPullInterval = 100 * time.Millisecond // the large entry's way to the ingress
	sc.Relay = pub
	s := startNode(t, sc)
	pnc := connect(t, srv.ClientURL())
	wg.Go(func() { pub.Run(ctx, pnc) })
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })

	loras := tooBigForGossip() // over 1.4 KB
	s.SetEngine(gossip.EngineState{ID: "big", Model: "m", Running: 1, LoRAs: loras})
	testutil.WaitFor(t, 10*time.Second, "the large entry counted", func() bool {
		return counterValue(t, reg, "kvmesh_gossip_nats_oversize_total") == 1
	})
	s.SetEngine(gossip.EngineState{ID: "big", Model: "m", Running: 2, LoRAs: loras})
	testutil.WaitFor(t, 10*time.Second, "its next version counted", func() bool {
		return counterValue(t, reg, "kvmesh_gossip_nats_oversize_total") == 2
	})

	// The lane carries the member's other entries all the same.
	s.SetEngine(gossip.EngineState{ID: "small", Model: "m", Running: 5})
	for {
		msg, err := seen.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no state lane message for the small entry: %v", err)
		}
		if len(msg.Data) > maxPayload {
			t.Fatalf("a %d-byte message published over max_payload %d", len(msg.Data), maxPayload)
		}
		if strings.Contains(string(msg.Data), `"small"`) {
			break
		}
	}
	if got := counterValue(t, reg, "kvmesh_gossip_nats_publish_failed_total"); got != 0 {
		t.Fatalf("publish_failed = %v: an entry over max_payload is oversize, not a failed publish", got)
	}
	if !pnc.IsConnected() || pnc.Stats().Reconnects != 0 {
		t.Fatalf("the publisher's connection did not stay up: connected %v, reconnects %d", pnc.IsConnected(), pnc.Stats().Reconnects)
	}
	// Gossip's push/pull brings the large entry, newest version.
	testutil.WaitFor(t, 10*time.Second, "the large entry at the ingress by push/pull", func() bool {
		v, ok := in.Engine("big")
		return ok && v.Running == 2
	})

	out := logs.String()
	if n := strings.Count(out, "larger than the NATS max_payload"); n != 1 {
		t.Fatalf("%d error lines for one key over max_payload twice, want 1:\n%s", n, out)
	}
	for _, want := range []string{"level=ERROR", "big", "nats_max_payload=1024", "bytes="} {
		if !strings.Contains(out, want) {
			t.Fatalf("the error lacks %q:\n%s", want, out)
		}
	}
}

// A publisher on kvmesh.state.> that takes a live sidecar's entry off the
// lane and sends it again with the engine's URL pointed at its own server
// (the engine's prompts and API key would go there) is refused: the URL of
// the engine a member's gossip metadata names must be the metadata's, and
// the lane never introduces or changes an engine's address (an engine the
// metadata does not name, a DaemonSet sidecar's second one, comes first
// by gossip). Each refusal is counted in
// kvmesh_gossip_engine_url_mismatch_total, warned about once a minute per
// member, and the engine keeps its real URL, while the sidecar's own
// entries still come over the lane.
func TestForgedEngineURLOverNATSRefused(t *testing.T) {
	const realURL, evilURL = "http://127.0.0.1:8000", "http://127.0.0.1:45002"
	srv := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var logs testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	ic := gossipConfig("ingress-1", gossip.RoleIngress)
	ic.Registerer = reg
	ic.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	in := startNode(t, ic)
	sub, err := Subscribe(connect(t, srv.URL()), natsutil.Default(), in, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	raw, seen := laneTap(t, srv.URL(), "sidecar-1")
	pub := NewPublisher(natsutil.Default(), nil)
	sc := gossipConfig("sidecar-1", gossip.RoleSidecar, in.Addr())
	sc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1", Model: "m", EngineURL: realURL}
	sc.Relay = pub
	s := startNode(t, sc)
	pnc := connect(t, srv.URL())
	wg.Go(func() { pub.Run(ctx, pnc) })
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })

	s.SetEngine(gossip.EngineState{ID: "e1", Model: "m", URL: realURL, Running: 3})
	msg, err := seen.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the ingress sees e1", func() bool {
		v, ok := in.Engine("e1")
		return ok && v.URL == realURL && v.Running == 3
	})

	// forged is msg's entry with the engine id, URL and running count
	// replaced and a version 2 s ahead (within gossip.MaxRelayAhead).
	forged := func(id, url string, running int) []byte {
		var e map[string]json.RawMessage
		if err := json.Unmarshal(msg.Data[1:], &e); err != nil {
			t.Fatal(err)
		}
		var st map[string]any
		if err := json.Unmarshal(e["e"], &st); err != nil {
			t.Fatal(err)
		}
		st["id"], st["url"], st["run"] = id, url, running
		e["n"], _ = json.Marshal(id)
		e["e"], _ = json.Marshal(st)
		e["v"] = json.RawMessage(fmt.Sprint(time.Now().Add(2 * time.Second).UnixNano()))
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return append([]byte{msg.Data[0]}, b...)
	}
	publish := func(data []byte) {
		t.Helper()
		if err := raw.Publish(msg.Subject, data); err != nil {
			t.Fatal(err)
		}
		if err := raw.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	publish(forged("e1", evilURL, 0))
	publish(forged("e1", evilURL, 1))
	testutil.WaitFor(t, 10*time.Second, "the forged entries refused", func() bool {
		return counterValue(t, reg, "kvmesh_gossip_engine_url_mismatch_total") == 2
	})
	if v, _ := in.Engine("e1"); v.URL != realURL || v.Running != 3 {
		t.Fatalf("e1 after forged entries: url %q running %d; want %q, 3", v.URL, v.Running, realURL)
	}

	// An engine the metadata does not name comes first by gossip; the lane
	// then carries its load, never another URL.
	s.SetEngine(gossip.EngineState{ID: "e2", Model: "m", URL: "http://127.0.0.1:8001", Running: 1})
	testutil.WaitFor(t, 10*time.Second, "the ingress sees e2", func() bool {
		v, ok := in.Engine("e2")
		return ok && v.URL == "http://127.0.0.1:8001"
	})
	publish(forged("e2", evilURL, 7))
	publish(forged("e9", evilURL, 7)) // an engine gossip never delivered: ignored, not warned
	testutil.WaitFor(t, 10*time.Second, "the forged e2 refused", func() bool {
		return counterValue(t, reg, "kvmesh_gossip_engine_url_mismatch_total") == 3
	})
	if _, ok := in.Engine("e9"); ok {
		t.Fatal("an engine first seen on the lane, with a URL, was taken")
	}
	if v, _ := in.Engine("e2"); v.URL != "http://127.0.0.1:8001" {
		t.Fatalf("e2's url %q after a forged entry", v.URL)
	}

	// The sidecar's own entries still come over the lane: one too large
	// for a broadcast packet, which gossip carries only by push/pull (once
	// an hour here).
	s.SetEngine(gossip.EngineState{ID: "e1", Model: "m", URL: realURL, Running: 5, LoRAs: tooBigForGossip()})
	testutil.WaitFor(t, 5*time.Second, "the ingress sees running=5", func() bool {
		v, _ := in.Engine("e1")
		return v.Running == 5 && v.URL == realURL
	})

	out := logs.String()
	if n := strings.Count(out, "refusing an engine entry"); n != 1 {
		t.Fatalf("%d warnings for 3 refusals of one member within a minute, want 1:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "member=sidecar-1", "engine=e1", "url=" + evilURL, "want=" + realURL, "lane=nats"} {
		if !strings.Contains(out, want) {
			t.Fatalf("warning lacks %q:\n%s", want, out)
		}
	}
}

// laneTap subscribes, on a connection of its own (returned, to send on),
// to member's subject of the state lane: the messages a test takes off the
// lane to send again.
func laneTap(t *testing.T, url, member string) (*nats.Conn, *nats.Subscription) {
	t.Helper()
	raw := connect(t, url)
	seen, err := raw.SubscribeSync(natsutil.Default().StateSubject(member))
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Flush(); err != nil {
		t.Fatal(err)
	}
	return raw, seen
}
