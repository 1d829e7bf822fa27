package kvevents

import (
	"fmt"
	"strconv"
	"strings"

	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"
)

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
	host, port, ok := zmqep.SplitTCP(endpoint)
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

// PublisherBinds reports whether a publisher given endpoint binds it (vLLM's
// rule) rather than connecting to it, in which case subscribers must bind.
func PublisherBinds(endpoint string) bool { return zmqep.ShouldBind(endpoint) }
