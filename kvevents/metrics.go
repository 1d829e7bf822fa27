package kvevents

import "github.com/prometheus/client_golang/prometheus"

// subscriberMetric describes one SubscriberStats counter.
type subscriberMetric struct {
	desc *prometheus.Desc
	get  func(SubscriberStats) uint64
}

// SubscriberCollector exports a Subscriber's counters as Prometheus
// counters named kvmesh_kvevents_*_total with an "engine" label. It reads
// the atomics at scrape time, so it costs nothing on the event path.
type SubscriberCollector struct {
	engine  string
	stats   func() SubscriberStats
	metrics []subscriberMetric
}

var _ prometheus.Collector = (*SubscriberCollector)(nil)

// NewSubscriberCollector returns a collector for sub, labelled with engine.
func NewSubscriberCollector(engine string, sub *Subscriber) *SubscriberCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("kvmesh_kvevents_"+name+"_total", help, []string{"engine"}, nil)
	}
	return &SubscriberCollector{
		engine: engine,
		stats:  sub.Stats,
		metrics: []subscriberMetric{
			{d("received", "Live KV-event messages received from the engine."), func(s SubscriberStats) uint64 { return s.Received }},
			{d("delivered", "KV-event batches handed to the consumer, live or replayed."), func(s SubscriberStats) uint64 { return s.Delivered }},
			{d("gaps", "Sequence gaps seen on the live socket."), func(s SubscriberStats) uint64 { return s.Gaps }},
			{d("replays", "Replay requests sent to the engine."), func(s SubscriberStats) uint64 { return s.Replays }},
			{d("replayed", "Batches recovered through replay."), func(s SubscriberStats) uint64 { return s.Replayed }},
			{d("replay_failures", "Replay exchanges that timed out or ran past the batch bound."), func(s SubscriberStats) uint64 { return s.ReplayFailures }},
			{d("resets", "Engine restarts detected (sequence went backwards)."), func(s SubscriberStats) uint64 { return s.Resets }},
			{d("lost_history", "Holes in the event stream that could not be replayed."), func(s SubscriberStats) uint64 { return s.LostHistory }},
			{d("decode_errors", "Payloads that failed to decode (skipped)."), func(s SubscriberStats) uint64 { return s.DecodeErrors }},
			{d("malformed", "Messages with a wrong frame layout (skipped)."), func(s SubscriberStats) uint64 { return s.Malformed }},
			{d("duplicates", "Live batches already delivered through replay (skipped)."), func(s SubscriberStats) uint64 { return s.Duplicates }},
			{d("probes", "Idle probes: replay requests not caused by a gap."), func(s SubscriberStats) uint64 { return s.Probes }},
			{d("unknown_events", "Events of unknown types skipped inside delivered batches."), func(s SubscriberStats) uint64 { return s.UnknownEvents }},
		},
	}
}

// Describe implements prometheus.Collector.
func (c *SubscriberCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector.
func (c *SubscriberCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(m.get(st)), c.engine)
	}
}
