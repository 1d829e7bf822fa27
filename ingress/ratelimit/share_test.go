package ratelimit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestShareThroughGossip runs two ingress-like replicas joined by real memberlist
// gossip on loopback: usage admitted on one replica limits the other.
func TestShareThroughGossip(t *testing.T) {
	newNode := func(name string, join []string) *gossip.Node {
		cfg := gossip.DefaultConfig()
		cfg.Name, cfg.Profile, cfg.Join = name, "local", join
		cfg.Meta = gossip.NodeMeta{Role: gossip.RoleIngress, ID: name}
		n, err := gossip.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	na := newNode("ingress-a", nil)
	nb := newNode("ingress-b", []string{na.Addr()})
	testutil.WaitFor(t, 10*time.Second, "both limiters' gossip members joined", func() bool { return na.NumMembers() == 2 && nb.NumMembers() == 2 })

	cfg := Config{PerKey: Limits{InputTokens: 10_000}}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, p := range []struct {
		l *Limiter
		n *gossip.Node
	}{{a, na}, {b, nb}} {
		wg.Add(1)
		go func() { defer wg.Done(); p.l.Share(ctx, p.n, 20*time.Millisecond, nil) }()
	}
	defer func() { cancel(); wg.Wait() }()

	if _, ok := a.Admit("alice", "m", 9_000); !ok {
		t.Fatal("first request refused")
	}
	// Once a's usage reached b, b refuses what it alone would admit.
	testutil.WaitFor(t, 10*time.Second, "b sees a's 9,000 input tokens for alice", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		o := b.origins["ingress-a"]
		return o != nil && o.scopes[hashKey("alice")].curr[dimIn] == 9_000
	})
	if d := b.AdmitAt("alice", "m", 2_000, time.Now()); d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("b admitted past the cluster limit: %+v", d)
	}
	if _, ok := b.Admit("alice", "m", 500); !ok {
		t.Fatal("b refused what still fits cluster-wide")
	}
}

// gossip.Node is the Carrier the ingress passes to Share.
var _ Carrier = (*gossip.Node)(nil)
