package gossip

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// blackHole listens on loopback and, once swallow is set, accepts and
// never answers (as a dead pod's IP that drops packets holds a dial, this
// holds memberlist's read until its TCPTimeout). Before that it closes
// each connection at once, so a join fails fast. Stops with the test.
type blackHole struct {
	ln       net.Listener
	swallow  atomic.Bool
	accepted atomic.Int32 // connections swallowed
}

func newBlackHole(t *testing.T) *blackHole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{ln: ln}
	var mu sync.Mutex
	var held []net.Conn // referenced, or the collector would close them
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !b.swallow.Load() {
				_ = c.Close()
				continue
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			b.accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	return b
}

// TestSilentSeedHoldsNeitherBroadcastsNorClose: a seed address that
// accepts and never answers keeps a join waiting for the profile's
// TCPTimeout (30s on the WAN profile used here). While the node joins it
// (a seed that is not a member), its load still reaches a live peer by
// broadcast (push/pull, which would carry it too, is slowed down to an
// hour), and Close ends the join instead of waiting for it.
func TestSilentSeedHoldsNeitherBroadcastsNorClose(t *testing.T) {
	hole := newBlackHole(t)
	pc := testConfig("peer", RoleIngress, nil)
	pc.PushPullInterval = time.Hour
	peer := start(t, pc)

	c := testConfig("n", RoleIngress, nil, peer.Addr(), hole.ln.Addr().String())
	c.Profile = "wan"
	c.PushPullInterval = time.Hour
	n, err := New(c) // joins the peer; the hole still refuses
	if err != nil {
		t.Fatal(err)
	}
	var cerr error
	closed := make(chan struct{})
	var closing sync.Once
	closeNode := func() { closing.Do(func() { go func() { cerr = n.Close(); close(closed) }() }) }
	t.Cleanup(func() { closeNode(); <-closed })

	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return n.NumMembers() == 2 && peer.NumMembers() == 2 })
	hole.swallow.Store(true)
	testutil.WaitFor(t, 15*time.Second, "the seed check to join the silent seed", func() bool { return hole.accepted.Load() > 0 })

	for _, load := range []int{3, 8} {
		n.SetInFlight(map[string]int{"e1": load})
		testutil.WaitFor(t, 10*time.Second, "the peer to see the new load", func() bool { return peer.InFlight()["e1"] == load })
	}

	closeNode()
	testutil.WaitFor(t, 10*time.Second, "Close to return during the join", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	// The WAN profile retransmits the leave over more gossip rounds (500ms
	// each) than Close's one second of leave waits for.
	if cerr != nil && !strings.Contains(cerr.Error(), "timeout waiting for leave broadcast") {
		t.Fatalf("Close: %v", cerr)
	}
}

// TestIPv6: a member bound to an IPv6 address gives an address others can
// join ("[::1]:port"), and one joins it.
func TestIPv6(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	c := testConfig("v6-a", RoleSidecar, nil)
	if err := c.SetAddrs("[::1]:0", ""); err != nil {
		t.Fatal(err)
	}
	a := start(t, c)
	if addr := a.Addr(); !strings.HasPrefix(addr, "[::1]:") {
		t.Fatalf("Addr() = %q, want [::1]:port", addr)
	}
	a.SetEngine(EngineState{ID: "e6", Model: "m"})
	c = testConfig("v6-b", RoleIngress, nil, a.Addr())
	if err := c.SetAddrs("[::1]:0", ""); err != nil {
		t.Fatal(err)
	}
	b := start(t, c)
	testutil.WaitFor(t, 10*time.Second, "b sees a's engine", func() bool { _, ok := b.Engine("e6"); return ok })
}
