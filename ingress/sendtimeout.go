package ingress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// The client send timeout (Config.SendTimeout), nginx's send_timeout.
//
// A streamed answer is pulled at the client's pace (proxyStream.Read runs
// only when fasthttp can write), so a client that stops reading blocks the
// write, the stream stops reading its engine, and nothing on the upstream
// side (IdleTimeout) ever fires: the request would hold its upstream
// connection, its engine's generation and a MaxConcurrent slot until the
// client closes. fasthttp's WriteTimeout is a deadline for the whole
// response, which a long healthy stream would hit. So every accepted client
// connection is wrapped: each Write sets a fresh write deadline, and a
// Write fails only when SendTimeout passes with no byte taken by the
// client. fasthttp then closes the response's body stream with that error
// (proxyStream.CloseWithError), which cancels the upstream request as a
// client disconnect does, and closes the connection.

// sendTimeoutListener wraps the connections it accepts in sendConn.
type sendTimeoutListener struct {
	net.Listener
	d time.Duration
}

func (l sendTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sendConn{Conn: c, d: l.d}, nil
}

// sendConn is a client connection whose writes fail after d without
// progress. Writes come from the connection's serving goroutine; Close
// (crypto/tls's close_notify, written through Write) may come from
// another.
type sendConn struct {
	net.Conn
	d time.Duration
	// deadline is a write deadline the caller set (a monotime reading, which
	// a wall-clock step before the write moves not; 0: none):
	// crypto/tls's 5 s for its close_notify alert, the admin server's
	// WriteTimeout. A write waits until the earlier of it and d.
	deadline atomic.Int64
	// fired: a write went d without progress. The client is not reading,
	// so every later write fails at once; else closing a TLS connection
	// would wait another whole d to write its close_notify.
	fired atomic.Bool
}

// Write writes p, failing with errSendTimeout once a wait of d passes in
// which the client took none of it. A wait that moved some bytes starts
// another: a slow but reading client is not cut, however large p. A
// deadline the caller set ends the write as a net.Conn's does.
func (c *sendConn) Write(p []byte) (int, error) {
	if c.fired.Load() {
		return 0, &sendTimeoutError{d: c.d}
	}
	written := 0
	for {
		deadline, own := time.Now().Add(c.d), false
		if dl := c.deadline.Load(); dl != 0 && dl < monotime.Of(deadline) {
			deadline, own = monotime.Time(dl), true
		}
		if err := c.Conn.SetWriteDeadline(deadline); err != nil {
			return written, err
		}
		n, err := c.Conn.Write(p[written:])
		written += n
		switch {
		case err == nil:
			return written, nil
		case !errors.Is(err, os.ErrDeadlineExceeded), own:
			return written, err
		case n == 0:
			c.fired.Store(true)
			return written, &sendTimeoutError{d: c.d}
		}
	}
}

// SetWriteDeadline records the caller's write deadline, which Write keeps.
func (c *sendConn) SetWriteDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = monotime.Of(t)
	}
	c.deadline.Store(ns)
	return nil
}

// SetDeadline sets the read deadline and records the write deadline.
func (c *sendConn) SetDeadline(t time.Time) error {
	_ = c.SetWriteDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

// errSendTimeout is what a client connection's write fails with when the
// client took nothing for the send timeout (errors.Is).
var errSendTimeout = errors.New("client stopped reading")

// sendTimeoutError is errSendTimeout with the timeout; a net.Error whose
// Timeout is true, as the deadline's own error.
type sendTimeoutError struct{ d time.Duration }

func (e *sendTimeoutError) Error() string {
	return fmt.Sprintf("%v: nothing of the answer was taken for %v", errSendTimeout, e.d)
}
func (e *sendTimeoutError) Unwrap() []error { return []error{errSendTimeout, os.ErrDeadlineExceeded} }
func (e *sendTimeoutError) Timeout() bool   { return true }
func (e *sendTimeoutError) Temporary() bool { return false }

var _ net.Error = (*sendTimeoutError)(nil)

// netConnOf is the connection under a sendConn, conn itself otherwise.
func netConnOf(conn net.Conn) net.Conn {
	if sc, ok := conn.(*sendConn); ok {
		return sc.Conn
	}
	return conn
}
