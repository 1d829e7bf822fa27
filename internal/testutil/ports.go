package testutil

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePortBase returns a base of n consecutive loopback ports that were
// free for both TCP and UDP when probed (gossip takes both), trying
// random bases in [20000, 60000) a bounded number of times. Another
// process may still take one before the caller binds it: callers retry
// on "address already in use", a bounded number of times too.
func FreePortBase(tb testing.TB, n int) int {
	tb.Helper()
	for range 50 {
		base := 20000 + rand.IntN(40000-n)
		if portsFree(base, n) {
			return base
		}
	}
	tb.Fatalf("no %d consecutive free loopback ports found", n)
	return 0
}

func portsFree(base, n int) bool {
	var closers []func() error
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	for p := base; p < base+n; p++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		closers = append(closers, l.Close)
		u, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		closers = append(closers, u.Close)
	}
	return true
}
