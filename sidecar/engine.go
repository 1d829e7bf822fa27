package sidecar

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Load is the engine load scraped from its /metrics.
type Load struct {
	Running       int       `json:"running"`
	Waiting       int       `json:"waiting"`
	KVUsage       float64   `json:"kv_usage"`
	QueuedPrefill int64     `json:"queued_prefill_tokens"`
	Scraped       time.Time `json:"scraped"`

	// GPUBlocks is the engine's KV capacity in blocks as vLLM reports it
	// (vllm:cache_config_info's num_gpu_blocks label); KVTokens is
	// SGLang's in tokens (sglang:max_total_num_tokens), turned into blocks
	// by the block size in effect (capacity). 0: not reported.
	GPUBlocks int   `json:"gpu_blocks,omitempty"`
	KVTokens  int64 `json:"kv_tokens,omitempty"`
	// badGPUBlocks is a num_gpu_blocks label that is not a block count
	// (left out of GPUBlocks), for the warning; "" when none.
	badGPUBlocks string
	// work sums the engine's request and token counters (workNames);
	// workOK: it exposes one at least. Not gossiped: their growth shows
	// the engine serving (silent.go).
	work   float64
	workOK bool
}

// engineCounters are the per-engine counters read by the metrics collector.
type engineCounters struct {
	batches, deltas, deltaKeys, publishErrors atomic.Uint64
	queueDrops                                atomic.Uint64 // deltas dropped: publish queue full
	snapshots, rankResets, lostHistory        atomic.Uint64
	engineResets, resetFailures, scrapeErrs   atomic.Uint64
	clears                                    atomic.Uint64 // AllBlocksCleared events seen
	loopRestarts                              atomic.Uint64
	resetsSuppressed                          atomic.Uint64 // reset requests within resetMinInterval of the last
	metricsMissing                            atomic.Uint64 // scrapes answered 404 (engine without metrics)
	snapshotErrors                            atomic.Uint64 // snapshot requests answered with an error reply
}

// engine is the sidecar's work for one engine: the event loop owns the
// subscriber; mu guards the state so the snapshot responder (a NATS
// goroutine) and the gossip loop can read it consistently.
type engine struct {
	cfg     EngineConfig
	s       *Sidecar
	log     *slog.Logger
	epoch   uint64
	subject string
	c       engineCounters
	resetCh chan struct{} // cap 1: a reset is pending (reset-engine policy)

	// epochStart (unix ns) orders this epoch against another live one of
	// the same engine (kvevents.NewerEpoch): a restart overlapping itself.
	epochStart int64
	// subMetrics exports the running subscriber's counters (nil when stopped).
	subMetrics atomic.Pointer[kvevents.SubscriberCollector]

	// mu guards the fields below. Held while applying one engine batch and
	// while queueing a delta (so seq order is publish order); never across a
	// network call: publishLoop does the NATS work from a bounded queue.
	mu        sync.Mutex
	st        *state
	seq       uint64
	published kvevents.EngineDigest // head and digests as of the last delta
	// batchTS (unix ns) is the stamp of the newest engine batch whose ops
	// are pending (0: none; reset at each flush). A delta with no engine
	// batch behind it (a rank's restart, lost history, a new subscriber's
	// clear) is stamped with the time the sidecar made it instead: the
	// last batch's stamp would show the engine's idle time since as
	// propagation lag in every ingress.
	batchTS int64
	load    Load
	loras   string // gossip.JoinLoRAs of the adapters /v1/models lists (models.go)
	// maxModelLen and root: the base model's, as /v1/models lists them (models.go).
	maxModelLen int
	root        string
	running     bool // the event loop is consuming
	// scrapeFails counts metrics scrapes failed in a row; from
	// unreadyScrapeFails on, the engine is gossiped as not ready.
	scrapeFails int
	// scrapeErr is the last failed scrape's error ("" after a success);
	// unreadySince is when the failed scrapes made the engine not ready.
	scrapeErr    string
	unreadySince time.Time
	// lorasLeftOut is how many of the engine's adapters /v1/models listed
	// that gossip does not carry (gossip.LoRAsLeftOut), warned once per change.
	lorasLeftOut int
	// warnedNoMetrics: the "engine serves no metrics" warning was logged.
	warnedNoMetrics bool
	// warnedGPUBlocks: the bad num_gpu_blocks label last warned about.
	warnedGPUBlocks string
	started         bool // the event loop ran before (its state must be dropped on restart)
	// lastResetReq is when requestReset last asked for an engine reset.
	lastResetReq time.Time
	// modelMismatch says what the engine serves while its /v1/models does
	// not list the configured model ("" while it does): not ready meanwhile.
	modelMismatch string
	// lastBlockSize is the last non-zero block size in effect (checkBlockSize).
	lastBlockSize int
	// sub is the running event loop's subscriber (nil while none runs);
	// taken is how many of its messages were applied and flushed
	// (awaitProbe compares it with a Probe's stream position).
	sub   *kvevents.Subscriber
	taken uint64
	// silence follows a working engine whose KV events do not arrive (silent.go).
	silence silence
}

func newEngine(s *Sidecar, cfg EngineConfig) *engine {
	var b [8]byte
	_, _ = rand.Read(b[:])
	epoch := binary.LittleEndian.Uint64(b[:]) | 1 // never 0: 0 means "no head" in gossip
	e := &engine{
		cfg: cfg, s: s, epoch: epoch, epochStart: time.Now().UnixNano(),
		log:     s.log.With("engine", cfg.ID),
		subject: s.subj.DeltaSubject(cfg.Model, cfg.ID),
		resetCh: make(chan struct{}, 1),
		st:      newState(cfg.Model, cfg.BlockSize, max(cfg.DPSize, len(cfg.RankEvents))),
	}
	e.published.Head.Epoch = epoch
	return e
}

// unreadyScrapeFails failed scrapes in a row make an engine not ready: one
// lost scrape is noise, two (2 s by default) mean the engine is not serving.
const unreadyScrapeFails = 2

// readyLocked is the engine's gossiped readiness (mu held).
func (e *engine) readyLocked() bool {
	return e.running && e.scrapeFails < unreadyScrapeFails && e.modelMismatch == ""
}

// runForever runs the event loop until ctx ends, restarting it with backoff
// when its subscriber fails, so one broken engine does not stop the others
// (DaemonSet mode). /ready is false while an engine's loop is down.
func (e *engine) runForever(ctx context.Context) {
	bo := backoff.Backoff{Min: time.Second, Max: 30 * time.Second, Jitter: 0.2}
	for n := 0; ; n++ {
		err := e.run(ctx)
		if ctx.Err() != nil {
			return
		}
		e.c.loopRestarts.Add(1)
		wait := bo.Delay(n)
		e.log.Error("engine event loop failed; restarting", "err", err, "in", wait)
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// run consumes the engine's events until ctx ends.
func (e *engine) run(ctx context.Context) error {
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
		Endpoint: e.cfg.Events, ReplayEndpoint: e.cfg.Replay, Bind: e.cfg.Bind,
		Endpoints: e.cfg.RankEvents, ReplayEndpoints: e.cfg.RankReplay,
		DPSize: max(e.cfg.DPSize, 1), Logger: e.log,
		// Learn an idle engine's cache at start instead of at its next event.
		ReplayOnStart: true, IdleProbe: e.s.cfg.IdleProbe,
	})
	if err != nil {
		return err
	}
	defer sub.Close()
	e.subMetrics.Store(kvevents.NewSubscriberCollector(e.cfg.ID, sub))
	defer e.subMetrics.Store(nil)
	e.mu.Lock()
	if e.started {
		// A new subscriber replays from seq 0: start from nothing, or the
		// replayed stores would count twice.
		for r := range e.st.ranks {
			e.st.dropRank(r)
		}
		e.flushLocked()
	}
	e.started, e.running = true, true
	e.sub, e.taken = sub, 0
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running, e.sub = false, nil
		e.mu.Unlock()
	}()
	window := e.s.cfg.BatchWindow
	var nolive noLiveWatch
	taken := uint64(0)
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		e.watchLive(&nolive, m, sub.Stats())
		e.mu.Lock()
		e.handle(m)
		taken++
		// Take what else arrives within the window into the same delta.
		for e.st.pendingKeys < e.s.cfg.MaxDeltaKeys && window > 0 {
			e.mu.Unlock()
			wctx, cancel := context.WithTimeout(ctx, window)
			m, err = sub.Next(wctx)
			cancel()
			if err == nil {
				e.watchLive(&nolive, m, sub.Stats())
			}
			e.mu.Lock()
			if err != nil {
				break
			}
			e.handle(m)
			taken++
		}
		e.flushLocked()
		e.taken = taken
		e.mu.Unlock()
		if err != nil && ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
	}
}

// noLiveProbes idle probes that each found new batches, with no live batch
// ever received and no restart since the first, make the "events arrive
// only through replay probes" warning: one probe finding batches is what an
// idle engine's restart can look like (its first batches published before
// its PUB socket connected); several are an engine publishing all along.
const noLiveProbes = 3

// noLiveWatch follows one subscriber's messages for the warning that
// batches come only from idle probes, never live (watchLive).
type noLiveWatch struct {
	warned bool
	// lastProbe is the probe count credited last; skipThrough the probe
	// count up to which replayed batches are a restart's or a hole's
	// recovery, not new batches found by a probe.
	lastProbe, skipThrough uint64
	// found counts the probes that found new batches since the last
	// restart or hole.
	found int
}

// watchLive warns, once per subscriber, when the engine's batches keep
// arriving only through idle probes: the live PUB/SUB link is missing. It
// looks at each message m with the subscriber's counters st as m is taken.
// Batches replayed at start (before any probe) or after a restart or a hole
// are not counted: an idle engine's restart, found by a probe and replayed
// from 0, is no sign of miswiring. The advice depends on the side binding.
func (e *engine) watchLive(w *noLiveWatch, m kvevents.Message, st kvevents.SubscriberStats) {
	if w.warned || st.Received > 0 {
		return
	}
	switch {
	case m.Kind == kvevents.MsgReset || m.Kind == kvevents.MsgLostHistory:
		w.skipThrough, w.found = st.Probes, 0
		return
	case m.Kind != kvevents.MsgBatch || !m.Replayed:
		return
	case st.Probes <= w.skipThrough || st.Probes == w.lastProbe:
		return // the start's replay, a restart's, or a probe already counted
	}
	w.lastProbe = st.Probes
	if w.found++; w.found < noLiveProbes {
		return
	}
	w.warned = true
	if e.cfg.Bind {
		e.log.Warn("KV events arrive only through replay probes, not live: the sidecar binds its events endpoint (--bind-events) but the engine's PUB socket does not connect to it; give the engine this sidecar's address as tcp://HOST:PORT (no wildcard, so it connects), or bind the engine (tcp://*:PORT) and run the sidecar without --bind-events",
			"events", e.cfg.Events, "probes", st.Probes, "replayed", st.Replayed)
		return
	}
	e.log.Warn("KV events arrive only through replay probes, not live: the engine's PUB endpoint is probably connected to rather than bound; give the engine tcp://*:PORT or run the sidecar with --bind-events",
		"events", e.cfg.Events, "probes", st.Probes, "replayed", st.Replayed)
}

// handle applies one subscriber message. Caller holds mu.
func (e *engine) handle(m kvevents.Message) {
	switch m.Kind {
	case kvevents.MsgBatch:
		e.c.batches.Add(1)
		e.batchArrived()
		if e.st.apply(m.Rank, m.Batch) && e.s.cfg.ResyncPolicy == ResyncResetEngine {
			e.requestReset("unknown parent")
		}
		e.checkBlockSize()
		if m.Batch.TS > 0 {
			e.batchTS = int64(m.Batch.TS * 1e9)
		}
		for i := range m.Batch.Events {
			if m.Batch.Events[i].Kind == kvevents.AllBlocksCleared {
				e.c.clears.Add(1) // confirms a requested reset (see resetLoop)
			}
		}
	case kvevents.MsgReset:
		e.c.rankResets.Add(1)
		e.log.Info("engine rank restarted: dropping its state", "rank", m.Rank)
		e.st.restarted(m.Rank)
	case kvevents.MsgLostHistory:
		e.c.lostHistory.Add(1)
		e.log.Warn("engine event history lost", "rank", m.Rank, "from", m.From, "to", m.Seq, "policy", e.s.cfg.ResyncPolicy,
			"undecodable", m.Undecodable)
		e.st.dropRank(m.Rank)
		// A batch the decoder cannot read is no reason to reset the engine:
		// its next batches are likely just as unreadable (a wire format kvmesh
		// does not know), and each would reset it again.
		if e.s.cfg.ResyncPolicy == ResyncResetEngine && !m.Undecodable {
			e.requestReset("lost history")
		}
	}
}

// checkBlockSize warns when the block size in effect differs from the last
// one gossiped: the engine restarted with another (learned again after the
// restart, or read from a batch, which dropped the keys of the old size).
// The ingresses key this engine's requests with the new size from the next
// gossip round. Caller holds mu.
func (e *engine) checkBlockSize() {
	bs := e.st.blockSize
	if bs == 0 || bs == e.lastBlockSize {
		return
	}
	if e.lastBlockSize != 0 {
		e.log.Warn("engine block size changed: keys of the old size dropped, the new size gossiped", "from", e.lastBlockSize, "to", bs)
	}
	e.lastBlockSize = bs
}

// resetMinInterval bounds reset-engine: at most one engine reset is
// requested per interval, however often history is lost or parents are
// unknown (a recurring cause would otherwise reset the engine at every batch).
const resetMinInterval = time.Minute

// requestReset asks resetLoop to reset the engine's prefix cache. Caller
// holds mu.
func (e *engine) requestReset(reason string) {
	now := time.Now()
	if !e.lastResetReq.IsZero() && now.Sub(e.lastResetReq) < resetMinInterval {
		e.c.resetsSuppressed.Add(1)
		e.log.Debug("engine cache reset not requested: one was requested recently", "reason", reason, "at", e.lastResetReq)
		return
	}
	select {
	case e.resetCh <- struct{}{}:
		e.lastResetReq = now
		e.log.Info("engine cache reset requested", "reason", reason)
	default: // one is pending already
	}
}

// flushLocked publishes the pending ops as deltas of at most MaxDeltaKeys
// keys and kvevents.MaxDeltaOps ops each (readers refuse a delta with more
// ops as malformed; one-key ops of alternating kinds or tiers, a replay of
// a busy engine's history or a rank's mixed-tier drop, reach that long
// before the key cap), and each small enough for the NATS server's
// max_payload (once known). The ops keep their order across the deltas.
// Caller holds mu, so deltas leave in sequence order.
func (e *engine) flushLocked() {
	ops := e.st.takePending()
	ts := e.batchTS
	e.batchTS = 0
	if len(ops) == 0 {
		return
	}
	if ts == 0 {
		ts = time.Now().UnixNano()
	}
	limit := e.s.cfg.MaxDeltaKeys
	size := int(e.s.maxPayload()) // 0: not connected yet
	for len(ops) > 0 {
		var part []kvevents.Op
		n, keys := 0, 0
		for len(ops) > 0 && n < limit && len(part) < kvevents.MaxDeltaOps {
			op := ops[0]
			room := limit - n
			if size > 0 {
				fit := kvevents.MaxKeysIn(size, len(part)+1, e.cfg.ID, e.cfg.Model) - keys
				if fit < 1 && len(part) > 0 {
					break // not even one more op fits
				}
				room = min(room, max(fit, 1))
			}
			if len(op.Keys) > room && op.Kind != kvevents.OpClear {
				part = append(part, kvevents.Op{Kind: op.Kind, Tier: op.Tier, Keys: op.Keys[:room]})
				ops[0].Keys = op.Keys[room:]
				n += room
				break
			}
			part = append(part, op)
			n += max(len(op.Keys), 1)
			keys += len(op.Keys)
			ops = ops[1:]
		}
		e.publishLocked(part, n, ts)
	}
	e.published = kvevents.EngineDigest{Head: kvevents.Head{Epoch: e.epoch, Seq: e.seq}, Digests: e.st.digests}
}

// publishLocked queues one delta of ops stamped ts: the newest engine
// batch's time, or the sidecar's own when no batch is behind it (flushLocked).
func (e *engine) publishLocked(ops []kvevents.Op, nkeys int, ts int64) {
	e.seq++
	d := kvevents.Delta{Engine: e.cfg.ID, Model: e.cfg.Model, Epoch: e.epoch, Seq: e.seq, TS: ts, Ops: ops, EpochStart: e.epochStart}
	e.c.deltas.Add(1)
	e.c.deltaKeys.Add(uint64(nkeys))
	if err := e.s.enqueue(e, kvevents.AppendDelta(make([]byte, 0, kvevents.EncodedDeltaSize(len(ops), nkeys, d.Engine, d.Model)), &d)); err != nil {
		// The receivers see the gap and take a snapshot; nothing else to do.
		e.c.publishErrors.Add(1)
		e.log.Debug("delta publish failed", "seq", e.seq, "err", err)
	}
}

// snapshot flushes pending ops and returns the key set per tier at the head.
func (e *engine) snapshot() (kvevents.Head, [kvevents.NumTiers][]uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushLocked()
	var keys [kvevents.NumTiers][]uint64
	for t := range keys {
		keys[t] = e.st.keys(kvevents.Tier(t))
	}
	return kvevents.Head{Epoch: e.epoch, Seq: e.seq}, keys
}

// Status is one engine's state in the sidecar (for /debug/state and tests).
type Status struct {
	Engine  string                 `json:"engine"`
	Model   string                 `json:"model"`
	Epoch   uint64                 `json:"epoch"`
	Seq     uint64                 `json:"seq"`
	Keys    [kvevents.NumTiers]int `json:"keys"`
	Load    Load                   `json:"load"`
	Running bool                   `json:"running"`
	// Ready is what gossip tells the ingresses (routable); ScrapeError the
	// last failed metrics scrape while it is not.
	Ready       bool   `json:"ready"`
	ScrapeError string `json:"last_scrape_error,omitempty"`
	// ModelMismatch is what the engine serves while its /v1/models does
	// not list Model (models.go): not ready meanwhile.
	ModelMismatch   string `json:"model_mismatch,omitempty"`
	OrphanParents   uint64 `json:"orphan_parents"`
	OrphanLocations uint64 `json:"orphan_locations"`
	UnknownRemoves  uint64 `json:"unknown_removes"`
	RankResets      uint64 `json:"rank_resets"`
	LostHistory     uint64 `json:"lost_history"`
	EngineResets    uint64 `json:"engine_resets"`
	LoRAs           string `json:"loras,omitempty"` // the adapters /v1/models lists (models.go)
	// EventsSilent: the engine has been serving requests for
	// Config.EventsSilentAfter at least (WorkWithoutEventsSince on) and no
	// KV-event batch has arrived meanwhile (silent.go); still Ready.
	EventsSilent           bool       `json:"events_silent"`
	WorkWithoutEventsSince *time.Time `json:"work_without_events_since,omitempty"`
	// LastBatch is when the last KV-event batch arrived (null: none yet).
	LastBatch *time.Time `json:"last_batch"`
}

func (e *engine) status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{Engine: e.cfg.ID, Model: e.cfg.Model, Epoch: e.epoch, Seq: e.seq, Load: e.load, Running: e.running,
		OrphanParents: e.st.c.orphanParents, OrphanLocations: e.st.c.orphanLocations, UnknownRemoves: e.st.c.unknownRemoves,
		RankResets: e.c.rankResets.Load(), LostHistory: e.c.lostHistory.Load(), EngineResets: e.c.engineResets.Load(),
		LoRAs: e.loras, Ready: e.readyLocked(), ScrapeError: e.scrapeErr, ModelMismatch: e.modelMismatch,
		EventsSilent: e.silence.silent, WorkWithoutEventsSince: timeOrNil(e.silence.workSince), LastBatch: timeOrNil(e.silence.lastBatch)}
	for t := range s.Keys {
		s.Keys[t] = len(e.st.keyRefs[t])
	}
	return s
}
