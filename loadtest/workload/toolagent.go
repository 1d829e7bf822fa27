package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// ToolAgent is a tool-calling agent workload: Families agent families
// (a coding agent, a search agent, ...), each with a long system prompt of
// tool definitions (SystemMin..SystemMax tokens, drawn once per family)
// that every call of the family repeats. Tasks start as a Poisson process
// at Rate per second, pick a family (Zipf: a few families carry most
// tasks) and make Steps calls on average: each call's prompt is the
// previous one + the previous call's output (a short tool call, Call
// tokens) + the tool's result (ToolOut tokens, or LongOut with
// probability LongFrac: a file, a web page, a query result). Calls of a
// task are ToolTime apart (exponential): many short calls with long shared
// prefixes, and now and then a long prompt.
type ToolAgent struct {
	// Tasks is the number of agent tasks. Default 250.
	Tasks int
	// Rate is task starts per second. Default 2.
	Rate float64
	// Families and their system prompt lengths. Defaults 8, 3,000..8,000.
	Families             int
	SystemMin, SystemMax int
	// ZipfS is the family popularity's exponent (> 1). Default 1.2.
	ZipfS float64
	// Steps is the mean calls per task (geometric). Default 6.
	Steps float64
	// Goal is the task's own instructions, Call a call's mean output, ToolOut
	// a short tool result's and LongOut a long one's mean tokens; LongFrac
	// the share of long results. Defaults 200, 60, 150, 6,000, 0.15.
	Goal, Call, ToolOut, LongOut int
	LongFrac                     float64
	// MaxContext ends a task whose next prompt would exceed it. Default 32,768.
	MaxContext int
	// ToolTime is the mean time between a task's calls. Default 2 s.
	ToolTime time.Duration
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	Seed      uint64
}

// Defaults fills zero fields.
func (c *ToolAgent) Defaults() {
	def(&c.Tasks, 250)
	deff(&c.Rate, 2)
	def(&c.Families, 8)
	def(&c.SystemMin, 3000)
	def(&c.SystemMax, 8000)
	deff(&c.ZipfS, 1.2)
	deff(&c.Steps, 6)
	def(&c.Goal, 200)
	def(&c.Call, 60)
	def(&c.ToolOut, 150)
	def(&c.LongOut, 6000)
	deff(&c.LongFrac, 0.15)
	def(&c.MaxContext, 32768)
	if c.ToolTime == 0 {
		c.ToolTime = 2 * time.Second
	}
}

// Validate lists every problem (after Defaults).
func (c ToolAgent) Validate() error {
	var errs []error
	for name, v := range map[string]int{"tasks": c.Tasks, "families": c.Families, "system min": c.SystemMin,
		"goal": c.Goal, "call": c.Call, "tool out": c.ToolOut, "long out": c.LongOut} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%w: tool-agent %s %d must be > 0", ErrBadWorkload, name, v))
		}
	}
	if c.SystemMax < c.SystemMin || c.MaxContext < c.SystemMax+c.Goal {
		errs = append(errs, fmt.Errorf("%w: tool-agent system %d..%d, max context %d", ErrBadWorkload, c.SystemMin, c.SystemMax, c.MaxContext))
	}
	if !(c.Rate > 0) || !(c.Steps >= 1) || !(c.ZipfS > 1) || !(c.LongFrac >= 0 && c.LongFrac <= 1) || c.ToolTime < 0 {
		errs = append(errs, fmt.Errorf("%w: tool-agent rate %v > 0, steps %v ≥ 1, zipf %v > 1, long frac %v in [0,1], tool time %v ≥ 0",
			ErrBadWorkload, c.Rate, c.Steps, c.ZipfS, c.LongFrac, c.ToolTime))
	}
	return errors.Join(errs...)
}

// Generate returns the requests in arrival order.
func (c ToolAgent) Generate() ([]Request, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x7001))
	sys := make([]int, c.Families)
	for i := range sys {
		sys[i] = c.SystemMin + rng.IntN(c.SystemMax-c.SystemMin+1)
	}
	zipf := rand.NewZipf(rng, c.ZipfS, 1, uint64(c.Families-1))
	var reqs []Request
	var start time.Duration
	var err error
	for t := 0; t < c.Tasks; t++ {
		if start, err = nextStart(start, rng.ExpFloat64()/c.Rate, "tool-agent rate", c.Rate, "task", t); err != nil {
			return nil, err
		}
		fam := int(zipf.Uint64())
		steps := geometric(rng, c.Steps)
		id := uint64(t) << 8
		segs := make([]segment, 0, 2+2*steps)
		segs = append(segs, seg(streamSystem, uint64(fam), sys[fam]), seg(streamGoal, id, around(rng, c.Goal)))
		at := start
		for k := 0; k < steps; k++ {
			if k > 0 {
				n := around(rng, c.ToolOut)
				if rng.Float64() < c.LongFrac {
					n = around(rng, c.LongOut)
				}
				if segTokens(segs)+n > c.MaxContext {
					break
				}
				segs = append(segs, seg(streamTool, id|uint64(k), n))
				at += expDur(rng, c.ToolTime)
			}
			out := around(rng, c.Call)
			reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: out, Group: fam,
				Session: "t" + strconv.Itoa(t), src: &segSource{seed: c.Seed, segs: segs[:len(segs):len(segs)]}})
			segs = append(segs, seg(streamCall, id|uint64(k), out))
		}
	}
	return finish(reqs, c.RateScale, c.Limit)
}
