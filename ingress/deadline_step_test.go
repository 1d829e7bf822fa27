package ingress

import (
	"net"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestConnDeadlinesAcrossWallStep: a read or write deadline the caller set
// (fasthttp's DoTimeout on an engine connection, crypto/tls's close_notify
// on a client's) is kept on the monotonic clock. Kept as wall-clock ns and
// re-armed by each Read or Write as time.Unix(0, ns), a deadline 5 s away
// set before the wall clock stepped forward an hour had passed by then,
// and the exchange failed at once.
func TestConnDeadlinesAcrossWallStep(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	// A deadline taken 5 s ahead before a 1-hour step forward: its wall
	// reading is an hour behind the clock's now, its monotonic one 5 s ahead.
	dl := testutil.WallStepped(time.Now().Add(5*time.Second), -time.Hour)

	ic := &idleConn{Conn: a, up: &upstream{id: "e"}}
	if err := ic.SetReadDeadline(dl); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = b.Write([]byte("x")) }()
	buf := make([]byte, 1)
	if n, err := ic.Read(buf); n != 1 || err != nil {
		t.Fatalf("read under a deadline 5 s away, set before a 1-hour wall step: %d bytes, %v", n, err)
	}

	sc := &sendConn{Conn: b, d: time.Minute}
	if err := sc.SetWriteDeadline(dl); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = a.Read(make([]byte, 1)) }()
	if n, err := sc.Write([]byte("y")); n != 1 || err != nil {
		t.Fatalf("write under a deadline 5 s away, set before a 1-hour wall step: %d bytes, %v", n, err)
	}
}
