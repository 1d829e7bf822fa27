package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/index"
)

// Sentinel errors.
var (
	// ErrNoCandidates means every engine was filtered out (or none exist).
	ErrNoCandidates = errors.New("scheduler: no candidate engine")
	// ErrConfig wraps every configuration problem. Its text names no
	// package: the callers say which configuration it is ("scheduler: ",
	// "--scheduler-config: "), so the message does not say it twice.
	ErrConfig = errors.New("invalid config")
)

// PrefixIndex is the index view the scheduler reads. *index.Index
// implements it. LookupFor must be safe for concurrent use and write one
// Match per engine id into out (zero for unknown engines).
type PrefixIndex interface {
	LookupFor(keys []uint64, engines []string, res *index.Result, out []index.Match)
}

var _ PrefixIndex = (*index.Index)(nil)

// TierWeights weigh matched blocks by where they live: a CPU-tier block
// must be copied back, so it saves less than a GPU one.
type TierWeights struct {
	GPU, CPU, Other, Speculative float64
}

// DefaultTierWeights are GPU 1.0, CPU 0.8, other 0.5, speculative 0.9
// (speculative blocks are being computed now on the engine's GPU).
func DefaultTierWeights() TierWeights {
	return TierWeights{GPU: 1.0, CPU: 0.8, Other: 0.5, Speculative: 0.9}
}

// Weighted is a matched-block count weighted by tier.
func (w TierWeights) Weighted(m index.Match) float64 {
	return w.GPU*float64(m.GPU) + w.CPU*float64(m.CPU-m.GPU) +
		w.Other*float64(m.Other-m.CPU) + w.Speculative*float64(m.Spec-m.Other)
}

// Scheduler runs filters and a policy for each request. Safe for
// concurrent use; per-call scratch comes from a pool.
type Scheduler struct {
	filters []Filter
	policy  Policy
	idx     PrefixIndex
	weights TierWeights
	seed    uint64
	seq     atomic.Uint64
	log     *slog.Logger
	pool    sync.Pool // *Cycle
	m       metrics
}

// Options are the framework-level settings of a Scheduler.
type Options struct {
	TierWeights TierWeights
	Seed        uint64       // random stream seed (deterministic runs)
	Logger      *slog.Logger // nil: slog.Default(); decisions log at Debug
}

// New assembles a Scheduler. idx may be nil (no prefix information).
func New(filters []Filter, policy Policy, idx PrefixIndex, opt Options) (*Scheduler, error) {
	if policy == nil {
		return nil, fmt.Errorf("new scheduler: %w: no policy", ErrConfig)
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Scheduler{filters: filters, policy: policy, idx: idx, weights: opt.TierWeights, seed: opt.Seed, log: opt.Logger}
	s.pool.New = func() any { return &Cycle{} }
	return s, nil
}

// Policy returns the policy's name.
func (s *Scheduler) Policy() string { return s.policy.Name() }

// Cycle is one scheduling call's scratch space and random stream. Plugins
// may use the float buffers (Floats) and Rand during the call only.
type Cycle struct {
	cands []Candidate
	ids   []string
	match []index.Match
	res   index.Result
	// Request.Chains: the engines of one chain's size, their places in
	// the candidates, and their matches.
	sub      []string
	at       []int
	subMatch []index.Match
	floats   [4][]float64
	rng      uint64
}

// Rand returns the next value of the call's deterministic random stream
// (splitmix64 seeded from the scheduler seed and call number).
func (c *Cycle) Rand() uint64 {
	c.rng += 0x9E3779B97F4A7C15
	z := c.rng
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Intn returns a random int in [0,n).
func (c *Cycle) Intn(n int) int { return int(c.Rand() % uint64(n)) }

// Float returns a random float in [0,1).
func (c *Cycle) Float() float64 { return float64(c.Rand()>>11) / (1 << 53) }

// Floats returns scratch buffer i (0..3) resized to n and zeroed.
func (c *Cycle) Floats(i, n int) []float64 {
	b := c.floats[i]
	if cap(b) < n {
		b = make([]float64, n)
	}
	b = b[:n]
	clear(b)
	c.floats[i] = b
	return b
}

// Schedule filters engines, looks up the request's prefix on each, runs the
// policy and writes the ranked result into d.
func (s *Scheduler) Schedule(req *Request, engines []Engine, d *Decision) error {
	cyc := s.pool.Get().(*Cycle)
	defer s.pool.Put(cyc)
	d.Engine, d.Policy, d.Reason, d.Filtered = "", s.policy.Name(), "", 0
	d.Ranked = d.Ranked[:0]
	kept := s.prepare(req, engines, cyc, &d.Filtered)
	if len(kept) == 0 {
		s.m.noCandidates.Add(1)
		return ErrNoCandidates
	}
	pick, reason := s.policy.Pick(req, kept, cyc)
	if pick < 0 || pick >= len(kept) {
		return fmt.Errorf("schedule: policy %s picked %d of %d", s.policy.Name(), pick, len(kept))
	}
	kept[0], kept[pick] = kept[pick], kept[0]
	rest := kept[1:]
	slices.SortStableFunc(rest, func(a, b Candidate) int {
		switch {
		case a.Score > b.Score:
			return -1
		case a.Score < b.Score:
			return 1
		}
		return 0
	})
	offered := 0.0
	for _, c := range kept {
		d.Ranked = append(d.Ranked, EngineScore{Engine: c.ID, Score: c.Score, Match: c.Match, MatchBlock: c.MatchBlock, Hit: c.Hit})
		offered = max(offered, s.reqBlocks(req, &c))
	}
	d.Engine, d.Reason = kept[0].ID, reason
	s.m.decisions.Add(1)
	s.m.requestBlocks.Add(uint64(len(req.Keys)))
	s.m.matchedBlocks.Add(uint64(s.reqBlocks(req, &kept[0]) + 0.5))
	s.m.offeredBlocks.Add(uint64(offered + 0.5))
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("schedule", "policy", d.Policy, "engine", d.Engine, "reason", reason,
			"hit", kept[0].Hit, "candidates", len(kept), "filtered", d.Filtered)
	}
	return nil
}

// prepare seeds the cycle's random stream, looks the request's prefix up on
// every engine, fills each candidate's Match, Hit and CachedTokens and
// returns those the filters keep (cycle scratch, valid until cyc is reused).
func (s *Scheduler) prepare(req *Request, engines []Engine, cyc *Cycle, filtered *int) []Candidate {
	cyc.rng = s.seed ^ (s.seq.Add(1) * 0xD1B54A32D192ED03)
	cs := cyc.cands[:0]
	ids := cyc.ids[:0]
	for i := range engines {
		cs = append(cs, Candidate{Engine: &engines[i]})
		ids = append(ids, engines[i].ID)
	}
	if cap(cyc.match) < len(ids) {
		cyc.match = make([]index.Match, len(ids))
	}
	match := cyc.match[:len(ids)]
	switch {
	case s.idx != nil && len(req.Chains) > 0:
		s.lookupChains(req, engines, cyc, match)
	case s.idx != nil && len(req.Keys) > 0:
		s.idx.LookupFor(req.Keys, ids, &cyc.res, match)
	default:
		clear(match)
	}
	blocks := float64(req.Blocks())
	bs := req.BlockSize
	kept := cs[:0]
	for i := range cs {
		c := &cs[i]
		c.Match = match[i]
		if len(req.Chains) > 0 {
			// Engines of several block sizes: each one's share of its own
			// chain, and its blocks' tokens.
			var keys []uint64
			bs, keys, _ = req.chainFor(c.Engine)
			blocks = float64(max(1, len(keys)))
		}
		c.MatchBlock = bs
		w := s.weights.Weighted(c.Match)
		c.Hit = math.Min(1, w/blocks)
		c.CachedTokens = int(w * float64(bs))
		if !s.keep(req, c) {
			*filtered++
			continue
		}
		kept = append(kept, *c)
	}
	cyc.cands, cyc.ids = cs[:0], ids[:0]
	s.m.filtered.Add(uint64(*filtered))
	return kept
}

// lookupChains looks each engine up with the chain of its block size
// (Request.Chains): one index lookup per chain, over the engines of its
// size. An engine whose size has no chain matches nothing.
func (s *Scheduler) lookupChains(req *Request, engines []Engine, cyc *Cycle, match []index.Match) {
	clear(match)
	for ch := -1; ch < len(req.Chains); ch++ {
		bs, keys := req.BlockSize, req.Keys
		if ch >= 0 {
			bs, keys = req.Chains[ch].BlockSize, req.Chains[ch].Keys
		}
		if len(keys) == 0 {
			continue
		}
		sub, at := cyc.sub[:0], cyc.at[:0]
		for i := range engines {
			if b, _, ok := req.chainFor(&engines[i]); ok && b == bs {
				sub, at = append(sub, engines[i].ID), append(at, i)
			}
		}
		cyc.sub, cyc.at = sub[:0], at[:0]
		if len(sub) == 0 {
			continue
		}
		if cap(cyc.subMatch) < len(sub) {
			cyc.subMatch = make([]index.Match, len(sub))
		}
		out := cyc.subMatch[:len(sub)]
		s.idx.LookupFor(keys, sub, &cyc.res, out)
		for j, i := range at {
			match[i] = out[j]
		}
	}
}

// reqBlocks is candidate c's tier-weighted match in blocks of the
// request's BlockSize (the decision metrics'), whatever its own size.
func (s *Scheduler) reqBlocks(req *Request, c *Candidate) float64 {
	return c.InRequestBlocks(req, s.weights.Weighted(c.Match))
}

func (s *Scheduler) keep(req *Request, c *Candidate) bool {
	for _, f := range s.filters {
		if !f.Keep(req, c) {
			return false
		}
	}
	return true
}

// Close closes every plugin that holds resources. Idempotent.
func (s *Scheduler) Close() error {
	var errs []error
	for _, f := range s.filters {
		if c, ok := f.(Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	if c, ok := s.policy.(Closer); ok {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
