package ingress

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// fedLearner is a learner with samples of engines e0…e(n-1), engine i
// observed i+1 times.
func fedLearner(t testing.TB, n int) *learn.Learner {
	t.Helper()
	lr, err := learn.New(learn.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4, 2))
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("engine-%03d.pool-a.llama-3-8b-instruct", i)
		for k := 0; k <= i%5; k++ {
			tok := 100 + rng.IntN(8000)
			lr.ObservePrefill(id, tok, time.Duration((0.01+float64(tok)/20000)*1e9))
			lr.ObserveDecode(id, 8, 8*float64(tok), time.Duration((0.01+1e-7*8*float64(tok))*1e9), 20)
		}
	}
	return lr
}

// TestRestartedPeerStartsOver: a peer's shares under one epoch add up
// (each lists some engines); a share under a new epoch (the replica
// restarted with the same name) drops what the old one shared.
func TestRestartedPeerStartsOver(t *testing.T) {
	lr, _ := learn.New(learn.Config{})
	s := &Server{learn: lr, learnShares: newLearnShares(prometheus.NewRegistry(), "t"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	src := fedLearner(t, 2)
	own, pooled := src.Own(nil)
	share := func(epoch uint64, es []learn.EngineStats) {
		var buf bytes.Buffer
		if err := learn.EncodeShare(&buf, epoch, &pooled, es); err != nil {
			t.Fatal(err)
		}
		s.mergeLearnShare("peer", buf.Bytes())
	}
	e1 := own[1].Engine
	share(1, own)
	learnt := lr.Rates(e1)
	if learnt == lr.Pooled() {
		t.Fatalf("%s is priced on the pooled estimate after a share of it", e1)
	}
	share(1, own[:1]) // same epoch, e1 not listed: kept
	if got := lr.Rates(e1); got != learnt {
		t.Fatalf("same epoch: %s went from %+v to %+v", e1, learnt, got)
	}
	share(2, own[:1]) // new epoch without e1: gone
	if got := lr.Rates(e1); got != lr.Pooled() {
		t.Fatalf("new epoch: %s still priced %+v, want the pooled %+v", e1, got, lr.Pooled())
	}
	if lr.Peers() != 1 {
		t.Fatalf("%d peers, want 1", lr.Peers())
	}
	if got := val(s.learnShares.WithLabelValues("accepted")); got != 3 {
		t.Fatalf("%v shares accepted, want 3", got)
	}
}

// TestLearnSharerTakesTurns: with more engines than fit in one blob, every
// blob stays under the limit, the engines with new samples go first, and
// every engine is sent within a bounded number of shares.
func TestLearnSharerTakesTurns(t *testing.T) {
	const n = 60
	lr := fedLearner(t, n)
	var ls learnSharer
	now := time.Unix(1000, 0)
	seen := map[string]int{}
	shares := 0
	for ; len(seen) < n && shares < 20; shares++ {
		b, err := ls.share(now, lr)
		if err != nil || b == nil {
			t.Fatalf("share %d: %v, %d bytes", shares, err, len(b))
		}
		if len(b) > learn.MaxShareBytes {
			t.Fatalf("share %d: %d bytes, limit %d", shares, len(b), learn.MaxShareBytes)
		}
		sh, err := learn.DecodeShare(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(sh.Engines) == 0 || len(sh.Engines) >= n {
			t.Fatalf("share %d holds %d of %d engines: the test needs several turns", shares, len(sh.Engines), n)
		}
		for _, e := range sh.Engines {
			seen[e.Engine]++
		}
		if b2, _ := ls.share(now.Add(time.Second), lr); b2 != nil {
			t.Fatal("shared again before the interval")
		}
		now = now.Add(learnShareInterval)
	}
	if len(seen) != n {
		t.Fatalf("after %d shares %d of %d engines were sent", shares, len(seen), n)
	}
	t.Logf("%d engines in %d shares", n, shares)
	// New samples of one engine put it first.
	hot := "engine-007.pool-a.llama-3-8b-instruct"
	for k := 0; k < 50; k++ {
		lr.ObservePrefill(hot, 1000, 60*time.Millisecond)
	}
	b, _ := ls.share(now, lr)
	sh, err := learn.DecodeShare(b)
	if err != nil || len(sh.Engines) == 0 || sh.Engines[0].Engine != hot {
		t.Fatalf("after new samples of %s the share starts with %+v (%v)", hot, sh.Engines[:min(1, len(sh.Engines))], err)
	}
}

// TestLearnedCostsSharedByGossip runs two ingress replicas on loopback
// memberlist in front of one real simulated engine:
//   - requests through replica a only: b, which never sent the engine a
//     request, comes to price it exactly as a does (a's sums reached it);
//   - then requests through b too: both fit on the union of their samples,
//     so their estimates agree, and each still publishes only its own;
//   - b leaves: a is back to its own samples.
func TestLearnedCostsSharedByGossip(t *testing.T) {
	eng, want := startLearnSim(t, 25000)

	engines := []StaticEngine{{ID: "e0", Model: "m", URL: eng.URL()}}
	cfg := testConfig(engines...)
	cfg.Scheduler.Policy = "kvmesh"
	cfg.Learn.Prior = learn.Rates{PrefillRate: 2 * want}
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local"}
	cfgA := cfg
	cfgA.ID = "ingress-a"
	regA := prometheus.NewRegistry()
	a := startIngress(t, cfgA, Deps{Membership: newStaticMembership(engines), Registry: regA})
	cfgB := cfg
	cfgB.ID = "ingress-b"
	cfgB.Cluster.GossipSeeds = []string{a.GossipAddr()}
	b := startIngress(t, cfgB, Deps{Membership: newStaticMembership(engines)}) // Close is idempotent

	rng := rand.New(rand.NewPCG(7, 1))
	send := func(s *Server, n int) { sendRandomStreams(t, s, rng, n, 8000, 4) }
	same := func(x, y learn.Rates) bool {
		return math.Abs(x.PrefillRate/y.PrefillRate-1) < 1e-9 && math.Abs(x.StepBase/y.StepBase-1) < 1e-9 &&
			math.Abs(x.DecodeSecPerToken/y.DecodeSecPerToken-1) < 1e-9
	}

	send(a, 16)
	ra := a.learn.Rates("e0")
	if math.Abs(ra.PrefillRate/cfg.Learn.Prior.PrefillRate-1) < 0.2 {
		t.Fatalf("a learned %+v, still near its prior: the test shows nothing", ra)
	}
	testutil.WaitFor(t, 30*time.Second, "b prices e0 with a's measurements", func() bool {
		return same(b.learn.Rates("e0"), a.learn.Rates("e0"))
	})
	if own, _ := b.learn.Own(nil); len(own) != 0 {
		t.Fatalf("b publishes %d engines it never sent to", len(own))
	}

	send(b, 8)
	testutil.WaitFor(t, 30*time.Second, "a and b fit the union of their samples", func() bool {
		return a.learn.Peers() == 1 && b.learn.Peers() == 1 && same(a.learn.Rates("e0"), b.learn.Rates("e0"))
	})
	ownA, pooledA := a.learn.Own(nil)
	ownB, _ := b.learn.Own(nil)
	if len(ownA) != 1 || len(ownB) != 1 || ownA[0].Samples < 16 || ownB[0].Samples < 8 || ownB[0].Samples >= ownA[0].Samples+ownB[0].Samples {
		t.Fatalf("own sums: a %+v, b %+v", ownA, ownB)
	}
	if g := metricValue(t, regA, "kvmesh_ingress_learn_shares_total", "result", "accepted"); g < 1 {
		t.Errorf("a accepted %v shares", g)
	}
	if l := a.learned("e0"); l.Peers != 1 || l.PrefillSamples != ownA[0].Samples-l.DecodeSamples {
		t.Errorf("a's /debug/engines block %+v: want 1 peer and its own samples (%d)", *l, ownA[0].Samples)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "a forgets b's share after b left", func() bool { return a.learn.Peers() == 0 })
	// a's own sums alone, fitted by a learner that only has them as a share.
	alone, _ := learn.New(a.cfg.Learn.learnConfig())
	if err := alone.SetPeer("a", pooledA, ownA); err != nil {
		t.Fatal(err)
	}
	if got, want := a.learn.Rates("e0"), alone.Rates("e0"); !same(got, want) || same(got, b.learn.Rates("e0")) {
		t.Errorf("a after b left: %+v, want its own samples' %+v (b: %+v)", got, want, b.learn.Rates("e0"))
	}

	// A member gossiping junk and then implausible sums under the key:
	// both counted as rejected, nothing of them used.
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.BindAddr, gc.BindPort = "rogue", "local", "127.0.0.1", 0
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleIngress, ID: "rogue"}
	gc.Join = []string{a.GossipAddr()}
	gc.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	rogue, err := gossip.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rogue.Close() })
	before := a.learn.Rates("e0")
	if err := rogue.SetAppState(LearnStateName, []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "a rejects the junk share", func() bool {
		return metricValue(t, regA, "kvmesh_ingress_learn_shares_total", "result", "rejected") >= 1
	})
	bad := pooledA
	bad.Prefill[1] = 1e30 // (Σx)² far above Σw·Σx²
	var buf bytes.Buffer
	if err := learn.EncodeShare(&buf, 1, &bad, ownA); err != nil {
		t.Fatal(err)
	}
	if err := rogue.SetAppState(LearnStateName, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "a rejects the implausible share", func() bool {
		return metricValue(t, regA, "kvmesh_ingress_learn_shares_total", "result", "rejected") >= 2
	})
	if got := a.learn.Rates("e0"); got != before || a.learn.Peers() != 0 {
		t.Errorf("rejected shares changed a: %+v (was %+v), %d peers", got, before, a.learn.Peers())
	}
}

// TestLearnSharerForgetsWhatTheLearnerForgot: the sharer's record of what
// it sent follows the learner's engines (forget.go drops departed ones).
func TestLearnSharerForgetsWhatTheLearnerForgot(t *testing.T) {
	const n = 8
	lr := fedLearner(t, n)
	var ls learnSharer
	now := time.Unix(1000, 0)
	if b, err := ls.share(now, lr); err != nil || b == nil {
		t.Fatalf("share: %v", err)
	}
	if len(ls.sent) != n {
		t.Fatalf("sent %d engines, want %d", len(ls.sent), n)
	}
	own, _ := lr.Own(nil)
	for _, e := range own[:n/2] {
		lr.Forget(e.Engine)
	}
	if b, err := ls.share(now.Add(learnShareInterval), lr); err != nil || b == nil {
		t.Fatalf("share: %v", err)
	}
	if len(ls.sent) != n/2 {
		t.Fatalf("the sharer keeps %d engines, the learner %d", len(ls.sent), n/2)
	}
	for _, e := range own[:n/2] {
		if _, ok := ls.sent[e.Engine]; ok {
			t.Fatalf("%s kept after the learner forgot it", e.Engine)
		}
	}
}
