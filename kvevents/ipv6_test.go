package kvevents_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	zmq "github.com/pebbe/zmq4"
)

// requireIPv6Loopback skips when this machine has no ::1 (a container
// started without IPv6); every other failure is the test's.
func requireIPv6Loopback(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	_ = ln.Close()
}

// TestIPv6Endpoints: an engine publishing on tcp://[::1]:P, with its replay
// there too, reaches the subscriber, and gaps are replayed over IPv6 (ZMQ
// sockets refuse IPv6 endpoints unless ZMQ_IPV6 is set on each).
func TestIPv6Endpoints(t *testing.T) {
	requireIPv6Loopback(t)
	eng := newFakeEngine(t, kvtest.PublisherConfig{Endpoint: "tcp://[::1]:*", ReplayEndpoint: "tcp://[::1]:*"}, 3)
	if ep := eng.pub.Endpoint(); !strings.HasPrefix(ep, "tcp://[::1]:") {
		t.Fatalf("publisher bound %q, want tcp://[::1]:port", ep)
	}
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: eng.pub.Endpoint(), ReplayEndpoint: eng.pub.ReplayEndpoint()})
	v := newView()
	connect(t, sub, v, eng)

	eng.pub.SetDropRate(0.5)
	for range 40 {
		eng.step()
	}
	eng.pub.SetDropRate(0)
	eng.step()
	pump(t, sub, v, "every batch over IPv6", func() bool { return v.last[0] == eng.pub.NextSeq()-1 && equalTo(v, eng)() })
	if st := sub.Stats(); eng.pub.Stats().Dropped > 0 && st.Replayed < eng.pub.Stats().Dropped {
		t.Fatalf("publisher %+v, subscriber %+v: drops not replayed over IPv6", eng.pub.Stats(), st)
	}
}

// TestIPv6BindMode: a subscriber binding tcp://[::1]:* (--bind-events)
// gets a real IPv6 endpoint and receives what a PUB connecting to it sends.
func TestIPv6BindMode(t *testing.T) {
	requireIPv6Loopback(t)
	sub := newTestSubscriber(t, kvevents.SubscriberConfig{Endpoint: "tcp://[::1]:*", Bind: true})
	ep := sub.Endpoints()[0]
	if !strings.HasPrefix(ep, "tcp://[::1]:") || strings.HasSuffix(ep, ":*") {
		t.Fatalf("bound endpoint %q, want tcp://[::1]:port", ep)
	}
	pub, err := zmq.NewSocket(zmq.PUB)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close() }()
	_ = pub.SetLinger(0)
	if err := pub.SetIpv6(true); err != nil {
		t.Fatal(err)
	}
	if err := pub.Connect(ep); err != nil {
		t.Fatal(err)
	}
	b := kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{42}, BlockSize: 4, Medium: "GPU"}}}
	payload := kvtest.AppendBatch(nil, &b, kvtest.ArrayForm)
	deadline := time.Now().Add(10 * time.Second)
	for seq := uint64(0); ; seq++ {
		// A PUB drops what it sends before the connection is up: resend
		// until one arrives (each with the next sequence number).
		if _, err := pub.SendMessage("", seq8(seq), payload); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		m, err := sub.Next(ctx)
		cancel()
		if err == nil && m.Kind == kvevents.MsgBatch {
			if len(m.Batch.Events) != 1 || m.Batch.Events[0].BlockHashes[0] != 42 {
				t.Fatalf("batch %+v", m.Batch)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing received on %s (stats %+v)", ep, sub.Stats())
		}
	}
}
