package scheduler

import "fmt"

// WeightedScorer is a scorer with its weight in a Weighted policy.
type WeightedScorer struct {
	Scorer Scorer
	Weight float64
}

// Weighted is the generic scoring policy: the weighted sum of its scorers'
// clamped scores, highest wins, ties broken at random. Most published
// routers (Kthena, llm-d) are instances of it with different scorers and
// weights; Scale multiplies the final score (Kthena reports 0–100).
type Weighted struct {
	PolicyName string
	Scorers    []WeightedScorer
	Scale      float64
}

var _ Policy = (*Weighted)(nil)

// NewWeighted checks and returns a Weighted policy.
func NewWeighted(name string, scorers ...WeightedScorer) (*Weighted, error) {
	if len(scorers) == 0 {
		return nil, fmt.Errorf("policy %s: %w: no scorers", name, ErrConfig)
	}
	for _, s := range scorers {
		if s.Scorer == nil || s.Weight < 0 {
			return nil, fmt.Errorf("policy %s: %w: bad scorer or negative weight", name, ErrConfig)
		}
	}
	return &Weighted{PolicyName: name, Scorers: scorers, Scale: 1}, nil
}

// Name implements Policy.
func (w *Weighted) Name() string { return w.PolicyName }

// Pick implements Policy.
func (w *Weighted) Pick(req *Request, cs []Candidate, cyc *Cycle) (int, string) {
	total := cyc.Floats(0, len(cs))
	for _, ws := range w.Scorers {
		out := cyc.Floats(1, len(cs))
		ws.Scorer.Score(req, cs, out)
		for i, v := range out {
			total[i] += ws.Weight * Clamp01(v)
		}
	}
	scale := w.Scale
	if scale == 0 {
		scale = 1
	}
	for i := range cs {
		cs[i].Score = total[i] * scale
	}
	return ArgMax(cs, cyc), "weighted-score"
}

// Clamp01 clamps v to [0,1]; NaN becomes 0.
func Clamp01(v float64) float64 {
	switch {
	case v > 1:
		return 1
	case v >= 0:
		return v
	default: // negative or NaN
		return 0
	}
}

// ArgMax returns the index of the highest Score, breaking ties uniformly at
// random (reservoir sampling, so no allocation).
func ArgMax(cs []Candidate, cyc *Cycle) int {
	best, n := 0, 0
	for i := range cs {
		switch {
		case i == 0 || cs[i].Score > cs[best].Score:
			best, n = i, 1
		case cs[i].Score == cs[best].Score:
			n++
			if cyc.Intn(n) == 0 {
				best = i
			}
		}
	}
	return best
}

// ArgMin returns the index of the lowest value of f, ties at random.
func ArgMin(cs []Candidate, cyc *Cycle, f func(c *Candidate) float64) int {
	best, n := 0, 0
	bv := 0.0
	for i := range cs {
		v := f(&cs[i])
		switch {
		case i == 0 || v < bv:
			best, n, bv = i, 1, v
		case v == bv:
			n++
			if cyc.Intn(n) == 0 {
				best = i
			}
		}
	}
	return best
}
