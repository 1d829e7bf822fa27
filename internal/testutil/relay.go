package testutil

import (
	"net"
	"sync"
	"testing"
)

// Relay is a TCP relay between NATS clients and a server that a test can
// freeze: then nothing flows either way while every connection stays open,
// and new connections are accepted and never answered, which is what a
// SIGSTOPped proxy or a blackholing middlebox does to a path (a fault injection
// stopped a relay between an ingress and NATS to find the 6-minute blind spot
// nats.go's default pings left).
type Relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	frozen bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewRelay relays to target (host:port) until the test ends.
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &Relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.accept() // owned by the relay; ends when close closes the listener
	tb.Cleanup(r.close)
	return r
}

// Addr is the relay's own address.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Freeze stops every byte; Thaw lets them flow again (connections accepted
// while frozen are closed then: their clients gave up on them long ago).
func (r *Relay) Freeze() { r.mu.Lock(); r.frozen = true; r.mu.Unlock() }
func (r *Relay) Thaw()   { r.mu.Lock(); r.frozen = false; r.cond.Broadcast(); r.mu.Unlock() }

func (r *Relay) close() {
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

// track registers c; false when the Relay is closed.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// waitThawed blocks while the Relay is frozen; false once it is closed.
func (r *Relay) waitThawed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.frozen && !r.closed {
		r.cond.Wait()
	}
	return !r.closed
}

func (r *Relay) accept() {
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

// pipe copies src to dst, holding what it read while the Relay is frozen.
func (r *Relay) pipe(dst, src net.Conn) {
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
		if err != nil { // EOF, or a connection closed by the Relay or a client
			return
		}
	}
}
