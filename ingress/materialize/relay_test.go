package materialize_test

import (
	"net"
	"sync"
	"testing"
)

// The relay below is a copy of the one in internal/natsutil's tests (test
// code is not shared across packages).

// relay is a TCP relay between NATS clients and a server that a test can
// freeze: then nothing flows either way while every connection stays open,
// and new connections are accepted and never answered, which is what a
// SIGSTOPped proxy or a blackholing middlebox does to a path (the fault
// injection of finding 1 stopped a relay).
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.accept() // owned by the relay; ends when close closes the listener
	t.Cleanup(r.close)
	return r
}

func (r *relay) url() string { return "nats://" + r.ln.Addr().String() }

// freeze stops every byte; thaw lets them flow again (connections accepted
// while frozen are closed then: their clients gave up on them long ago).
func (r *relay) freeze() { r.mu.Lock(); r.frozen = true; r.mu.Unlock() }
func (r *relay) thaw()   { r.mu.Lock(); r.frozen = false; r.cond.Broadcast(); r.mu.Unlock() }

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	r.wg.Wait()
}

// track registers c; false when the relay is closed.
func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// waitThawed blocks while the relay is frozen; false once it is closed.
func (r *relay) waitThawed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.frozen && !r.closed {
		r.cond.Wait()
	}
	return !r.closed
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			return
		}
		r.wg.Add(1)
		go func() { // owned by the relay
			defer r.wg.Done()
			r.mu.Lock()
			parked := r.frozen
			r.mu.Unlock()
			if parked { // accepted, never answered
				r.waitThawed()
				c.Close()
				return
			}
			up, err := net.Dial("tcp", r.target)
			if err != nil || !r.track(up) {
				c.Close()
				return
			}
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.pipe(up, c) }()
			r.pipe(c, up)
		}()
	}
}

// pipe copies src to dst, holding what it read while the relay is frozen.
func (r *relay) pipe(dst, src net.Conn) {
	defer func() { dst.Close(); src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !r.waitThawed() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF, or a connection closed by the relay or a client
			return
		}
	}
}
