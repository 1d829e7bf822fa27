package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvevents"
)

// collector exports the kvmesh_sidecar_* series from the engines' atomics and
// states at scrape time, so the event path never touches the registry.
type collector struct{ s *Sidecar }

var _ prometheus.Collector = (*collector)(nil)

var (
	descCounters = map[string]*prometheus.Desc{}
	counterHelp  = []struct{ name, help string }{
		{"batches_total", "Engine KV-event batches applied."},
		{"deltas_published_total", "Deltas published."},
		{"delta_keys_total", "Keys in published delta ops."},
		{"publish_errors_total", "Delta publishes that failed: core NATS sends (receivers resync on the gap) and JetStream stream acks (a missing stream is recreated)."},
		{"publish_queue_drops_total", "Deltas dropped because the publish queue was full (NATS slow or gone; receivers resync on the gap)."},
		{"snapshots_served_total", "Snapshot requests answered."},
		{"snapshot_errors_total", "Snapshot requests the engine's key set could not be sent for (a chunk over the NATS max_payload, a failed send): answered with an error reply, logged at error."},
		{"rank_resets_total", "DP-rank restarts seen (state dropped)."},
		{"lost_history_total", "Event-history losses that could not be replayed."},
		{"engine_resets_total", "Engine prefix-cache resets done (reset-engine policy)."},
		{"engine_reset_failures_total", "Engine prefix-cache reset attempts that failed."},
		{"engine_resets_suppressed_total", "Engine resets not requested because one was requested less than a minute before (reset-engine policy)."},
		{"scrape_errors_total", "Engine /metrics scrapes that failed."},
		{"scrape_no_metrics_total", "Engine /metrics scrapes answered 404 (SGLang without --enable-metrics): the engine stays ready, its load unknown."},
		{"event_loop_restarts_total", "Engine event loops restarted after a subscriber failure."},
		{"orphan_parents_total", "BlockStored events whose parent hash was unknown (blocks not indexed)."},
		{"orphan_locations_total", "Tier location updates for unknown hashes."},
		{"unknown_removes_total", "BlockRemoved for hashes not held."},
		{"key_conflicts_total", "Known hashes stored again with different tokens."},
		{"skipped_group_events_total", "Events of KV-cache groups other than full attention (sliding window, Mamba), stores and removals: not routable, not indexed."},
		{"block_size_changes_total", "Events of a block size other than the one in effect (the engine restarted with another): the engine's keys were dropped and the new size gossiped."},
		{"bad_events_total", "Events (or their trailing blocks) missing what a key needs: no block size, fewer tokens than blocks, an offload tier's block (LMCache chunk) of no whole number of engine blocks. Not indexed."},
	}
	descKeys  = prometheus.NewDesc("kvmesh_sidecar_keys", "Keys in the engine's key set per tier.", []string{"engine", "tier"}, nil)
	descSeq   = prometheus.NewDesc("kvmesh_sidecar_delta_seq", "Last published delta sequence of the current epoch.", []string{"engine"}, nil)
	descReady = prometheus.NewDesc("kvmesh_sidecar_engine_ready", "1 when this sidecar finds the engine ready and says so in its gossip state (its event loop runs, its metrics answer and it serves the configured model), 0 when not. Whether any member hears it is kvmesh_gossip_alone (1: no one does).",
		[]string{"engine"}, nil)
	descMismatch = prometheus.NewDesc("kvmesh_sidecar_engine_model_mismatch",
		"1 while the engine's /v1/models does not list the sidecar's --model (another model or engine at its URL): gossiped as not ready; 0 otherwise.",
		[]string{"engine"}, nil)
	descSilent = prometheus.NewDesc("kvmesh_sidecar_events_silent",
		"1 while the engine's metrics have shown it serving requests for the events-silent window (default 30 s) and no KV-event batch has arrived since: the sidecar probably listens where the engine does not publish (an events or replay endpoint typo); the engine stays ready, routed without cache affinity. 0 otherwise.",
		[]string{"engine"}, nil)
)

func init() {
	for _, c := range counterHelp {
		descCounters[c.name] = prometheus.NewDesc("kvmesh_sidecar_"+c.name, c.help, []string{"engine"}, nil)
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descCounters {
		ch <- d
	}
	ch <- descKeys
	ch <- descSeq
	ch <- descReady
	ch <- descMismatch
	ch <- descSilent
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.s.engines {
		e.mu.Lock()
		sc := e.st.c
		var keys [kvevents.NumTiers]int
		for t := range keys {
			keys[t] = len(e.st.keyRefs[t])
		}
		seq := e.seq
		ready, mismatch := 0.0, 0.0
		if e.readyLocked() {
			ready = 1
		}
		if e.modelMismatch != "" {
			mismatch = 1
		}
		silent := 0.0
		if e.silence.silent {
			silent = 1
		}
		e.mu.Unlock()
		vals := map[string]uint64{
			"batches_total": e.c.batches.Load(), "deltas_published_total": e.c.deltas.Load(),
			"delta_keys_total": e.c.deltaKeys.Load(), "publish_errors_total": e.c.publishErrors.Load(),
			"publish_queue_drops_total": e.c.queueDrops.Load(),
			"snapshots_served_total":    e.c.snapshots.Load(), "snapshot_errors_total": e.c.snapshotErrors.Load(), "rank_resets_total": e.c.rankResets.Load(),
			"lost_history_total": e.c.lostHistory.Load(), "engine_resets_total": e.c.engineResets.Load(),
			"engine_reset_failures_total": e.c.resetFailures.Load(), "scrape_errors_total": e.c.scrapeErrs.Load(),
			"engine_resets_suppressed_total": e.c.resetsSuppressed.Load(), "scrape_no_metrics_total": e.c.metricsMissing.Load(),
			"event_loop_restarts_total": e.c.loopRestarts.Load(),
			"orphan_parents_total":      sc.orphanParents, "orphan_locations_total": sc.orphanLocations,
			"unknown_removes_total": sc.unknownRemoves, "key_conflicts_total": sc.keyConflicts,
			"skipped_group_events_total": sc.skippedGroups, "bad_events_total": sc.badEvents,
			"block_size_changes_total": sc.blockSizeChanges,
		}
		for name, v := range vals {
			ch <- prometheus.MustNewConstMetric(descCounters[name], prometheus.CounterValue, float64(v), e.cfg.ID)
		}
		for t, n := range keys {
			ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(n), e.cfg.ID, kvevents.Tier(t).String())
		}
		ch <- prometheus.MustNewConstMetric(descSeq, prometheus.GaugeValue, float64(seq), e.cfg.ID)
		ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready, e.cfg.ID)
		ch <- prometheus.MustNewConstMetric(descMismatch, prometheus.GaugeValue, mismatch, e.cfg.ID)
		ch <- prometheus.MustNewConstMetric(descSilent, prometheus.GaugeValue, silent, e.cfg.ID)
	}
}

// subscriberCollector exports every engine's kvmesh_kvevents_* counters.
// It is unchecked (describes nothing) because the subscribers come and go
// with Run and every engine's collector shares the same descriptors.
type subscriberCollector struct{ s *Sidecar }

var _ prometheus.Collector = (*subscriberCollector)(nil)

func (c *subscriberCollector) Describe(chan<- *prometheus.Desc) {}

func (c *subscriberCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.s.engines {
		if col := e.subMetrics.Load(); col != nil {
			col.Collect(ch)
		}
	}
}
