package gossip

import (
	"net"
	"net/url"
	"strings"
	"time"
)

// Routing addresses. An engine entry carries the addresses an ingress
// connects to or sends others to: the engine's URL (every request, with
// the engines' API key) and, for an SGLang prefill engine, its bootstrap
// address (sent to decode engines). Load may come from anyone allowed to
// send state, since a forged load only skews routing; an address decides
// where prompts go, so it must come from where the member vouches for it:
//
//   - The engine its member's metadata names (NodeMeta.ID, the first
//     engine of a sidecar) must carry the metadata's URL (NodeMeta.EngineURL),
//     on both lanes. Memberlist carries metadata under the gossip key when
//     there is one, and only the member itself raises it (refuting any other
//     claim), so a member's own state can never point its engine elsewhere.
//   - A bootstrap address must be on the URL's host: the sidecar derives it
//     from the URL (sidecar.EngineConfig.Bootstrap).
//   - On the state lane (MergeRelayed) an entry may carry an address only
//     when it is the metadata's, or when gossip already delivered this
//     entry of the member's current generation with the same addresses:
//     the lane carries load faster, it never introduces or changes an
//     address. Engines that metadata does not name (a DaemonSet sidecar's
//     second and further engines, and any engine entry of an ingress, the
//     orchestrator or a member whose metadata is malformed or has no URL)
//     therefore appear first by gossip (a broadcast, or the next push/pull
//     for an entry too large for one), seconds later, and the lane then
//     carries their load. Gossip carries them as before: its senders hold
//     the gossip key.
//
// A refused entry whose address contradicts what the member vouches for is
// counted in kvmesh_gossip_engine_url_mismatch_total and warned about once
// a minute per member; one that only came by the lane before gossip is
// counted as ignored, silently.

// routeVerdict is checkRoute's answer.
type routeVerdict int

const (
	routeOK         routeVerdict = iota
	routeUnattested              // relayed, with an address gossip has not delivered: ignored
	routeMismatch                // an address the member does not vouch for: refused, warned
)

// checkRoute decides on e, received from a member whose metadata is meta;
// have is the entry of the same key held now (nil: none). want is the
// address e should have carried, for the warning.
func checkRoute(meta NodeMeta, have, e *entry) (v routeVerdict, want string) {
	if e.Kind != kindEngine || e.Engine == nil {
		return routeOK, ""
	}
	s := e.Engine
	if s.Bootstrap != "" && s.URL != "" && !bootstrapOnHost(s.Bootstrap, s.URL) { // without a URL the engine is not routed to
		return routeMismatch, "a bootstrap address on the URL's host"
	}
	bound := meta.ID != "" && s.ID == meta.ID && meta.EngineURL != ""
	if bound && !sameURL(s.URL, meta.EngineURL) {
		return routeMismatch, meta.EngineURL
	}
	if !e.relayed || (s.URL == "" && s.Bootstrap == "") {
		return routeOK, ""
	}
	if have == nil || have.Engine == nil {
		if bound {
			return routeOK, "" // the URL is the metadata's, the bootstrap on its host
		}
		return routeUnattested, ""
	}
	if have.Engine.URL != s.URL || have.Engine.Bootstrap != s.Bootstrap {
		return routeMismatch, have.Engine.URL
	}
	return routeOK, ""
}

// sameURL: a and b name the same engine, a trailing slash aside (a sidecar
// gossips its --engine-url without one; its metadata kept the flag as
// given, and a sidecar of an earlier version still does).
func sameURL(a, b string) bool {
	return strings.TrimSuffix(a, "/") == strings.TrimSuffix(b, "/")
}

// bootstrapOnHost: boot (host:port) is on raw's host.
func bootstrapOnHost(boot, raw string) bool {
	h, _, err := net.SplitHostPort(boot)
	if err != nil {
		return false
	}
	u, err := url.Parse(raw)
	return err == nil && u.Hostname() != "" && u.Hostname() == h
}

// routeRefusal is one entry refused by checkRoute as routeMismatch, to be
// warned about once n.mu is released.
type routeRefusal struct {
	origin, id, url, want string
	relayed               bool
}

// refuseRouteLocked counts a refused entry; a mismatch is also queued on
// out for warnRoutes. Called with n.mu held.
func (n *Node) refuseRouteLocked(v routeVerdict, want string, e *entry, out *[]routeRefusal) {
	if v == routeUnattested {
		n.m.ignored.Add(1)
		return
	}
	n.m.urlMismatch.Add(1)
	*out = append(*out, routeRefusal{origin: e.Origin, id: e.Engine.ID, url: e.Engine.URL, want: want, relayed: e.relayed})
}

// warnRoutes logs refusals, at most once a minute per member (the origins
// are alive members: merge checks that first), with how many went unlogged
// since. Every refusal is counted all the same.
func (n *Node) warnRoutes(rs []routeRefusal) {
	now := time.Now()
	for _, r := range rs {
		due, suppressed := n.routeWarn.due(r.origin, now)
		if !due {
			continue
		}
		lane := "gossip"
		if r.relayed {
			lane = "nats"
		}
		attrs := []any{"member", r.origin, "engine", r.id, "url", redactURL(r.url), "want", redactURL(r.want), "lane", lane}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed, "per", aheadWarnEvery)
		}
		n.log.Warn("refusing an engine entry whose address its member does not vouch for (its gossip metadata, or on the NATS state lane what gossip delivered): a forged entry (a publisher on the NATS state lane, <prefix>.state.>, posing as the member) or a sidecar whose state and metadata disagree; the engine keeps the address it had",
			attrs...)
	}
}

// redactURL hides a URL's password for logs.
func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return u.Redacted()
	}
	return raw
}
