package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Gate holds a loopback port for a server a test starts later: until Open it
// accepts every connection and closes it at once (what a client sees of a
// server that is down), and after Open(target) it forwards each new
// connection to target. A test that instead closes a listener and starts the
// server on its port later races every other socket on the machine for that
// port (an ephemeral port is handed out again), and loses now and then.
type Gate struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewGate listens on 127.0.0.1 and closes the gate when the test ends.
func NewGate(tb testing.TB) *Gate {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	g := &Gate{ln: ln, conns: map[net.Conn]struct{}{}}
	g.wg.Add(1)
	go g.accept() // owned by the gate; ends when Close closes the listener
	tb.Cleanup(g.Close)
	return g
}

// Addr is the gate's host:port.
func (g *Gate) Addr() string { return g.ln.Addr().String() }

// Open forwards the connections that come from now on to target (host:port).
func (g *Gate) Open(target string) {
	g.mu.Lock()
	g.target = target
	g.mu.Unlock()
}

// Shut cuts every forwarded connection and refuses new ones until the next
// Open (a network partition between the clients and the server).
func (g *Gate) Shut() {
	g.mu.Lock()
	g.target = ""
	for c := range g.conns {
		c.Close()
	}
	clear(g.conns)
	g.mu.Unlock()
}

// Close stops accepting and cuts every forwarded connection.
func (g *Gate) Close() {
	g.ln.Close()
	g.Shut()
	g.wg.Wait()
}

func (g *Gate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		target := g.target
		g.mu.Unlock()
		if target == "" {
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		g.mu.Lock()
		g.conns[c], g.conns[up] = struct{}{}, struct{}{}
		g.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer g.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			g.mu.Lock()
			delete(g.conns, dst)
			delete(g.conns, src)
			g.mu.Unlock()
		}
		g.wg.Add(2)
		go pipe(up, c)
		go pipe(c, up)
	}
}
