package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Mix is two products on one pool: Requests requests, Poisson at Rate per
// second, a LongFrac share of them long-document summaries (a shared
// Instruction, then the request's own document of LongMin..LongMax tokens;
// LongOutMin..LongOutMax answer tokens, uniform) and the rest short chat
// (one of SystemPrompts system prompts of System tokens, uniformly, then a
// UserMin..UserMax-token message; a log-normal answer of median
// ChatOutMedian and log-sd ChatOutSigma, capped at ChatOutCap).
//
// The shape: a few long prefills with nothing to reuse beside many short
// requests with hot prefixes, on the same engines.
type Mix struct {
	// Requests is the number of requests. Default 1,000.
	Requests int
	// Rate is requests per second. Default 12.
	Rate float64
	// LongFrac is the share of long summaries. Default 0.15 (set a
	// negative value for none).
	LongFrac float64
	// Instruction is the summaries' shared instruction, LongMin..LongMax
	// their documents', LongOutMin..LongOutMax their answers' tokens.
	// Defaults 256, 8,000..28,000, 200..700.
	Instruction            int
	LongMin, LongMax       int
	LongOutMin, LongOutMax int
	// SystemPrompts chat system prompts of System tokens, UserMin..UserMax
	// a chat message's tokens. Defaults 4, 600, 64..600.
	SystemPrompts, System int
	UserMin, UserMax      int
	// ChatOutMedian, ChatOutSigma and ChatOutCap shape a chat answer.
	// Defaults 120, 0.9, 2,500.
	ChatOutMedian int
	ChatOutSigma  float64
	ChatOutCap    int
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	// Seed fixes everything.
	Seed uint64
}

// Defaults fills zero fields.
func (c *Mix) Defaults() {
	def(&c.Requests, 1000)
	deff(&c.Rate, 12)
	deff(&c.LongFrac, 0.15)
	def(&c.Instruction, 256)
	def(&c.LongMin, 8000)
	def(&c.LongMax, 28000)
	def(&c.LongOutMin, 200)
	def(&c.LongOutMax, 700)
	def(&c.SystemPrompts, 4)
	def(&c.System, 600)
	def(&c.UserMin, 64)
	def(&c.UserMax, 600)
	def(&c.ChatOutMedian, 120)
	deff(&c.ChatOutSigma, 0.9)
	def(&c.ChatOutCap, 2500)
}

// Validate lists every problem (after Defaults).
func (c Mix) Validate() error {
	var errs []error
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"long", c.LongMin, c.LongMax}, {"long out", c.LongOutMin, c.LongOutMax}, {"user", c.UserMin, c.UserMax}, {"chat out median..cap", c.ChatOutMedian, c.ChatOutCap}} {
		if r.lo <= 0 || r.hi < r.lo {
			errs = append(errs, fmt.Errorf("%w: mix %s %d..%d: want 0 < min ≤ max", ErrBadWorkload, r.name, r.lo, r.hi))
		}
	}
	if c.Requests <= 0 || c.Instruction <= 0 || c.SystemPrompts <= 0 || c.System <= 0 || !(c.Rate > 0) ||
		!(c.LongFrac <= 1) || !(c.ChatOutSigma >= 0) {
		errs = append(errs, fmt.Errorf("%w: mix requests %d, instruction %d, system prompts %d, system %d (each > 0), rate %v > 0, long frac %v ≤ 1, chat out sigma %v ≥ 0",
			ErrBadWorkload, c.Requests, c.Instruction, c.SystemPrompts, c.System, c.Rate, c.LongFrac, c.ChatOutSigma))
	}
	return errors.Join(errs...)
}

// Generate returns the requests in arrival order. A summary's Group is
// SystemPrompts (the instruction); a chat request's its system prompt.
func (c Mix) Generate() ([]Request, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x313))
	mu := math.Log(float64(c.ChatOutMedian))
	reqs := make([]Request, 0, c.Requests)
	var at time.Duration
	var err error
	for i := 0; i < c.Requests; i++ {
		if at, err = nextStart(at, rng.ExpFloat64()/c.Rate, "mix rate", c.Rate, "request", i); err != nil {
			return nil, err
		}
		var segs []segment
		var out, group int
		if rng.Float64() < c.LongFrac {
			group = c.SystemPrompts
			segs = []segment{seg(streamInstruction, 0, c.Instruction), seg(streamOwnDoc, uint64(i), uniform(rng, c.LongMin, c.LongMax))}
			out = uniform(rng, c.LongOutMin, c.LongOutMax)
		} else {
			group = rng.IntN(c.SystemPrompts)
			segs = []segment{seg(streamSystem, uint64(group), c.System), seg(streamUser, uint64(i), uniform(rng, c.UserMin, c.UserMax))}
			out = min(max(int(math.Exp(mu+c.ChatOutSigma*rng.NormFloat64())), 1), c.ChatOutCap)
		}
		reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: out, Group: group,
			Session: "m" + strconv.Itoa(i), src: &segSource{seed: c.Seed, segs: segs}})
	}
	return finish(reqs, c.RateScale, c.Limit)
}
