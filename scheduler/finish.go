package scheduler

// Finisher is an optional capability of a Policy that keeps its own record
// of the requests it routed (Dynamo's active sequences): the caller reports
// each request's end with the engine the policy picked and the prompt's
// keys, exactly as they were passed to Pick. Called concurrently; must not
// block.
type Finisher interface {
	Finished(engine string, keys []uint64)
}

// Finished reports the end of a request the policy routed to engine with
// the given prompt keys, to a policy that implements Finisher; otherwise it
// does nothing. The ingress calls it once per scheduled request.
func (s *Scheduler) Finished(engine string, keys []uint64) {
	if f, ok := s.policy.(Finisher); ok {
		f.Finished(engine, keys)
	}
}
