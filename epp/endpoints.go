package epp

import (
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/kvmesh/kvmesh/ingress"
)

// An endpoint is a model server's "ip:port" as the gateway addresses it. The
// mesh knows engines by id and base URL (the sidecar advertises the URL it
// reaches its engine on: in Kubernetes the pod IP and the engine's port), so
// an engine's endpoint is its URL's host:port.

// endpointOf returns the host:port of a base URL ("http://10.0.0.5:8000/v1"
// → "10.0.0.5:8000"); the scheme's default port when none is given.
func endpointOf(rawURL string) (string, bool) {
	rest := rawURL
	port := ""
	switch {
	case strings.HasPrefix(rest, "http://"):
		rest, port = rest[len("http://"):], "80"
	case strings.HasPrefix(rest, "https://"):
		rest, port = rest[len("https://"):], "443"
	default:
		return "", false
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if rest == "" {
		return "", false
	}
	if h, p, err := net.SplitHostPort(rest); err == nil {
		if !validPort(p) || h == "" {
			return "", false
		}
		return rest, true
	}
	if strings.ContainsAny(rest, "[]") {
		if !strings.HasPrefix(rest, "[") || !strings.HasSuffix(rest, "]") || len(rest) < 3 || strings.ContainsAny(rest[1:len(rest)-1], "[]") {
			return "", false
		}
		return rest + ":" + port, true
	}
	if strings.Contains(rest, ":") {
		return "", false
	}
	return rest + ":" + port, true
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536 && p[0] != '+' && p[0] != '-'
}

// parseEndpoint checks one "ip:port" (IPv6 as "[::1]:8000") and returns it
// in canonical form (the IP as net/netip prints it).
func parseEndpoint(s string) (string, bool) {
	h, p, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil || !validPort(p) {
		return "", false
	}
	ip := net.ParseIP(h)
	if ip == nil {
		return "", false
	}
	return net.JoinHostPort(ip.String(), p), true
}

// parseEndpointList splits a comma-separated endpoint list (the protocol's
// header and metadata form), dropping empty and malformed entries; bad
// counts the malformed ones.
func parseEndpointList(dst []string, s string) (out []string, bad int) {
	out = dst
	for s != "" {
		var item string
		item, s, _ = strings.Cut(s, ",")
		if strings.TrimSpace(item) == "" {
			continue
		}
		ep, ok := parseEndpoint(item)
		if !ok {
			bad++
			continue
		}
		out = append(out, ep)
	}
	return out, bad
}

// endpointCache memoizes endpointOf per URL: engine URLs change rarely and
// the hot path should not re-parse them.
type endpointCache struct {
	m sync.Map // url → string ("" when the URL has no usable endpoint)
}

func (c *endpointCache) of(url string) (string, bool) {
	if v, ok := c.m.Load(url); ok {
		s := v.(string)
		return s, s != ""
	}
	ep, ok := endpointOf(url)
	if ok {
		if canon, cok := parseEndpoint(ep); cok {
			ep = canon // IP literals in canonical form; host names stay as given
		}
	}
	c.m.Store(url, ep)
	return ep, ok
}

// PoolEndpoints is the set of ready endpoints of the InferencePool the
// picker serves (pool.go implements it over informers). Has must be safe
// for concurrent use and must not block.
type PoolEndpoints interface {
	Has(endpoint string) bool
	// Synced reports whether the pool and its pods have been listed.
	Synced() bool
}

// poolMembership narrows the mesh's engines to those whose endpoint is a
// ready pod of the pool: endpoints come from the pool, cache state and load
// from the mesh. A pool pod the mesh does not know (no sidecar yet) is not a
// candidate: the picker has no model or cache state for it.
type poolMembership struct {
	inner ingress.Membership
	pool  PoolEndpoints
	eps   *endpointCache
}

func (m *poolMembership) Engines(dst []ingress.EngineInfo) []ingress.EngineInfo {
	n := len(dst)
	dst = m.inner.Engines(dst)
	if m.pool == nil {
		return dst
	}
	out := dst[:n]
	for _, e := range dst[n:] {
		if ep, ok := m.eps.of(e.URL); ok && m.pool.Has(ep) {
			out = append(out, e)
		}
	}
	return out
}
