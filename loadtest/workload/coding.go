package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Coding is a coding-assistant workload: Users users, each with their own
// repository context (RepoMin..RepoMax tokens) that every turn of the
// user's session repeats first. Sessions start as a Poisson process at
// Rate per second and run TurnsMin..TurnsMax turns, GapMin..GapMax apart
// (uniform; open-loop, as Chat). Each turn after the first is an edit
// with probability EditProb: the context is rewritten from a uniform point
// in its second half on (same length), so the cached tail is invalid, and
// the conversation history, which sits after the context, is dropped.
// Otherwise the history grows by the previous turn's message and answer.
// A prompt is context + history + a new message (MessageMin..MessageMax
// tokens); the answer is OutputMin..OutputMax tokens (all uniform).
//
// The shape: long per-user prefixes reused across a session's turns, which
// a router keeps hitting only by sending the user back to the engine that
// holds them, and which an edit partly invalidates.
type Coding struct {
	// Users is the number of sessions (one per user). Default 48.
	Users int
	// Rate is session starts per second. Default 1.
	Rate float64
	// RepoMin, RepoMax bound a user's repository context. Defaults 20,000
	// and 50,000.
	RepoMin, RepoMax int
	// TurnsMin, TurnsMax bound a session's turns. Defaults 4 and 12.
	TurnsMin, TurnsMax int
	// GapMin, GapMax bound the time between a session's turns. Defaults 5 s
	// and 20 s.
	GapMin, GapMax time.Duration
	// EditProb is a later turn's chance of an edit. Default 0.35 (set a
	// negative value for none).
	EditProb float64
	// MessageMin..MessageMax bound a message, OutputMin..OutputMax an
	// answer. Defaults 50..400 and 100..900.
	MessageMin, MessageMax int
	OutputMin, OutputMax   int
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	// Seed fixes everything.
	Seed uint64
}

// Defaults fills zero fields.
func (c *Coding) Defaults() {
	def(&c.Users, 48)
	deff(&c.Rate, 1)
	def(&c.RepoMin, 20000)
	def(&c.RepoMax, 50000)
	def(&c.TurnsMin, 4)
	def(&c.TurnsMax, 12)
	if c.GapMin == 0 && c.GapMax == 0 {
		c.GapMin, c.GapMax = 5*time.Second, 20*time.Second
	}
	deff(&c.EditProb, 0.35)
	def(&c.MessageMin, 50)
	def(&c.MessageMax, 400)
	def(&c.OutputMin, 100)
	def(&c.OutputMax, 900)
}

// Validate lists every problem (after Defaults).
func (c Coding) Validate() error {
	var errs []error
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"repo", c.RepoMin, c.RepoMax}, {"turns", c.TurnsMin, c.TurnsMax}, {"message", c.MessageMin, c.MessageMax}, {"output", c.OutputMin, c.OutputMax}} {
		if r.lo <= 0 || r.hi < r.lo {
			errs = append(errs, fmt.Errorf("%w: coding %s %d..%d: want 0 < min ≤ max", ErrBadWorkload, r.name, r.lo, r.hi))
		}
	}
	if c.Users <= 0 || !(c.Rate > 0) || c.GapMin < 0 || c.GapMax < c.GapMin || !(c.EditProb <= 1) {
		errs = append(errs, fmt.Errorf("%w: coding users %d > 0, rate %v > 0, gap %v..%v (0 ≤ min ≤ max), edit prob %v ≤ 1",
			ErrBadWorkload, c.Users, c.Rate, c.GapMin, c.GapMax, c.EditProb))
	}
	return errors.Join(errs...)
}

// Generate returns the requests in arrival order.
func (c Coding) Generate() ([]Request, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc0de))
	var reqs []Request
	var start time.Duration
	var err error
	for u := 0; u < c.Users; u++ {
		if start, err = nextStart(start, rng.ExpFloat64()/c.Rate, "coding rate", c.Rate, "session", u); err != nil {
			return nil, err
		}
		id := uint64(u) << 16
		repoLen := uniform(rng, c.RepoMin, c.RepoMax)
		repo := []segment{seg(streamRepo, id, repoLen)}
		segs := repo // context + history; grows in place, as Chat's
		at := start
		for k, turns := 0, uniform(rng, c.TurnsMin, c.TurnsMax); k < turns; k++ {
			if k > 0 {
				at += uniformDur(rng, c.GapMin, c.GapMax)
				if rng.Float64() < c.EditProb {
					cut := uniform(rng, repoLen/2, repoLen-1)
					repo = append(cutSegs(repo, cut), seg(streamEdit, id|uint64(k), repoLen-cut))
					segs = repo[:len(repo):len(repo)]
				}
			}
			segs = append(segs, seg(streamUser, id|uint64(k), uniform(rng, c.MessageMin, c.MessageMax)))
			out := uniform(rng, c.OutputMin, c.OutputMax)
			reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: out, Group: u,
				Session: "u" + strconv.Itoa(u), src: &segSource{seed: c.Seed, segs: segs[:len(segs):len(segs)]}})
			segs = append(segs, seg(streamAnswer, id|uint64(k), out))
		}
	}
	return finish(reqs, c.RateScale, c.Limit)
}
