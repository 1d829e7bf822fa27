package ingress

import "golang.org/x/sys/unix"

// On Linux the watcher also sees a peer's close behind bytes it has not
// read (POLLRDHUP: finBehindBytes), so TLS client connections are watched
// too: a TLS client that closes sends its close_notify alert before its FIN.
const finBehindBytes = true

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
