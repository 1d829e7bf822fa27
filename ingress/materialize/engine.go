package materialize

import (
	"sort"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// engineState is the materializer's copy of one engine. Guarded by
// Materializer.mu.
type engineState struct {
	id, model  string
	epoch, seq uint64
	synced     bool // a snapshot was installed and no clear happened since
	sets       [kvevents.NumTiers]map[uint64]struct{}
	digests    [kvevents.NumTiers]kvevents.Digest

	snapshotting bool
	again        bool      // another snapshot was asked for while one was in flight
	retryAt      time.Time // non-zero: a snapshot is due at this time (failure backoff)
	failures     int
	failWarned   bool              // the failing warning of this streak was logged
	buf          []*kvevents.Delta // deltas that arrived while not in sequence, bounded
	bufBytes     int               // buf's estimated memory (deltaBytes)

	// epochs is the sidecar epoch followed and the others seen (epoch.go);
	// epoch above is the installed snapshot's, which catches up with it.
	epochs epochView
	// followSeen: the followed epoch's last delta or snapshot; staleSince:
	// the first ignored delta of an older epoch since (zero: none).
	followSeen, staleSince time.Time
	// staleNews: since staleSince an ignored delta changed what the copy
	// holds (a key it lacks stored, one it holds removed), which the
	// followed sidecar, were it alive, would have published too;
	// staleEpoch is the older epoch last heard from. tick switches to it
	// once the followed one has echoed nothing for EpochGrace.
	staleNews  bool
	staleEpoch uint64
	// otherSeen: the last delta of another epoch than the followed one (an
	// older one ignored, or the one followed before a switch): while it is
	// recent, two sidecars answer a snapshot request (fetchSnapshot).
	otherSeen time.Time
	// probe is the gossiped epoch whose head made the snapshot in flight.
	probe uint64

	lastMsg time.Time
	// confirmed: the last time this copy was known to equal the engine's
	// (a delta applied in sequence: its stamp; a snapshot installed, gossip's
	// head and digest equal to it: then), kvmesh_materializer_engine_state_age_seconds.
	confirmed     time.Time
	lag           time.Duration // the last applied delta's propagation lag
	lagAt         time.Time     // when lag was measured (zero: never)
	applied       uint64
	inGossip      bool
	goneSince     time.Time
	behindSince   time.Time
	mismatchSince time.Time
	// aheadSince: since when gossip's head has been behind the copy's in
	// the same epoch while quiet; aheadRepaired: the copy's head when that
	// last took a snapshot (once per head: a sidecar whose gossip lags for
	// good costs one snapshot, not one every AheadGrace).
	aheadSince    time.Time
	aheadRepaired kvevents.Head
	// outsideSince, outsideSeen: the first and the last delta that arrived
	// while gossip did not list the engine (zero: none since it was listed).
	outsideSince, outsideSeen time.Time
	// gossipEpoch: the epoch of the head gossip lists for the engine (0:
	// none, or not listed). unlistedEpoch: the epoch of the deltas that
	// last came from another epoch than that one, since unlistedSince
	// (reset when gossip lists it): a restarted sidecar's until gossip
	// carries its head, for seconds; for longer, another deployment's
	// sidecar with the same engine id on this NATS (unlistedLocked).
	gossipEpoch   uint64
	unlistedEpoch uint64
	unlistedSince time.Time
}

// Estimated memory of a buffered delta: its header, each op's, 8 bytes a
// key (what MaxBufferedBytes counts).
const (
	deltaOverhead = 128
	opOverhead    = 48
)

func deltaBytes(d *kvevents.Delta) int {
	n := deltaOverhead + len(d.Engine) + len(d.Model)
	for i := range d.Ops {
		n += opOverhead + 8*len(d.Ops[i].Keys)
	}
	return n
}

// bufferLocked keeps a copy of d in e's buffer (the decoder reuses its
// slices). A buffer only saves work: the snapshot that follows is correct
// on its own, and a delta missing after it shows up as a gap (or as gossip's
// head ahead), which takes another snapshot. So it is bounded twice: an
// engine's full buffer (MaxBuffered deltas) is dropped, and past
// MaxBufferedBytes over every engine the largest buffers are dropped until
// d fits (d itself, if it alone is over).
func (m *Materializer) bufferLocked(e *engineState, d *kvevents.Delta) {
	if len(e.buf) >= m.cfg.MaxBuffered {
		m.dropBufferLocked(e, "engine_limit")
	}
	size := deltaBytes(d)
	for m.bufBytes > 0 && m.bufBytes+size > m.cfg.MaxBufferedBytes {
		big := m.largestBufferLocked()
		if big == nil || big.bufBytes == 0 {
			m.bufBytes = 0 // cannot be (every change is counted); never loop on it
			break
		}
		m.dropBufferLocked(big, "byte_budget")
	}
	if size > m.cfg.MaxBufferedBytes {
		m.met.bufferDrops.WithLabelValues("byte_budget").Inc()
		return
	}
	c := &kvevents.Delta{Engine: d.Engine, Model: d.Model, Epoch: d.Epoch, Seq: d.Seq, TS: d.TS, EpochStart: d.EpochStart, Ops: make([]kvevents.Op, len(d.Ops))}
	for i, op := range d.Ops {
		c.Ops[i] = kvevents.Op{Kind: op.Kind, Tier: op.Tier, Keys: append([]uint64(nil), op.Keys...)}
	}
	e.buf = append(e.buf, c)
	e.bufBytes += size
	m.bufBytes += size
}

// takeBufferLocked empties e's buffer and returns what it held.
func (m *Materializer) takeBufferLocked(e *engineState) []*kvevents.Delta {
	buf := e.buf
	m.bufBytes -= e.bufBytes
	e.buf, e.bufBytes = nil, 0
	return buf
}

// dropBufferLocked drops e's buffer (reason: engine_limit, byte_budget).
func (m *Materializer) dropBufferLocked(e *engineState, reason string) {
	m.takeBufferLocked(e)
	m.met.bufferDrops.WithLabelValues(reason).Inc()
}

// largestBufferLocked is the engine whose buffer holds the most bytes
// (called only when the budget is full: a scan of the engines is rare).
func (m *Materializer) largestBufferLocked() *engineState {
	var big *engineState
	for _, e := range m.engines {
		if big == nil || e.bufBytes > big.bufBytes {
			big = e
		}
	}
	return big
}

func (e *engineState) head() kvevents.Head { return kvevents.Head{Epoch: e.epoch, Seq: e.seq} }

// tick is the housekeeping pass: due retries, gossip discovery, digest and
// head checks, and clearing engines whose sidecar is gone.
func (m *Materializer) tick(now time.Time) {
	var views map[string]int
	var engines []engineView
	if m.cfg.Membership != nil {
		for _, v := range m.cfg.Membership.Engines() {
			engines = append(engines, engineView{id: v.ID, model: v.Model, digest: v.Digest})
		}
		views = make(map[string]int, len(engines))
		for i, v := range engines {
			views[v.id] = i
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// While the link is down a snapshot request cannot be answered: the
	// reconnect resyncs every engine (Run), so no retry or check now.
	down := !m.downSince.IsZero()
	for _, v := range engines {
		e := m.engines[v.id]
		if e != nil && v.model != "" && v.model != e.model {
			m.changeModelLocked(e, v.model)
			e = nil
		}
		if e == nil {
			e = m.engine(v.id, v.model)
			m.snapshotLocked(e, "discovered in gossip")
		}
		if !e.inGossip {
			m.unlisted--
		}
		e.inGossip, e.goneSince = true, time.Time{}
		e.outsideSince, e.outsideSeen = time.Time{}, time.Time{}
		e.gossipEpoch = v.digest.Head.Epoch
		if e.unlistedEpoch == e.gossipEpoch {
			e.unlistedEpoch, e.unlistedSince = 0, time.Time{}
		}
		if !down {
			m.checkHeadLocked(e, v.digest, now)
		}
	}
	for id, e := range m.engines {
		if !down && !e.snapshotting && e.retryAt != (time.Time{}) && !now.Before(e.retryAt) {
			m.snapshotLocked(e, "retry")
		}
		if !down {
			m.checkSilentLocked(e, now)
		}
		if views == nil {
			switch {
			case !down && e.synced && !e.snapshotting && now.Sub(e.lastMsg) >= m.cfg.IdleCheck:
				e.lastMsg = now // one probe per IdleCheck
				m.snapshotLocked(e, "idle check")
			case !e.synced && !e.snapshotting && now.Sub(e.lastMsg) > 10*m.cfg.SnapshotTimeout:
				// No sidecar answered (cleared) and no delta came for long:
				// the engine left. Kept, it would be retried forever and every
				// engine that ever came and went would stay in memory.
				m.forgetLocked(e, "unreachable")
			}
			continue
		}
		if _, ok := views[id]; ok {
			continue
		}
		e.gossipEpoch = 0
		switch {
		case e.inGossip && e.goneSince.IsZero():
			e.goneSince = now
		case e.inGossip && now.Sub(e.goneSince) >= m.cfg.GoneAfter:
			m.forgetLocked(e, "gone from gossip")
		case !e.inGossip && !e.synced && now.Sub(e.lastMsg) > 10*m.cfg.SnapshotTimeout:
			m.forgetLocked(e, "unreachable") // a stream subject of a long-dead engine
		}
	}
	if views != nil {
		m.warnOutsideLocked(now)
	}
}

// outsideLocked reports whether e counts as outside gossip at now: its
// deltas have kept arriving, for OutsideGossipAfter, while gossip does not
// list it, and the last one is recent (ten times that).
func (m *Materializer) outsideLocked(e *engineState, now time.Time) bool {
	return m.cfg.Membership != nil && !e.inGossip && !e.outsideSince.IsZero() &&
		e.outsideSeen.Sub(e.outsideSince) >= m.cfg.OutsideGossipAfter && now.Sub(e.outsideSeen) < 10*m.cfg.OutsideGossipAfter
}

// noteOutside notes a delta of e, which gossip does not list.
func (e *engineState) noteOutside(now time.Time) {
	if e.outsideSince.IsZero() {
		e.outsideSince = now
	}
	e.outsideSeen = now
}

// OutsideGossip returns the engines, sorted, whose deltas keep arriving on
// NATS while gossip does not list them (Config.OutsideGossipAfter):
// kvmesh_materializer_engines_outside_gossip counts them.
func (m *Materializer) OutsideGossip() []string {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.outsideIDsLocked(now)
}

func (m *Materializer) outsideIDsLocked(now time.Time) []string {
	var ids []string
	for id, e := range m.engines {
		if m.outsideLocked(e, now) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// maxOutsideNamed bounds the engines the outside-gossip warning names.
const maxOutsideNamed = 16

// warnOutsideLocked warns, at most once a minute, while engines are
// outside gossip: the ingress follows their caches but routes nothing to
// them, since gossip (which carries their addresses and load) does not
// list them. The likeliest cause is a gossip partition: members whose
// seeds form islands, a network split, or a sidecar with another
// --gossip-key or dead seeds.
func (m *Materializer) warnOutsideLocked(now time.Time) {
	if now.Sub(m.outsideWarned) < time.Minute {
		return
	}
	ids := m.outsideIDsLocked(now)
	if len(ids) == 0 {
		return
	}
	m.outsideWarned = now
	n := len(ids)
	if n > maxOutsideNamed {
		ids = ids[:maxOutsideNamed]
	}
	m.log.Warn("engines publish deltas on NATS but gossip does not list them: this ingress does not route to them; a gossip partition (members whose --join seeds form islands, a network split) or their sidecars alone in gossip (another --gossip-key, dead seeds: kvmesh_gossip_alone on them); warned once a minute",
		"engines", ids, "count", n, "for_at_least", m.cfg.OutsideGossipAfter)
}

// checkSilentLocked follows the older epoch again once the followed one
// has been silent for EpochGrace since an older one's delta brought a
// change: both sidecars publish every change of the engine, so a live
// followed one would have sent it too (an older one merely behind sends
// nothing new). onDelta switches only on a later delta of the older epoch,
// which an engine gone idle after a short burst never sends: its index
// stayed behind the engine until the next request, minutes later.
func (m *Materializer) checkSilentLocked(e *engineState, now time.Time) {
	if !e.staleNews || e.staleSince.IsZero() || now.Sub(e.staleSince) < m.cfg.EpochGrace || m.unlistedHeldLocked(e, e.staleEpoch, now) {
		return
	}
	m.log.Info("switching to another sidecar epoch: the followed one went silent", "engine", e.id,
		"epoch", e.staleEpoch, "epoch_start", startTime(e.epochs.startOf(e.staleEpoch)), "silent_epoch", e.epochs.follow,
		"silent_epoch_start", startTime(e.epochs.followStart), "silent_for", now.Sub(e.followSeen).Round(time.Millisecond))
	m.followLocked(e, e.staleEpoch, 0, now)
}

type engineView struct {
	id, model string
	digest    kvevents.EngineDigest
}

// checkHeadLocked compares e with its gossiped head and digest. At the same
// head the digests must be equal; gossip ahead of e (or in another epoch)
// while no delta arrives means deltas were lost without a later one to
// reveal the gap (a busy stream reveals gaps by itself, and a materializer
// that merely lags must not snapshot in a loop). Either condition must
// persist for DigestGrace before a resync.
func (m *Materializer) checkHeadLocked(e *engineState, g kvevents.EngineDigest, now time.Time) {
	if !e.synced || e.snapshotting || e.retryAt != (time.Time{}) || g.Head.Epoch == 0 {
		return
	}
	h := e.head()
	if g.Head.Epoch != h.Epoch && e.epochs.older(g.Head.Epoch, 0) {
		// Gossip shows the older of two live sidecars of the engine (the
		// view follows whichever updated last): not a reason to resync.
		e.behindSince, e.mismatchSince = time.Time{}, time.Time{}
		return
	}
	if g.Head == h && g.Digests == e.digests {
		e.confirmed = now // an idle engine's copy is current, though no delta came
	}
	quiet := now.Sub(e.lastMsg) >= m.cfg.DigestGrace
	behind := quiet && (g.Head.Epoch != h.Epoch || g.Head.Seq > h.Seq)
	mismatch := g.Head == h && g.Digests != e.digests
	// Ahead: a delta applied that gossip's head never reaches. A live
	// engine's next delta would show it (taken as a duplicate, then a
	// digest mismatch at equal heads), an idle one's never does.
	ahead := quiet && g.Head.Epoch == h.Epoch && g.Head.Seq < h.Seq && h != e.aheadRepaired
	if !ahead {
		e.aheadSince = time.Time{}
	}
	switch {
	case ahead:
		e.behindSince, e.mismatchSince = time.Time{}, time.Time{}
		if e.aheadSince.IsZero() {
			e.aheadSince = now
		} else if now.Sub(e.aheadSince) >= m.cfg.AheadGrace {
			m.met.ahead.Inc()
			m.log.Warn("copy ahead of gossip's head for long while the engine is quiet: a delta the sidecar did not publish (a forged or buggy publisher on its subject) or its gossip lagging; resyncing",
				"engine", e.id, "head", h, "gossip_head", g.Head, "for", now.Sub(e.aheadSince).Round(time.Millisecond))
			e.aheadRepaired, e.aheadSince = h, time.Time{}
			m.snapshotLocked(e, "ahead of gossip head")
		}
	case behind:
		e.mismatchSince = time.Time{}
		if e.behindSince.IsZero() {
			e.behindSince = now
		} else if now.Sub(e.behindSince) >= m.cfg.DigestGrace {
			m.met.gaps.Inc()
			if g.Head.Epoch != h.Epoch {
				e.probe = g.Head.Epoch // lost, unless it answers (installSnapshot)
			}
			m.snapshotLocked(e, "behind gossip head")
		}
	case mismatch:
		e.behindSince = time.Time{}
		if e.mismatchSince.IsZero() {
			e.mismatchSince = now
		} else if now.Sub(e.mismatchSince) >= m.cfg.DigestGrace {
			m.met.mismatches.Inc()
			m.log.Warn("digest mismatch with gossip; resyncing", "engine", e.id, "head", h)
			m.snapshotLocked(e, "digest mismatch")
		}
	default:
		e.behindSince, e.mismatchSince = time.Time{}, time.Time{}
	}
}

func (m *Materializer) forgetLocked(e *engineState, reason string) {
	m.log.Info("forgetting engine", "engine", e.id, "reason", reason)
	m.clearLocked(e)
	m.takeBufferLocked(e)
	if !e.inGossip {
		m.unlisted--
	}
	delete(m.engines, e.id)
}

// failingSnapshots is how many snapshots of an engine in a row must fail
// for it to count as failing: Synced no longer waits for it, a warning is
// logged (once per streak) and kvmesh_materializer_failing_engines counts it.
const failingSnapshots = 3

// failingLocked reports whether e counts as failing: failingSnapshots
// failures in a row, of an engine gossip lists (or of any engine without
// gossip). An engine known only from the delta stream's subjects (a
// restarted ingress finds every engine of the stream's last max age, the
// pods of the last rollout among them) that gossip does not list has most
// likely left: its snapshots fail with nobody to answer, and it is
// forgotten once no delta came for ten snapshot timeouts. Counted, it
// would raise the alert on every ingress restart after a rollout.
func (m *Materializer) failingLocked(e *engineState) bool {
	return e.failures >= failingSnapshots && (m.cfg.Membership == nil || e.inGossip)
}

// Synced reports whether the initial discovery is done and every known
// engine has been snapshotted (engines that failed three times in a row do
// not hold readiness hostage: they are logged, counted in
// kvmesh_materializer_failing_engines and marked in Status). Use it for the
// ingress's /ready.
func (m *Materializer) Synced() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.discovered {
		return false
	}
	for _, e := range m.engines {
		if !e.synced && e.failures < failingSnapshots {
			return false
		}
	}
	return true
}

// EngineStatus is one engine's state in this materializer (for /debug/index).
type EngineStatus struct {
	Engine    string                 `json:"engine"`
	Model     string                 `json:"model"`
	Epoch     uint64                 `json:"epoch"`
	Seq       uint64                 `json:"seq"`
	Synced    bool                   `json:"synced"`
	Keys      [kvevents.NumTiers]int `json:"keys"` // gpu, cpu, other
	Lag       time.Duration          `json:"lag_ns"`
	LastDelta time.Time              `json:"last_delta"`
	Applied   uint64                 `json:"deltas_applied"`
	Buffered  int                    `json:"buffered"`
	// BufferedBytes: the buffer's estimated memory (Config.MaxBufferedBytes).
	BufferedBytes int                   `json:"buffered_bytes"`
	InGossip      bool                  `json:"in_gossip"`
	Digest        kvevents.EngineDigest `json:"digest"`
	// Snapshotting: a snapshot is in flight or due (a retry).
	Snapshotting bool `json:"snapshotting"`
	// SnapshotFailures: snapshots failed in a row (3 or more: failing).
	SnapshotFailures int `json:"snapshot_failures"`
}

// Status returns every engine's status, sorted by engine id.
func (m *Materializer) Status() []EngineStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]EngineStatus, 0, len(m.engines))
	for _, e := range m.engines {
		s := EngineStatus{
			Engine: e.id, Model: e.model, Epoch: e.epoch, Seq: e.seq, Synced: e.synced,
			Lag: e.lag, LastDelta: e.lastMsg, Applied: e.applied, Buffered: len(e.buf), BufferedBytes: e.bufBytes, InGossip: e.inGossip,
			Digest:       kvevents.EngineDigest{Head: e.head(), Digests: e.digests},
			Snapshotting: e.snapshotting || e.retryAt != (time.Time{}), SnapshotFailures: e.failures,
		}
		for t := range e.sets {
			s.Keys[t] = len(e.sets[t])
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Engine < out[j].Engine })
	return out
}

// Keys returns a copy of one engine's key set per tier (tests and debugging).
func (m *Materializer) Keys(engine string) (sets [kvevents.NumTiers][]uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.engines[engine]
	if e == nil {
		return sets, false
	}
	for t := range e.sets {
		for k := range e.sets[t] {
			sets[t] = append(sets[t], k)
		}
	}
	return sets, true
}

// KeyCount is the number of keys held over all engines and tiers.
func (m *Materializer) KeyCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keys
}
