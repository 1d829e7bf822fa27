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
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// evTransferDone: a disaggregated request's KV has reached its decode
// engine. Numbered apart from heap.go's kinds so both files can grow.
const evTransferDone evKind = 16

// pdSim is one P/D policy's run: like sim, plus roles, a two-leg request
// life (prefill leg with max_tokens 1 → KV transfer → decode leg) and the
// P/D router. Single goroutine.
//
// Modelled as vLLM's NIXL path does it: the prefill engine runs the prompt
// with one output token; the transfer takes setup + the blocks the decode
// engine lacks × KV bytes ÷ bandwidth; the decode engine then holds the
// blocks in its prefix cache (ImportPrefix, with KV events, so the router
// sees them) and computes only the last partial block before decoding.
// Simplification: the prefill engine frees its blocks when its leg ends,
// not when the decode engine has read them (a few milliseconds later).
type pdSim struct {
	clock
	cfg    *PDConfig
	idx    *index.Index
	router *pd.Router
	root   uint64

	engines     []*engine.Engine
	ids         map[string]int
	view        []scheduler.Engine
	trans       []*translator
	stepPending []bool
	awaitFirst  [][]int
	kvRefs      map[string]kvRefs // per engine id: the in-flight requests' prompt blocks (LocalKVTokens)

	busy int // prefill legs and transfers in flight (they feed other engines)

	flights []pdFlight
	byReq   map[*engine.Request]int

	// What the ingress learns from what it observes (equal information:
	// no router is told a request's output length or an engine's timing).
	learner *learn.Learner     // kvmesh's cost model; nil for the emulations
	outPred learn.OutputLength // output length predicted from finished requests
	outs    *pd.OutputDist     // their distribution, when kvmesh prices over it
	ctx     []engineCtx        // per engine: the context the ingress counts there
	lat     []latAcc           // per engine: TTFT/TPOT finished since the last snapshot
	legs    []int              // per engine: legs the ingress has in flight there

	// The router-side hold (hold.go): aggregated routing only, as the
	// ingress holds without P/D configured.
	hold holdState

	keyBuf []uint64
	plan   pd.Plan
	sreq   scheduler.Request
	out    pdStats
}

type pdFlight struct {
	prefill, decode int // engine indexes; prefill −1 when aggregated
	uncachedP       int // router's estimate of the prefill leg's uncached tokens
	uncachedD       int // same on the decode engine (aggregated: the whole prefill)
	active          int
	kvKeys          []uint64 // the prompt's block keys, registered in the decode engine's kvRefs
	kvOwn           int      // the prompt tail and predicted output, charged to LocalKVTokens beside the blocks
	xferTokens      int
	sent            time.Duration
	preq, dreq      *engine.Request
	prefillCached   int
	prompt          int
	ahead           int // prefill tokens queued on the first leg's engine at dispatch, plus own uncached
}

type pdSink struct {
	s *pdSim
	e int
}

func (k pdSink) KVEvents(_ time.Duration, events []kvevents.Event) {
	t := k.s.trans[k.e]
	t.ops, t.keys = t.ops[:0], t.keys[:0]
	t.translate(events)
	id := k.s.view[k.e].ID
	for _, o := range t.ops {
		keys := t.keys[o.start:o.end]
		switch o.kind {
		case opStore:
			k.s.idx.Store(id, o.tier, keys)
		case opRemove:
			k.s.idx.Remove(id, o.tier, keys)
		case opClear:
			k.s.idx.ClearEngine(id)
		}
	}
}

func newPDSim(cfg *PDConfig, reqs []workload.Request, policy string) (*pdSim, error) {
	idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL, ExactLookup: cfg.ExactLookup})
	if err != nil {
		return nil, err
	}
	sc := cfg.Scheduler
	sc.Policy, sc.Seed = "kvmesh", cfg.Seed
	sched, err := registry.New(sc, idx, nil)
	if err != nil {
		return nil, err
	}
	var lr *learn.Learner
	if (policy == "aggregated" || policy == "kvmesh" || policy == "kvmesh-always") && !cfg.FixedCosts {
		if lr, err = learn.New(pd.LearnConfig(cfg.Learn)); err != nil {
			return nil, err
		}
	}
	var outs *pd.OutputDist
	if cfg.OutputDist && (policy == "kvmesh" || policy == "kvmesh-always") {
		outs = pd.NewOutputDist()
	}
	pol, err := cfg.pdPolicy(policy, lr, outs)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", policy, err)
	}
	var hold holdState
	if policy == "aggregated" {
		k, err := pd.CostFrom(cfg.Scheduler)
		if err != nil {
			return nil, err
		}
		hold = newHoldState(policies.Hold{Seconds: k.HoldSeconds, Aging: k.HoldAging, Affinity: k.HoldAffinity}, lr, len(reqs))
	}
	router, err := pd.NewRouter(sched, pol)
	if err != nil {
		return nil, err
	}
	s := &pdSim{cfg: cfg, idx: idx, router: router, root: kvevents.Root(cfg.Model, "", ""),
		ids: make(map[string]int), flights: make([]pdFlight, len(reqs)), byReq: make(map[*engine.Request]int), learner: lr,
		outs: outs, hold: hold}
	if err := s.clock.init(reqs, cfg.Concurrency, cfg.SnapshotInterval); err != nil {
		return nil, err
	}
	s.prog = startProgress(&cfg.Config, policy, &s.clock)
	s.out.init(len(reqs))
	add := func(role scheduler.Role, n int) error {
		for j := 0; j < n; j++ {
			e := len(s.engines)
			ec := cfg.Engine
			ec.HashSeed = uint64(e)*0x9E3779B97F4A7C15 + 1
			eng, err := engine.New(ec, pdSink{s, e})
			if err != nil {
				return fmt.Errorf("engine %d: %w", e, err)
			}
			r, id := role, role.String()+"-"+strconv.Itoa(j)
			if policy == "aggregated" {
				r, id = scheduler.RoleMixed, "mixed-"+strconv.Itoa(e) // the same GPUs, no P/D
			}
			s.engines = append(s.engines, eng)
			s.ids[id] = e
			s.view = append(s.view, scheduler.Engine{ID: id, Healthy: true, Model: cfg.Model, Role: r, GPUBlocks: ec.GPUBlocks})
			s.trans = append(s.trans, newTranslator(cfg.Model, ec.BlockSize))
		}
		return nil
	}
	for _, r := range []struct {
		role scheduler.Role
		n    int
	}{{scheduler.RolePrefill, cfg.Roles.Prefill}, {scheduler.RoleDecode, cfg.Roles.Decode}, {scheduler.RoleMixed, cfg.Roles.Mixed}} {
		if err := add(r.role, r.n); err != nil {
			return nil, err
		}
	}
	s.stepPending = make([]bool, len(s.engines))
	s.awaitFirst = make([][]int, len(s.engines))
	s.kvRefs = map[string]kvRefs{}
	s.ctx = make([]engineCtx, len(s.engines))
	s.lat = make([]latAcc, len(s.engines))
	s.legs = make([]int, len(s.engines))
	return s, nil
}

func (s *pdSim) run(ctx context.Context) PDResult {
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
			s.release(now)
		case evStep:
			s.step(ev.arg, now)
		case evTransferDone:
			s.transferDone(ev.arg, now)
		case evSnapshot:
			s.snapshot()
			s.snapshotted(now)
		}
	}
	s.out.wall = time.Since(start)
	s.prog.done(&s.clock, now)
	for _, e := range s.engines {
		s.out.preemptions += int(e.Load().Preemptions)
	}
	return s.out.result(s.cfg)
}

// release dispatches the request the client's backlog releases, if any.
func (s *pdSim) release(now time.Duration) {
	if i, ok := s.next(); ok {
		s.dispatch(i, now)
	}
}

func (s *pdSim) snapshot() { scrape(s.engines, s.view, s.lat) }

// dispatch routes request i, or holds it (hold.go).
func (s *pdSim) dispatch(i int, now time.Duration) {
	if s.hold.on() {
		s.inflight++ // its client slot, while it waits
		s.hold.arrive(i, s.reqs[i].PromptTokens, s.learner, now)
		s.drainHeld(now)
		return
	}
	s.send(i, now)
}

// drainHeld sends held requests, smallest key first, while an engine has
// room; each is charged to its engine before the next is considered.
func (s *pdSim) drainHeld(now time.Duration) {
	s.hold.drain(s.view, s.learner, now, &s.inflight, s.send)
}

// pickRoom moves the plan to the best option the hold lets the request go
// to now (Hold.Pick over the aggregated options).
func (s *pdSim) pickRoom(promptTokens int) {
	bs := s.cfg.Engine.BlockSize
	for _, o := range s.plan.Options {
		if s.hold.rule.May(s.hold.room(&s.view[s.ids[o.Decode]], s.learner), o.DecodeMatch.Spec*bs, promptTokens) {
			s.plan.Decode, s.plan.DecodeMatch, s.plan.DecodeCached = o.Decode, o.DecodeMatch, o.DecodeCached
			return
		}
	}
}

func (s *pdSim) send(i int, now time.Duration) {
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
	s.sreq = scheduler.Request{Keys: s.keyBuf, BlockSize: bs, PromptTokens: len(prompt), OutputTokens: predOut,
		Model: s.cfg.Model, SessionID: w.Session, Now: epoch.Add(now)}
	if predOut == 0 {
		predOut = policies.DefaultKVMeshConfig().DefaultOutputTokens
	}
	if err := s.router.Route(&s.sreq, s.view, &s.plan); err != nil {
		s.fail(i, now)
		return
	}
	if s.hold.on() {
		s.pickRoom(len(prompt))
	}
	f := pdFlight{prefill: -1, decode: s.ids[s.plan.Decode], sent: now, active: len(prompt) + predOut, prompt: len(prompt)}
	f.uncachedD = max(0, len(prompt)-s.plan.DecodeCached)
	f.kvKeys = append([]uint64(nil), s.keyBuf...)
	f.kvOwn = len(prompt) - len(f.kvKeys)*bs + predOut
	e, leg := f.decode, &engine.Request{ID: "a" + strconv.Itoa(i), Prompt: prompt, OutputLen: w.OutputTokens}
	if s.plan.Mode == pd.Disaggregated {
		f.prefill = s.ids[s.plan.Prefill]
		f.uncachedP = max(0, len(prompt)-s.plan.PrefillCached)
		f.xferTokens = f.uncachedD
		e, leg = f.prefill, &engine.Request{ID: "p" + strconv.Itoa(i), Prompt: prompt, OutputLen: 1}
		f.preq = leg
	} else {
		f.dreq = leg
	}
	if err := s.engines[e].Add(leg, now); err != nil {
		s.fail(i, now)
		return
	}
	f.ahead = s.view[e].LocalPrefillTokens + f.uncachedD
	s.ctx[e].sent(&s.view[e], now)
	if f.prefill >= 0 {
		f.ahead = s.view[e].LocalPrefillTokens + f.uncachedP
	}
	s.flights[i] = f
	s.byReq[leg] = i
	s.ctx[e].prompt += f.prompt
	s.legs[e]++
	s.idx.AddSpeculative(s.view[e].ID, s.keyBuf, epoch.Add(now))
	d := &s.view[f.decode]
	d.InFlight++
	d.LocalActiveTokens += f.active
	d.LocalKVTokens += s.refs(f.decode).add(f.kvKeys)*bs + f.kvOwn
	if f.prefill >= 0 {
		p := &s.view[f.prefill]
		p.InFlight++
		p.LocalPrefillTokens += f.uncachedP
		s.busy++
		s.out.disaggregated++
	} else {
		d.LocalPrefillTokens += f.uncachedD
	}
	s.awaitFirst[e] = append(s.awaitFirst[e], i)
	s.inflight++
	s.out.dispatched(now)
	s.wake(e, now)
}

func (s *pdSim) wake(e int, now time.Duration) {
	if !s.stepPending[e] {
		s.stepPending[e] = true
		s.h.push(now, evStep, e)
	}
}

func (s *pdSim) fail(i int, now time.Duration) {
	s.out.failed++
	s.pending--
	s.fol.done(&s.h, i, now, now)
	if s.free() {
		s.release(now)
	}
}

func (s *pdSim) step(e int, now time.Duration) {
	s.stepPending[e] = false
	eng := s.engines[e]
	var c0, seqs float64
	prefilling := len(s.awaitFirst[e]) > 0
	if s.learner != nil {
		c0, seqs = s.ctx[e].tokens(eng.Load()), float64(s.legs[e])
		s.ctx[e].meter.At(now, c0)
	}
	before := s.ctx[e].meter.Integral()
	res := eng.Step(now, s.horizon(s.busy > 0))
	if s.learner != nil && res.Steps > 0 {
		s.ctx[e].meter.At(res.End, s.ctx[e].tokens(eng.Load()))
		if !prefilling && seqs > 0 {
			// A stretch of pure decoding as the ingress sees it: none of
			// its requests there awaited a first token.
			d := res.End - now
			s.learner.ObserveDecode(s.view[e].ID, seqs, (s.ctx[e].meter.Integral()-before)/d.Seconds(), d/time.Duration(res.Steps), res.Steps)
		}
	}
	aw := s.awaitFirst[e][:0]
	for _, i := range s.awaitFirst[e] {
		f := &s.flights[i]
		leg, unc := f.dreq, f.uncachedD
		first := f.prefill < 0 // the aggregated request's only leg
		if f.prefill == e && f.preq != nil {
			leg, unc, first = f.preq, f.uncachedP, true
		}
		if leg != nil && (leg.Generated() > 0 || leg.Done()) {
			s.view[e].LocalPrefillTokens -= unc
			if s.learner != nil && first {
				s.ctx[e].observePrefill(s.learner, s.view[e].ID, f.sent, f.ahead, leg.Result().FirstToken-f.sent)
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
		s.ctx[e].prompt -= f.prompt
		s.legs[e]--
		s.ctx[e].finGen += uint64(r.Result().OutputTokens)
		if r == f.preq {
			s.prefillDone(i, r.Result())
			continue
		}
		s.decodeDone(i, r.Result(), now)
	}
	if res.Steps > 0 {
		// The engine is busy until the step's end even when the step
		// finished every request it had: a request that arrives meanwhile
		// waits for the next step, which starts there.
		s.stepPending[e] = true
		s.h.push(max(res.End, now+1), evStep, e)
	}
}

func (s *pdSim) prefillDone(i int, res engine.Result) {
	f := &s.flights[i]
	s.view[f.prefill].InFlight--
	f.prefillCached = res.CachedTokens + res.CPUCachedTokens
	bytes := float64(f.xferTokens) * s.cfg.Engine.Profile.KVBytesPerToken
	s.out.xferBytes += bytes
	s.h.push(res.Finished+s.cfg.transferTime(bytes), evTransferDone, i)
}

// refs is engine e's kvRefs, by its id: an autoscaled engine starts with
// none, also in a reused slot.
func (s *pdSim) refs(e int) kvRefs {
	id := s.view[e].ID
	m := s.kvRefs[id]
	if m == nil {
		m = kvRefs{}
		s.kvRefs[id] = m
	}
	return m
}

func (s *pdSim) transferDone(i int, now time.Duration) {
	f := &s.flights[i]
	s.busy--
	prompt := f.preq.Prompt
	eng := s.engines[f.decode]
	eng.ImportPrefix(prompt, "", "", now)
	f.dreq = &engine.Request{ID: "d" + strconv.Itoa(i), Prompt: prompt, OutputLen: s.reqs[i].OutputTokens}
	f.preq = nil
	f.uncachedD = 0
	if err := eng.Add(f.dreq, now); err != nil {
		s.view[f.decode].InFlight--
		s.view[f.decode].LocalActiveTokens -= f.active
		s.view[f.decode].LocalKVTokens -= s.refs(f.decode).drop(f.kvKeys)*s.cfg.Engine.BlockSize + f.kvOwn
		f.kvKeys = nil
		s.inflight--
		s.fail(i, now)
		return
	}
	s.byReq[f.dreq] = i
	s.ctx[f.decode].prompt += f.prompt
	s.legs[f.decode]++
	s.awaitFirst[f.decode] = append(s.awaitFirst[f.decode], i)
	s.wake(f.decode, now)
}

func (s *pdSim) decodeDone(i int, res engine.Result, now time.Duration) {
	f := &s.flights[i]
	v := &s.view[f.decode]
	v.InFlight--
	v.LocalActiveTokens -= f.active
	v.LocalKVTokens -= s.refs(f.decode).drop(f.kvKeys)*s.cfg.Engine.BlockSize + f.kvOwn
	f.kvKeys = nil
	f.dreq = nil
	cached := res.CachedTokens + res.CPUCachedTokens
	if f.prefill >= 0 {
		cached = f.prefillCached
	}
	s.outPred.Observe(res.OutputTokens)
	s.outs.Observe(s.cfg.Model, res.OutputTokens, res.E2E.Seconds())
	if res.OutputTokens > 1 {
		a := &s.lat[f.decode]
		a.ttft += res.TTFT
		a.tpot += (res.Finished - res.FirstToken) / time.Duration(res.OutputTokens-1)
		a.n++
	}
	h := s.hold.heldFor(i)
	if h > 0 {
		s.out.held++
		s.out.heldSum += h.Seconds()
	}
	s.out.finished(f.decode, f.prefill, f.sent-h, res, cached) // the client's TTFT counts the time held
	s.pending--
	s.h.push(max(res.Finished, now), evRelease, i)
	s.fol.done(&s.h, i, res.Finished, now)
}
