package scheduler

// Forgetter is an optional capability of a Policy (and of a Scheduler, and
// of a P/D router) that keeps state per engine, such as a record of what it
// routed where: Forget drops everything it keeps of engine, which has left
// the cluster. The ingress calls it once the engine has been out of its
// membership for a grace period with nothing of the ingress's in flight;
// an engine seen again afterwards starts afresh. Called concurrently with
// routing; must not block.
type Forgetter interface {
	Forget(engine string)
}

var _ Forgetter = (*Scheduler)(nil)

// Forget drops engine's state from the policy when it implements
// Forgetter; otherwise it does nothing.
func (s *Scheduler) Forget(engine string) {
	if f, ok := s.policy.(Forgetter); ok {
		f.Forget(engine)
	}
}
