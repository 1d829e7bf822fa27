package des

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/filters"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
	"github.com/kvmesh/kvmesh/sim/engine"
	"go.yaml.in/yaml/v3"
)

// epoch anchors virtual time for APIs that take a time.Time.
var epoch = time.Unix(1_700_000_000, 0)

// sim is one policy's run. Single goroutine; nothing is shared with other
// runs except the read-only request list.
type sim struct {
	clock
	cfg   *Config
	idx   *index.Index
	sched *scheduler.Scheduler
	root  uint64

	engines     []*engine.Engine
	ids         map[string]int
	view        []scheduler.Engine
	trans       []*translator
	stepPending []bool
	awaitFirst  [][]int  // per engine: requests without a first token yet
	kvRefs      []kvRefs // per engine: the in-flight requests' prompt blocks (LocalKVTokens)

	flights []flight
	byReq   map[*engine.Request]int

	// What the ingress learns from what it observes (equal information:
	// no router is told a request's output length or an engine's timing).
	learner *learn.Learner     // kvmesh's cost model; nil for other policies
	outPred learn.OutputLength // output length predicted from finished requests
	ctx     []engineCtx        // per engine: the context the ingress counts there

	finisher policies.Finisher // the policy, when it tracks its requests (Dynamo)
	lat      []latAcc          // per engine: TTFT/TPOT of requests finished since the last snapshot

	delayed  []delayedOp
	dhead    int
	dkeys    []uint64
	keyBuf   []uint64
	decision scheduler.Decision
	sreq     scheduler.Request

	hold holdState // hold.go

	out runStats
}

// latAcc sums the latencies of requests finished on an engine since the
// last snapshot: a scrape of vLLM's TTFT and TPOT histograms (Δsum/Δcount).
type latAcc struct {
	ttft, tpot time.Duration
	n          int
}

type flight struct {
	keys     []uint64 // prompt keys, kept only for a policies.Finisher
	engine   int
	uncached int
	active   int
	kvKeys   []uint64 // the prompt's block keys, registered in the engine's kvRefs
	kvOwn    int      // the prompt tail and predicted output, charged to LocalKVTokens beside the blocks
	ahead    int      // prefill tokens queued ahead on the engine at dispatch, plus own uncached
	prompt   int
	sent     time.Duration
	req      *engine.Request
}

// engineCtx is the context an ingress counts on one engine: the prompts of
// its in-flight requests plus the tokens it has streamed back for them.
type engineCtx struct {
	prompt int    // Σ prompt tokens in flight
	finGen uint64 // Σ output tokens of finished requests (the rest of the generation counter is in flight)
	meter  learn.ContextMeter
	// kvBoundAt is the last dispatch here whose snapshot of the engine
	// showed it stalled on KV memory (learn.KVBound); kvBoundSeen says
	// there was one. A request dispatched at or before it, and awaiting
	// its first token then, waited through such a stall: its TTFT goes to
	// the pooled prefill line only (learn.Learner.ObservePrefillKVBound),
	// as the live ingress's (ingress/learn.go).
	kvBoundAt   time.Duration
	kvBoundSeen bool
}

// sent notes a dispatch at now to the engine whose snapshot is v.
func (c *engineCtx) sent(v *scheduler.Engine, now time.Duration) {
	if learn.KVBound(v.Waiting, v.KVUsage) {
		c.kvBoundAt, c.kvBoundSeen = now, true
	}
}

// observePrefill feeds lr the first token of a request sent at sent after
// d, for tokens of prefill work, on engine id: to the pooled line only
// when a dispatch there since (its own included) saw the engine KV-bound.
func (c *engineCtx) observePrefill(lr *learn.Learner, id string, sent time.Duration, tokens int, d time.Duration) {
	if c.kvBoundSeen && c.kvBoundAt >= sent {
		lr.ObservePrefillKVBound(id, tokens, d)
		return
	}
	lr.ObservePrefill(id, tokens, d)
}

func (c *engineCtx) tokens(l engine.Load) float64 {
	return float64(c.prompt) + float64(l.GenerationTokens-c.finGen)
}

type delayedOp struct {
	at         time.Duration
	engine     int
	op         op
	start, end int // into dkeys
}

// sink adapts one engine's events to the translator and the index.
type sink struct {
	s *sim
	e int
}

var _ engine.EventSink = sink{}

func (k sink) KVEvents(now time.Duration, events []kvevents.Event) { k.s.onEvents(k.e, now, events) }

func newSim(cfg *Config, reqs []workload.Request, policy string) (*sim, error) {
	idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL, ExactLookup: cfg.ExactLookup})
	if err != nil {
		return nil, err
	}
	sc := cfg.Scheduler
	sc.Policy = policy
	sc.Seed = cfg.Seed
	sched, pol, lr, err := newScheduler(cfg, sc, idx)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", policy, err)
	}
	fin, _ := pol.(policies.Finisher)
	var hold holdState
	if k, ok := pol.(policies.KVMesh); ok {
		hold = newHoldState(k.Hold, lr, len(reqs))
	}
	s := &sim{
		cfg: cfg, idx: idx, sched: sched, learner: lr, finisher: fin, hold: hold,
		lat:     make([]latAcc, cfg.Engines),
		ctx:     make([]engineCtx, cfg.Engines),
		root:    kvevents.Root(cfg.Model, "", ""),
		ids:     make(map[string]int, cfg.Engines),
		flights: make([]flight, len(reqs)),
		byReq:   make(map[*engine.Request]int),
	}
	if err := s.clock.init(reqs, cfg.Concurrency, cfg.SnapshotInterval); err != nil {
		return nil, err
	}
	s.prog = startProgress(cfg, policy, &s.clock)
	s.out.init(len(reqs), cfg.Engines)
	for e := 0; e < cfg.Engines; e++ {
		ec := cfg.Engine
		ec.HashSeed = uint64(e)*0x9E3779B97F4A7C15 + 1 // opaque, per engine, like vLLM's random NONE_HASH
		eng, err := engine.New(ec, sink{s, e})
		if err != nil {
			return nil, fmt.Errorf("engine %d: %w", e, err)
		}
		id := "engine-" + strconv.Itoa(e)
		s.engines = append(s.engines, eng)
		s.ids[id] = e
		s.view = append(s.view, scheduler.Engine{ID: id, Healthy: true, Model: cfg.Model, GPUBlocks: ec.GPUBlocks})
		s.trans = append(s.trans, newTranslator(cfg.Model, ec.BlockSize))
	}
	s.stepPending = make([]bool, cfg.Engines)
	s.awaitFirst = make([][]int, cfg.Engines)
	s.kvRefs = newKVRefs(cfg.Engines)
	return s, nil
}

// kvRefs counts, per prompt block key, the router's requests in flight on
// one engine that hold it, so that LocalKVTokens counts a block they share
// once, as the engine holds it once (the ingress's upstream.kvAdd).
type kvRefs map[uint64]int32

func newKVRefs(n int) []kvRefs {
	r := make([]kvRefs, n)
	for i := range r {
		r[i] = kvRefs{}
	}
	return r
}

// add registers keys and returns how many no request in flight held.
func (m kvRefs) add(keys []uint64) int {
	added := 0
	for _, k := range keys {
		if m[k] == 0 {
			added++
		}
		m[k]++
	}
	return added
}

// drop unregisters keys and returns how many no request in flight holds
// any more.
func (m kvRefs) drop(keys []uint64) int {
	freed := 0
	for _, k := range keys {
		if n := m[k]; n > 1 {
			m[k] = n - 1
		} else {
			delete(m, k)
			freed++
		}
	}
	return freed
}

// newScheduler builds policy sc.Policy over the framework's filters.
// kvmesh's cost model is a learner (unless cfg.FixedCosts), returned so the
// run can feed it; the policy is returned so the run can report finished
// requests to the policies that track their own (policies.Finisher).
func newScheduler(cfg *Config, sc scheduler.Config, idx *index.Index) (*scheduler.Scheduler, scheduler.Policy, *learn.Learner, error) {
	sc.Defaults()
	if err := registry.Validate(&sc); err != nil {
		return nil, nil, nil, err
	}
	pol, err := registry.Policy(&sc)
	if err != nil {
		return nil, nil, nil, err
	}
	if d, ok := pol.(policies.Dynamo); ok && d.Active == nil {
		d.Active = policies.NewActiveBlocks() // the run reports finished requests (Finisher)
		pol = d
	}
	var lr *learn.Learner
	if k, ok := pol.(policies.KVMesh); ok && !cfg.FixedCosts {
		if lr, err = learn.New(cfg.Learn); err != nil {
			return nil, nil, nil, err
		}
		k.Costs = lr
		pol = k
	}
	var fp *yaml.Node
	if n, ok := sc.Params["filters"]; ok {
		fp = &n
	}
	fs, err := filters.Factory("filters", fp)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := scheduler.New(fs, pol, idx, scheduler.Options{TierWeights: sc.Weights(), Seed: sc.Seed})
	return s, pol, lr, err
}

// run simulates until every request finished or ctx is cancelled (checked
// every few thousand events; the partial result is then discarded).
func (s *sim) run(ctx context.Context) runStats {
	start := time.Now()
	s.start()
	var now time.Duration
	for n := 0; s.h.len() > 0; n++ {
		if n&4095 == 0 {
			if ctx.Err() != nil {
				break
			}
			s.progressed(now)
		}
		ev := s.h.pop()
		now = ev.at
		switch ev.kind {
		case evArrival, evFollow:
			if s.arrived(ev) {
				s.dispatch(ev.arg, now)
			}
		case evRelease:
			s.inflight--
			if i, ok := s.next(); ok {
				s.dispatch(i, now)
			}
		case evStep:
			s.step(ev.arg, now)
		case evSnapshot:
			s.snapshot()
			s.snapshotted(now)
		}
	}
	s.out.wall = time.Since(start)
	s.prog.done(&s.clock, now)
	s.out.badEvents = 0
	for _, t := range s.trans {
		s.out.badEvents += t.bad
	}
	return s.out
}

func (s *sim) snapshot() { scrape(s.engines, s.view, s.lat) }

// applyDelayed applies KV-event ops that have reached the index by now.
func (s *sim) applyDelayed(now time.Duration) {
	for s.dhead < len(s.delayed) && s.delayed[s.dhead].at <= now {
		d := s.delayed[s.dhead]
		s.dhead++
		s.applyOp(d.engine, d.op, s.dkeys[d.start:d.end])
	}
	if s.dhead == len(s.delayed) {
		s.delayed, s.dhead, s.dkeys = s.delayed[:0], 0, s.dkeys[:0]
	}
}

func (s *sim) applyOp(e int, o op, keys []uint64) {
	id := s.view[e].ID
	switch o.kind {
	case opStore:
		s.idx.Store(id, o.tier, keys)
	case opRemove:
		s.idx.Remove(id, o.tier, keys)
	case opClear:
		s.idx.ClearEngine(id)
	}
}

func (s *sim) onEvents(e int, now time.Duration, events []kvevents.Event) {
	t := s.trans[e]
	t.ops, t.keys = t.ops[:0], t.keys[:0]
	t.translate(events)
	for _, o := range t.ops {
		keys := t.keys[o.start:o.end]
		if s.cfg.EventDelay <= 0 {
			s.applyOp(e, o, keys)
			continue
		}
		start := len(s.dkeys)
		s.dkeys = append(s.dkeys, keys...)
		s.delayed = append(s.delayed, delayedOp{at: now + s.cfg.EventDelay, engine: e, op: o, start: start, end: len(s.dkeys)})
	}
}

// dispatch routes request i, or holds it (hold.go).
func (s *sim) dispatch(i int, now time.Duration) {
	if s.holding() {
		s.holdArrival(i, now)
		return
	}
	s.send(i, now)
}

func (s *sim) send(i int, now time.Duration) {
	s.applyDelayed(now)
	if s.cfg.SnapshotInterval < 0 {
		s.snapshot()
	}
	w := &s.reqs[i]
	prompt := w.AppendPrompt(make([]uint32, 0, w.PromptTokens))
	bs := s.cfg.Engine.BlockSize
	s.keyBuf = kvevents.AppendKeys(s.keyBuf[:0], s.root, prompt, bs)
	// The router is not told the output length: it predicts it from the
	// requests it has seen finish (0 before any: the policy's default).
	predOut := s.outPred.Predict()
	s.out.predicted(predOut, w.OutputTokens)
	s.sreq = scheduler.Request{
		Keys: s.keyBuf, BlockSize: bs, PromptTokens: len(prompt), OutputTokens: predOut,
		Model: s.cfg.Model, SessionID: w.Session, Now: epoch.Add(now),
	}
	if err := s.sched.Schedule(&s.sreq, s.view, &s.decision); err != nil {
		s.fail(i, now, err)
		return
	}
	if s.holding() {
		s.pickRoom(len(prompt))
	}
	e := s.ids[s.decision.Engine]
	m := s.decision.Ranked[0].Match
	best := 0
	for _, c := range s.decision.Ranked {
		best = max(best, c.Match.Spec)
	}
	s.out.offer(len(prompt), best*bs)
	uncached := max(0, len(prompt)-m.Spec*bs)
	r := &engine.Request{ID: strconv.Itoa(i), Prompt: prompt, OutputLen: w.OutputTokens}
	if err := s.engines[e].Add(r, now); err != nil {
		s.fail(i, now, err)
		return
	}
	s.idx.AddSpeculative(s.decision.Engine, s.keyBuf, epoch.Add(now))
	if predOut == 0 {
		predOut = policies.DefaultKVMeshConfig().DefaultOutputTokens
	}
	v := &s.view[e]
	f := flight{engine: e, uncached: uncached, active: len(prompt) + predOut, req: r,
		ahead: v.LocalPrefillTokens + uncached, prompt: len(prompt), sent: now}
	s.ctx[e].sent(v, now)
	if s.finisher != nil {
		f.keys = append([]uint64(nil), s.keyBuf...)
	}
	s.flights[i] = f
	s.byReq[r] = i
	s.ctx[e].prompt += f.prompt
	v.InFlight++
	v.LocalPrefillTokens += f.uncached
	v.LocalActiveTokens += f.active
	f.kvKeys = append([]uint64(nil), s.keyBuf...)
	f.kvOwn = len(prompt) - len(f.kvKeys)*bs + predOut
	v.LocalKVTokens += s.kvRefs[e].add(f.kvKeys)*bs + f.kvOwn
	s.awaitFirst[e] = append(s.awaitFirst[e], i)
	s.inflight++
	s.out.dispatched(now)
	if !s.stepPending[e] {
		s.stepPending[e] = true
		s.h.push(now, evStep, e)
	}
}

// fail drops a request the cluster cannot take (too long, no engine) for
// the reason err.
func (s *sim) fail(i int, now time.Duration, err error) {
	s.out.fail(now, err)
	s.pending--
	s.fol.done(&s.h, i, now, now)
	// The client slot is never taken; let the next backlog request go.
	if s.free() {
		if j, ok := s.next(); ok {
			s.dispatch(j, now)
		}
	}
}

func (s *sim) step(e int, now time.Duration) {
	s.stepPending[e] = false
	until := s.horizon(false)
	eng := s.engines[e]
	var (
		c0, seqs   float64
		prefilling bool
	)
	if s.learner != nil {
		c0, seqs, prefilling = s.ctx[e].tokens(eng.Load()), float64(s.view[e].InFlight), len(s.awaitFirst[e]) > 0
		s.ctx[e].meter.At(now, c0)
	}
	before := s.ctx[e].meter.Integral()
	res := eng.Step(now, until)
	if s.learner != nil && res.Steps > 0 {
		s.ctx[e].meter.At(res.End, s.ctx[e].tokens(eng.Load()))
		if !prefilling {
			// A stretch of pure decoding as the ingress sees it: none of
			// its requests there awaited a first token.
			d := res.End - now
			s.learner.ObserveDecode(s.view[e].ID, seqs, (s.ctx[e].meter.Integral()-before)/d.Seconds(), d/time.Duration(res.Steps), res.Steps)
		}
	}
	// First tokens: the request's queued prefill work leaves the estimate.
	aw := s.awaitFirst[e][:0]
	for _, i := range s.awaitFirst[e] {
		f := &s.flights[i]
		if f.req.Generated() > 0 || f.req.Done() {
			s.view[e].LocalPrefillTokens -= f.uncached
			if s.learner != nil {
				s.ctx[e].observePrefill(s.learner, s.view[e].ID, f.sent, f.ahead, f.req.Result().FirstToken-f.sent)
			}
			continue
		}
		aw = append(aw, i)
	}
	s.awaitFirst[e] = aw
	if len(s.hold.held) > 0 {
		defer s.drainHeld(now) // first tokens freed room
	}
	for _, r := range res.Finished {
		i, ok := s.byReq[r]
		if !ok {
			continue
		}
		delete(s.byReq, r)
		f := &s.flights[i]
		v := &s.view[e]
		v.InFlight--
		v.LocalActiveTokens -= f.active
		v.LocalKVTokens -= s.kvRefs[e].drop(f.kvKeys)*s.cfg.Engine.BlockSize + f.kvOwn
		f.kvKeys = nil
		f.req = nil
		res := r.Result()
		if s.holding() {
			h := s.hold.heldFor(i)
			res.Arrival, res.TTFT, res.QueueTime = res.Arrival-h, res.TTFT+h, res.QueueTime+h
		}
		s.ctx[e].prompt -= f.prompt
		s.ctx[e].finGen += uint64(res.OutputTokens)
		s.outPred.Observe(res.OutputTokens)
		if res.OutputTokens > 1 {
			a := &s.lat[e]
			a.ttft += res.TTFT
			a.tpot += (res.Finished - res.FirstToken) / time.Duration(res.OutputTokens-1)
			a.n++
		}
		if s.finisher != nil {
			s.finisher.Finished(v.ID, f.keys)
			f.keys = nil
		}
		s.out.finished(i, e, res)
		s.pending--
		s.h.push(max(res.Finished, now), evRelease, i)
		s.fol.done(&s.h, i, res.Finished, now)
	}
	if res.Steps > 0 {
		// The engine is busy until the step's end even when the step
		// finished every request it had: a request that arrives meanwhile
		// waits for the next step, which starts there.
		s.stepPending[e] = true
		s.h.push(max(res.End, now+1), evStep, e)
	}
}
