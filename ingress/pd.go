package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// The P/D path (docs/PD.md): when Deps.PD is set and a prefill engine is
// among the candidates, the P/D step decides per request whether to
// disaggregate. A disaggregated request runs two legs, vLLM's NIXL protocol:
//
//  1. prefill leg: the upstream body with stream false, stream_options
//     removed, max_tokens and max_completion_tokens 1 and
//     kv_transfer_params {do_remote_decode: true, ...}, sent to the prefill
//     engine (admission: Config.PD);
//  2. decode leg: the client's request with the kv_transfer_params of the
//     prefill answer copied verbatim (opaque), through the ordinary proxy:
//     streaming, usage and retries come from the decode engine, so the
//     client sees the same response shapes as on the aggregated path.
//
// A prefill leg that fails before the first byte (connect error, timeout,
// 5xx, 429, an answer without kv_transfer_params) falls back to the
// aggregated path on the decode engine; a 4xx is the request's fault and is
// relayed. Other ingress replicas see the prefill engine's in-flight count
// through the usual gossip of per-engine loads.

// PDPlanner is the P/D step; *pd.Router implements it.
type PDPlanner interface {
	Route(req *scheduler.Request, engines []scheduler.Engine, plan *pd.Plan) error
	Policy() string
}

var _ PDPlanner = (*pd.Router)(nil)

// ErrPrefillFull: a prefill engine's admission queue is full. The request
// then moves to the plan's next prefill engine (NIXL: the next one for the
// same decode engine the cost model ranks above serving it whole there;
// SGLang: the next pair), or else falls back as for any prefill failure,
// aggregated on the decode engine; 429 only when the engine it would fall
// back to is queueing too.
var ErrPrefillFull = errors.New("prefill engine queue full")

// PDConfig is the P/D path: the decision and admission control.
type PDConfig struct {
	// Policy turns the P/D step on when Deps.PD is nil: one of pd.Names
	// (kvmesh: the cost model's per-request decision). "" (default): off.
	// Without it prefill-role engines are never given a request.
	Policy string `yaml:"policy"`
	// TransferGbps is the prefill → decode KV bandwidth the cost model
	// assumes. Default 100.
	TransferGbps float64 `yaml:"transferGbps"`
	// SLOTTFT is the time-to-first-token objective the cost model prices
	// (0: none).
	SLOTTFT time.Duration `yaml:"sloTTFT"`
	// SLOTPOT is the time-per-output-token objective the cost model prices
	// (0: none).
	SLOTPOT time.Duration `yaml:"sloTPOT"`
	// MaxPrefillInFlight caps prefill legs in flight per prefill engine
	// from this replica. Default 8.
	MaxPrefillInFlight int `yaml:"maxPrefillInFlight"`
	// PrefillQueue bounds legs waiting for a slot per prefill engine; a
	// request arriving at a full queue moves to the plan's next prefill
	// engine (the next SGLang pair), else is served aggregated, or gets
	// 429 when the engine it would fall back to is queueing. Default 64;
	// negative: no queue.
	PrefillQueue int `yaml:"prefillQueue"`
	// PrefillTimeout bounds a prefill leg, queue wait included; past it the
	// request falls back to aggregated. Default 60s.
	PrefillTimeout time.Duration `yaml:"prefillTimeout"`
}

// problems reports every invalid field.
func (c *PDConfig) problems(bad func(string, ...any)) {
	if c.Policy != "" {
		pc := pd.Config{Policy: c.Policy, TransferGbps: c.TransferGbps, SLOTTFT: c.SLOTTFT.Seconds(), SLOTPOT: c.SLOTPOT.Seconds()}
		if _, err := pd.New(pc); err != nil {
			bad("pd: %v", err)
		}
	}
	if c.MaxPrefillInFlight < 0 || c.PrefillTimeout < 0 || c.SLOTTFT < 0 || c.SLOTPOT < 0 {
		bad("pd: maxPrefillInFlight, prefillTimeout, sloTTFT and sloTPOT must be ≥ 0")
	}
}

func (c *PDConfig) defaults() {
	if c.MaxPrefillInFlight == 0 {
		c.MaxPrefillInFlight = 8
	}
	if c.PrefillQueue == 0 {
		c.PrefillQueue = 64
	}
	if c.PrefillTimeout == 0 {
		c.PrefillTimeout = 60 * time.Second
	}
}

// pdCall is one call's P/D state.
type pdCall struct {
	plan pd.Plan
	// prefill is the engine that runs the request's prefill leg: "" when
	// the request is served aggregated, by its plan or after the leg fell
	// back (servedWhole), so that the answering engine counts as the one
	// that did the prefill.
	prefill string
	pmatch  index.Match
	// planned is the prefill engine a leg was given up on (fallback or
	// 429), for the access log; "" otherwise.
	planned  string
	result   string // prefill leg result for the access log
	duration time.Duration
	// res is what the plan charged its engines until the legs charge
	// them themselves (pdState.reserve).
	res pdReservation
}

// pdReservation is a disaggregated plan's charge on its engines from the
// decision until the legs carry it: the prefill engine's until the
// prefill leg charges it (runPrefill), the decode engine's until the
// decode leg is sent (prefillLeg returns). Without it a request whose
// prefill leg runs is on its decode engine nowhere, and every plan made
// meanwhile sees that engine idle: a burst of long prompts put all its
// decode legs on one engine.
type pdReservation struct {
	prefill, decode string
	pre, act        int // the prefill engine's prefill tokens; the decode engine's active tokens
	kv              int // the decode engine's KV tokens (as upstream.kv)
}

// pendingLoad is the reservations on one engine.
type pendingLoad struct{ n, pre, act, kv int }

// pdState is the server's P/D admission and metrics, built on first use.
type pdState struct {
	once  sync.Once
	cfg   PDConfig
	mu    sync.Mutex // guards gates and pending
	gates map[string]*prefillGate
	// pending is the plans' reservations per engine (pdReservation).
	pending map[string]pendingLoad
	// planMu makes a plan and its reservation one step: a plan reads the
	// reservations and this replica's load on the engines, decides and
	// reserves before the next plan reads them, so that concurrent
	// requests see each other's choice (not each the idle cluster they
	// all arrived to).
	planMu sync.Mutex
	// router is Deps.PD, or the one built from PDConfig.Policy over the
	// server's scheduler; nil: P/D off.
	router PDPlanner
	// inited is set when once's function has run: goroutines that do not
	// take the once (forget.go) read router only after it.
	inited atomic.Bool

	// noKV is the NIXL prefill engines whose legs lately answered by
	// length without kv_transfer_params (no KV connector: markNoKV), left
	// out of prefill legs until their mark's time; guarded by mu.
	noKV map[string]*noKVMark
	// kvFails is, per SGLang engine, the last engine of the other role in
	// a pair whose room could not be read (pd_sglang.go's noTransfer, which
	// tells from them whose fault it is); guarded by mu.
	kvFails map[string]*kvFail

	legs      *prometheus.CounterVec // leg, result
	noKVMarks *prometheus.CounterVec // engine
	prefillS  prometheus.Histogram
	decisions *prometheus.CounterVec // mode, reason
	queued    prometheus.GaugeFunc
	legsNow   prometheus.GaugeFunc
}

// noKVMark is a prefill engine left out of prefill legs: its leg answered
// by length without kv_transfer_params.
type noKVMark struct {
	until  time.Time // not given prefill legs before
	n      int       // marks in a row (no leg answered with params between): the backoff
	warned time.Time // the last warning logged
}

// noKVBackoff is how long a prefill engine answering without
// kv_transfer_params is left out of prefill legs: a misconfigured engine
// stays so until someone restarts it, so the first leg after the mark
// mostly finds it unchanged.
var noKVBackoff = backoff.Backoff{Min: 30 * time.Second, Max: 10 * time.Minute, Jitter: 0.2}

// noKVWarnEvery bounds the warnings about one engine.
const noKVWarnEvery = 10 * time.Minute

// prefillGate is one prefill engine's admission: a semaphore of
// MaxPrefillInFlight slots and a bounded count of waiters.
type prefillGate struct {
	slots   chan struct{}
	waiting atomic.Int64
}

func (s *Server) pdInit() *pdState {
	p := &s.pd
	p.once.Do(func() {
		p.cfg = s.cfg.PD
		p.cfg.defaults()
		p.mu.Lock() // pdLoads (the load-sharing goroutine) reads gates under mu, without the once
		p.gates = make(map[string]*prefillGate)
		p.pending = make(map[string]pendingLoad)
		p.noKV = make(map[string]*noKVMark)
		p.mu.Unlock()
		p.router = s.deps.PD
		if p.router == nil && p.cfg.Policy != "" {
			p.router = s.buildPD(p.cfg)
		}
		cl := prometheus.Labels{"ingress": s.cfg.ID}
		p.legs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_pd_legs_total",
			Help: "P/D legs by leg (prefill; decode for SGLang failed_kv_transfer) and result (ok, client_error, client_gone, rejected (429), fallback_<why> when served aggregated instead, " +
				"next_queue_full when a full queue moved the leg to the plan's next prefill engine (SGLang: the next pair); SGLang: failed_<why>; why stalled: the stall watch cut a hung engine's leg).", ConstLabels: cl}, []string{"leg", "result"})
		p.noKVMarks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_pd_prefill_no_kv_marks_total",
			Help:        "Times a NIXL prefill engine was left out of prefill legs for a backoff because a leg it ran to its length answered without kv_transfer_params (an engine started without --kv-transfer-config).",
			ConstLabels: cl}, []string{"engine"})
		p.prefillS = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvmesh_ingress_pd_prefill_seconds",
			Help: "Prefill leg duration, admission wait included.", ConstLabels: cl, Buckets: latencyBuckets})
		p.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_pd_decisions_total",
			Help: "P/D decisions by mode and reason; a request planned disaggregated and served aggregated after its prefill leg was given up " +
				"counts again, mode aggregated, reason nixl_fallback or sglang_fallback.", ConstLabels: cl}, []string{"mode", "reason"})
		p.queued = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_pd_prefill_queued",
			Help: "Prefill legs waiting for an admission slot, all prefill engines.", ConstLabels: cl}, p.waiting)
		p.legsNow = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_pd_prefill_inflight",
			Help: "Prefill legs holding an admission slot (sent, not answered), all prefill engines.", ConstLabels: cl}, p.inFlight)
		// At 0 from the start, the results docs/OPERATIONS.md says to alert on.
		for _, r := range pdAlertResults {
			p.legs.WithLabelValues("prefill", r)
		}
		for _, c := range []prometheus.Collector{p.legs, p.noKVMarks, p.prefillS, p.decisions, p.queued, p.legsNow} {
			if err := s.deps.Registry.Register(c); err != nil {
				s.log.Warn("pd metrics", "err", err)
			}
		}
		p.inited.Store(true)
	})
	return p
}

// pdAlertResults are the prefill legs' results of an engine that is not
// what gossip says (a wrong model, a kvmesh ingress), created at 0.
var pdAlertResults = [...]string{"fallback_wrong_model", "fallback_" + loopResult, "failed_wrong_model", "failed_" + loopResult}

// busy reports whether engine has prefill legs of this replica holding or
// waiting for an admission slot, or a plan's reservation.
func (p *pdState) busy(engine string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.gates[engine]
	_, reserved := p.pending[engine]
	return reserved || g != nil && (len(g.slots) > 0 || g.waiting.Load() > 0)
}

// forget drops engine's admission gate unless legs hold or wait for it
// or a plan reserved it (false then), and the P/D router's state of it
// (forget.go). A leg that took the gate just before is admitted on the
// dropped gate, and releases it there.
func (p *pdState) forget(engine string) bool {
	p.mu.Lock()
	g := p.gates[engine]
	if _, reserved := p.pending[engine]; reserved || g != nil && (len(g.slots) > 0 || g.waiting.Load() > 0) {
		p.mu.Unlock()
		return false
	}
	delete(p.gates, engine)
	delete(p.noKV, engine)
	delete(p.kvFails, engine)
	p.mu.Unlock()
	if p.inited.Load() {
		if f, ok := p.router.(scheduler.Forgetter); ok {
			f.Forget(engine)
		}
	}
	return true
}

// markNoKV leaves engine out of prefill legs for a backoff: its leg ran to
// its length and answered without kv_transfer_params, which a vLLM engine
// with a NIXL connector never does (one that stops early, on EOS, answers
// none either, and is not marked). Legs already in flight that answer the
// same way while it is marked do not lengthen the mark. It warns once per
// noKVWarnEvery per engine.
func (s *Server) markNoKV(p *pdState, engine, url string) {
	now := time.Now()
	p.mu.Lock()
	m, d := p.markLocked(engine, now)
	if d == 0 {
		p.mu.Unlock()
		return
	}
	warn := m.warned.IsZero() || now.Sub(m.warned) >= noKVWarnEvery
	if warn {
		m.warned = now
	}
	p.mu.Unlock()
	p.noKVMarks.WithLabelValues(engine).Inc()
	if warn {
		s.log.Warn("prefill engine answered a prefill leg without kv_transfer_params: is it started with --kv-transfer-config "+
			"(a NIXL connector, kv_role kv_producer or kv_both)? Its requests are prefilled again on the decode engine; "+
			"it gets no prefill legs for a while", "engine", engine, "url", url, "for", d.Round(time.Second).String())
	}
}

// noKVOK clears engine's mark: a leg of it answered with kv_transfer_params.
func (p *pdState) noKVOK(engine string) {
	p.mu.Lock()
	delete(p.noKV, engine)
	p.mu.Unlock()
}

// markRefusedKey leaves engine out of prefill legs (and whole requests)
// for noKVBackoff, as markNoKV does: its leg answered 401, so it wants an
// engine key this ingress does not send (upstreamauth.go warned of it).
// Without the mark the cost model kept choosing the idle-looking engine:
// 49 of 50 legs went to it and fell back, P/D off in all but name. A leg
// answered with kv_transfer_params clears it (noKVOK), as after a fixed
// key and a restart.
// It returns how long the engine is left out, 0 when a mark already ran.
func (p *pdState) markRefusedKey(engine string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, d := p.markLocked(engine, time.Now())
	return d
}

// markLocked leaves engine out of prefill legs for the next step of
// noKVBackoff and returns its mark and that step; 0 when a mark already
// runs (legs in flight when it was marked do not lengthen it). Under mu.
func (p *pdState) markLocked(engine string, now time.Time) (*noKVMark, time.Duration) {
	m := p.noKV[engine]
	if m == nil {
		m = &noKVMark{}
		p.noKV[engine] = m
	}
	if now.Before(m.until) {
		return m, 0
	}
	d := noKVBackoff.Delay(m.n)
	m.n++
	m.until = now.Add(d)
	return m, d
}

// leaveOutRefusing marks a prefill engine that answered a leg 401 and says
// for how long it gets no prefill legs.
func (s *Server) leaveOutRefusing(p *pdState, engine string) {
	if d := p.markRefusedKey(engine); d > 0 {
		s.log.Info("prefill engine refused this ingress's engine key: no prefill legs for it for a while (until one answers with kv_transfer_params after that)",
			"engine", engine, "for", d.Round(time.Second).String())
	}
}

// noKVMarked reports whether engine is left out of prefill legs now.
func (p *pdState) noKVMarked(engine string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.noKV[engine]
	return m != nil && now.Before(m.until)
}

// gateIDs appends the engines with an admission gate.
func (p *pdState) gateIDs(dst []string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.gates {
		dst = append(dst, id)
	}
	return dst
}

func (p *pdState) inFlight() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, g := range p.gates {
		n += len(g.slots)
	}
	return float64(n)
}

func (p *pdState) waiting() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := int64(0)
	for _, g := range p.gates {
		n += g.waiting.Load()
	}
	return float64(n)
}

// pdLoads adds this replica's prefill legs per prefill engine (in flight
// and queued at admission) to loads, for gossip.
func (s *Server) pdLoads(loads []EngineLoad) []EngineLoad {
	p := &s.pd
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, g := range p.gates {
		legs, queued := len(g.slots), int(g.waiting.Load())
		if legs == 0 && queued == 0 {
			continue
		}
		i := slices.IndexFunc(loads, func(l EngineLoad) bool { return l.Engine == id })
		if i < 0 {
			loads = append(loads, EngineLoad{Engine: id})
			i = len(loads) - 1
		}
		loads[i].PrefillLegs, loads[i].PrefillQueued = legs, queued
	}
	return loads
}

func (p *pdState) gate(engine string) *prefillGate {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.gates[engine]
	if !ok {
		g = &prefillGate{slots: make(chan struct{}, p.cfg.MaxPrefillInFlight)}
		p.gates[engine] = g
	}
	return g
}

// acquire takes a slot, waiting until deadline; ErrPrefillFull when the
// queue is full, ErrUpstream on timeout.
func (g *prefillGate) acquire(queue int, deadline time.Time) error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
	}
	if g.waiting.Add(1) > int64(queue) {
		g.waiting.Add(-1)
		return ErrPrefillFull
	}
	defer g.waiting.Add(-1)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: prefill admission timed out", ErrUpstream)
	}
}

func (g *prefillGate) release() { <-g.slots }

// planPD runs the P/D step when a prefill engine is a candidate, and puts
// the plan's decode engine first in the ranking. With P/D on, prefill-role
// engines leave the ranking (they serve prefill legs) unless the plan
// serves the request whole on one (the kvmesh policy, when no decode
// engine keeps its TPOT) or nothing else is left; batched prompts are
// served aggregated.
func (c *call) planPD() error {
	s := c.s
	if !hasPrefill(c.cands) {
		return nil
	}
	p := s.pdInit()
	if p.router == nil {
		return nil
	}
	if c.seqs > 1 || c.ep == epResponses || c.ep == epMessages || c.ep == epOther { // vLLM's Responses API takes no kv_transfer_params; the Messages API is kept whole too
		reason := "several_sequences"
		if c.seqs <= 1 {
			reason = "endpoint"
		}
		p.decisions.WithLabelValues(pd.Aggregated.String(), reason).Inc()
		c.dropPrefillEngines("")
		return nil
	}
	// One plan at a time (planMu): the load read below includes every
	// earlier plan's reservation or its legs' own charges.
	p.planMu.Lock()
	defer p.planMu.Unlock()
	c.pdLoad(p)
	if err := p.router.Route(&c.sreq, c.cands, &c.pd.plan); err != nil {
		return fmt.Errorf("%w: %w", ErrNoEngine, err)
	}
	pl := &c.pd.plan
	p.decisions.WithLabelValues(pl.Mode.String(), pl.Reason).Inc()
	c.pd.prefill, c.pd.pmatch = pl.Prefill, pl.PrefillMatch
	c.dropPrefillEngines(pl.Decode)
	if len(c.dec.Ranked) == 0 {
		return fmt.Errorf("%w: no engine can decode", ErrNoEngine)
	}
	if pl.Mode == pd.Disaggregated {
		c.reserve(p) // prefillLeg, which always follows a plan, releases it
	}
	return nil
}

// pdLoad brings the candidates' load up to the moment of the plan: this
// replica's own load on each (read when the request arrived, before its
// tokenizing, while other requests' legs may have been sent since) and
// the plans' reservations, legs waiting at this replica's prefill
// admission included (other replicas' arrive through gossip in
// InFlight). It reads the reservations before the engines' load: a leg
// charges its engine before it releases its reservation, so a request is
// never missing from both. Under planMu.
func (c *call) pdLoad(p *pdState) {
	j := 0
	for i := range c.cands {
		e := &c.cands[i]
		p.mu.Lock()
		res := p.pending[e.ID]
		p.mu.Unlock()
		// The candidates were added in membership's order (candidates):
		// the engine's own entry holds the other replicas' in-flight
		// count, to which addLocalLoad added this replica's.
		k := j
		for k < len(c.infos) && c.infos[k].ID != e.ID {
			k++
		}
		if k < len(c.infos) {
			j = k + 1
			if up := c.s.ups.lookup(e.ID); up != nil {
				n, pre, act := up.load()
				e.InFlight = c.infos[k].InFlight + n
				e.LocalPrefillTokens, e.LocalActiveTokens, e.LocalKVTokens = pre, act, up.kvTokens()
			}
		}
		e.InFlight += res.n
		e.LocalPrefillTokens += res.pre
		e.LocalActiveTokens += res.act
		e.LocalKVTokens += res.kv
		if e.Role == scheduler.RolePrefill && p.noKVMarked(e.ID, c.start) {
			e.Healthy = false // markNoKV: no prefill legs, nor whole requests, for now
		}
	}
}

// reserve charges the plan's engines until its legs charge them (pdReservation):
// the prefill engine with one request and the prompt tokens its leg will
// compute (as runPrefill charges), the decode engine with one request and
// its prompt and expected output (as startAttempt charges its active set)
// and the KV its decode leg will add there: its prompt blocks no request in
// flight there holds, its prompt tail and expected output (as startAttempt
// charges the engine's KV; reservations of one prefix each count it).
// Blocks are the decode engine's own size (keysOf, blockOf).
func (c *call) reserve(p *pdState) {
	out := c.req.maxTokens
	if out <= 0 {
		out = defaultOutputTokens
	}
	r := &c.pd.res
	r.decode, r.act = c.pd.plan.Decode, c.promptTokens+out
	keys, bs := c.keysOf(r.decode), c.blockOf(r.decode)
	r.kv = max(c.promptTokens, len(keys)*bs) + out
	if up := c.s.ups.lookup(r.decode); up != nil {
		r.kv -= up.kvHeld(keys) * bs
	}
	p.mu.Lock()
	l := p.pending[r.decode]
	l.n, l.act, l.kv = l.n+1, l.act+r.act, l.kv+r.kv
	p.pending[r.decode] = l
	p.mu.Unlock()
	c.reservePrefill(p)
}

// prefillLegTokens is the prompt tokens the prefill leg computes on
// c.pd.prefill: those beyond its matched prefix, counted in its own blocks
// (pmatch is, with the prompt keyed per block size), not the model's most
// common size (tester h-reg8 F2).
func (c *call) prefillLegTokens() int64 {
	return int64(max(0, c.promptTokens-c.pd.pmatch.Spec*c.blockOf(c.pd.prefill)))
}

// reservePrefill charges c.pd.prefill, the engine the prefill leg is for,
// until the leg charges it: a leg waiting at its admission counts so too.
func (c *call) reservePrefill(p *pdState) {
	r := &c.pd.res
	r.prefill, r.pre = c.pd.prefill, int(c.prefillLegTokens())
	p.mu.Lock()
	l := p.pending[r.prefill]
	l.n, l.pre = l.n+1, l.pre+r.pre
	p.pending[r.prefill] = l
	p.mu.Unlock()
}

// unreserve releases the plan's reservation on its prefill engine, and on
// its decode engine too when decode is set; what is released already is
// not released again.
func (c *call) unreserve(p *pdState, decode bool) {
	r := &c.pd.res
	if r.prefill == "" && (!decode || r.decode == "") {
		return
	}
	p.mu.Lock()
	if r.prefill != "" {
		p.unpend(r.prefill, 1, r.pre, 0, 0)
		r.prefill = ""
	}
	if decode && r.decode != "" {
		p.unpend(r.decode, 1, 0, r.act, r.kv)
		r.decode = ""
	}
	p.mu.Unlock()
}

// unpend takes a reservation off engine's pending load. Under mu.
func (p *pdState) unpend(engine string, n, pre, act, kv int) {
	l := p.pending[engine]
	l.n, l.pre, l.act, l.kv = l.n-n, l.pre-pre, l.act-act, l.kv-kv
	if l.n <= 0 {
		delete(p.pending, engine)
		return
	}
	p.pending[engine] = l
}

// dropPrefillEngines removes prefill-role engines from the ranking (when
// another engine remains) and moves first, if ranked, to the front.
func (c *call) dropPrefillEngines(first string) {
	keep := 0
	for _, r := range c.dec.Ranked {
		if roleOf(c.cands, r.Engine) != scheduler.RolePrefill {
			keep++
		}
	}
	if keep == 0 {
		return
	}
	ranked := c.dec.Ranked[:0]
	var head scheduler.EngineScore
	found := false
	for _, r := range c.dec.Ranked {
		switch {
		case r.Engine == first:
			head, found = r, true
		case roleOf(c.cands, r.Engine) != scheduler.RolePrefill:
			ranked = append(ranked, r)
		}
	}
	if found {
		ranked = append(ranked, scheduler.EngineScore{})
		copy(ranked[1:], ranked)
		ranked[0] = head
	}
	c.dec.Ranked = ranked
}

// dropRanked removes engine id, which denied the model (wrongmodel.go),
// from the ranking while another engine remains (the proxy's attempt on
// the last one answers the client).
func (c *call) dropRanked(id string) {
	if len(c.dec.Ranked) > 1 {
		c.dec.Ranked = slices.DeleteFunc(c.dec.Ranked, func(r scheduler.EngineScore) bool { return r.Engine == id })
	}
}

// buildPD builds the configured P/D router over the server's scheduler
// (nil, logged, when the scheduler is not kvmesh's own).
func (s *Server) buildPD(c PDConfig) PDPlanner {
	sch, ok := s.deps.Scheduler.(*scheduler.Scheduler)
	if !ok {
		s.log.Warn("pd: the scheduler is not *scheduler.Scheduler; P/D off")
		return nil
	}
	cost, err := pd.CostFrom(s.cfg.Scheduler)
	var pol pd.Policy
	if err == nil {
		pol, err = pd.New(s.pdPolicyConfig(c, cost))
	}
	if err == nil {
		var r *pd.Router
		if r, err = pd.NewRouter(sch, pol); err == nil {
			return r
		}
	}
	s.log.Warn("pd: P/D off", "err", err)
	return nil
}

// pdPolicyConfig is the P/D policy's config: the objectives, the
// ingress's learner, when on, as its per-engine cost model (learn.go), and
// the output lengths of finished attempts (Server.outs).
func (s *Server) pdPolicyConfig(c PDConfig, cost *policies.KVMeshConfig) pd.Config {
	pc := pd.Config{Policy: c.Policy, Cost: cost, TransferGbps: c.TransferGbps,
		SLOTTFT: c.SLOTTFT.Seconds(), SLOTPOT: c.SLOTPOT.Seconds()}
	if s.learn != nil {
		pc.Costs = s.learn
	}
	pc.Outputs = s.outs
	return pc
}

func hasPrefill(cs []scheduler.Engine) bool {
	for i := range cs {
		if cs[i].Role == scheduler.RolePrefill {
			return true
		}
	}
	return false
}

func roleOf(cs []scheduler.Engine, id string) scheduler.Role {
	for i := range cs {
		if cs[i].ID == id {
			return cs[i].Role
		}
	}
	return scheduler.RoleMixed
}

// pdPolicyName is the P/D step's policy, for the startup log: Deps.PD's,
// else PDConfig.Policy, else "off".
func (s *Server) pdPolicyName() string {
	switch {
	case s.deps.PD != nil:
		return s.deps.PD.Policy()
	case s.cfg.PD.Policy != "":
		return s.cfg.PD.Policy
	}
	return "off"
}

// hideEngines is err as its client reads it: with Config.EngineHeader off
// (an engine's id defaults to its URL's host:port) the text after err's
// sentinel is hidden instead of naming engines, and the log keeps err's
// whole text (logText).
func (s *Server) hideEngines(err error, hidden string) error {
	if s.cfg.EngineHeader {
		return err
	}
	msg := hidden
	if sentinel := errors.Unwrap(err); sentinel != nil {
		msg = sentinel.Error() + ": " + hidden
	}
	return &upstreamError{msg: msg, err: err}
}

// legFailure accounts a P/D leg that failed without an answer head on up
// (the engine's failures and health, a refused client certificate too,
// as attemptFailed; nothing for a local_error, the ingress's own
// resources) and returns its failure's label:
// classifyErr's, or "stalled" while the stall watch has the engine ejected
// (hung: its cut ended the leg). The leg cannot tell whether its own
// connection was the one cut (closeEngine closes the connections under
// fasthttp), so another failure on an engine the watch ejected meanwhile,
// a rare race, is labelled "stalled" too.
func (s *Server) legFailure(up *upstream, err error) string {
	why := classifyErr(err)
	if why == "local_error" {
		return why // the ingress's own limit: nothing about the engine (as attemptFailed)
	}
	stalled := s.health.stalledOut(up.id) // before observe, which may eject it anew
	up.failures.Add(1)
	s.health.observe(up, why)
	if stalled {
		return "stalled"
	}
	return why
}

// fallbackEngine is the engine an aggregated fallback is sent to first:
// the ranking's head, as the proxy takes it (planPD put the plan's decode
// engine there when the scheduler ranked it); "" when nothing is ranked.
func (c *call) fallbackEngine() string {
	if len(c.dec.Ranked) == 0 {
		return ""
	}
	return c.dec.Ranked[0].Engine
}

// queueing reports whether engine id has requests waiting (its last
// reported load): a prefill queue that is full falls back to aggregated
// only onto an engine that is not, else the client gets 429.
func (c *call) queueing(id string) bool {
	for i := range c.cands {
		if c.cands[i].ID == id {
			return c.cands[i].Waiting > 0
		}
	}
	return false
}

// nextPrefill returns the option a leg whose prefill queue is full moves
// to, and the index to go on from: the first of the plan's options from
// index from on (best first by the cost model) that keeps the plan's
// decode engine (the ranking's head, where the decode leg goes) and whose
// prefill engine speaks NIXL. -1 when there is none, or when the cost
// model ranks serving the request whole on the decode engine (the
// aggregated fallback) above it.
func (c *call) nextPrefill(from int) (pd.Choice, int) {
	pl := &c.pd.plan
	for i := from; i < len(pl.Options); i++ {
		o := pl.Options[i]
		switch {
		case o.Decode != pl.Decode:
			continue
		case o.Prefill == "":
			return pd.Choice{}, -1
		}
		if pi := c.infoOf(o.Prefill); pi != nil && pi.PDProtocol != gossip.PDProtocolSGLang {
			return o, i + 1
		}
	}
	return pd.Choice{}, -1
}

// prefillLeg runs the prefill leg of a disaggregated request. On success
// c.body becomes the decode leg's body. It returns false when it answered
// the client itself (a 4xx from the prefill engine, or the client left).
func (c *call) prefillLeg(ctx *fasthttp.RequestCtx) bool {
	if c.pd.prefill == "" {
		return true
	}
	p := c.s.pdInit()
	if pi := c.infoOf(c.pd.prefill); pi != nil && pi.PDProtocol == gossip.PDProtocolSGLang {
		// pd_sglang.go: both legs at once; the reservation stays through
		// the admission wait and goes once a pair is admitted (sglangPair)
		return c.sglangLegs(ctx)
	}
	_, ok := c.runPrefill(ctx, p, time.Now()) // prefillDone releases the reservation
	return ok
}

// servedWhole records that the request planned with a prefill leg is
// served without one (aggregated, or not at all): the engine that answers
// does the whole prefill, so the learner takes its prefill sample
// (learnFirstToken), the SLO recorder credits it the TTFT (observeCall) and
// the access log names it, instead of the prefill engine given up.
func (c *call) servedWhole() {
	if c.pd.prefill != "" {
		c.pd.planned = c.pd.prefill
	}
	c.pd.prefill, c.pd.pmatch = "", index.Match{}
}

// servedPDMode is how the request was served, the access log's pd_mode:
// the plan's mode ("aggregated", "disaggregated"), or "fallback" for a
// request planned disaggregated whose prefill leg was given up (served
// whole by the engine that answered, or refused with 429). The plan's own
// mode is the log's pd_planned.
func (c *call) servedPDMode() string {
	if c.pd.plan.Mode == pd.Disaggregated && c.pd.prefill == "" {
		return "fallback"
	}
	return c.pd.plan.Mode.String()
}

// prefillEngine is the engine that did the request's prefill, for the
// access log: the prefill leg's engine, or after a leg was given up the
// engine that answered; "" for a request planned aggregated (its engine
// did it).
func (c *call) prefillEngine() string {
	if c.pd.prefill == "" && c.pd.planned != "" {
		return c.engine
	}
	return c.pd.prefill
}

// prefillDone records a leg's result (metrics, the access log's fields)
// and releases the plan's reservation; it runs before the call is
// finished, after which nothing may touch c.
func (c *call) prefillDone(p *pdState, res string, start time.Time) string {
	// The decode leg (or the aggregated fallback) is sent next and charges
	// its engine then (startAttempt); or the call is answered already.
	c.unreserve(p, true)
	c.pd.result, c.pd.duration = res, time.Since(start)
	if res == "rejected" || strings.HasPrefix(res, "fallback_") {
		c.servedWhole()
	}
	if strings.HasPrefix(res, "fallback_") {
		// Served aggregated instead, counted as SGLang's fallbacks are
		// (sglang_fallback): a decision's count by mode says how requests
		// were served, whichever the protocol.
		p.decisions.WithLabelValues(pd.Aggregated.String(), "nixl_fallback").Inc()
	}
	p.legs.WithLabelValues("prefill", res).Inc()
	switch res {
	case "fallback_queue_full", "fallback_admission_timeout", "fallback_body", "fallback_invalid", "fallback_no_engine":
		// never sent: not a leg's duration
	default:
		p.prefillS.Observe(c.pd.duration.Seconds())
	}
	return res
}

func (c *call) runPrefill(ctx *fasthttp.RequestCtx, p *pdState, start time.Time) (string, bool) {
	s := c.s
	body := c.upstreamBody() // route.go: "model" names the routed pool
	pbody, err := prefillBody(body, c.req.maxTokens, c.req.stream)
	if errors.Is(err, errLegHidesRefusal) || c.overContext() {
		// Served aggregated: the engine answers the 400 itself, as on the
		// aggregated path, and no prefill engine holds blocks for a decode
		// leg it would refuse.
		return c.prefillDone(p, "fallback_invalid", start), true
	}
	if err != nil {
		return c.prefillDone(p, "fallback_body", start), true
	}
	g := p.gate(c.pd.prefill)
	err = g.acquire(p.cfg.PrefillQueue, start.Add(p.cfg.PrefillTimeout))
	for next := 1; errors.Is(err, ErrPrefillFull); {
		// The plan's next prefill engine for the same decode engine,
		// charged with its own prefix match (the plan's first option is
		// the one just refused); the refusal is counted apart from the
		// request's final result.
		var o pd.Choice
		if o, next = c.nextPrefill(next); next < 0 {
			break
		}
		p.legs.WithLabelValues("prefill", "next_queue_full").Inc()
		c.pd.prefill, c.pd.pmatch = o.Prefill, o.PrefillMatch
		c.unreserve(p, false) // the reservation moves with the leg
		c.reservePrefill(p)
		g = p.gate(c.pd.prefill)
		err = g.acquire(p.cfg.PrefillQueue, start.Add(p.cfg.PrefillTimeout))
	}
	if err != nil {
		if errors.Is(err, ErrPrefillFull) {
			if fb := c.fallbackEngine(); c.queueing(fb) {
				// No engine left for it: the engine the fallback would
				// take is queueing already, and a whole prefill there
				// would wait behind its queue and stall its streams.
				err := s.hideEngines(fmt.Errorf("%w: %s, and %s is queueing", ErrPrefillFull, c.pd.prefill, fb),
					"the planned prefill engine's, and the engine it would fall back to is queueing")
				c.prefillDone(p, "rejected", start)
				c.fail(ctx, err)
				c.finish()
				return "rejected", false
			}
			// Like any prefill failure: the decode engine serves it whole.
			return c.prefillDone(p, "fallback_queue_full", start), true
		}
		return c.prefillDone(p, "fallback_admission_timeout", start), true
	}
	defer g.release()
	url := c.urlOf(c.pd.prefill)
	up, err := s.ups.get(c.pd.prefill, url)
	if err != nil {
		return c.prefillDone(p, "fallback_no_engine", start), true
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	c.setUpstreamHeaders(&req.Header)
	req.SetRequestURI(url + c.path)
	req.SetHost(up.hc.Addr)
	req.SetBodyRaw(pbody)
	// The client watcher (clientwatch.go) cancels the leg of a client that
	// leaves, and the leg's deadline cuts it at PrefillTimeout: either way
	// the engine's connection is closed, which is how it learns to abort
	// (an abandoned leg would otherwise hold its blocks for the decode
	// read that never comes). The watch stays for the decode leg.
	if c.watch == nil {
		c.watch = s.ups.startWatch(ctx)
	}
	var expiry *time.Timer
	if c.watch != nil {
		req.Header.SetBytesV(watchHeader, c.watch.idText)
		w, n := c.watch, c.watch.attempt()
		expiry = time.AfterFunc(time.Until(start.Add(p.cfg.PrefillTimeout)), func() { w.expire(n) })
	}
	charge := c.prefillLegTokens()
	if up.inflight.Add(1) == 1 {
		up.progress.Store(monoNow()) // the stall watch counts from here (health.go)
	}
	pre := up.prefill.Add(charge)
	c.unreserve(p, false) // charged: the plan's reservation is carried by the leg now
	up.total.Add(1)
	// Do, not DoDeadline: the upstream clients stream response bodies,
	// which DoDeadline does not support; the expiry timer bounds the leg.
	resp := fasthttp.AcquireResponse()
	sent, sentMono := time.Now(), monoNow()
	err = tlsCauseOf(resp, up.hc.Do(req, resp)) // upstreamtls.go: an alert refusing our certificate
	expired := expiry != nil && !expiry.Stop()
	if err == nil && resp.StatusCode() == fasthttp.StatusOK {
		c.learnPrefillLeg(up, pre, time.Since(sent)) // learn.go
	}
	up.inflight.Add(-1)
	up.prefill.Add(-charge)
	if c.watch.isCanceled() {
		c.watch.release()
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		c.prefillDone(p, "client_gone", start)
		c.clientGone(ctx)
		return "client_gone", false
	}
	if err != nil {
		c.watch.release()
		fasthttp.ReleaseResponse(resp)
		if expired {
			return c.prefillDone(p, "fallback_timeout", start), true
		}
		// A dead prefill engine leaves this replica's ranking at once.
		return c.prefillDone(p, "fallback_"+s.legFailure(up, err), start), true
	}
	st := resp.StatusCode()
	switch {
	case st >= 500 || st == fasthttp.StatusTooManyRequests:
		looped := loopAnswer(resp) // loop.go: the "engine" is a kvmesh ingress
		c.watch.release()
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		if looped != "" {
			s.loopedEngine(up)
			return c.prefillDone(p, "fallback_"+loopResult, start), true
		}
		// Held against the engine as on the aggregated path and SGLang's
		// leg (a 429 is shedding, not a failure: healthKind): an engine
		// failing every leg answers fast and idle, so the cost model
		// would keep choosing it.
		up.failures.Add(1)
		s.health.observe(up, statusResult(st))
		return c.prefillDone(p, "fallback_"+statusResult(st), start), true
	case st == fasthttp.StatusUnauthorized:
		// upstreamauth.go: the ingress's engine key, not the client's.
		_ = s.credentialError(up, resp)
		s.leaveOutRefusing(p, up.id)
		c.watch.release()
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		return c.prefillDone(p, "fallback_credential_refused", start), true
	case st != fasthttp.StatusOK:
		buf, rerr := readAll(resp)
		if st == fasthttp.StatusNotFound && rerr == nil && c.noSuchModel(buf.Bytes()) {
			// Not the request's fault: the prefill engine is not the one
			// gossip says it is, or lost an adapter (wrongmodel.go). It
			// leaves the model's requests and this one is served
			// aggregated.
			bufPool.Put(buf)
			c.watch.release()
			_ = resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
			model, adapter := c.sentModel()
			s.deniedModel(up, model, adapter)
			return c.prefillDone(p, "fallback_wrong_model", start), true
		}
		c.engine = c.pd.prefill
		c.prefillDone(p, "client_error", start)
		up.inflight.Add(1) // relayRead ends an attempt
		c.relayRead(ctx, up, resp, st, buf, rerr)
		return "client_error", false
	}
	buf, rerr := readAll(resp)
	c.watch.release()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	defer bufPool.Put(buf)
	if rerr != nil {
		return c.prefillDone(p, "fallback_read_error", start), true
	}
	s.health.ok(up, sentMono) // a 5xx run is one in a row only until an answer
	params, finish, ok := kvTransferParams(buf.Bytes())
	if !ok {
		if finish == "length" {
			s.markNoKV(p, c.pd.prefill, url) // no KV connector: it would prefill its every leg twice
		}
		return c.prefillDone(p, "fallback_no_params", start), true
	}
	p.noKVOK(c.pd.prefill)
	dbody, err := withKVParams(body, params)
	if err != nil {
		return c.prefillDone(p, "fallback_body", start), true
	}
	c.body = dbody
	return c.prefillDone(p, "ok", start), true
}

// overContext reports whether the decode engine will refuse the request
// for its context length: prompt plus output limit over its max_model_len
// (vLLM's API server checks it before the request reaches the engine, so
// the decode leg would never read the KV the leg prepared, and the prefill
// engine would hold its blocks until its abort timeout). Without an output
// limit (-1) the engine takes what is left of the context, refused only
// when nothing is. The prompt's count may be the ingress's estimate
// (untokenized): erring costs only the split, as legHidesRefusal's.
func (c *call) overContext() bool {
	d := c.infoOf(c.pd.plan.Decode)
	if d == nil || d.MaxModelLen <= 0 {
		return false
	}
	return c.promptTokens+max(c.req.maxTokens, 1) > d.MaxModelLen
}

// errLegHidesRefusal: the engine refuses the request (400) for a member
// the prefill leg's body rewrites, so the leg would succeed, hold its
// blocks, and only the decode leg would be refused.
var errLegHidesRefusal = errors.New("the prefill leg would hide values the engine refuses")

// prefillBody is the prefill leg's body: the request with stream false, no
// stream_options or min_tokens, one output token and do_remote_decode set.
// maxTokens is the output limit the engine applies (request.maxTokens, -1:
// none) and stream the client's. errLegHidesRefusal when the client's
// values are ones vLLM's validation refuses (SamplingParams: max_tokens
// at least 1, 0 ≤ min_tokens ≤ max_tokens; stream_options only with
// stream) and the rewrite would hide.
func prefillBody(body []byte, maxTokens int, stream bool) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("prefill body: %w", err)
	}
	if legHidesRefusal(m, maxTokens, stream) {
		return nil, errLegHidesRefusal
	}
	delete(m, "stream_options")
	delete(m, "min_tokens") // the leg generates one token; min_tokens > 1 would be a 400
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = json.RawMessage("1")
	}
	m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)
	return json.Marshal(m)
}

// legHidesRefusal reports whether the members prefillBody rewrites hold a
// value the engine refuses. Erring towards true costs only the split: the
// request is served aggregated.
func legHidesRefusal(m map[string]json.RawMessage, maxTokens int, stream bool) bool {
	if maxTokens == 0 {
		return true
	}
	for _, k := range [...]string{"max_tokens", "max_completion_tokens"} {
		// vLLM's chat takes max_completion_tokens or else max_tokens: a
		// limit below 1 under either name is refused or changes which applies.
		if v, ok := m[k]; ok && string(v) != "null" {
			if n, ok := pyInt(v); !ok || n < 1 {
				return true
			}
		}
	}
	if v, ok := m["min_tokens"]; ok && string(v) != "null" {
		n, ok := pyInt(v)
		if !ok || n < 0 || (maxTokens >= 0 && n > int64(maxTokens)) {
			return true
		}
	}
	v, ok := m["stream_options"]
	return ok && !stream && string(v) != "null" && string(bytes.Join(bytes.Fields(v), nil)) != "{}" // a non-empty object is truthy
}

// kvTransferParams returns the prefill answer's kv_transfer_params object
// verbatim, and its first choice's finish_reason; false when the params
// are missing, null or not an object.
func kvTransferParams(body []byte) (_ json.RawMessage, finish string, _ bool) {
	var m struct {
		KV      json.RawMessage `json:"kv_transfer_params"`
		Choices []struct {
			Finish *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, "", false
	}
	if len(m.Choices) > 0 && m.Choices[0].Finish != nil {
		finish = *m.Choices[0].Finish
	}
	kv := bytes.TrimSpace(m.KV)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, finish, false
	}
	return kv, finish, true
}

// withKVParams is the decode leg's body: the client's request with params
// added verbatim.
func withKVParams(body []byte, params json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("decode body: %w", err)
	}
	m["kv_transfer_params"] = params
	return json.Marshal(m)
}
