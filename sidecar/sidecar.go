package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Sidecar serves one or more engines. New validates; Run does the work until
// its context ends or Close is called. Status, Ready and AdminAddr are safe
// to call at any time.
type Sidecar struct {
	cfg     Config
	log     *slog.Logger
	engines []*engine
	reg     prometheus.Registerer
	gather  prometheus.Gatherer

	conn atomic.Pointer[natsutil.Conn]
	// subj: the installation's subjects (cfg.NATS.Prefix).
	subj    natsutil.Subjects
	gossip  atomic.Pointer[gossip.Node]
	ready   atomic.Bool
	admin   atomic.Pointer[net.TCPAddr]
	running atomic.Bool
	// quit ends with Close (stop): Run ends, or, when Close came first,
	// returns at once.
	quit     context.Context
	stop     context.CancelFunc
	finished chan struct{}
	// pubq hands encoded deltas from the event loops (under their engine's
	// lock, never blocking) to publishLoop, in sequence order.
	pubq chan pubMsg
	// pubs follows failed delta publishes as incidents (warnings and
	// their end).
	pubs pubIncident
}

// maxPayload is the NATS server's max_payload (0 until connected), as
// natsutil.Conn stores it on each (re)connect: the first deltas after one
// are cut to the new server's limit, and engine loops bound deltas with an
// atomic load rather than the connection's lock.
func (s *Sidecar) maxPayload() int64 {
	if c := s.conn.Load(); c != nil {
		return c.MaxPayload()
	}
	return 0
}

// pubMsg is one encoded delta waiting for NATS.
type pubMsg struct {
	e    *engine
	data []byte
}

// New validates cfg and prepares the engines (no I/O).
func New(cfg Config) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	subj, err := cfg.NATS.Subjects() // valid: cfg.Validate checked the prefix
	if err != nil {
		return nil, err
	}
	s := &Sidecar{cfg: cfg, subj: subj, log: log.With("component", "sidecar"), finished: make(chan struct{})}
	s.quit, s.stop = context.WithCancel(context.Background())
	s.pubs = pubIncident{log: s.log, now: time.Now}
	if cfg.Registerer != nil {
		s.reg = cfg.Registerer
		if g, ok := cfg.Registerer.(prometheus.Gatherer); ok {
			s.gather = g
		}
	} else {
		// The process's own registry: with the Go runtime and process
		// collectors, as the ingress's (a given Registerer has its owner's).
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		s.reg, s.gather = r, r
	}
	for _, ec := range cfg.Engines {
		if ec.Role == "" {
			ec.Role = "mixed"
		}
		// "http://host:port/" is the same engine: without the slash the
		// paths built on it (URL+"/metrics") and the gossiped URL the
		// ingresses proxy to stay single-slashed.
		ec.URL = strings.TrimSuffix(ec.URL, "/")
		if ec.MetricsURL == "" && ec.URL != "" {
			ec.MetricsURL = ec.URL + "/metrics"
		}
		s.engines = append(s.engines, newEngine(s, ec))
	}
	for _, c := range []prometheus.Collector{&collector{s: s}, &subscriberCollector{s: s}} {
		if err := s.reg.Register(c); err != nil {
			return nil, fmt.Errorf("sidecar metrics: %w", err)
		}
	}
	return s, nil
}

// ErrRunning is returned by a second Run.
var ErrRunning = errors.New("sidecar: already running")

// Run connects to NATS (starting an embedded server when no URL is given),
// serves snapshots, joins gossip, starts the admin server and consumes every
// engine's events until ctx ends or Close is called. Shutdown is ordered:
// the event, scrape and gossip loops stop first; then the publisher sends
// the deltas they queued and waits (boundedly: drainWait) for NATS to take
// them; then (deferred, last in first out) gossip leaves so peers drop our
// engines at once, the admin server stops, the snapshot subscriptions end
// and the NATS connection closes.
func (s *Sidecar) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	s.pubq = make(chan pubMsg, s.cfg.PublishQueue)
	defer close(s.finished)
	if s.quit.Err() != nil { // Close before Run
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.quit, cancel)() // Close cancels Run's ctx

	nc := s.cfg.NATS
	nc.WaitForServer = true // started before NATS: run and catch up, do not exit
	conn, err := natsutil.Connect(ctx, nc, s.log)
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	defer conn.Close()
	s.conn.Store(conn)
	conn.OnPublishError(s.publishFailed) // JetStream acks that never came, a missing stream
	conn.OnPublishOK(s.pubs.ok)          // acks: the end of a failing spell

	for _, e := range s.engines {
		sub, err := conn.NC.Subscribe(s.subj.SnapSubject(e.cfg.Model, e.cfg.ID), e.serveSnapshot)
		if err != nil {
			return fmt.Errorf("sidecar: snapshot subscribe: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if conn.NC.IsConnected() { // else the subscriptions go out when it connects
		if err := conn.NC.FlushTimeout(5 * time.Second); err != nil {
			return fmt.Errorf("sidecar: nats flush: %w", err)
		}
	}

	if s.cfg.AdminAddr != "" {
		stopAdmin, err := s.serveAdmin()
		if err != nil {
			return err
		}
		defer stopAdmin()
	}

	// The publisher outlives the loops that feed it: Run stops them, then
	// stopPublisher lets it send what they queued (once; deferred too, for
	// the early returns, before conn.Close).
	pubStop, pubDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(pubDone); s.publishLoop(pubStop) }() // owned by Run
	var stopOnce sync.Once
	stopPublisher := func() {
		stopOnce.Do(func() {
			close(pubStop)
			<-pubDone
			s.flushPublished(conn)
		})
	}
	defer stopPublisher()

	var wg sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for _, e := range s.engines {
		wg.Add(1)
		go func() { // owned by Run; ends with ctx
			defer wg.Done()
			e.runForever(ctx)
		}()
		if e.cfg.MetricsURL != "" && e.cfg.MetricsURL != "-" {
			wg.Add(1)
			go func() { defer wg.Done(); e.scrapeLoop(ctx, client, e.cfg.MetricsURL) }()
		}
		if s.cfg.ModelsInterval > 0 && e.cfg.URL != "" {
			wg.Add(1)
			go func() { defer wg.Done(); e.modelsLoop(ctx, client, e.cfg.URL+"/v1/models") }() // models.go
		}
		if s.cfg.ResyncPolicy == ResyncResetEngine {
			wg.Add(1)
			go func() { defer wg.Done(); e.resetLoop(ctx, client) }()
		}
		if e.cfg.TokenizerDir != "" && conn.JS != nil {
			wg.Add(1)
			go func() { defer wg.Done(); e.tokenizerLoop(ctx, conn.JS) }()
		}
	}

	if s.cfg.Gossip != nil {
		gc := *s.cfg.Gossip
		if gc.Logger == nil {
			gc.Logger = s.log
		}
		if gc.Registerer == nil {
			// kvmesh_gossip_* on the sidecar's /metrics too, as on the
			// ingress's: members, kvmesh_gossip_alone (an alert's key:
			// a sidecar alone in gossip serves an engine no ingress
			// sees), oversize own entries.
			gc.Registerer = s.reg
		}
		s.startStateLane(ctx, &wg, &gc, conn) // staterelay.go
		node, err := gossip.New(gc)
		if err == nil {
			if err = s.engineIDsFree(ctx, node); err != nil { // engineid.go
				node.Shutdown() // nothing published yet: no leave to send
			}
		}
		if err != nil {
			stopped := ctx.Err() != nil // Close or ctx while waiting for an engine id: no failure
			cancel()
			wg.Wait()
			if stopped {
				return nil
			}
			return fmt.Errorf("sidecar: %w", err)
		}
		s.gossip.Store(node)
		defer func() { _ = node.Close() }() // after the engines stopped: peers drop our engines at once
		wg.Add(1)
		go func() { defer wg.Done(); s.gossipLoop(ctx, node) }()
	}
	s.ready.Store(true)
	s.log.Info("sidecar running", "engines", len(s.engines), "nats", conn.NC.ConnectedUrlRedacted())

	<-ctx.Done()
	s.ready.Store(false)
	wg.Wait()
	stopPublisher() // before gossip leaves: the last head gossiped is in NATS
	return nil
}

// Close stops Run and waits for it. Safe to call twice, and before Run
// (Run then returns at once).
func (s *Sidecar) Close() error {
	s.stop()
	if s.running.Load() {
		<-s.finished
	}
	return nil
}

// Ready reports whether NATS is connected, every engine's event loop runs
// and, with gossip seeds, gossip has reached another member since the
// start. A sidecar whose seeds never answered (dead or wrong seeds,
// another --gossip-key) serves engines no ingress routes to: a deployment
// error, which a rollout gated on /ready then stops at. One that had
// members and lost them all (every other member down, a network
// partition) stays ready: unready, a whole DaemonSet would flap with the
// network and gain nothing; kvmesh_gossip_alone and a warning once a
// minute say it either way. The engine's own pod probes /health, not this.
func (s *Sidecar) Ready() bool {
	c := s.conn.Load()
	if !s.ready.Load() || c == nil || c.NC.Status() != nats.CONNECTED {
		return false
	}
	if g := s.gossip.Load(); g != nil && g.Alone() && !g.EverJoined() && !g.SeedsOnlySelf() {
		return false // its seeds never answered: a wrong --join or --gossip-key
	}
	for _, e := range s.engines {
		e.mu.Lock()
		ok := e.running
		e.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}

// Status returns every engine's status.
func (s *Sidecar) Status() []Status {
	out := make([]Status, len(s.engines))
	for i, e := range s.engines {
		out[i] = e.status()
	}
	return out
}

// Keys returns a copy of one engine's key set per tier (tests, debugging).
func (s *Sidecar) Keys(engine string) (keys [kvevents.NumTiers][]uint64, ok bool) {
	for _, e := range s.engines {
		if e.cfg.ID == engine {
			e.mu.Lock()
			for t := range keys {
				keys[t] = e.st.keys(kvevents.Tier(t))
			}
			e.mu.Unlock()
			return keys, true
		}
	}
	return keys, false
}

// Conn is the NATS connection while Run is active (nil otherwise); callers
// use it, e.g., to reach the embedded server's URL.
func (s *Sidecar) Conn() *natsutil.Conn { return s.conn.Load() }

// Gossip is the gossip member while Run is active (nil without gossip).
func (s *Sidecar) Gossip() *gossip.Node { return s.gossip.Load() }

// enqueue hands one encoded delta to publishLoop without blocking (caller
// holds e.mu, so deltas of one engine are queued in sequence order). A full
// queue drops the delta: the receivers see the gap and resync.
func (s *Sidecar) enqueue(e *engine, data []byte) error {
	if s.pubq == nil {
		return errors.New("publish: not running")
	}
	select {
	case s.pubq <- pubMsg{e: e, data: data}:
		return nil
	default:
		e.c.queueDrops.Add(1)
		return errors.New("publish queue full")
	}
}

// drainWait bounds how long a stopping sidecar spends sending the deltas
// still queued and waiting for NATS to take them (a NATS server down at
// shutdown must not hold the pod's termination).
const drainWait = 2 * time.Second

// publishLoop sends queued deltas until stop is closed, then the ones
// still queued (for at most drainWait; any left are counted as queue
// drops). PublishAsync may wait (up to its stall wait) when too many acks
// are pending; only this loop waits, never an engine's event loop or
// snapshot reply.
func (s *Sidecar) publishLoop(stop <-chan struct{}) {
	for {
		select {
		case m := <-s.pubq:
			s.send(m)
		case <-stop:
			deadline := time.Now().Add(drainWait)
			for {
				select {
				case m := <-s.pubq:
					if time.Now().After(deadline) {
						m.e.c.queueDrops.Add(1)
						continue
					}
					s.send(m)
				default:
					return
				}
			}
		}
	}
}

// send publishes one queued delta, counting a failure.
func (s *Sidecar) send(m pubMsg) {
	if err := s.publish(m.e.subject, m.data); err != nil {
		if errors.Is(err, nats.ErrMaxPayload) { // deltas are cut to fit once the limit is known
			s.log.Error("delta over the NATS max_payload", "engine", m.e.cfg.ID, "bytes", len(m.data), "nats_max_payload", s.maxPayload())
		}
		m.e.c.publishErrors.Add(1)
		s.warnPublishError(m.e.cfg.ID, err)
	}
}

// flushPublished waits, for at most drainWait, until the server has every
// delta sent and JetStream has acknowledged the stream's copies; a stopping
// sidecar's last deltas then reach the ingresses and the stream rather than
// dying in the connection's buffer.
func (s *Sidecar) flushPublished(conn *natsutil.Conn) {
	if !conn.NC.IsConnected() {
		return
	}
	deadline := time.Now().Add(drainWait)
	if err := conn.NC.FlushTimeout(drainWait); err != nil {
		s.log.Warn("stopping: NATS did not confirm the last deltas", "err", err)
		return
	}
	if conn.JS == nil {
		return
	}
	select {
	case <-conn.JS.PublishAsyncComplete():
	case <-time.After(time.Until(deadline)):
		s.log.Warn("stopping: JetStream did not acknowledge the last deltas", "pending", conn.JS.PublishAsyncPending())
	}
}

// publishFailed is told (by natsutil.Conn, on a NATS goroutine) of each
// JetStream publish that failed after it was sent: no ack within the ack
// timeout, no stream (KVMESH_DELTAS deleted: the connection then creates it
// again), an error from the stream, an ack lost with the connection. The
// delta went out as a NATS message, so live ingresses may have it; the stream
// may not. Counted in kvmesh_sidecar_publish_errors_total.
func (s *Sidecar) publishFailed(subject string, err error) {
	id := subject
	for _, e := range s.engines {
		if e.subject == subject {
			e.c.publishErrors.Add(1)
			id = e.cfg.ID
			break
		}
	}
	s.warnPublishError(id, err)
}

// warnPublishError records a failed publish (pubIncident logs it).
func (s *Sidecar) warnPublishError(engine string, err error) { s.pubs.fail(engine, err) }

// publish sends one delta: through JetStream (the stream captures it, async
// with bounded in-flight acks) or, when the stream is disabled or JetStream
// pushes back, as a plain NATS message so live subscribers still get it.
func (s *Sidecar) publish(subject string, data []byte) error {
	c := s.conn.Load()
	if c == nil {
		return errors.New("publish: not connected")
	}
	if c.JS != nil {
		if _, err := c.JS.PublishAsync(subject, data); err == nil {
			return nil
		}
	}
	if err := c.NC.Publish(subject, data); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if c.JS == nil { // no stream, no acks: a sent delta is the success
		s.pubs.ok()
	}
	return nil
}

// serveSnapshot answers one snapshot request with the engine's key set in
// chunks of at most SnapshotChunkKeys keys, and each small enough for the
// NATS server's max_payload, sent to the request's inbox. A reply that
// cannot be sent is logged at error and followed by an error reply
// (kvevents.SnapshotErrorHeader), so the ingress knows why instead of
// waiting for its timeout.
func (e *engine) serveSnapshot(msg *nats.Msg) {
	if msg.Reply == "" {
		return
	}
	payload := e.s.maxPayload()
	head, keys := e.snapshot()
	e.c.snapshots.Add(1)
	limit := e.s.cfg.SnapshotChunkKeys
	if payload > 0 {
		limit = min(limit, kvevents.MaxKeysIn(int(payload), kvevents.NumTiers, e.cfg.ID, e.cfg.Model))
	}
	total := 0
	for _, k := range keys {
		total += len(k)
	}
	if limit < 1 {
		e.failSnapshot(msg, fmt.Sprintf("max_payload %d leaves no room for a key", payload), payload)
		return
	}
	chunks := max((total+limit-1)/limit, 1)
	if chunks > kvevents.MaxSnapshotChunks {
		e.failSnapshot(msg, fmt.Sprintf("%d keys need %d chunks at max_payload %d, over %d", total, chunks, payload, kvevents.MaxSnapshotChunks), payload)
		return
	}
	c := kvevents.SnapshotChunk{Engine: e.cfg.ID, Model: e.cfg.Model, Epoch: head.Epoch, Seq: head.Seq, TS: time.Now().UnixNano(), Chunks: chunks,
		EpochStart: e.epochStart}
	var buf []byte
	t, off := 0, 0
	for i := 0; i < chunks; i++ {
		c.Chunk, c.Ops = i, c.Ops[:0]
		n := 0
		for n < limit && t < kvevents.NumTiers {
			rest := keys[t][off:]
			take := min(len(rest), limit-n)
			c.Ops = append(c.Ops, kvevents.Op{Kind: kvevents.OpStore, Tier: kvevents.Tier(t), Keys: rest[:take]})
			n += take
			off += take
			if off == len(keys[t]) {
				t, off = t+1, 0
			}
		}
		buf = kvevents.AppendSnapshotChunk(buf[:0], &c)
		if err := msg.Respond(buf); err != nil {
			e.failSnapshot(msg, fmt.Sprintf("chunk %d of %d (%d bytes): %v", i, chunks, len(buf), err), payload)
			return
		}
	}
}

// failSnapshot logs a snapshot request the engine cannot answer and sends
// the requester an error reply saying why.
func (e *engine) failSnapshot(msg *nats.Msg, why string, payload int64) {
	e.c.snapshotErrors.Add(1)
	e.log.Error("snapshot reply failed: ingresses cannot sync this engine", "why", why, "nats_max_payload", payload)
	r := nats.NewMsg(msg.Reply)
	r.Header.Set(kvevents.SnapshotErrorHeader, why)
	if err := msg.RespondMsg(r); err != nil {
		e.log.Error("snapshot error reply failed", "err", err)
	}
}

// gossipLoop publishes each engine's load, head and digest.
func (s *Sidecar) gossipLoop(ctx context.Context, node *gossip.Node) {
	t := time.NewTicker(s.cfg.GossipInterval)
	defer t.Stop()
	last := make([]gossip.EngineState, len(s.engines))
	for {
		for i, e := range s.engines {
			e.mu.Lock()
			st := gossip.EngineState{
				ID: e.cfg.ID, Model: e.cfg.Model, URL: e.cfg.URL, EngineRole: e.cfg.Role,
				DPSize: max(e.cfg.DPSize, 1), BlockSize: e.st.blockSize,
				Running: e.load.Running, Waiting: e.load.Waiting, KVUsage: e.load.KVUsage, QueuedPrefill: e.load.QueuedPrefill,
				GPUBlocks: e.load.capacity(e.st.blockSize),
				Ready:     e.readyLocked(), Digest: e.published,
				Group: e.cfg.PDGroup, PDProtocol: gossipPDProtocol(e.cfg.PDProtocol), Bootstrap: e.cfg.Bootstrap(),
				LoRAs: e.loras, MaxModelLen: e.maxModelLen, Root: e.root,
			}
			e.mu.Unlock()
			if st != last[i] { // unchanged state is re-broadcast by the node itself
				node.SetEngine(st)
				last[i] = st
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// gossipPDProtocol is EngineState.PDProtocol: "" stands for NIXL (and no
// P/D), so states of vLLM engines stay as they were.
func gossipPDProtocol(p string) string {
	if p == PDProtocolSGLang {
		return gossip.PDProtocolSGLang
	}
	return ""
}
