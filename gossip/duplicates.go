package gossip

import (
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Three things the view shows that should be unique, and that nothing else
// makes visible:
//
//   - an engine id gossiped by more than one alive member with one URL: two
//     sidecars on one engine. Allowed on purpose for a sidecar restarted
//     beside its old self (the overlap lasts until the old one leaves or is
//     found dead), and handled (the materializer follows one of them,
//     epoch.go there), but a pair that stays is two sidecars doing one's job;
//   - an engine id gossiped by several members with different URLs: two
//     engines given one id (a copied manifest, a DaemonSet slot reused), a
//     configuration error. The ingress keeps one record per id, whose URL
//     follows whichever sidecar changed its entry last, so routing
//     alternates between the two engines while the index follows one
//     sidecar's keys: the prefix predictions are wrong half the time. A
//     rescheduled engine whose old sidecar is not yet found dead looks the
//     same for a few seconds, hence the same delay before the error;
//   - an engine URL gossiped under more than one engine id: two sidecars
//     given different --engine-id for one engine, a misconfiguration. The
//     ingress routes to each id as to an engine of its own, so the engine
//     gets two shares of the load with two copies of one index.
//
// All are counted at every scrape (kvmesh_gossip_engines_multiple_sidecars:
// ids with several members, either kind; kvmesh_gossip_engine_ids_conflicting:
// those with several URLs; kvmesh_gossip_engine_urls_shared) and reported
// once they have lasted dupWarnAfter, again at most every dupWarnEvery per
// engine or URL. Sidecars report only their own engines; the other roles all
// of them.

// Duplicates are the engine ids and URLs the view holds more than once.
type Duplicates struct {
	// Engines maps an engine id gossiped by several alive members to those
	// members, sorted.
	Engines map[string][]string
	// Conflicts maps an engine id of Engines whose members gossip different
	// URLs (compared as NormalURL does) to those URLs, sorted: two engines
	// under one id.
	Conflicts map[string][]string
	// URLs maps an engine URL (NormalURL) gossiped under several engine ids
	// to those ids, sorted.
	URLs map[string][]string
}

const (
	dupWarnAfter = 30 * time.Second // past a restart's overlap, or a rename's
	dupWarnEvery = 10 * time.Minute
	// dupCheckEvery: the broadcast loop checks every this many of its ticks.
	dupCheckEvery = 8
)

// Duplicates returns the engine ids gossiped by several alive members (and
// those of them gossiped with different URLs) and the URLs gossiped under
// several engine ids.
func (n *Node) Duplicates() Duplicates {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.duplicatesLocked()
}

func (n *Node) duplicatesLocked() Duplicates {
	d := Duplicates{Engines: map[string][]string{}, Conflicts: map[string][]string{}, URLs: map[string][]string{}}
	for k, e := range n.entries {
		if k.kind != kindEngine {
			continue
		}
		d.Engines[k.name] = append(d.Engines[k.name], k.origin)
		u := NormalURL(e.Engine.URL)
		if u == "" {
			continue
		}
		if !slices.Contains(d.URLs[u], k.name) {
			d.URLs[u] = append(d.URLs[u], k.name)
		}
		if !slices.Contains(d.Conflicts[k.name], u) {
			d.Conflicts[k.name] = append(d.Conflicts[k.name], u)
		}
	}
	for _, m := range []map[string][]string{d.Engines, d.Conflicts, d.URLs} {
		for k, v := range m {
			if len(v) < 2 {
				delete(m, k)
				continue
			}
			slices.Sort(v)
		}
	}
	return d
}

// NormalURL is an engine URL as the duplicate checks compare it (the keys
// of Duplicates.URLs): scheme and host lower-cased (both are
// case-insensitive), an IP literal in its canonical form, the scheme's
// default port and a trailing slash dropped. Host names are not resolved
// (no DNS lookup on the gossip path): one engine named by a host name and
// by its address is not found. An unparsable URL is compared as gossiped,
// less a trailing slash.
func NormalURL(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return strings.TrimSuffix(raw, "/")
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 literal
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host + strings.TrimSuffix(u.EscapedPath(), "/")
}

// dupWarnings is what checkDuplicates remembers per engine id or URL.
// Guarded by Node.mu; bounded by the entries (keys no longer duplicated
// are dropped at each check).
type dupWarnings struct {
	since  map[string]time.Time // duplicated since
	warned map[string]time.Time // last warning
}

// The reports' messages (tests and docs quote them).
const (
	msgDupSidecars = "engine gossiped by several sidecars with one URL: two sidecars for one engine (beyond a restart's overlap); the index follows one of them"
	msgDupEngines  = "engine id gossiped by several sidecars with different URLs: two engines share one engine id; routing alternates between them while the index follows one; give each engine its own --engine-id"
	msgDupURL      = "engine URL gossiped under several engine ids: sidecars with different --engine-id for one engine, which gets a share of the load for each"
)

// checkDuplicates reports duplicates that lasted dupWarnAfter (run by
// loop; logs outside the lock).
func (n *Node) checkDuplicates(now time.Time) {
	type warning struct {
		key, what string
		who, urls []string
		since     time.Time
	}
	var out []warning
	n.mu.Lock()
	if n.dups.since == nil {
		n.dups = dupWarnings{since: map[string]time.Time{}, warned: map[string]time.Time{}}
	}
	d := n.duplicatesLocked()
	sidecar := n.cfg.Meta.Role == RoleSidecar
	seen := make(map[string]bool, len(d.Engines)+len(d.URLs))
	check := func(key, what string, who, urls []string, mine bool) {
		seen[key] = true
		since, ok := n.dups.since[key]
		if !ok {
			n.dups.since[key] = now
			return
		}
		if (sidecar && !mine) || now.Sub(since) < dupWarnAfter || now.Sub(n.dups.warned[key]) < dupWarnEvery {
			return
		}
		n.dups.warned[key] = now
		out = append(out, warning{key, what, who, urls, since})
	}
	for id, nodes := range d.Engines {
		// Keyed apart: a pair of sidecars on one engine that turns into
		// two engines (one sidecar's URL changed) is reported anew.
		key, urls := "engine\x00"+id, d.Conflicts[id]
		if urls != nil {
			key = "conflict\x00" + id
		}
		check(key, id, nodes, urls, slices.Contains(nodes, n.cfg.Name))
	}
	for u, ids := range d.URLs {
		mine := false
		for _, id := range ids {
			_, own := n.entries[entryKey{n.cfg.Name, kindEngine, id}]
			mine = mine || own
		}
		check("url\x00"+u, u, ids, nil, mine)
	}
	for k := range n.dups.since {
		if !seen[k] {
			delete(n.dups.since, k)
			delete(n.dups.warned, k)
		}
	}
	n.mu.Unlock()
	for _, w := range out {
		// A Duration is logged as its text: slog's JSON handler would
		// write it as integer nanoseconds.
		lasted := now.Sub(w.since).Round(time.Second).String()
		switch kind, _, _ := strings.Cut(w.key, "\x00"); kind {
		case "engine":
			n.log.Warn(msgDupSidecars, "engine", w.what, "nodes", w.who, "for", lasted)
		case "conflict":
			n.log.Error(msgDupEngines, "engine", w.what, "urls", w.urls, "nodes", w.who, "for", lasted)
		default:
			n.log.Warn(msgDupURL, "url", w.what, "engines", w.who, "for", lasted)
		}
	}
}
