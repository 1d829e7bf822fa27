package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// SetAddrs sets where the member listens and is dialled from the forms
// the command line and YAML files give: bind "host:port" (port 0 picks a
// free one), advertise "" (derived by memberlist), "host" or "host:port".
// It is the one parser of these addresses (the sidecar and the ingress
// both use it) and lists every problem.
func (c *Config) SetAddrs(bind, advertise string) error {
	var errs []error
	host, port, err := net.SplitHostPort(bind)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || p < 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("gossip bind %q: want host:port", bind))
	} else {
		c.BindAddr, c.BindPort = host, p
	}
	if advertise != "" {
		c.AdvertiseAddr, c.AdvertisePort = advertise, 0
		if h, port, err := net.SplitHostPort(advertise); err == nil {
			ap, perr := strconv.Atoi(port)
			if perr != nil || h == "" || ap < 0 || ap > 65535 {
				errs = append(errs, fmt.Errorf("gossip advertise %q: want host or host:port", advertise))
			}
			c.AdvertiseAddr, c.AdvertisePort = h, ap
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
