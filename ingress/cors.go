package ingress

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// CORS lets browser applications call the client port, as vLLM's server
// allows (its --allowed-origins, default every origin): a preflight (OPTIONS
// with Access-Control-Request-Method) is answered here with 204, and every
// answer to an allowed Origin carries Access-Control-Allow-Origin, error
// answers included (401, 400, 413, 429 with its Retry-After, 503, a stream's
// error before it started), so a browser application can read them.
// Credentials (cookies) are never allowed: clients authenticate with bearer
// tokens, which a browser sends only when the page adds them. Off unless
// Config.CORSOrigins is set.

// corsIndex is the index in Config.CORSOrigins of the entry allowing origin
// ("*" or origin itself), -1 when none does.
func (s *Server) corsIndex(origin []byte) int {
	if len(origin) == 0 {
		return -1
	}
	for i, o := range s.cfg.CORSOrigins {
		if o == "*" || o == string(origin) {
			return i
		}
	}
	return -1
}

// cors answers a preflight from an allowed origin; true means ctx was one
// and is answered. Other requests get their CORS headers from corsHeaders
// once their answer is made.
func (s *Server) cors(ctx *fasthttp.RequestCtx) bool {
	if len(s.cfg.CORSOrigins) == 0 || !ctx.IsOptions() || len(ctx.Request.Header.Peek("Access-Control-Request-Method")) == 0 {
		return false
	}
	i := s.corsIndex(ctx.Request.Header.Peek("Origin"))
	if i < 0 {
		return false // no CORS headers: the browser refuses the answer
	}
	s.corsHeaders(ctx, i)
	h := &ctx.Response.Header
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	if rh := ctx.Request.Header.Peek("Access-Control-Request-Headers"); len(rh) > 0 {
		h.SetBytesV("Access-Control-Allow-Headers", rh)
	}
	h.Set("Access-Control-Max-Age", "600")
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}

// corsHeaders adds the answer headers for the allowed origin at index i of
// Config.CORSOrigins (corsIndex; nothing when i < 0).
func (s *Server) corsHeaders(ctx *fasthttp.RequestCtx, i int) {
	if i < 0 || i >= len(s.cfg.CORSOrigins) {
		return
	}
	h := &ctx.Response.Header
	allow := s.cfg.CORSOrigins[i]
	h.Set("Access-Control-Allow-Origin", allow)
	if allow != "*" {
		h.Set("Vary", "Origin")
	}
	if s.cfg.EngineHeader {
		h.Set("Access-Control-Expose-Headers", engineHeader+", X-Request-Id, Retry-After")
	} else {
		h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
	}
}

// checkCORSOrigins refuses, by name, an origin a browser can never send:
// what it sends is scheme://host[:port], lowercase, with no path (not even
// "/"), no default port and no userinfo; "*" allows any. "null" (sandboxed
// documents, file: pages) is refused too: any page can make itself null.
func checkCORSOrigins(origins []string) error {
	var errs []error
	for _, o := range origins {
		if o == "*" {
			continue
		}
		if why := badOrigin(o); why != "" {
			errs = append(errs, fmt.Errorf("%w: cors origin %q: %s", ErrConfig, o, why))
		}
	}
	return errors.Join(errs...)
}

// badOrigin says what is wrong with o as an origin, "" when nothing is.
func badOrigin(o string) string {
	const want = "want scheme://host[:port] as a browser sends it in Origin (e.g. https://app.example), or *"
	if o == "null" {
		return "the null origin is any sandboxed page's; " + want
	}
	u, err := url.Parse(o)
	switch {
	case err != nil || u.Scheme == "" || u.Opaque != "" || u.Host == "":
		return want
	case u.User != nil:
		return "no userinfo in an origin; " + want
	case u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(o[len(u.Scheme)+3:], "/?#"):
		return "no path (not even a trailing /), query or fragment in an origin; " + want
	case o != strings.ToLower(o):
		return "browsers send origins in lowercase; " + want
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 || p[0] == '0' {
			return "bad port; " + want
		}
		if u.Scheme == "http" && p == "80" || u.Scheme == "https" && p == "443" {
			return "browsers leave the default port out; " + want
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "empty port; " + want
	}
	h := u.Hostname()
	if canon, ip := ipHost(h, strings.HasPrefix(u.Host, "[")); ip && h != canon {
		if canon == "" {
			return "an IP address in a form browsers refuse or rewrite (IPv6 compressed, no zone: http://[::1]:3000; IPv4 in dotted decimal); " + want
		}
		return fmt.Sprintf("browsers send this IP address as %s; %s", canon, want)
	}
	return ""
}

// ipHost: whether h (bracketed: written in brackets) is an IP address to
// a browser (ip), and its form in a browser's Origin (canon; "" when no
// browser sends it): an IPv6 address compressed, in lowercase hex, with an
// IPv4-mapped one in hex too ([0:0::1] is [::1], [::ffff:127.0.0.1] is
// [::ffff:7f00:1]), and no zone; a host whose last label is a number is an
// IPv4 address, sent in dotted decimal (127.1 is 127.0.0.1; the WHATWG URL
// standard's host parser).
func ipHost(h string, bracketed bool) (canon string, ip bool) {
	if bracketed {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", true
		}
		if a.Is4In6() {
			b := a.As16()
			return fmt.Sprintf("::ffff:%x:%x", uint16(b[12])<<8|uint16(b[13]), uint16(b[14])<<8|uint16(b[15])), true
		}
		return a.String(), true
	}
	labels := strings.Split(strings.TrimSuffix(h, "."), ".")
	last := labels[len(labels)-1]
	if hex, isHex := strings.CutPrefix(last, "0x"); isHex {
		last = hex
		if strings.Trim(last, "0123456789abcdef") != "" {
			return "", false
		}
	} else if last == "" || strings.Trim(last, "0123456789") != "" {
		return "", false
	}
	if a, err := netip.ParseAddr(strings.TrimSuffix(h, ".")); err == nil && a.Is4() {
		return a.String(), true
	}
	return "", true // a numeric host written otherwise: 127.1, 0x7f.0.0.1, 010.0.0.1 (octal)
}
