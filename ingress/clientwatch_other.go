//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package ingress

import "net"

const peekSupported, finBehindBytes = false, false

func peerClosed(net.Conn) bool { return false }
