// Package endpoint holds the ZMQ endpoint rules the KV-event subscriber
// (kvevents) and the test publisher (kvevents/kvtest) share: vLLM's
// bind-or-connect rule, the one process-wide context inproc:// needs, and
// turning a bound endpoint into one peers can dial.
package endpoint

import (
	"net"
	"strings"
	"sync"

	zmq "github.com/pebbe/zmq4"
)

// SharedContext is the one ZMQ context of every kvevents socket in the
// process, so inproc:// endpoints connect a Publisher and a Subscriber in
// the same process (inproc only works within one context). It is never
// terminated: sockets are closed with linger 0 instead.
var SharedContext = sync.OnceValues(zmq.NewContext)

// BindContext returns the context for sockets of which some bind: its own
// (own true: the caller terminates it after closing its sockets, which
// waits until the I/O thread has closed the listeners, so the ports are free
// when Close returns; a socket's Close alone is asynchronous, and an engine
// or sidecar restarted on the same ports would race it), or the shared one
// when an endpoint is inproc://, which needs its peer's context.
func BindContext(endpoints ...string) (ctx *zmq.Context, own bool, err error) {
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "inproc://") {
			ctx, err = SharedContext()
			return ctx, false, err
		}
	}
	ctx, err = zmq.NewContext()
	return ctx, err == nil, err
}

// ShouldBind is vLLM's rule for a PUB endpoint (spec §1): bind when the
// endpoint has a wildcard host or port, or is ipc/inproc; connect otherwise.
// Port 0 also binds, because connecting to port 0 means nothing.
func ShouldBind(endpoint string) bool {
	if strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return true
	}
	_, port, ok := SplitTCP(endpoint)
	return ok && port == "0"
}

// SplitTCP splits "tcp://host:port" into host and port.
func SplitTCP(endpoint string) (host, port string, ok bool) {
	rest, found := strings.CutPrefix(endpoint, "tcp://")
	if !found {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// Connectable turns a bound endpoint as ZMQ reports it (LAST_ENDPOINT, e.g.
// "tcp://0.0.0.0:41234") into one a local peer can connect to.
func Connectable(endpoint string) string {
	host, port, ok := SplitTCP(endpoint)
	if !ok {
		return endpoint
	}
	host = strings.Trim(host, "[]")
	// With ZMQ_IPV6 set, libzmq reports an IPv4 bind as IPv4-mapped
	// ("[::ffff:127.0.0.1]"): give peers the IPv4 address it is.
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil {
		host = ip.To4().String()
	}
	switch host {
	case "0.0.0.0", "*", "":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "tcp://" + net.JoinHostPort(host, port)
}
