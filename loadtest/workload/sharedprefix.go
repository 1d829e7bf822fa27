package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// SharedPrefix is the synthetic shared-prefix workload used by SGLang's,
// Kthena's and llm-d's router benchmarks: Groups groups of Prompts prompts;
// every prompt of a group starts with the group's Shared tokens and ends
// with its own Question tokens, and asks for Output tokens.
type SharedPrefix struct {
	Groups, Prompts  int
	Shared, Question int
	Output           int
	// Rate is the mean arrival rate in requests/s (Poisson arrivals); 0
	// means every request arrives at time 0 (the client's concurrency limit
	// then paces them).
	Rate float64
	// Seed fixes prompts, the request order and the arrival times.
	Seed uint64
}

// Validate lists every problem.
func (c SharedPrefix) Validate() error {
	var errs []error
	for name, v := range map[string]int{"groups": c.Groups, "prompts": c.Prompts, "output": c.Output} {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%w: %s %d must be > 0", ErrBadWorkload, name, v))
		}
	}
	if c.Shared < 0 || c.Question < 0 || c.Shared+c.Question == 0 {
		errs = append(errs, fmt.Errorf("%w: shared %d and question %d must be ≥ 0 and not both 0", ErrBadWorkload, c.Shared, c.Question))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("%w: rate %v", ErrBadWorkload, c.Rate))
	}
	return errors.Join(errs...)
}

// Generate returns the workload's requests in arrival order. Requests of
// all groups are interleaved in a seeded random order, as the public
// benchmarks shuffle them.
func (c SharedPrefix) Generate() ([]Request, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	n := c.Groups * c.Prompts
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	order := rng.Perm(n)
	src := &sharedSource{cfg: c}
	reqs := make([]Request, n)
	var t float64
	for i, k := range order {
		g, p := k/c.Prompts, k%c.Prompts
		if c.Rate > 0 {
			t += rng.ExpFloat64() / c.Rate
			if t*float64(time.Second) >= math.MaxInt64 {
				return nil, rateOverflow("rate", c.Rate, "request", i, t)
			}
		}
		reqs[i] = Request{
			ID:           i,
			Arrival:      time.Duration(t * float64(time.Second)),
			PromptTokens: c.Shared + c.Question,
			OutputTokens: c.Output,
			Group:        g,
			Session:      "g" + strconv.Itoa(g) + "-p" + strconv.Itoa(p),
			src:          src,
		}
		reqs[i].qid = uint64(k)
	}
	return reqs, nil
}

type sharedSource struct{ cfg SharedPrefix }

func (s *sharedSource) appendPrompt(dst []uint32, r *Request) []uint32 {
	c := s.cfg
	for i := 0; i < c.Shared; i++ {
		dst = append(dst, token(c.Seed, uint64(r.Group)<<1, i))
	}
	for i := 0; i < c.Question; i++ {
		dst = append(dst, token(c.Seed, r.qid<<1|1, i))
	}
	return dst
}
