package scheduler

// WithCandidates runs the framework's part of a decision — the filters and
// one index lookup per engine — and hands the kept candidates (Match, Hit
// and CachedTokens filled) to fn instead of a policy. It is how a step that
// chooses more than one engine (the P/D pair choice in scheduler/pd) stays
// one more scheduler step on the same candidates, weights and filters.
// cs and cyc are valid only during fn; fn must not retain them. It returns
// how many engines the filters removed, and ErrNoCandidates when none is
// left (fn is then not called).
func (s *Scheduler) WithCandidates(req *Request, engines []Engine, fn func(cs []Candidate, cyc *Cycle) error) (filtered int, err error) {
	cyc := s.pool.Get().(*Cycle)
	defer s.pool.Put(cyc)
	kept := s.prepare(req, engines, cyc, &filtered)
	if len(kept) == 0 {
		s.m.noCandidates.Add(1)
		return filtered, ErrNoCandidates
	}
	s.m.decisions.Add(1)
	return filtered, fn(kept, cyc)
}

// Weights returns the tier weights the scheduler applies.
func (s *Scheduler) Weights() TierWeights { return s.weights }
