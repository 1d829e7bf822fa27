package gossip

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kvmesh_gossip_* series. Counters are atomics so the
// memberlist callbacks never wait on the registry.
type metrics struct {
	malformed atomic.Uint64 // undecodable messages, entries or metadata
	received  atomic.Uint64 // entries accepted (newer than what we had)
	ignored   atomic.Uint64 // entries from unknown/dead origins or not newer
	conflicts atomic.Uint64 // a member claiming a live member's name
	relayed   atomic.Uint64 // entries accepted through MergeRelayed
	future    atomic.Uint64 // relayed entries refused as versioned past MaxRelayAhead
	oversize  atomic.Uint64 // own entries queued too large for a broadcast packet
	restarts  atomic.Uint64 // members seen advertising a new generation under their name
	// urlMismatch: engine entries refused for an address their member
	// does not vouch for (routing.go)
	urlMismatch atomic.Uint64
}

// registerMetrics registers the series on reg and returns a func that
// unregisters them (New calls it when it fails after this point).
func (n *Node) registerMetrics(reg prometheus.Registerer) (unregister func(), err error) {
	unregister = func() {}
	if reg == nil {
		return unregister, nil
	}
	var done []prometheus.Collector
	unregister = func() {
		for _, c := range done {
			reg.Unregister(c)
		}
	}
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_members", Help: "Alive members of the gossip cluster, this node included."},
			func() float64 { return float64(n.NumMembers()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_alone", Help: "1 while this member was given seeds (--join) and sees no other alive member: its seeds do not answer (dead, unreachable, another --gossip-key) or every other member is gone, so its state reaches no one (a sidecar's engines get no traffic); warned once a minute. 0 otherwise, and always 0 without seeds."},
			func() float64 {
				if n.Alone() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_engines_multiple_sidecars", Help: "Engine ids gossiped by more than one alive member: two sidecars for one engine (a restart overlapping its old self, for seconds; longer, a second sidecar doing the first one's job), or, with different URLs, two engines under one id (kvmesh_gossip_engine_ids_conflicting). Warned about after 30 s."},
			func() float64 { return float64(len(n.Duplicates().Engines)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_engine_urls_shared", Help: "Engine URLs gossiped under more than one engine id: sidecars with different --engine-id for one engine, which the ingress routes to as several engines. Warned about after 30 s."},
			func() float64 { return float64(len(n.Duplicates().URLs)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_engine_ids_conflicting", Help: "Engine ids gossiped by several alive members with different URLs: two engines given one id, a configuration error (routing alternates between them while the index follows one). Also counted in kvmesh_gossip_engines_multiple_sidecars. Logged as an error after 30 s."},
			func() float64 { return float64(len(n.Duplicates().Conflicts)) }),
		counter("kvmesh_gossip_malformed_total", "Gossip messages, entries or node metadata that failed to decode and were skipped.", &n.m.malformed),
		counter("kvmesh_gossip_entries_received_total", "Gossip state entries accepted from other members.", &n.m.received),
		counter("kvmesh_gossip_name_conflicts_total", "Members seen claiming the name of another live member (names must be unique; the member known first keeps it).", &n.m.conflicts),
		counter("kvmesh_gossip_relay_received_total", "Gossip state entries accepted from the relay (the NATS state lane) rather than from gossip: newer than what gossip had delivered.", &n.m.relayed),
		counter("kvmesh_gossip_relay_future_total", "Entries the relay (the NATS state lane) carried that were refused because their version, the origin's clock, was more than gossip.MaxRelayAhead (5 min) ahead of this member's clock: clock skew (logged once a minute per member with the skew); gossip still carries them.", &n.m.future),
		counter("kvmesh_gossip_oversize_entries_total", "Own state entries too large for one gossip broadcast packet, counted each time one is due: gossip carries them by push/pull only (the NATS state lane carries them where it runs).", &n.m.oversize),
		counter("kvmesh_gossip_entries_ignored_total", "Gossip state entries not adopted: copies of a version already known (the usual case: push/pull and the NATS state lane deliver entries again, so on a healthy mesh it outgrows entries_received_total), older than known, from a member not alive (held; counted as received too if adopted later), or of another generation (process start) than the one the member advertises.", &n.m.ignored),
		counter("kvmesh_gossip_engine_url_mismatch_total", "Engine state entries refused because an address they carry (the engine URL, the SGLang bootstrap address) is not the one their member vouches for: for the engine its gossip metadata names, the metadata's URL; on the NATS state lane, what gossip delivered (the lane never introduces or changes an address); a bootstrap address must be on the URL's host. A forged entry (a publisher on kvmesh.state.> posing as a member) or a sidecar whose state and metadata disagree; warned about once a minute per member, and the engine keeps the address it had.", &n.m.urlMismatch),
		counter("kvmesh_gossip_member_restarts_total", "Members seen restarted under the same name (their metadata advertised a new generation): the predecessor's state entries were dropped, whatever the clocks.", &n.m.restarts),
	} {
		if err := reg.Register(c); err != nil {
			unregister()
			return func() {}, err
		}
		done = append(done, c)
	}
	return unregister, nil
}
