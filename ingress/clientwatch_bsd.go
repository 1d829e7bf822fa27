//go:build darwin || freebsd || netbsd || openbsd

package ingress

// A FIN behind unread bytes is not seen here (no POLLRDHUP), so TLS
// connections are not watched: a close_notify alert ahead of the FIN looks
// like a pipelined request.
const finBehindBytes = false

func hungUp(uintptr) bool { return false }
