package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// SetAddrs sets where the member listens and is dialled from the forms
// the command line and YAML files give: bind "IP:port" (port 0 picks a
// free one; an empty IP listens on every address), advertise "" (derived
// by memberlist), "IP" or "[IPv6]" (the bind port) or "IP:port". Memberlist dials and
// binds IP addresses, never names, so a name is refused here, at start,
// instead of by memberlist after the rest has started. An IPv6 address
// with a port is written in brackets ("[fd00::1]:7946"); an unbracketed
// one is always the whole address, never split at its last colon
// ("fd00::1:7946" is itself an IPv6 address). Manifests give the pod IP
// alone ("--gossip-advertise=$(POD_IP)"), which reads the same on IPv4
// and IPv6 clusters. It is the one parser of these addresses (the
// sidecar, the ingress, the orchestrator and kvmesh get use it) and lists
// every problem, naming the flags.
func (c *Config) SetAddrs(bind, advertise string) error {
	var errs []error
	host, port, err := net.SplitHostPort(bind)
	p, perr := strconv.Atoi(port)
	switch {
	case err != nil || perr != nil || p < 0 || p > 65535:
		errs = append(errs, fmt.Errorf("gossip bind %q: want host:port, the host an IP, IPv6 in brackets ([::]:7946) (--gossip-bind)", bind))
	case host != "" && net.ParseIP(host) == nil:
		errs = append(errs, fmt.Errorf("gossip bind %q (--gossip-bind): %q is not an IP address (memberlist binds addresses, not names)", bind, host))
	default:
		c.BindAddr, c.BindPort = host, p
	}
	if advertise != "" {
		c.AdvertiseAddr, c.AdvertisePort = advertise, 0
		h := advertise
		if len(advertise) > 2 && advertise[0] == '[' && advertise[len(advertise)-1] == ']' {
			h = advertise[1 : len(advertise)-1] // an IPv6 address in brackets, no port: the bind port
			c.AdvertiseAddr = h
		} else if sh, port, err := net.SplitHostPort(advertise); err == nil {
			ap, perr := strconv.Atoi(port)
			if perr != nil || sh == "" || ap < 0 || ap > 65535 {
				errs = append(errs, fmt.Errorf("gossip advertise %q (--gossip-advertise): want IP or IP:port", advertise))
			}
			h, c.AdvertiseAddr, c.AdvertisePort = sh, sh, ap
		}
		if h != "" && net.ParseIP(h) == nil {
			errs = append(errs, fmt.Errorf("gossip advertise %q (--gossip-advertise): %q is not an IP address; memberlist dials IPs, not names "+
				"(give the pod IP alone, $(POD_IP), or an IPv6 address with a port in brackets, [fd00::1]:7946)", advertise, h))
		}
	}
	return errors.Join(errs...)
}

// DecodeKey decodes a base64 gossip encryption key (the form of the
// --gossip-key flag and $KVMESH_GOSSIP_KEY): 16, 24 or 32 bytes.
func DecodeKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("gossip key is not base64: %w", err)
	}
	if len(k) != 16 && len(k) != 24 && len(k) != 32 {
		return nil, fmt.Errorf("gossip key is %d bytes; want 16, 24 or 32", len(k))
	}
	return k, nil
}
