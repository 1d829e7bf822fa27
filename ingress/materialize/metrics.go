package materialize

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kvmesh_materializer_* series.
type metrics struct {
	applied    prometheus.Counter
	ops        prometheus.Counter
	keys       prometheus.Counter
	duplicates prometheus.Counter
	gaps       prometheus.Counter
	epochs     prometheus.Counter
	mismatches prometheus.Counter
	malformed  prometheus.Counter
	resyncs    prometheus.Counter
	// staleEpochs: deltas of an engine's older live sidecar epoch.
	staleEpochs prometheus.Counter
	snapshots   *prometheus.CounterVec
	lag         prometheus.Histogram
	// bufferDrops: buffers dropped by reason (engine_limit, byte_budget).
	bufferDrops *prometheus.CounterVec
	// unlistedDropped: deltas of engines gossip does not list, past MaxUnlisted.
	unlistedDropped prometheus.Counter
	// aheadStamps: deltas stamped later than the local clock (host clocks skewed).
	aheadStamps prometheus.Counter
	// modelChanges: engines whose id came back serving another model.
	modelChanges prometheus.Counter
	// otherModel: deltas naming another model than the engine's, ignored.
	otherModel prometheus.Counter
	// refused: deltas and snapshot chunks refused by reason (refusal
	// reasons in refuse.go), never applied.
	refused *prometheus.CounterVec
	// ahead: copies found ahead of gossip's head and re-snapshotted.
	ahead prometheus.Counter
	// unlistedEpochs: deltas from an epoch gossip has not listed for the
	// engine for OutsideGossipAfter.
	unlistedEpochs prometheus.Counter
}

func newMetrics() *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_materializer_" + name, Help: help})
	}
	met := &metrics{
		applied:    c("deltas_applied_total", "Deltas applied in sequence."),
		ops:        c("ops_applied_total", "Delta ops applied."),
		keys:       c("keys_applied_total", "Keys in applied delta ops (the ingest rate)."),
		duplicates: c("deltas_duplicate_total", "Deltas at or below the applied sequence, ignored."),
		gaps:       c("gaps_total", "Sequence gaps that triggered a snapshot."),
		epochs:     c("new_epochs_total", "Sidecar epoch changes that triggered a snapshot."),
		mismatches: c("digest_mismatches_total", "Digest differences with gossip at the same head that triggered a snapshot."),
		malformed:  c("malformed_total", "Undecodable deltas or snapshot chunks, skipped (an undecodable delta resnapshots its engine)."),
		resyncs:    c("reconnect_resyncs_total", "NATS reconnects after which every engine was resynced."),
		staleEpochs: c("stale_epoch_deltas_total",
			"Deltas of an engine's older sidecar epoch while a newer one is live (a sidecar restart overlapping itself), ignored."),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_materializer_snapshots_total", Help: "Snapshot requests by result (ok, timeout, no_responders, sidecar_error: the sidecar answered it cannot send its key set, error).",
		}, []string{"result"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvmesh_materializer_propagation_lag_seconds",
			Help:    "Engine event time to applied in this ingress's index (clock skew between hosts included; a stamp up to 50 ms ahead counts as 0).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5},
		}),
		bufferDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_materializer_buffer_drops_total",
			Help: "Engines' delta buffers (deltas that came during a snapshot or after a gap) dropped by reason: engine_limit (an engine's max buffered deltas), " +
				"byte_budget (the largest, when every engine's together reached max buffered bytes). The next snapshot recovers; many drops mean extra snapshots.",
		}, []string{"reason"}),
		unlistedDropped: c("unlisted_dropped_total",
			"Deltas of engines gossip does not list, ignored because max unlisted such engines are known already."),
		aheadStamps: c("deltas_stamped_ahead_total",
			"Deltas applied whose sidecar's timestamp is more than 50 ms later than this host's clock (the hosts' clocks disagree beyond NTP's error): not in the propagation lag histogram."),
		modelChanges: c("engine_model_changes_total",
			"Engines whose id came back serving another model (gossip, or without gossip a newer sidecar's deltas): the old key set dropped, the new model's snapshotted."),
		otherModel: c("other_model_deltas_total",
			"Deltas naming another model than gossip lists for their engine (a sidecar of the engine id's previous or next model), ignored."),
		unlistedEpochs: c("unlisted_epoch_deltas_total",
			"Deltas of an engine gossip lists, from a sidecar epoch other than the one gossip lists for it, for longer than outside-gossip-after (30 s; a restarted sidecar's take a second or so): "+
				"most likely another installation on this NATS whose sidecar has the same engine id. The epoch gossip lists is followed; warned about once a minute."),
		ahead: c("ahead_of_gossip_total",
			"Copies of an engine found ahead of gossip's head in the same epoch, with no delta coming, for the ahead grace (10 s), and re-snapshotted: a delta the sidecar did not publish (a forged or buggy publisher on the engine's subject) or the sidecar's gossip lagging. Once per head."),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_materializer_refused_total",
			Help: "Deltas and snapshot reply chunks refused, never applied, by reason: delta_subject (a delta whose engine or model is not the one its subject names), " +
				"snapshot_subject (a snapshot chunk naming another engine or model than the request's subject), delta_epoch_ahead and snapshot_epoch_ahead " +
				"(an epoch start more than materialize.MaxEpochAhead, 5 min, past this host's clock). A misbehaving or forged publisher, or clock skew for the last two.",
		}, []string{"reason"}),
	}
	for _, r := range []string{"engine_limit", "byte_budget"} {
		met.bufferDrops.WithLabelValues(r)
	}
	for _, r := range refusalReasons {
		met.refused.WithLabelValues(r)
	}
	return met
}

func (m *metrics) register(reg prometheus.Registerer, ages prometheus.Collector, engines, keys, stale, failing, buffered, outside func() float64) error {
	if reg == nil {
		return nil
	}
	for _, col := range []prometheus.Collector{
		m.applied, m.ops, m.keys, m.duplicates, m.gaps, m.epochs, m.mismatches, m.malformed, m.resyncs, m.staleEpochs, m.snapshots, m.lag, ages, m.bufferDrops, m.unlistedDropped, m.aheadStamps, m.modelChanges, m.otherModel, m.refused, m.ahead, m.unlistedEpochs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_engines_outside_gossip",
			Help: "Engines whose deltas have kept arriving on NATS for 30 s (outside-gossip-after) while gossip does not list them: this ingress follows their caches but does not route to them. A gossip partition (seeds forming islands, a network split) or their sidecars alone in gossip; warned once a minute with their ids. 0 without gossip."}, outside),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_engines", Help: "Engines known to this materializer."}, engines),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_keys", Help: "Keys held over all engines and tiers."}, keys),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_buffered_bytes",
			Help: "Estimated memory of every engine's delta buffer (bounded by max buffered bytes)."}, buffered),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_stale_seconds",
			Help: "How long the index has not followed the sidecars because the NATS connection is down (lost, or found dead by its pings); 0 while connected."}, stale),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_materializer_failing_engines",
			Help: "Engines whose last 3 or more snapshots failed (of the engines gossip lists, when there is gossip): readiness does not wait for them, their index entries are stale (empty if never synced)."}, failing),
	} {
		if err := reg.Register(col); err != nil {
			return err
		}
	}
	return nil
}

// maxEngineAgeSeries bounds kvmesh_materializer_engine_state_age_seconds:
// engine ids come from the sidecars' subjects and gossip, and a scrape must
// stay small however many there are. Past it, the oldest states are the
// ones exported (what an operator looks for); kvmesh_materializer_engines
// still counts them all.
const maxEngineAgeSeries = 1024

var descEngineAge = prometheus.NewDesc("kvmesh_materializer_engine_state_age_seconds",
	"Per engine: seconds since this ingress last confirmed its copy of the engine's cache (a delta applied in sequence, as of its stamp, "+
		"a snapshot installed, or gossip's head and digest equal to its own); since the engine was first seen if never. "+
		"The series goes when the engine leaves the index; at most 1024 engines, the oldest.",
	[]string{"engine"}, nil)

// engineAges is kvmesh_materializer_engine_state_age_seconds: read from
// the engines under m.mu at scrape time, so the delta path only stores a
// time and a forgotten engine's series is gone with it (no label to
// delete, none left behind).
type engineAges struct{ m *Materializer }

var _ prometheus.Collector = engineAges{}

func (c engineAges) Describe(ch chan<- *prometheus.Desc) { ch <- descEngineAge }

func (c engineAges) Collect(ch chan<- prometheus.Metric) {
	type age struct {
		engine string
		age    time.Duration
	}
	now := c.m.now()
	c.m.mu.Lock()
	ages := make([]age, 0, len(c.m.engines))
	for id, e := range c.m.engines {
		ages = append(ages, age{id, max(now.Sub(e.confirmed), 0)})
	}
	c.m.mu.Unlock()
	if len(ages) > maxEngineAgeSeries {
		sort.Slice(ages, func(i, j int) bool {
			if ages[i].age != ages[j].age {
				return ages[i].age > ages[j].age
			}
			return ages[i].engine < ages[j].engine
		})
		ages = ages[:maxEngineAgeSeries]
	}
	for _, a := range ages {
		// An engine id that is no valid label value (not UTF-8) has no
		// series rather than a panic; it still counts in _engines.
		if mt, err := prometheus.NewConstMetric(descEngineAge, prometheus.GaugeValue, a.age.Seconds(), a.engine); err == nil {
			ch <- mt
		}
	}
}
