package ingress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"
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
// progress. Writes come from the connection's serving goroutine only.
type sendConn struct {
	net.Conn
	d time.Duration
}

// Write writes p, failing with errSendTimeout once a wait of d passes in
// which the client took none of it. A wait that moved some bytes starts
// another: a slow but reading client is not cut, however large p.
func (c *sendConn) Write(p []byte) (int, error) {
	written := 0
	for {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.d)); err != nil {
			return written, err
		}
		n, err := c.Conn.Write(p[written:])
		written += n
		switch {
		case err == nil:
			return written, nil
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return written, err
		case n == 0:
			return written, &sendTimeoutError{d: c.d}
		}
	}
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
