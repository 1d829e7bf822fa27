package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Chat is a multi-turn chat workload: conversations that grow. Sessions
// start as a Poisson process at Rate per second; each opens with one of
// SystemPrompts system prompts (System tokens, shared by every session
// that uses it) and a first user message, and every later turn's prompt is
// the previous prompt + the previous answer + a new user message. Turns
// of a session are Think apart (exponential), so sessions interleave.
//
// The run is open-loop: a turn arrives Think after the previous turn's
// arrival, not after its answer (a DES does not know the answer's time
// before it runs). Engines cache prompt blocks, so the previous answer is
// a cache hit on the next turn only on engines whose cache holds
// generated tokens; the simulator's do not, which makes the answer part a
// miss — what a real router would see with engines that do not cache
// decode blocks.
type Chat struct {
	// Sessions is the number of conversations. Default 300.
	Sessions int
	// Rate is session starts per second. Default 5.
	Rate float64
	// Turns is the mean turns per session (geometric, 1..4·Turns).
	// Default 6.
	Turns float64
	// SystemPrompts system prompts of System tokens. Defaults 4 and 800.
	SystemPrompts, System int
	// FirstUser is the first user message's mean length (often a pasted
	// document), User every later one's, Answer the mean answer (output)
	// length. Defaults 600, 120, 250.
	FirstUser, User, Answer int
	// MaxContext ends a session whose next prompt would exceed it.
	// Default 32,768.
	MaxContext int
	// Think is the mean time between a session's turns. Default 10 s.
	Think time.Duration
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	// Seed fixes everything.
	Seed uint64
}

// Defaults fills zero fields.
func (c *Chat) Defaults() {
	def(&c.Sessions, 300)
	deff(&c.Rate, 5)
	deff(&c.Turns, 6)
	def(&c.SystemPrompts, 4)
	def(&c.System, 800)
	def(&c.FirstUser, 600)
	def(&c.User, 120)
	def(&c.Answer, 250)
	def(&c.MaxContext, 32768)
	if c.Think == 0 {
		c.Think = 10 * time.Second
	}
}

// Validate lists every problem (after Defaults).
func (c Chat) Validate() error {
	var errs []error
	for name, v := range map[string]int{"sessions": c.Sessions, "system prompts": c.SystemPrompts, "system": c.System,
		"first user": c.FirstUser, "user": c.User, "answer": c.Answer, "max context": c.MaxContext} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%w: chat %s %d must be > 0", ErrBadWorkload, name, v))
		}
	}
	if !(c.Rate > 0) || !(c.Turns >= 1) || c.Think < 0 {
		errs = append(errs, fmt.Errorf("%w: chat rate %v must be > 0, turns %v ≥ 1, think %v ≥ 0", ErrBadWorkload, c.Rate, c.Turns, c.Think))
	}
	if c.MaxContext < c.System+c.FirstUser {
		errs = append(errs, fmt.Errorf("%w: chat max context %d below system %d + first user %d", ErrBadWorkload, c.MaxContext, c.System, c.FirstUser))
	}
	return errors.Join(errs...)
}

// Generate returns the requests in arrival order.
func (c Chat) Generate() ([]Request, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc4a7))
	var reqs []Request
	var start time.Duration
	var err error
	for s := 0; s < c.Sessions; s++ {
		if start, err = nextStart(start, rng.ExpFloat64()/c.Rate, "chat rate", c.Rate, "session", s); err != nil {
			return nil, err
		}
		sys := rng.IntN(c.SystemPrompts)
		turns := geometric(rng, c.Turns)
		id := uint64(s) << 8
		segs := make([]segment, 0, 1+2*turns)
		segs = append(segs, seg(streamSystem, uint64(sys), c.System), seg(streamUser, id, around(rng, c.FirstUser)))
		at := start
		for k := 0; k < turns; k++ {
			if k > 0 {
				next := seg(streamUser, id|uint64(k), around(rng, c.User))
				if segTokens(segs)+next.n > c.MaxContext {
					break
				}
				segs = append(segs, next)
				at += expDur(rng, c.Think)
			}
			answer := around(rng, c.Answer)
			reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: answer, Group: sys,
				Session: "c" + strconv.Itoa(s), src: &segSource{seed: c.Seed, segs: segs[:len(segs):len(segs)]}})
			// The answer joins the conversation; the next turn appends
			// after it (segs may grow in place: earlier turns hold
			// capped sub-slices, so they never see later segments).
			segs = append(segs, seg(streamAnswer, id|uint64(k), answer))
		}
	}
	return finish(reqs, c.RateScale, c.Limit)
}

func def(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func deff(p *float64, v float64) {
	if *p == 0 {
		*p = v
	}
}
