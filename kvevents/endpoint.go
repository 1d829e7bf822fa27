package kvevents

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	zmq "github.com/pebbe/zmq4"
)

// sharedContext is the one ZMQ context of every kvevents socket in the
// process, so inproc:// endpoints connect a Publisher and a Subscriber in
// the same process (inproc only works within one context). It is never
// terminated: sockets are closed with linger 0 instead.
var sharedContext = sync.OnceValues(zmq.NewContext)

// bindContext returns the context for sockets of which some bind: its own
// (own true: the caller terminates it after closing its sockets, which
// waits until the I/O thread has closed the listeners, so the ports are free
// when Close returns; a socket's Close alone is asynchronous, and an engine
// or sidecar restarted on the same ports would race it), or the shared one
// when an endpoint is inproc://, which needs its peer's context.
func bindContext(endpoints ...string) (ctx *zmq.Context, own bool, err error) {
	for _, ep := range endpoints {
		if strings.HasPrefix(ep, "inproc://") {
			ctx, err = sharedContext()
			return ctx, false, err
		}
	}
	ctx, err = zmq.NewContext()
	return ctx, err == nil, err
}

// shouldBind is vLLM's rule for a PUB endpoint (spec §1): bind when the
// endpoint has a wildcard host or port, or is ipc/inproc; connect otherwise.
// Port 0 also binds, because connecting to port 0 means nothing.
func shouldBind(endpoint string) bool {
	if strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return true
	}
	_, port, ok := splitTCP(endpoint)
	return ok && port == "0"
}

// splitTCP splits "tcp://host:port" into host and port.
func splitTCP(endpoint string) (host, port string, ok bool) {
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

// OffsetEndpoint returns the endpoint of DP rank r given rank 0's: a tcp
// endpoint with a numeric, non-zero port gets port+r (vLLM and SGLang offset
// each rank's publisher and replay socket this way); wildcard or zero ports
// stay as they are (every rank binds its own random port) and ipc/inproc
// paths get a "-r" suffix. It also validates the endpoint's form.
func OffsetEndpoint(endpoint string, r int) (string, error) {
	if strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		if r == 0 {
			return endpoint, nil
		}
		return fmt.Sprintf("%s-%d", endpoint, r), nil
	}
	host, port, ok := splitTCP(endpoint)
	if !ok || host == "" {
		return "", fmt.Errorf("%w: %q is not tcp://host:port, ipc:// or inproc://", ErrConfig, endpoint)
	}
	if r < 0 {
		return "", fmt.Errorf("%w: negative rank %d", ErrConfig, r)
	}
	if port == "*" || port == "0" {
		return endpoint, nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p+r > 65535 {
		return "", fmt.Errorf("%w: bad port in %q", ErrConfig, endpoint)
	}
	if r == 0 {
		return endpoint, nil
	}
	return "tcp://" + host + ":" + strconv.Itoa(p+r), nil
}

// connectable turns a bound endpoint as ZMQ reports it (LAST_ENDPOINT, e.g.
// "tcp://0.0.0.0:41234") into one a local peer can connect to.
func connectable(endpoint string) string {
	host, port, ok := splitTCP(endpoint)
	if !ok {
		return endpoint
	}
	switch host {
	case "0.0.0.0", "*", "":
		host = "127.0.0.1"
	case "[::]", "::":
		host = "[::1]"
	}
	return "tcp://" + net.JoinHostPort(strings.Trim(host, "[]"), port)
}

// PublisherBinds reports whether a publisher given endpoint binds it (vLLM's
// rule) rather than connecting to it, in which case subscribers must bind.
func PublisherBinds(endpoint string) bool { return shouldBind(endpoint) }
