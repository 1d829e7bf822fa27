package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Stream namespaces of segment token streams: a segment's tokens are
// token(seed, kind<<56|id, i), so a system prompt, a user message and an
// answer with the same id never share tokens.
const (
	streamSystem uint64 = iota + 1
	streamUnique
	streamUser
	streamAnswer
	streamGoal
	streamCall
	streamTool
	streamRepo
	streamEdit
	streamDoc
	streamQuestion
	streamInstruction
	streamOwnDoc
)

// segment is one run of a prompt's tokens: n tokens of one stream.
type segment struct {
	stream uint64
	n      int
}

func seg(kind, id uint64, n int) segment { return segment{stream: kind<<56 | id&(1<<56-1), n: n} }

// segSource is a prompt made of segments. Requests of one conversation
// share the session's segment slice (each a prefix of it), so a thousand
// turns do not hold a thousand copies.
type segSource struct {
	seed uint64
	segs []segment
}

func (s *segSource) appendPrompt(dst []uint32, _ *Request) []uint32 {
	for _, g := range s.segs {
		for i := 0; i < g.n; i++ {
			dst = append(dst, token(s.seed, g.stream, i))
		}
	}
	return dst
}

func segTokens(segs []segment) int {
	n := 0
	for _, g := range segs {
		n += g.n
	}
	return n
}

// around draws an integer uniformly in [mean/2, 3·mean/2], at least 1:
// lengths that vary without a heavy tail, so a short trace is not decided
// by one outlier.
func around(rng *rand.Rand, mean int) int {
	if mean <= 1 {
		return 1
	}
	return max(1, mean/2+rng.IntN(mean+1))
}

// uniform draws an integer uniformly in [lo, hi] (lo ≤ hi).
func uniform(rng *rand.Rand, lo, hi int) int { return lo + rng.IntN(hi-lo+1) }

// uniformDur draws a duration uniformly in [lo, hi] (lo ≤ hi).
func uniformDur(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Float64()*float64(hi-lo))
}

// cutSegs is the first n tokens of segs (n ≤ their total), in a new
// slice: a cut segment keeps its stream, so its tokens are the first n of
// the uncut one's.
func cutSegs(segs []segment, n int) []segment {
	out := make([]segment, 0, len(segs)+1)
	for _, g := range segs {
		if n <= 0 {
			break
		}
		g.n = min(g.n, n)
		n -= g.n
		out = append(out, g)
	}
	return out
}

// expDur draws an exponential duration with the given mean.
func expDur(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// nextStart is start + gap seconds, the gap drawn at rate (named what,
// for the error) before session or task i: an error when the sum passes
// the largest time.Duration, which converted would wrap to a negative
// arrival.
func nextStart(start time.Duration, gap float64, what string, rate float64, item string, i int) (time.Duration, error) {
	ns := gap * float64(time.Second)
	if ns >= math.MaxInt64-float64(start) {
		return 0, rateOverflow(what, rate, item, i, start.Seconds()+gap)
	}
	return start + time.Duration(ns), nil
}

// rateOverflow is the error for an arrival, at secs seconds, of item i
// past the largest time a run can hold (time.Duration's ~292 years): the
// rate named what is too small, likely a unit mistake.
func rateOverflow(what string, rate float64, item string, i int, secs float64) error {
	return fmt.Errorf("%w: %s %v: %s %d would arrive %.3g s (%.0f years) in, past the largest time a run can hold (%.0f years): a rate this small is likely a unit mistake",
		ErrBadWorkload, what, rate, item, i, secs, secs/secondsPerYear, float64(math.MaxInt64)/1e9/secondsPerYear)
}

// secondsPerYear is a Julian year's seconds.
const secondsPerYear = 365.25 * 24 * 3600

// geometric draws a count ≥ 1 with the given mean, capped at 4·mean.
func geometric(rng *rand.Rand, mean float64) int {
	if mean <= 1 {
		return 1
	}
	p := 1 / mean
	n := 1 + int(math.Floor(math.Log(1-rng.Float64())/math.Log(1-p)))
	return min(max(n, 1), int(4*mean))
}

// finish sorts requests by arrival (ties by session, then prompt length:
// a conversation's turns stay in order), divides arrivals by rateScale,
// keeps the first limit (0 = all) and numbers them.
func finish(reqs []Request, rateScale float64, limit int) ([]Request, error) {
	if rateScale == 0 {
		rateScale = 1
	}
	if rateScale < 0 || math.IsNaN(rateScale) || math.IsInf(rateScale, 0) {
		return nil, fmt.Errorf("%w: rate scale %v", ErrBadWorkload, rateScale)
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: limit %d is negative", ErrBadWorkload, limit)
	}
	slices.SortStableFunc(reqs, func(a, b Request) int {
		return cmp.Or(cmp.Compare(a.Arrival, b.Arrival), cmp.Compare(a.Session, b.Session), cmp.Compare(a.PromptTokens, b.PromptTokens))
	})
	if limit > 0 && len(reqs) > limit {
		reqs = reqs[:limit:limit]
	}
	for i := range reqs {
		ns := float64(reqs[i].Arrival) / rateScale
		if ns >= math.MaxInt64 {
			return nil, fmt.Errorf("%w: arrival %v at rate scale %v overflows", ErrBadWorkload, reqs[i].Arrival, rateScale)
		}
		reqs[i].ID = i
		reqs[i].Arrival = time.Duration(ns)
	}
	return reqs, nil
}
