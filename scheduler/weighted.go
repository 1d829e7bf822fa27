package scheduler

import (
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

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

// ScorerConfig is one scorer of a weighted policy's block: a registered
// scorer's name and its weight (> 0).
type ScorerConfig struct {
	Name   string  `yaml:"name"`
	Weight float64 `yaml:"weight"`
}

// WeightedConfig is the block of a weighted policy: its scorers (at least
// one).
type WeightedConfig []ScorerConfig

// validate lists every problem, with the scorer names p knows.
func (w WeightedConfig) validate(name string, p *Plugins) error {
	probs := NewProblems(name)
	if len(w) == 0 {
		probs.Addf("", "needs at least one scorer (it has none by default): list them under %s: in a SchedulerConfig file (kvmesh ingress --scheduler-config, or --config's scheduler: block), as scheduler/testdata/scheduler.yaml does", name)
	}
	for i, s := range w {
		if _, ok := p.Scorer(s.Name); !ok {
			probs.Addf(fmt.Sprintf("[%d].name", i), "%q is unknown (one of %v)", s.Name, p.ScorerNames())
		}
		probs.Positive(fmt.Sprintf("[%d].weight", i), s.Weight)
	}
	return joinErrs(probs.Errs())
}

// WeightedFactory is the PolicyFactory of the generic weighted policy over
// p's scorers: its block is a list of {name, weight}.
func (p *Plugins) WeightedFactory(name string, params *yaml.Node) (Policy, error) {
	var w WeightedConfig
	err := errors.Join(DecodeParams(params, &w), w.validate(name, p))
	if err != nil {
		return nil, err
	}
	ws := make([]WeightedScorer, len(w))
	for i, s := range w {
		sc, _ := p.Scorer(s.Name)
		ws[i] = WeightedScorer{Scorer: sc, Weight: s.Weight}
	}
	return NewWeighted(name, ws...)
}
