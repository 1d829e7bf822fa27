package ingress

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// On Linux the watcher also sees a peer's close behind bytes it has not
// read (POLLRDHUP: finBehindBytes), so TLS client connections are watched
// too: a TLS client that closes sends its close_notify alert before its FIN.
const peekSupported, finBehindBytes = true, true

// peerClosed waits until conn's socket is readable or its read deadline
// passes and reports whether the peer closed it (EOF, reset, or a FIN behind
// unread bytes). It consumes nothing. Unread bytes without a FIN (a
// pipelined request, a TLS record) are left for the server: the watcher
// waits for the next event (the poller is edge-triggered and reports a FIN
// as one).
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
		closed = hungUp(fd)
		return closed
	})
	// err is the deadline set by stop (or the server closing the
	// connection): no verdict.
	return err == nil && closed
}

// hungUp reports whether the peer shut its side of fd down (or the socket
// failed), whatever bytes are still unread.
func hungUp(fd uintptr) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}
