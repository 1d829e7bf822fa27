package sidecar

import (
	"strings"
	"time"
)

// silentWarnEvery spaces the warnings while an engine's events stay silent.
const silentWarnEvery = 10 * time.Minute

// silence follows an engine that serves requests while no KV-event batch
// arrives: the sidecar listening where the engine does not publish (an
// events port typo, the most likely misconfiguration of a new deployment),
// an engine started without KV events or prefix caching. The sidecar is
// ready all the same and its engine gossiped as ready with no keys, so the
// ingresses route to it without cache affinity; replay timeouts were the
// only trace. Guarded by the engine's mu.
type silence struct {
	// workSince and workLast are the first and the latest scrape that
	// showed the engine working since the last batch (zero: none).
	workSince, workLast time.Time
	// lastBatch is when the last batch arrived (zero: none yet).
	lastBatch time.Time
	// work is the last scrape's Load.work (workOK: it had one), the base
	// its growth is measured from.
	work   float64
	workOK bool
	// silent: the engine worked for EventsSilentAfter with no batch;
	// warned is when that was last logged.
	silent bool
	warned time.Time
}

// watchSilence takes a good scrape's load l (mu held). The engine is
// working when its request and token counters grew since the previous
// scrape, or requests run or hold KV cache. Events are silent once it has
// been seen working over EventsSilentAfter (from its first sign of work
// since the last batch to its latest) and still no batch came: a working
// vLLM engine stores blocks, and publishes them, at every new prompt.
// Entering the state is warned at once, then every silentWarnEvery while it
// lasts; a batch ends it (batchArrived).
func (e *engine) watchSilence(l Load) {
	z := &e.silence
	now := l.Scraped
	grew := l.workOK && z.workOK && l.work > z.work
	z.work, z.workOK = l.work, l.workOK
	if !grew && l.Running == 0 && l.KVUsage == 0 {
		return
	}
	window := e.s.cfg.EventsSilentAfter
	if z.workSince.IsZero() || (!z.silent && now.Sub(z.workLast) > window) {
		// Work after an idle spell longer than the window starts the
		// window again: a healthy engine idle for a while, then given a
		// prompt too short to fill a block (no event due), is not silent.
		z.workSince = now
	}
	z.workLast = now
	if window <= 0 || z.workLast.Sub(z.workSince) < window {
		return
	}
	if z.silent && now.Sub(z.warned) < silentWarnEvery {
		return
	}
	z.silent, z.warned = true, now
	last := "never"
	if !z.lastBatch.IsZero() {
		last = z.lastBatch.Format(time.RFC3339)
	}
	events, replay := e.cfg.Events, e.cfg.Replay
	if len(e.cfg.RankEvents) > 0 {
		events, replay = strings.Join(e.cfg.RankEvents, ","), strings.Join(e.cfg.RankReplay, ",")
	}
	var received, replayFailures uint64
	if e.sub != nil {
		st := e.sub.Stats()
		received, replayFailures = st.Received, st.ReplayFailures
	}
	e.log.Warn("engine serves requests but no KV event arrives: its cache is not indexed and the ingresses route to it without cache affinity; "+
		"check that the engine publishes KV events (vLLM: --kv-events-config with enable_kv_cache_events, prefix caching on) to the events endpoint given here, "+
		"and its replay endpoint (a port typo is the usual cause)",
		"events", events, "replay", replay, "bind_events", e.cfg.Bind, "dp_size", max(e.cfg.DPSize, 1),
		"working_since", z.workSince.Format(time.RFC3339), "last_batch", last,
		"live_received", received, "replay_failures", replayFailures)
}

// batchArrived ends a silence: a KV-event batch came (mu held).
func (e *engine) batchArrived() {
	z := &e.silence
	if z.silent {
		e.log.Info("KV events arrive again: the engine's cache is indexed", "silent_since", z.workSince.Format(time.RFC3339))
	}
	z.lastBatch = time.Now()
	z.workSince, z.workLast, z.silent, z.warned = time.Time{}, time.Time{}, false, time.Time{}
	// The next scrape takes its counters as the base: their growth up to
	// it is the work whose blocks this batch reported.
	z.workOK = false
}

// timeOrNil is &t, or nil for the zero time (JSON null or omitted).
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
