package pd

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// ErrNoOption means no engine (aggregated) and no pair can serve the
// request: every candidate was filtered, or the policy never aggregates and
// no pair exists.
var ErrNoOption = errors.New("pd: no aggregated engine or prefill/decode pair")

// Mode says how a request is served.
type Mode uint8

const (
	// Aggregated: one engine prefills and decodes.
	Aggregated Mode = iota
	// Disaggregated: a prefill engine computes the prompt's KV, the decode
	// engine reads it and decodes.
	Disaggregated
)

// String returns "aggregated" or "disaggregated".
func (m Mode) String() string {
	if m == Disaggregated {
		return "disaggregated"
	}
	return "aggregated"
}

// Option is one way to serve the request, as indexes into View.Cands.
// Prefill is -1 for an aggregated option.
type Option struct {
	Prefill, Decode int
	// Score is the policy's score, higher is better (kvmesh: −cost in
	// seconds).
	Score float64
}

// Aggregated reports whether the option is served by one engine.
func (o Option) Aggregated() bool { return o.Prefill < 0 }

// View is what a Policy sees: the kept candidates (every role), their
// indexes by role, and the option buffer it appends to. Decoders are the
// engines that can decode (decode and mixed); Prefillers the prefill-role
// engines; Mixed the mixed-role ones (a subset of Decoders: engines that
// can serve either leg, as vLLM's kv_role "kv_both"). Pairs are the
// (prefill, decode) index pairs of one group and protocol (SameGroup).
type View struct {
	Cands      []scheduler.Candidate
	Prefillers []int
	Decoders   []int
	Mixed      []int
	Options    []Option

	sub []scheduler.Candidate
}

// SameGroup reports whether prefill engine p and decode engine d may pair:
// the same P/D group, the same P/D protocol (an SGLang prefill server's
// bootstrap room is read only by an SGLang decode engine, NIXL blocks only
// by a NIXL one) and the same KV block size when both are known (vLLM's
// NixlConnector refuses a remote block size other than its own, and the
// decode engine then prefills the prompt again while the prefill engine
// holds blocks nobody reads). An engine whose size is not known yet
// pairs with any.
func (v *View) SameGroup(p, d int) bool {
	cp, cd := &v.Cands[p], &v.Cands[d]
	return cp.Group == cd.Group && cp.PDProtocol == cd.PDProtocol &&
		(cp.BlockSize <= 0 || cd.BlockSize <= 0 || cp.BlockSize == cd.BlockSize)
}

// paired reports whether decode engine d has a prefill-role engine it may
// pair with (SameGroup).
func (v *View) paired(d int) bool {
	for _, p := range v.Prefillers {
		if v.SameGroup(p, d) {
			return true
		}
	}
	return false
}

// Add appends an option.
func (v *View) Add(prefill, decode int, score float64) {
	v.Options = append(v.Options, Option{Prefill: prefill, Decode: decode, Score: score})
}

// Policy scores the options for one request.
//
// Choose appends every option it would accept to v.Options with a score
// (higher is better) and returns a short constant reason for the best one.
// The Router sorts the options (stable, so equal scores keep the order
// appended) and the first becomes the plan. Called concurrently; must not
// block or retain its arguments.
type Policy interface {
	Name() string
	Choose(req *scheduler.Request, v *View, cyc *scheduler.Cycle) string
}

// Recorder is a Policy that keeps state about its own decisions: the
// Router tells it the option it chose (before the request is sent).
type Recorder interface {
	Chosen(req *scheduler.Request, v *View, best Option)
}

// Choice is one ranked option by engine id (Prefill "" = aggregated).
type Choice struct {
	Prefill string
	Decode  string
	Score   float64
	// DecodeMatch and DecodeCached are the decode engine's matched prefix
	// and cached prompt tokens (as Plan's).
	DecodeMatch  index.Match
	DecodeCached int
	// PrefillMatch and PrefillCached are the prefill engine's (zero when
	// aggregated): an ingress that moves a leg to this option's prefill
	// engine charges that engine's load with its own uncached tokens.
	PrefillMatch  index.Match
	PrefillCached int
}

// Plan is a P/D decision. Reuse one per goroutine: Route overwrites it
// without allocating once its slices have grown.
type Plan struct {
	Mode Mode
	// Prefill is the prefill engine ("" when aggregated); Decode serves the
	// request's output (and its prefill when aggregated).
	Prefill, Decode string
	// PrefillMatch and DecodeMatch are the engines' matched prefix depths.
	PrefillMatch, DecodeMatch index.Match
	// PrefillCached and DecodeCached are the prompt tokens each engine
	// already holds (tier-weighted, as scheduler.Candidate.CachedTokens).
	PrefillCached, DecodeCached int
	Policy, Reason              string
	// Options lists every accepted option, best first: the ingress falls
	// back down this list when a leg fails before the first byte.
	Options []Choice
	// Filtered counts engines the scheduler's filters removed.
	Filtered int
}

// Router runs a Policy over a Scheduler's candidates. Safe for concurrent
// use.
type Router struct {
	s *scheduler.Scheduler
	p Policy
}

// NewRouter returns a Router choosing with p among s's candidates.
func NewRouter(s *scheduler.Scheduler, p Policy) (*Router, error) {
	if s == nil || p == nil {
		return nil, fmt.Errorf("pd: new router: %w: nil scheduler or policy", scheduler.ErrConfig)
	}
	return &Router{s: s, p: p}, nil
}

var _ scheduler.Forgetter = (*Router)(nil)

// Forget implements scheduler.Forgetter: engine's state goes from the
// scheduler's policy and from the P/D policy (the KVMesh policy's stall
// ledger, an emulation's routed history).
func (r *Router) Forget(engine string) {
	r.s.Forget(engine)
	if f, ok := r.p.(scheduler.Forgetter); ok {
		f.Forget(engine)
	}
}

// Policy returns the P/D policy's name.
func (r *Router) Policy() string { return r.p.Name() }

// Route decides how req is served among engines and writes the plan.
func (r *Router) Route(req *scheduler.Request, engines []Engine, plan *Plan) error {
	plan.Mode, plan.Prefill, plan.Decode, plan.Policy, plan.Reason = Aggregated, "", "", r.p.Name(), ""
	plan.PrefillMatch, plan.DecodeMatch, plan.PrefillCached, plan.DecodeCached = index.Match{}, index.Match{}, 0, 0
	plan.Options = plan.Options[:0]
	filtered, err := r.s.WithCandidates(req, engines, func(cs []scheduler.Candidate, cyc *scheduler.Cycle) error {
		v := viewPool.Get().(*View)
		defer viewPool.Put(v)
		v.reset(cs)
		reason := r.p.Choose(req, v, cyc)
		if len(v.Options) == 0 {
			return ErrNoOption
		}
		slices.SortStableFunc(v.Options, func(a, b Option) int {
			switch {
			case a.Score > b.Score:
				return -1
			case a.Score < b.Score:
				return 1
			}
			return 0
		})
		for _, o := range v.Options {
			d := &cs[o.Decode]
			c := Choice{Decode: d.ID, Score: o.Score, DecodeMatch: d.Match, DecodeCached: d.CachedTokens}
			if !o.Aggregated() {
				p := &cs[o.Prefill]
				c.Prefill, c.PrefillMatch, c.PrefillCached = p.ID, p.Match, p.CachedTokens
			}
			plan.Options = append(plan.Options, c)
		}
		best := v.Options[0]
		if rec, ok := r.p.(Recorder); ok {
			rec.Chosen(req, v, best)
		}
		d := &cs[best.Decode]
		plan.Decode, plan.DecodeMatch, plan.DecodeCached = d.ID, d.Match, d.CachedTokens
		if !best.Aggregated() {
			p := &cs[best.Prefill]
			plan.Mode, plan.Prefill, plan.PrefillMatch, plan.PrefillCached = Disaggregated, p.ID, p.Match, p.CachedTokens
		}
		plan.Reason = reason
		return nil
	})
	plan.Filtered = filtered
	if errors.Is(err, scheduler.ErrNoCandidates) {
		return fmt.Errorf("pd route: %w: %w", ErrNoOption, err)
	}
	return err
}

// Engine is scheduler.Engine (the same view; Role, Group and PDProtocol
// matter here).
type Engine = scheduler.Engine

func (v *View) reset(cs []scheduler.Candidate) {
	v.Cands = cs
	v.Prefillers, v.Decoders, v.Mixed, v.Options = v.Prefillers[:0], v.Decoders[:0], v.Mixed[:0], v.Options[:0]
	for i := range cs {
		switch cs[i].Role {
		case scheduler.RolePrefill:
			v.Prefillers = append(v.Prefillers, i)
		case scheduler.RoleMixed:
			v.Mixed = append(v.Mixed, i)
			v.Decoders = append(v.Decoders, i)
		default:
			v.Decoders = append(v.Decoders, i)
		}
	}
}

var viewPool = sync.Pool{New: func() any { return new(View) }}

// Sub copies the candidates at idx into the view's scratch slice (valid
// until the next Sub), for reusing a single-engine policy on one role.
func (v *View) Sub(idx []int) []scheduler.Candidate {
	v.sub = v.sub[:0]
	for _, i := range idx {
		v.sub = append(v.sub, v.Cands[i])
	}
	return v.sub
}
