package des

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// epoch anchors virtual time for APIs that take a time.Time.
var epoch = time.Unix(1_700_000_000, 0)

// sim is one policy's run. Single goroutine; nothing is shared with other
// runs except the read-only request list.
type sim struct {
	cfg   *Config
	reqs  []workload.Request
	idx   *index.Index
	sched *scheduler.Scheduler
	root  uint64

	engines     []*engine.Engine
	ids         map[string]int
	view        []scheduler.Engine
	trans       []*translator
	stepPending []bool
	awaitFirst  [][]int // per engine: requests without a first token yet

	h        eventHeap
	nextArr  int           // next request to push as an arrival (arrivals are pushed one at a time)
	arrAt    time.Duration // time of the pending arrival (-1 = none)
	nextSnap time.Duration // time of the pending snapshot event (-1 = none)
	inflight int
	backlog  []int
	bhead    int
	pending  int // arrivals not yet dispatched + in flight

	flights []flight
	byReq   map[*engine.Request]int

	delayed  []delayedOp
	dhead    int
	dkeys    []uint64
	keyBuf   []uint64
	decision scheduler.Decision
	sreq     scheduler.Request

	out runStats
}

type flight struct {
	engine   int
	uncached int
	active   int
	req      *engine.Request
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
	idx, err := index.New(index.Config{ExactLookup: cfg.ExactLookup})
	if err != nil {
		return nil, err
	}
	sc := cfg.Scheduler
	sc.Policy = policy
	sc.Seed = cfg.Seed
	sched, err := registry.New(sc, idx, nil)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", policy, err)
	}
	s := &sim{
		cfg: cfg, reqs: reqs, idx: idx, sched: sched,
		root:    kvevents.Root(cfg.Model, "", ""),
		ids:     make(map[string]int, cfg.Engines),
		flights: make([]flight, len(reqs)),
		byReq:   make(map[*engine.Request]int),
	}
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
	return s, nil
}

// run simulates until every request finished or ctx is cancelled (checked
// every few thousand events; the partial result is then discarded).
func (s *sim) run(ctx context.Context) runStats {
	start := time.Now()
	s.pushArrival()
	s.pending = len(s.reqs)
	s.nextSnap = -1
	if s.cfg.SnapshotInterval > 0 {
		s.nextSnap = 0
		s.h.push(0, evSnapshot, 0)
	}
	for n := 0; s.h.len() > 0; n++ {
		if n&4095 == 0 && ctx.Err() != nil {
			break
		}
		ev := s.h.pop()
		now := ev.at
		switch ev.kind {
		case evArrival:
			s.pushArrival()
			if s.cfg.Concurrency > 0 && s.inflight >= s.cfg.Concurrency {
				s.backlog = append(s.backlog, ev.arg)
				continue
			}
			s.dispatch(ev.arg, now)
		case evRelease:
			s.inflight--
			if s.bhead < len(s.backlog) {
				i := s.backlog[s.bhead]
				s.bhead++
				s.dispatch(i, now)
			}
		case evStep:
			s.step(ev.arg, now)
		case evSnapshot:
			s.snapshot()
			s.nextSnap = -1
			if s.pending > 0 {
				s.nextSnap = now + s.cfg.SnapshotInterval
				s.h.push(s.nextSnap, evSnapshot, 0)
			}
		}
	}
	s.out.wall = time.Since(start)
	s.out.badEvents = 0
	for _, t := range s.trans {
		s.out.badEvents += t.bad
	}
	return s.out
}

// pushArrival schedules the next workload request's arrival. Arrivals are
// sorted, so one pending arrival at a time keeps the heap small and makes
// the next arrival time known for step fusing.
func (s *sim) pushArrival() {
	s.arrAt = -1
	if s.nextArr < len(s.reqs) {
		s.arrAt = s.reqs[s.nextArr].Arrival
		s.h.push(s.arrAt, evArrival, s.nextArr)
		s.nextArr++
	}
}

// horizon is the earliest time an outside event can change an engine's
// input, passed to Step so it fuses decode-only steps up to it: the next
// arrival or snapshot; with a client backlog also any engine's next step
// (a finish frees a slot and the freed request may be routed anywhere), so
// then it is the heap top.
func (s *sim) horizon() time.Duration {
	if s.bhead < len(s.backlog) {
		if t, ok := s.h.peek(); ok {
			return t
		}
	}
	until := time.Duration(math.MaxInt64)
	if s.arrAt >= 0 {
		until = s.arrAt
	}
	if s.nextSnap >= 0 && s.nextSnap < until {
		until = s.nextSnap
	}
	return until
}

func (s *sim) snapshot() {
	for e, eng := range s.engines {
		l := eng.Load()
		v := &s.view[e]
		v.Running, v.Waiting, v.KVUsage, v.QueuedPrefillTokens = l.Running, l.Waiting, l.KVUsage, l.QueuedPrefillTokens
	}
}

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

func (s *sim) dispatch(i int, now time.Duration) {
	s.applyDelayed(now)
	if s.cfg.SnapshotInterval < 0 {
		s.snapshot()
	}
	w := &s.reqs[i]
	prompt := w.AppendPrompt(make([]uint32, 0, w.PromptTokens))
	bs := s.cfg.Engine.BlockSize
	s.keyBuf = kvevents.AppendKeys(s.keyBuf[:0], s.root, prompt, bs)
	s.sreq = scheduler.Request{
		Keys: s.keyBuf, BlockSize: bs, PromptTokens: len(prompt), OutputTokens: w.OutputTokens,
		Model: s.cfg.Model, SessionID: w.Session, Now: epoch.Add(now),
	}
	if err := s.sched.Schedule(&s.sreq, s.view, &s.decision); err != nil {
		s.fail(i, now)
		return
	}
	e := s.ids[s.decision.Engine]
	m := s.decision.Ranked[0].Match
	uncached := max(0, len(prompt)-m.Spec*bs)
	r := &engine.Request{ID: strconv.Itoa(i), Prompt: prompt, OutputLen: w.OutputTokens}
	if err := s.engines[e].Add(r, now); err != nil {
		s.fail(i, now)
		return
	}
	s.idx.AddSpeculative(s.decision.Engine, s.keyBuf, epoch.Add(now))
	f := flight{engine: e, uncached: uncached, active: len(prompt) + w.OutputTokens, req: r}
	s.flights[i] = f
	s.byReq[r] = i
	v := &s.view[e]
	v.InFlight++
	v.LocalPrefillTokens += f.uncached
	v.LocalActiveTokens += f.active
	s.awaitFirst[e] = append(s.awaitFirst[e], i)
	s.inflight++
	s.out.dispatched(now)
	if !s.stepPending[e] {
		s.stepPending[e] = true
		s.h.push(now, evStep, e)
	}
}

// fail drops a request the cluster cannot take (too long, no engine).
func (s *sim) fail(i int, now time.Duration) {
	s.out.failed++
	s.pending--
	// The client slot is never taken; let the next backlog request go.
	if s.bhead < len(s.backlog) && (s.cfg.Concurrency == 0 || s.inflight < s.cfg.Concurrency) {
		j := s.backlog[s.bhead]
		s.bhead++
		s.dispatch(j, now)
	}
}

func (s *sim) step(e int, now time.Duration) {
	s.stepPending[e] = false
	until := s.horizon()
	eng := s.engines[e]
	res := eng.Step(now, until)
	// First tokens: the request's queued prefill work leaves the estimate.
	aw := s.awaitFirst[e][:0]
	for _, i := range s.awaitFirst[e] {
		f := &s.flights[i]
		if f.req.Generated() > 0 || f.req.Done() {
			s.view[e].LocalPrefillTokens -= f.uncached
			continue
		}
		aw = append(aw, i)
	}
	s.awaitFirst[e] = aw
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
		f.req = nil
		res := r.Result()
		s.out.finished(i, e, res)
		s.pending--
		s.h.push(max(res.Finished, now), evRelease, i)
	}
	if res.Steps > 0 && !eng.Idle() {
		s.stepPending[e] = true
		s.h.push(max(res.End, now+1), evStep, e)
	}
}
