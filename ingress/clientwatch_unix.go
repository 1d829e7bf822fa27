//go:build linux || darwin || freebsd || netbsd || openbsd

package ingress

import (
	"net"
	"syscall"
)

const peekSupported = true

// peerClosed waits until conn's socket is readable or its read deadline
// passes and reports whether the peer closed it (EOF, reset, or where
// finBehindBytes a FIN behind unread bytes). It consumes nothing. Unread
// bytes without a FIN (a pipelined request, a TLS record) are left for the
// server: where finBehindBytes the watcher waits for the next event (the
// poller is edge-triggered and reports a FIN as one); elsewhere they end
// the wait without a verdict.
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
			return true
		case n == 0:
			closed = true
			return true
		}
		closed = finBehindBytes && hungUp(fd)
		return closed || !finBehindBytes
	})
	// err is the deadline set by stop (or the server closing the
	// connection): no verdict.
	return err == nil && closed
}
