package demo

import (
	"fmt"
	"net"
	"strconv"
)

// The port layout of a mesh started with a PortBase B (Config.PortBase;
// `kvmesh demo --port-base` and `kvmesh bench --mode live --port-base`),
// every port on 127.0.0.1:
//
//	B                    the embedded NATS server
//	B+1+4i               engine i's HTTP API (OpenAI routes, /metrics)
//	B+2+4i               engine i's KV-event stream (its sidecar binds it; the engine's PUB connects, vLLM's rule)
//	B+3+4i               engine i's KV-event replay (ROUTER)
//	B+4+4i               engine i's sidecar's gossip (TCP and UDP)
//	B+1+4E+2j            ingress j's HTTP API (E engines)
//	B+2+4E+2j            ingress j's gossip (TCP and UDP)
//
// so the mesh takes MeshPorts(E, I) ports, B to B+4E+2I. Ingresses are
// restarted for each policy on the same ports. PortBase 0 picks free
// (ephemeral) ports for every listener instead.
const (
	portsPerEngine  = 4
	portsPerIngress = 2
)

// MeshPorts is how many ports a mesh of engines and ingresses takes from
// its PortBase on.
func MeshPorts(engines, ingresses int) int {
	return 1 + portsPerEngine*engines + portsPerIngress*ingresses
}

// CheckPortBase says why base cannot hold n ports (base to base+n-1, each
// a TCP/UDP port ≤ 65535), or nil; base 0 means ephemeral ports. what
// names the n ports' owners for the message.
func CheckPortBase(base, n int, what string) error {
	switch {
	case base == 0:
		return nil
	case base < 1 || base > 65535:
		return fmt.Errorf("port base %d: want 1..65535, or 0 for ephemeral ports", base)
	case base > 65535-(n-1):
		return fmt.Errorf("port base %d: %s take %d ports, %d..%d, past 65535 (want a base ≤ %d)",
			base, what, n, base, base+n-1, 65535-(n-1))
	}
	return nil
}

// loopback is "127.0.0.1:port" for port base+off, or port 0 (a free
// port) without a base.
func loopback(base, off int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(portAt(base, off)))
}

// portAt is base+off, or 0 (a free port) without a base.
func portAt(base, off int) int {
	if base == 0 {
		return 0
	}
	return base + off
}
