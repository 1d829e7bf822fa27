package gossip

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// transport is memberlist's own UDP/TCP transport, except that its stream
// connections (joins, push/pulls, TCP pings) end when the node stops: a
// dial fails at once and an open connection is closed. memberlist's Join
// has no context, and a seed that accepts and never answers (or drops
// packets: a dead pod's IP kept in DNS) holds a join for the profile's
// TCPTimeout (10s on a LAN) per address; Close must not wait for that.
type transport struct {
	*memberlist.NetTransport
	stop context.Context
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

// newTransport binds mc's address, as memberlist does when it makes the
// transport itself (a few retries on a port taken between the TCP and the
// UDP bind when the port is picked), and fills in the picked port.
func newTransport(stop context.Context, mc *memberlist.Config) (*transport, error) {
	logger := mc.Logger
	if logger == nil {
		logger = log.New(io.Discard, "", 0)
	}
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: logger}
	tries := 1
	if mc.BindPort == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", net.JoinHostPort(mc.BindAddr, strconv.Itoa(mc.BindPort)), err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		if mc.AdvertisePort == 0 {
			mc.AdvertisePort = mc.BindPort
		}
	}
	return &transport{NetTransport: nt, stop: stop}, nil
}

// DialTimeout implements memberlist.Transport.
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport: a TCP dial
// bounded by timeout and by the node's stop.
func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.stop, "tcp", a.Addr)
	if err != nil {
		return nil, err
	}
	return &stoppableConn{Conn: c, unhook: context.AfterFunc(t.stop, func() { _ = c.Close() })}, nil
}

// stoppableConn is a dialled stream closed when the node stops, if
// memberlist has not closed it first.
type stoppableConn struct {
	net.Conn
	unhook func() bool
}

func (c *stoppableConn) Close() error {
	c.unhook()
	return c.Conn.Close()
}
