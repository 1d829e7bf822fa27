package scheduler

// Filter removes engines that cannot serve a request.
//
// Keep is called concurrently from many request goroutines for the same
// Filter value: it must be safe for concurrent use, must not block and must
// not retain req or c.
type Filter interface {
	Name() string
	Keep(req *Request, c *Candidate) bool
}

// Scorer rates every candidate for a request.
//
// Score writes one score per candidate into out (len(out) == len(cs)); 1 is
// best, 0 worst. The framework clamps to [0,1] and applies the configured
// weight, so a scorer never needs to. Called concurrently; must not block,
// allocate per call, or retain its arguments.
type Scorer interface {
	Name() string
	Score(req *Request, cs []Candidate, out []float64)
}

// Policy picks one engine. Pick sets every candidate's Score (higher is
// better; the policy's own scale) so the framework can rank fallbacks, and
// returns the chosen index and a short constant reason. cs is never empty.
// Called concurrently; implementations keep only atomic or locked state.
type Policy interface {
	Name() string
	Pick(req *Request, cs []Candidate, cyc *Cycle) (int, string)
}

// Closer is an optional capability: plugins holding resources implement it
// and Scheduler.Close calls it.
type Closer interface {
	Close() error
}
