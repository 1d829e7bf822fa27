package materialize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Materializer keeps an Index equal to every engine's key set. Create it with
// New, run it with Run; Synced, Status and KeyCount may be called from any
// goroutine at any time.
type Materializer struct {
	cfg Config
	log *slog.Logger
	met *metrics
	sem chan struct{} // bounds snapshot requests in flight

	// mu guards every field below and serializes index writes. The NATS
	// delivery goroutine holds it while applying one delta (no I/O); snapshot
	// workers take it only to install a fetched snapshot.
	mu         sync.Mutex
	engines    map[string]*engineState
	dec        kvevents.Delta // reused by the delivery goroutine
	scratch    []uint64
	discovered bool
	keys       int
	// bufBytes: every engine's buffer (Config.MaxBufferedBytes); unlisted:
	// the engines gossip does not list (Config.MaxUnlisted).
	bufBytes, unlisted int
	// unlistedWarned, skewWarned: the last warnings that unlisted engines
	// were dropped, that a sidecar's clock is ahead of this host's.
	unlistedWarned, skewWarned time.Time
	// malformedWarned: the last warning of an undecodable delta.
	malformedWarned time.Time
	// outsideWarned: the last warning of engines outside gossip;
	// unlistedEpochWarned: of deltas from an epoch gossip does not list.
	outsideWarned, unlistedEpochWarned time.Time
	// downSince: when Run saw the NATS connection down (lost, or found
	// dead by its pings); zero while connected.
	downSince time.Time
	// backAt: the last resync after a NATS reconnect (FirstReplyTimeout).
	backAt time.Time
	ctx    context.Context
	wg     sync.WaitGroup // snapshot workers

	// warnMu guards refusedWarned: the last warning of each refusal
	// reason (refuse.go; snapshot workers refuse without mu).
	warnMu        sync.Mutex
	refusedWarned map[string]time.Time

	running atomic.Bool
	// now is the clock of the engine state age gauge (tests set it).
	now func() time.Time
}

// New validates cfg and registers the metrics.
func New(cfg Config) (*Materializer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &Materializer{
		cfg: cfg, log: log.With("component", "materializer"), met: newMetrics(),
		sem: make(chan struct{}, cfg.MaxConcurrentSnapshots), engines: map[string]*engineState{}, now: time.Now,
		refusedWarned: map[string]time.Time{},
	}
	err := m.met.register(cfg.Registerer, engineAges{m},
		func() float64 { m.mu.Lock(); defer m.mu.Unlock(); return float64(len(m.engines)) },
		func() float64 { m.mu.Lock(); defer m.mu.Unlock(); return float64(m.keys) },
		func() float64 { return m.StaleFor().Seconds() },
		func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			n := 0
			for _, e := range m.engines {
				if m.failingLocked(e) {
					n++
				}
			}
			return float64(n)
		},
		func() float64 { m.mu.Lock(); defer m.mu.Unlock(); return float64(m.bufBytes) },
		func() float64 { return float64(len(m.OutsideGossip())) })
	if err != nil {
		return nil, fmt.Errorf("materializer metrics: %w", err)
	}
	return m, nil
}

// ErrRunning is returned by a second concurrent Run.
var ErrRunning = errors.New("materializer: already running")

// Run subscribes to the deltas, discovers engines (stream subjects and
// gossip) and keeps the index in sync until ctx ends. It returns nil on
// cancellation, after every snapshot worker stopped. The index keeps its
// content: the caller decides whether a stopped materializer's view is used.
func (m *Materializer) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.running.Store(false)
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		// Cancelled under mu: a snapshot asked for after this (a delta
		// callback still running) sees the context ended in snapshotLocked
		// and starts no worker, so none is added while Wait waits.
		m.mu.Lock()
		cancel()
		m.mu.Unlock()
		m.wg.Wait()
	}()
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()

	nc := m.cfg.Conn
	sub, err := nc.Subscribe(m.cfg.Subjects.DeltaWildcard(), m.onDelta)
	if err != nil {
		return fmt.Errorf("materializer subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// Generous pending limits: a burst must not turn into a slow-consumer drop
	// (which is recovered by a snapshot, but costs one).
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	if !m.waitConnected(ctx) {
		return nil
	}
	if err := nc.FlushTimeout(m.cfg.SnapshotTimeout); err != nil {
		return fmt.Errorf("materializer subscribe: %w", err)
	}
	m.discoverStream(ctx)
	reconnects := nc.Stats().Reconnects
	m.tick(time.Now())
	m.mu.Lock()
	m.discovered = true
	m.mu.Unlock()

	t := time.NewTicker(m.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			m.checkLink(now, &reconnects)
			m.tick(now)
		}
	}
}

// checkLink follows the connection: down (lost, or found dead by its
// pings), the index is stale and no snapshot is tried; connected again for
// real (nats.go counts a reconnect once TCP connects, before the handshake,
// so against a blackholing path the count climbs every attempt while
// nothing is connected), every engine is resynced, once.
func (m *Materializer) checkLink(now time.Time, reconnects *uint64) {
	nc := m.cfg.Conn
	r := nc.Stats().Reconnects // before the status: a reconnect after the status read is seen next time
	// Read before m.mu: nats.go's reconnect loop holds the connection's
	// lock through each connect attempt (up to its connect timeout against
	// a hung server), and requests take m.mu (Synced, StaleFor).
	status := nc.Status()
	up := status == nats.CONNECTED || status == nats.DRAINING_SUBS || status == nats.DRAINING_PUBS // nc.IsConnected()
	m.mu.Lock()
	wasDown := !m.downSince.IsZero()
	switch {
	case !up && !wasDown:
		m.downSince = now
		m.log.Warn("nats connection down: the index no longer follows the sidecars until it is back", "status", status.String())
	case up && wasDown:
		m.log.Info("nats connection back", "stale_for", now.Sub(m.downSince).Round(time.Millisecond))
		m.downSince = time.Time{}
	}
	m.mu.Unlock()
	if up && (r != *reconnects || wasDown) {
		*reconnects = r
		m.resyncAll("nats reconnect")
	}
}

// Stale reports whether the index has stopped following the sidecars: the
// NATS connection is down (lost, or found dead by its pings, within
// natsutil's Auth.StaleAfter of the path dying), as Run last saw it. The
// index keeps what it had, so routing goes on with it; the reconnect resyncs
// every engine. Synced is not changed by it: it says the first sync is done,
// and what follows it (the ingress's and the endpoint picker's readiness)
// must not take every replica out of service because NATS is away.
func (m *Materializer) Stale() bool { return m.StaleFor() > 0 }

// StaleFor is how long the index has been stale (0: it is not), the
// kvmesh_materializer_stale_seconds gauge.
func (m *Materializer) StaleFor() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.downSince.IsZero() {
		return 0
	}
	return max(time.Since(m.downSince), time.Nanosecond)
}

// waitConnected waits until the connection is up (a connection made in the
// background, NATS started after this ingress); false when ctx ends first.
// Until then the index is stale (empty): StaleFor counts from the wait's
// start, so the stale alert fires for a replica that never reached NATS as
// for one that lost it.
func (m *Materializer) waitConnected(ctx context.Context) bool {
	nc := m.cfg.Conn
	if nc.IsConnected() {
		return true
	}
	m.mu.Lock()
	m.downSince = time.Now()
	m.mu.Unlock()
	m.log.Warn("nats not reached yet: the index is empty, and stale, until it is; waiting before discovering engines")
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	m.mu.Lock()
	waited := time.Since(m.downSince)
	m.downSince = time.Time{}
	m.mu.Unlock()
	m.log.Info("nats reached: discovering engines", "waited", waited.Round(time.Millisecond).String())
	return true
}

// discoverStream snapshots every engine that has deltas in the stream, so a
// restarted ingress knows idle engines too. Without JetStream it does nothing.
func (m *Materializer) discoverStream(ctx context.Context) {
	js, err := jetstream.New(m.cfg.Conn)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.SnapshotTimeout)
	defer cancel()
	s, err := js.Stream(ctx, m.cfg.Subjects.Stream())
	if err != nil {
		m.log.Debug("no delta stream to discover engines from", "stream", m.cfg.Subjects.Stream(), "err", err)
		return
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(m.cfg.Subjects.DeltaWildcard()))
	if err != nil {
		m.log.Debug("delta stream info", "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for subject := range info.State.Subjects {
		model, engine, ok := m.cfg.Subjects.ParseDeltaSubject(subject)
		if !ok {
			continue
		}
		if m.engines[engine] == nil && !m.tooManyUnlistedLocked(engine) {
			m.snapshotLocked(m.engine(engine, model), "discovered in stream")
		}
	}
}

// onDelta is the NATS delivery callback: decode, then apply in sequence or
// buffer and snapshot. It allocates nothing on the in-sequence path.
func (m *Materializer) onDelta(msg *nats.Msg) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := &m.dec
	if err := kvevents.DecodeDelta(msg.Data, d); err != nil || d.Engine == "" {
		m.malformedLocked(msg.Subject, err)
		return
	}
	now := time.Now()
	if why := deltaRefusal(&m.cfg.Subjects, msg.Subject, d, now); why != "" {
		// Before anything is learned from it: not even a first sight.
		m.refuse(why, msg.Subject, d.Engine, d.Model, d.EpochStart, now)
		return
	}
	e := m.engines[d.Engine]
	if e == nil {
		if m.tooManyUnlistedLocked(d.Engine) {
			return
		}
		m.sightedLocked(d, now, "first sight")
		return
	}
	if d.Model != "" && d.Model != e.model {
		if m.cfg.Membership != nil {
			// Gossip names the engine's model (tick switches when it
			// changes): this sidecar serves the id's previous model, or its
			// next one before gossip says so. Its snapshot covers the deltas.
			m.met.otherModel.Inc()
			return
		}
		if e.epochs.follow != 0 && (d.Epoch == e.epochs.follow || e.epochs.older(d.Epoch, d.EpochStart)) {
			m.met.staleEpochs.Inc() // the previous model's sidecar, still running
			return
		}
		// Without gossip a newer sidecar's deltas tell of the engine id's
		// new model: its snapshot subject is the new model's.
		m.changeModelLocked(e, d.Model)
		m.sightedLocked(d, now, "model changed")
		return
	}
	e.lastMsg = now
	if m.cfg.Membership != nil && !e.inGossip {
		e.noteOutside(now)
	}
	if m.cfg.Membership != nil && e.inGossip && e.gossipEpoch != 0 && d.Epoch != e.gossipEpoch {
		m.unlistedLocked(e, d, now)
	}
	if e.epochs.follow == 0 { // discovered, its first epoch seen now: nothing to compare with
		e.epochs.setFollow(d.Epoch, d.EpochStart)
	}
	if d.Epoch != e.epochs.follow {
		if m.listedOverFollowedLocked(e, d.Epoch, now) {
			// Newer or not, the followed epoch is not the engine gossip
			// lists, and has not been for OutsideGossipAfter: this one is.
			// Once given up, the unlisted one stays older (epoch.go).
			m.log.Warn("following the sidecar epoch gossip lists for the engine instead of one it has not listed for long: another deployment on this NATS with the same engine id?",
				"engine", e.id, "epoch", d.Epoch, "unlisted_epoch", e.epochs.follow, "unlisted_for", now.Sub(e.unlistedSince).Round(time.Millisecond))
		} else if e.epochs.older(d.Epoch, d.EpochStart) {
			// Another live sidecar of the engine, older than the one
			// followed (epoch.go): ignored, unless the followed one has
			// been silent for EpochGrace while this one kept sending.
			m.met.staleEpochs.Inc()
			e.epochs.note(d.Epoch, d.EpochStart, true)
			e.otherSeen = now
			if e.staleSince.IsZero() {
				e.staleSince, e.staleNews = now, false
			}
			e.staleEpoch = d.Epoch
			e.staleNews = e.staleNews || m.newsLocked(e, d)
			if now.Sub(e.staleSince) < m.cfg.EpochGrace || m.unlistedHeldLocked(e, d.Epoch, now) {
				return // or tick's checkSilentLocked, if no delta comes
			}
			// Older by start time only: an older sidecar still running, or a
			// restarted one on a host whose clock is behind the silent one's.
			m.log.Info("switching to another sidecar epoch: the followed one went silent", "engine", e.id,
				"epoch", d.Epoch, "epoch_start", startTime(d.EpochStart), "silent_epoch", e.epochs.follow,
				"silent_epoch_start", startTime(e.epochs.followStart), "silent_for", now.Sub(e.followSeen).Round(time.Millisecond))
		}
		m.bufferLocked(e, d)
		m.followLocked(e, d.Epoch, d.EpochStart, now)
		return
	}
	e.followSeen, e.staleSince = now, time.Time{}
	e.epochs.setFollow(d.Epoch, d.EpochStart) // learns its start
	switch {
	case e.snapshotting || e.retryAt != (time.Time{}):
		m.bufferLocked(e, d)
	case d.Epoch != e.epoch: // followed, not installed (cleared meanwhile)
		m.bufferLocked(e, d)
		m.snapshotLocked(e, "not synced")
	case d.Seq <= e.seq:
		m.met.duplicates.Inc()
	case d.Seq > e.seq+1:
		m.met.gaps.Inc()
		m.bufferLocked(e, d)
		m.snapshotLocked(e, "gap")
	default:
		m.applyLocked(e, d)
		e.confirmed = now
		if at := time.Unix(0, d.TS); d.TS > 0 && at.Before(now) {
			// The copy is current as of the delta's own stamp, not its
			// arrival: an ingress behind its deltas (a burst queued in its
			// subscription) shows how far (clock skew included, as the lag).
			e.confirmed = at
		}
	}
}

// unlistedLocked notes a delta of e from another epoch than the one whose
// head gossip lists for it. A restarted sidecar's deltas come before
// gossip carries its head, for a second or so; past OutsideGossipAfter the
// epoch is counted (kvmesh_materializer_unlisted_epoch_deltas_total) and
// warned about once a minute: a sidecar gossip does not know publishes as
// the engine, most likely another installation on this NATS whose sidecar
// has the same engine id (its deltas won as the newer epoch, and this
// ingress indexed the other installation's cache for this engine). Its
// deltas are ignored once the listed epoch is followed again
// (listedOverFollowedLocked).
func (m *Materializer) unlistedLocked(e *engineState, d *kvevents.Delta, now time.Time) {
	if e.unlistedEpoch != d.Epoch {
		e.unlistedEpoch, e.unlistedSince = d.Epoch, now
	}
	if now.Sub(e.unlistedSince) < m.cfg.OutsideGossipAfter {
		return
	}
	m.met.unlistedEpochs.Inc()
	if now.Sub(m.unlistedEpochWarned) < time.Minute {
		return
	}
	m.unlistedEpochWarned = now
	m.log.Warn("deltas of an engine arrive from a sidecar epoch gossip does not list for it: another deployment on this NATS with the same engine id, or a sidecar with another installation's --nats-prefix? "+
		"Give each installation its own --nats-prefix, NATS account or server (docs/OPERATIONS.md, \"One NATS per installation\"); "+
		"the epoch gossip lists is followed again at its next delta; warned once a minute",
		"engine", e.id, "epoch", d.Epoch, "gossip_epoch", e.gossipEpoch, "for_at_least", now.Sub(e.unlistedSince).Round(time.Millisecond))
}

// listedOverFollowedLocked reports whether e should follow ep, another
// epoch than the one followed, because ep is the one gossip lists and the
// followed one has sent deltas gossip did not list for OutsideGossipAfter.
func (m *Materializer) listedOverFollowedLocked(e *engineState, ep uint64, now time.Time) bool {
	return m.cfg.Membership != nil && e.inGossip && ep == e.gossipEpoch && e.unlistedEpoch == e.epochs.follow &&
		e.unlistedEpoch != 0 && now.Sub(e.unlistedSince) >= m.cfg.OutsideGossipAfter
}

// unlistedHeldLocked reports whether e keeps to the followed epoch, the
// one gossip lists, however silent, rather than go back to ep, which gossip
// has not listed for OutsideGossipAfter: the other installation's busy
// sidecar would otherwise take over each time this one's engine idles.
func (m *Materializer) unlistedHeldLocked(e *engineState, ep uint64, now time.Time) bool {
	return m.cfg.Membership != nil && e.inGossip && e.gossipEpoch == e.epochs.follow && ep != e.gossipEpoch &&
		e.unlistedEpoch == ep && now.Sub(e.unlistedSince) >= m.cfg.OutsideGossipAfter
}

// malformedWarnEvery spaces the warnings of undecodable deltas.
const malformedWarnEvery = time.Minute

// malformedLocked counts a delta delivered on subject that does not decode
// (err; nil: it names no engine) and warns of it at most once a minute,
// naming the subject and why. Its changes are lost: for the engine its
// subject names, followed here, it is a gap, which a later delta would show
// only if one came (the last delta of a burst before the engine goes quiet
// left the copy behind, with /debug/index saying synced, until gossip's head
// or an idle check caught it), so the engine is snapshotted now, as after a
// seq gap. A publisher on the subject can cause no more snapshots than by
// skipping a seq: one in flight, one more queued behind it.
func (m *Materializer) malformedLocked(subject string, err error) {
	m.met.malformed.Inc()
	if err == nil {
		err = errors.New("no engine id")
	}
	model, engine, ok := m.cfg.Subjects.ParseDeltaSubject(subject)
	e := m.engines[engine]
	followed := ok && e != nil && e.model == model
	if now := time.Now(); now.Sub(m.malformedWarned) >= malformedWarnEvery {
		m.malformedWarned = now
		m.log.Warn("undecodable delta skipped: its changes are lost (the engine is resnapshotted, if followed); a publisher writing what this ingress cannot read (a newer sidecar, a broken or forged one)",
			"subject", subject, "err", err, "followed", followed, "per", malformedWarnEvery)
	}
	if followed {
		m.snapshotLocked(e, "malformed delta")
	}
}

// followLocked follows epoch ep of e (started at start; 0: unknown) from
// now on instead of the one followed until now, and snapshots it.
func (m *Materializer) followLocked(e *engineState, ep uint64, start int64, now time.Time) {
	e.epochs.setFollow(ep, start)
	if e.followSeen.After(e.otherSeen) {
		e.otherSeen = e.followSeen // the one followed until now
	}
	e.followSeen, e.staleSince = now, time.Time{}
	m.met.epochs.Inc()
	m.snapshotLocked(e, "new epoch")
}

// newsLocked reports whether d, a delta of an epoch not followed, changes
// e's copy: it stores a key the copy lacks or removes one it holds. A copy
// not in place (a snapshot due) tells nothing.
func (m *Materializer) newsLocked(e *engineState, d *kvevents.Delta) bool {
	if !e.synced || e.snapshotting || e.retryAt != (time.Time{}) {
		return false
	}
	for i := range d.Ops {
		op := &d.Ops[i]
		set := e.sets[op.Tier]
		switch op.Kind {
		case kvevents.OpStore, kvevents.OpRemove:
			for _, k := range op.Keys {
				if _, ok := set[k]; ok != (op.Kind == kvevents.OpStore) {
					return true
				}
			}
		case kvevents.OpClear:
			if len(set) > 0 {
				return true
			}
		}
	}
	return false
}

// sightedLocked takes on the engine of d, unknown until now: it follows
// d's epoch, buffers d and snapshots the engine.
func (m *Materializer) sightedLocked(d *kvevents.Delta, now time.Time, reason string) {
	e := m.engine(d.Engine, d.Model)
	if m.cfg.Membership != nil {
		e.noteOutside(now) // until tick sees it in gossip
	}
	e.epochs.setFollow(d.Epoch, d.EpochStart)
	e.followSeen = now
	m.bufferLocked(e, d)
	m.snapshotLocked(e, reason)
}

// changeModelLocked forgets e, whose id now serves model: its keys were
// the previous model's, and its snapshots must be asked of the new model's
// sidecar (the subject names the model).
func (m *Materializer) changeModelLocked(e *engineState, model string) {
	m.met.modelChanges.Inc()
	m.log.Info("engine serves another model: its key set is dropped and the new model's snapshotted", "engine", e.id,
		"model", model, "previous_model", e.model)
	m.forgetLocked(e, "model changed")
}

func (m *Materializer) engine(id, model string) *engineState {
	now := time.Now()
	e := &engineState{id: id, model: model, lastMsg: now, confirmed: now}
	for t := range e.sets {
		e.sets[t] = map[uint64]struct{}{}
	}
	m.engines[id] = e
	m.unlisted++ // until tick sees it in gossip
	return e
}

// tooManyUnlistedLocked reports (and counts) that engine, unknown so far,
// is not taken on: with gossip, MaxUnlisted engines it does not list are
// known already. A warning at most once a minute names one such engine.
func (m *Materializer) tooManyUnlistedLocked(engine string) bool {
	if m.cfg.Membership == nil || m.unlisted < m.cfg.MaxUnlisted {
		return false
	}
	m.met.unlistedDropped.Inc()
	if now := time.Now(); now.Sub(m.unlistedWarned) >= time.Minute {
		m.unlistedWarned = now
		m.log.Warn("too many engines publish deltas that gossip does not list; ignoring further ones until gossip lists them or the others are forgotten",
			"engine", engine, "unlisted", m.unlisted, "max_unlisted", m.cfg.MaxUnlisted)
	}
	return true
}

// applyLocked applies one in-sequence delta to e and the index.
func (m *Materializer) applyLocked(e *engineState, d *kvevents.Delta) {
	for i := range d.Ops {
		op := &d.Ops[i]
		set, dig := e.sets[op.Tier], &e.digests[op.Tier]
		s := m.scratch[:0]
		switch op.Kind {
		case kvevents.OpStore:
			for _, k := range op.Keys {
				if _, ok := set[k]; !ok {
					set[k] = struct{}{}
					dig.Add(k)
					s = append(s, k)
				}
			}
			if len(s) > 0 {
				m.cfg.Index.Store(e.id, op.Tier, s)
			}
			m.keys += len(s)
		case kvevents.OpRemove:
			for _, k := range op.Keys {
				if _, ok := set[k]; ok {
					delete(set, k)
					dig.Remove(k)
					s = append(s, k)
				}
			}
			if len(s) > 0 {
				m.cfg.Index.Remove(e.id, op.Tier, s)
			}
			m.keys -= len(s)
		case kvevents.OpClear:
			for k := range set {
				s = append(s, k)
			}
			clear(set)
			*dig = kvevents.Digest{}
			if len(s) > 0 {
				m.cfg.Index.Remove(e.id, op.Tier, s)
			}
			m.keys -= len(s)
		}
		m.scratch = s
		m.met.keys.Add(float64(len(op.Keys)))
	}
	e.seq = d.Seq
	e.applied++
	m.met.applied.Inc()
	m.met.ops.Add(float64(len(d.Ops)))
	if d.TS > 0 {
		now := time.Now()
		m.observeLagLocked(e, now.Sub(time.Unix(0, d.TS)), now)
	}
}

// AheadTolerance is how far ahead of this host's clock a delta's stamp may
// be and still count as a lag of 0: the error of hosts whose clocks NTP
// keeps (a few milliseconds between hosts, tens at worst), which would
// otherwise read as broken clocks on a healthy cluster.
const AheadTolerance = 50 * time.Millisecond

// LagWindow is how recent an engine's last applied delta must be for its
// lag to count in PropagationLag.
const LagWindow = time.Minute

// observeLagLocked records one applied delta's propagation lag at now: its
// sidecar's wall-clock stamp to now here. A stamp at most AheadTolerance
// ahead is a lag of 0 (the hosts' clocks within NTP's error). One further
// ahead is no lag but the sidecar's host clock ahead of this one: kept out
// of the histogram, where it would drag the sum below zero (a lag alert
// could never fire), counted, and warned about once a minute with the skew
// it shows at least.
func (m *Materializer) observeLagLocked(e *engineState, lag time.Duration, now time.Time) {
	e.lagAt = now
	if lag >= -AheadTolerance {
		e.lag = max(lag, 0)
		m.met.lag.Observe(e.lag.Seconds())
		return
	}
	e.lag = 0
	m.met.aheadStamps.Inc()
	if now.Sub(m.skewWarned) >= time.Minute {
		m.skewWarned = now
		m.log.Warn("a sidecar stamps its deltas later than this host's clock: the two hosts' clocks disagree (is NTP running?); the propagation lag is not measured for such deltas",
			"engine", e.id, "ahead_by_at_least", (-lag).Round(time.Millisecond))
	}
}

// PropagationLag is the largest propagation lag of the engines' last
// applied deltas, over the engines whose last one was applied within
// LagWindow before now; 0 when none was. An engine gone quiet drops out:
// its last delta's lag, a skewed or queued one included, does not stand
// for the index's lag for as long as it stays quiet.
func (m *Materializer) PropagationLag(now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lag time.Duration
	for _, e := range m.engines {
		if !e.lagAt.IsZero() && now.Sub(e.lagAt) < LagWindow {
			lag = max(lag, e.lag)
		}
	}
	return lag
}

// startTime is an epoch start for the log ("unknown" for a sidecar that
// does not send it).
func startTime(ns int64) any {
	if ns <= 0 {
		return "unknown"
	}
	return time.Unix(0, ns).UTC()
}

// ReconnectWindow is how long after a NATS reconnect snapshots wait only
// FirstReplyTimeout for their first chunk: the sidecars find their own dead
// paths within natsutil's StaleAfter (15 s with the default pings) and
// redial.
const ReconnectWindow = 15 * time.Second

// snapshotBackoff spaces a failing engine's snapshot retries.
var snapshotBackoff = backoff.Backoff{Min: 250 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.3}

// snapshotLocked starts a snapshot of e unless one is in flight. Deltas for e
// are buffered until it is installed.
func (m *Materializer) snapshotLocked(e *engineState, reason string) {
	if e.snapshotting {
		e.again = true // the reply may predate the reason: take another one after it
		return
	}
	if m.ctx == nil || m.ctx.Err() != nil {
		e.retryAt = time.Now() // picked up by the first tick of Run
		return
	}
	e.snapshotting, e.again = true, false
	e.retryAt = time.Time{}
	m.log.Debug("snapshot", "engine", e.id, "reason", reason)
	ctx := m.ctx
	// Replies of an epoch older than the followed one are only a fallback.
	epochs := e.epochs.clone()
	accept := func(epoch uint64, start int64) bool { return !epochs.older(epoch, start) }
	responders := 1
	if !e.otherSeen.IsZero() && time.Since(e.otherSeen) < m.cfg.SnapshotTimeout {
		responders = 2 // an overlap: an error reply of one does not end the request
	}
	var first time.Duration // the first chunk's own bound, just after a reconnect
	if !m.backAt.IsZero() && time.Since(m.backAt) < ReconnectWindow {
		first = m.cfg.FirstReplyTimeout
	}
	m.wg.Add(1)
	go func() { // owned by Run through m.wg; ends with ctx
		defer m.wg.Done()
		select {
		case m.sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		rctx, cancel := context.WithTimeout(ctx, m.cfg.SnapshotTimeout)
		s, err := fetchSnapshot(rctx, m.cfg.Conn, m.cfg.Subjects, e.model, e.id, accept, responders, first, m.refuse)
		cancel()
		<-m.sem
		m.installSnapshot(e, s, err)
	}()
}

// installSnapshot replaces e's key set with s (writing only the difference to
// the index), then applies the buffered deltas that follow it.
func (m *Materializer) installSnapshot(e *engineState, s *snapshot, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.snapshotting = false
	probe := e.probe
	e.probe = 0
	if m.engines[e.id] != e {
		return // forgotten meanwhile
	}
	if err != nil {
		result := "error"
		switch {
		case errors.Is(err, ErrNoResponders):
			result = "no_responders"
			// Nobody serves this engine's snapshots now. Without gossip
			// that is all there is to know of it: cleared, no stale
			// routing. An engine gossip lists has a live sidecar whose
			// NATS path is down, or not back yet: after a NATS outage
			// each sidecar finds its dead path on its own pings, up to
			// seconds after this replica reconnected and asked. Its
			// engine's cache is what it was, so routing goes on with the
			// last copy, as it did while NATS was away, and the retry
			// below takes the snapshot once the sidecar is back (before,
			// the copy was cleared: a healthy engine lost its affinity
			// for the seconds in between). Gossip dropping it clears it.
			if m.cfg.Membership == nil || !e.inGossip || !e.goneSince.IsZero() {
				m.clearLocked(e)
			}
		case errors.Is(err, context.DeadlineExceeded):
			result = "timeout"
		case errors.Is(err, ErrSidecarFailed):
			result = "sidecar_error"
		case errors.Is(err, ErrSnapshot):
			m.met.malformed.Inc()
		}
		m.met.snapshots.WithLabelValues(result).Inc()
		e.failures++
		if e.failures == failingSnapshots && !m.failingLocked(e) {
			m.log.Info("snapshots of an engine gossip does not list keep failing: it has probably left, and is forgotten once no delta comes for a while",
				"engine", e.id, "failures", e.failures, "result", result)
		} else if m.failingLocked(e) && !e.failWarned {
			// From here Synced no longer waits for the engine: say so once
			// per streak (also when gossip lists it only after its third
			// failure: it then counts as failing from its next one).
			e.failWarned = true
			m.log.Warn("snapshots of an engine keep failing: readiness no longer waits for it, and its index entries stay as they were (empty if never synced) until one succeeds; "+
				"if its sidecar runs, check it has this ingress's --nats-prefix (its snapshot subject is below)",
				"engine", e.id, "failures", e.failures, "result", result, "err", err,
				"subject", m.cfg.Subjects.SnapSubject(e.model, e.id))
		}
		// Jittered: after a NATS outage every ingress retries every
		// sidecar, and in lock step they would arrive together.
		wait := snapshotBackoff.Delay(e.failures - 1)
		e.retryAt = time.Now().Add(wait)
		m.log.Debug("snapshot failed", "engine", e.id, "err", err, "retry_in", wait)
		return
	}
	m.met.snapshots.WithLabelValues("ok").Inc()
	if e.failures >= failingSnapshots {
		m.log.Info("snapshot succeeded again", "engine", e.id, "after_failures", e.failures)
	}
	e.failures, e.failWarned = 0, false
	for _, o := range s.Others { // their starts, for ordering their deltas
		e.epochs.note(o.epoch, o.start, false)
	}
	switch {
	case e.epochs.follow == 0 || s.Epoch == e.epochs.follow:
		e.epochs.setFollow(s.Epoch, s.EpochStart)
	case !e.epochs.older(s.Epoch, s.EpochStart):
		// A newer epoch than the one followed answered before its deltas came.
		m.met.epochs.Inc()
		e.epochs.setFollow(s.Epoch, s.EpochStart)
	case !s.Fallback:
		// A newer epoch came while this reply was in flight.
		m.snapshotLocked(e, "newer epoch during the snapshot")
		return
	default:
		// Only an older epoch answered: the followed one's sidecar is gone.
		m.log.Info("switching to another sidecar epoch: the followed one did not answer its snapshot", "engine", e.id,
			"epoch", s.Epoch, "epoch_start", startTime(s.EpochStart), "silent_epoch", e.epochs.follow,
			"silent_epoch_start", startTime(e.epochs.followStart))
		e.epochs.setFollow(s.Epoch, s.EpochStart)
	}
	if probe != 0 && probe != s.Epoch {
		// Gossip showed an epoch that did not win this snapshot: an older
		// live sidecar, not a head to catch up with.
		e.epochs.note(probe, 0, true)
	}
	now := time.Now()
	e.followSeen, e.staleSince, e.confirmed = now, time.Time{}, now
	for t := range s.Keys {
		m.replaceTierLocked(e, kvevents.Tier(t), s.Keys[t])
	}
	e.epoch, e.seq, e.synced = s.Epoch, s.Seq, true
	e.behindSince, e.mismatchSince = time.Time{}, time.Time{}
	if e.again {
		m.snapshotLocked(e, "requested during the last snapshot")
		return
	}
	buf := m.takeBufferLocked(e)
	sort.SliceStable(buf, func(i, j int) bool { return buf[i].Seq < buf[j].Seq })
	for i, d := range buf {
		switch {
		case d.Epoch != e.epoch || d.Seq <= e.seq:
			// Older than the snapshot, or from another sidecar epoch: the
			// followed one is installed, and the others are older.
		case d.Seq == e.seq+1:
			m.applyLocked(e, d)
		default:
			m.met.gaps.Inc()
			for _, d := range buf[i:] {
				m.bufferLocked(e, d)
			}
			m.snapshotLocked(e, "gap after snapshot")
			return
		}
	}
}

// replaceTierLocked makes e's tier t equal keys, writing only the difference.
func (m *Materializer) replaceTierLocked(e *engineState, t kvevents.Tier, keys []uint64) {
	old := e.sets[t]
	next := make(map[uint64]struct{}, len(keys))
	var dig kvevents.Digest
	var add []uint64
	for _, k := range keys {
		if _, dup := next[k]; dup {
			continue
		}
		next[k] = struct{}{}
		dig.Add(k)
		if _, ok := old[k]; !ok {
			add = append(add, k)
		}
	}
	var del []uint64
	for k := range old {
		if _, ok := next[k]; !ok {
			del = append(del, k)
		}
	}
	if len(del) > 0 {
		m.cfg.Index.Remove(e.id, t, del)
	}
	if len(add) > 0 {
		m.cfg.Index.Store(e.id, t, add)
	}
	m.keys += len(next) - len(old)
	e.sets[t], e.digests[t] = next, dig
}

// clearLocked empties e in the index and in memory; e must be resynced.
func (m *Materializer) clearLocked(e *engineState) {
	m.cfg.Index.ClearEngine(e.id)
	for t := range e.sets {
		m.keys -= len(e.sets[t])
		e.sets[t] = map[uint64]struct{}{}
		e.digests[t] = kvevents.Digest{}
	}
	e.synced = false
	e.epoch, e.seq = 0, 0
}

// resyncAll snapshots every engine (after a NATS reconnect: deltas were lost).
func (m *Materializer) resyncAll(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.met.resyncs.Inc()
	m.backAt = time.Now()
	m.log.Info("resyncing every engine", "reason", reason, "engines", len(m.engines))
	for _, e := range m.engines {
		m.snapshotLocked(e, reason)
	}
}
