package gossip

import (
	"slices"
	"strings"
	"time"
)

// Two things the view shows that should be unique, and that nothing else
// makes visible:
//
//   - an engine id gossiped by more than one alive member: two sidecars on
//     one engine. Allowed on purpose for a sidecar restarted beside its old
//     self (the overlap lasts until the old one leaves or is found dead),
//     and handled (the materializer follows one of them, epoch.go there),
//     but a pair that stays is two sidecars doing one's job;
//   - an engine URL gossiped under more than one engine id: two sidecars
//     given different --engine-id for one engine, a misconfiguration. The
//     ingress routes to each id as to an engine of its own, so the engine
//     gets two shares of the load with two copies of one index.
//
// Both are counted at every scrape (kvmesh_gossip_engines_multiple_sidecars,
// kvmesh_gossip_engine_urls_shared) and warned about once they have lasted
// dupWarnAfter, again at most every dupWarnEvery per engine or URL. Sidecars
// warn only about their own engines; the other roles about all of them.

// Duplicates are the engine ids and URLs the view holds more than once.
type Duplicates struct {
	// Engines maps an engine id gossiped by several alive members to those
	// members, sorted.
	Engines map[string][]string
	// URLs maps an engine URL (a trailing slash ignored) gossiped under
	// several engine ids to those ids, sorted.
	URLs map[string][]string
}

const (
	dupWarnAfter = 30 * time.Second // past a restart's overlap, or a rename's
	dupWarnEvery = 10 * time.Minute
	// dupCheckEvery: the broadcast loop checks every this many of its ticks.
	dupCheckEvery = 8
)

// Duplicates returns the engine ids gossiped by several alive members and
// the URLs gossiped under several engine ids.
func (n *Node) Duplicates() Duplicates {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.duplicatesLocked()
}

func (n *Node) duplicatesLocked() Duplicates {
	d := Duplicates{Engines: map[string][]string{}, URLs: map[string][]string{}}
	for k, e := range n.entries {
		if k.kind != kindEngine {
			continue
		}
		d.Engines[k.name] = append(d.Engines[k.name], k.origin)
		if u := strings.TrimSuffix(e.Engine.URL, "/"); u != "" && !slices.Contains(d.URLs[u], k.name) {
			d.URLs[u] = append(d.URLs[u], k.name)
		}
	}
	for _, m := range []map[string][]string{d.Engines, d.URLs} {
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

// dupWarnings is what checkDuplicates remembers per engine id or URL.
// Guarded by Node.mu; bounded by the entries (keys no longer duplicated
// are dropped at each check).
type dupWarnings struct {
	since  map[string]time.Time // duplicated since
	warned map[string]time.Time // last warning
}

// checkDuplicates warns about duplicates that lasted dupWarnAfter (run by
// loop; logs outside the lock).
func (n *Node) checkDuplicates(now time.Time) {
	type warning struct {
		msg, key, what string
		who            []string
		since          time.Time
	}
	var out []warning
	n.mu.Lock()
	if n.dups.since == nil {
		n.dups = dupWarnings{since: map[string]time.Time{}, warned: map[string]time.Time{}}
	}
	d := n.duplicatesLocked()
	sidecar := n.cfg.Meta.Role == RoleSidecar
	seen := make(map[string]bool, len(d.Engines)+len(d.URLs))
	check := func(key, msg, what string, who []string, mine bool) {
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
		out = append(out, warning{msg, key, what, who, since})
	}
	for id, nodes := range d.Engines {
		check("engine\x00"+id, "engine gossiped by several sidecars: two sidecars for one engine (beyond a restart's overlap); the index follows one of them", id, nodes,
			slices.Contains(nodes, n.cfg.Name))
	}
	for u, ids := range d.URLs {
		mine := false
		for _, id := range ids {
			_, own := n.entries[entryKey{n.cfg.Name, kindEngine, id}]
			mine = mine || own
		}
		check("url\x00"+u, "engine URL gossiped under several engine ids: sidecars with different --engine-id for one engine, which gets a share of the load for each", u, ids, mine)
	}
	for k := range n.dups.since {
		if !seen[k] {
			delete(n.dups.since, k)
			delete(n.dups.warned, k)
		}
	}
	n.mu.Unlock()
	for _, w := range out {
		if strings.HasPrefix(w.key, "engine\x00") {
			n.log.Warn(w.msg, "engine", w.what, "nodes", w.who, "for", now.Sub(w.since).Round(time.Second))
		} else {
			n.log.Warn(w.msg, "url", w.what, "engines", w.who, "for", now.Sub(w.since).Round(time.Second))
		}
	}
}
