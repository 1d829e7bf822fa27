package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// RAG is a retrieval-augmented generation workload: Requests requests,
// Poisson at Rate per second, each one shared system prompt (System
// tokens), then PerMin..PerMax distinct documents drawn from a pool of
// Docs (popularity Zipf with exponent ZipfS; each document DocMin..DocMax
// tokens, drawn once) in random order, then a question of
// QuestionMin..QuestionMax tokens; the answer is OutputMin..OutputMax
// tokens (all uniform).
//
// The shape: popular documents recur, but in a different order each time,
// so a prefix cache reuses the system prompt and at most the first
// document; the rest is recomputed wherever the request goes.
type RAG struct {
	// Requests is the number of requests. Default 900.
	Requests int
	// Rate is requests per second. Default 16.
	Rate float64
	// System is the shared system prompt's tokens. Default 320.
	System int
	// Docs is the pool's size, DocMin..DocMax a document's tokens, ZipfS
	// the popularity exponent (> 1). Defaults 3,000, 512..1,536, 1.1.
	Docs           int
	DocMin, DocMax int
	ZipfS          float64
	// PerMin..PerMax bound the documents per request. Defaults 3..6.
	PerMin, PerMax int
	// QuestionMin..QuestionMax bound the question, OutputMin..OutputMax
	// the answer. Defaults 32..160 and 40..400.
	QuestionMin, QuestionMax int
	OutputMin, OutputMax     int
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	// Seed fixes everything.
	Seed uint64
}

// Defaults fills zero fields.
func (c *RAG) Defaults() {
	def(&c.Requests, 900)
	deff(&c.Rate, 16)
	def(&c.System, 320)
	def(&c.Docs, 3000)
	def(&c.DocMin, 512)
	def(&c.DocMax, 1536)
	deff(&c.ZipfS, 1.1)
	def(&c.PerMin, 3)
	def(&c.PerMax, 6)
	def(&c.QuestionMin, 32)
	def(&c.QuestionMax, 160)
	def(&c.OutputMin, 40)
	def(&c.OutputMax, 400)
}

// Validate lists every problem (after Defaults).
func (c RAG) Validate() error {
	var errs []error
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"doc", c.DocMin, c.DocMax}, {"per request", c.PerMin, c.PerMax}, {"question", c.QuestionMin, c.QuestionMax}, {"output", c.OutputMin, c.OutputMax}} {
		if r.lo <= 0 || r.hi < r.lo {
			errs = append(errs, fmt.Errorf("%w: rag %s %d..%d: want 0 < min ≤ max", ErrBadWorkload, r.name, r.lo, r.hi))
		}
	}
	if c.Requests <= 0 || c.System <= 0 || c.Docs < c.PerMax || !(c.Rate > 0) || !(c.ZipfS > 1) {
		errs = append(errs, fmt.Errorf("%w: rag requests %d > 0, system %d > 0, docs %d ≥ per request max %d, rate %v > 0, zipf %v > 1",
			ErrBadWorkload, c.Requests, c.System, c.Docs, c.PerMax, c.Rate, c.ZipfS))
	}
	return errors.Join(errs...)
}

// Generate returns the requests in arrival order.
func (c RAG) Generate() ([]Request, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x4a6))
	docs := make([]int, c.Docs)
	for i := range docs {
		docs[i] = uniform(rng, c.DocMin, c.DocMax)
	}
	zipf := rand.NewZipf(rng, c.ZipfS, 1, uint64(c.Docs-1))
	reqs := make([]Request, 0, c.Requests)
	var at time.Duration
	var err error
	chosen := make([]int, 0, c.PerMax)
	for i := 0; i < c.Requests; i++ {
		if at, err = nextStart(at, rng.ExpFloat64()/c.Rate, "rag rate", c.Rate, "request", i); err != nil {
			return nil, err
		}
		chosen = chosen[:0]
		for k := uniform(rng, c.PerMin, c.PerMax); len(chosen) < k; {
			if d := int(zipf.Uint64()); !slices.Contains(chosen, d) {
				chosen = append(chosen, d)
			}
		}
		rng.Shuffle(len(chosen), func(a, b int) { chosen[a], chosen[b] = chosen[b], chosen[a] })
		segs := make([]segment, 0, len(chosen)+2)
		segs = append(segs, seg(streamSystem, 0, c.System))
		for _, d := range chosen {
			segs = append(segs, seg(streamDoc, uint64(d), docs[d]))
		}
		segs = append(segs, seg(streamQuestion, uint64(i), uniform(rng, c.QuestionMin, c.QuestionMax)))
		reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: uniform(rng, c.OutputMin, c.OutputMax),
			Group: chosen[0], Session: "r" + strconv.Itoa(i), src: &segSource{seed: c.Seed, segs: segs}})
	}
	return finish(reqs, c.RateScale, c.Limit)
}
