package ingress

// Synced reports the part of Ready that does not depend on the engines'
// health: the index has caught up and the server is not draining. A front
// end whose readiness means "can decide" rather than "an engine is up" (the
// gateway's endpoint picker, which answers 503 with Retry-After itself when
// no engine is healthy) reads this.
func (s *Server) Synced() bool {
	return !s.draining.Load() && (s.deps.Synced == nil || s.deps.Synced())
}

// Leaving marks the start of a front end's drain (the endpoint picker's
// --drain-delay): /ready answers 503 with "draining": true, while requests
// are still decided (Pick) until Close, which the front end calls once it
// stops taking them.
func (s *Server) Leaving() { s.leaving.Store(true) }
