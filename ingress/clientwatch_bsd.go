//go:build darwin || freebsd || netbsd || openbsd

package ingress

import (
	"net"
	"syscall"
)

// A FIN behind unread bytes is not seen here (no POLLRDHUP), so TLS
// connections are not watched: a close_notify alert ahead of the FIN looks
// like a pipelined request.
const peekSupported, finBehindBytes = true, false

// peerClosed waits until conn is readable or its read deadline passes and
// reports whether the peer closed it (EOF or reset). It consumes nothing;
// unread bytes (a pipelined request) end the wait without a verdict.
func peerClosed(conn net.Conn) bool {
	sc, ok := socketOf(conn).(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
			return false // not readable yet: wait in the poller
		case err != nil:
			closed = true // reset
		default:
			closed = n == 0
		}
		return true
	})
	// err is the deadline set by stop (or the server closing the
	// connection): no verdict.
	return err == nil && closed
}
