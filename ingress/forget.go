package ingress

import (
	"cmp"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Forgetting departed engines. Engines come and go: the sidecar webhook
// names each engine after its pod, so every rollout and autoscale step
// brings new ids. What this replica keeps per engine — its upstream
// (connection pool, in-flight and learner counts, recent latency), its
// health record, its P/D admission gate, the learner's lines (its own and
// its peers'), the scheduler's and the P/D policy's own records (routed
// histories, active blocks, the stall ledger) and, without NATS, its slot
// in the prefix index — is dropped here, in one place, once the engine has
// been out of membership for engineForgetGrace and has nothing of this
// replica in flight. An engine back within the grace (a restart under the
// same name, a gossip flap) keeps all of it. The load loop sweeps at most
// every engineForgetEvery; nothing on the request path changes.
const (
	engineForgetGrace = 10 * time.Minute
	engineForgetEvery = 10 * time.Second
)

// departures is when each engine with state here was last a member.
type departures struct {
	mu    sync.Mutex
	now   func() time.Time // nil: time.Now (tests set a fake clock)
	grace time.Duration    // 0: engineForgetGrace
	every time.Duration    // 0: engineForgetEvery
	last  time.Time        // the last sweep
	seen  map[string]time.Time
	infos []EngineInfo // scratch
	ids   []string     // scratch
}

// setClock sets the sweep's clock, grace and period (tests).
func (d *departures) setClock(now func() time.Time, grace, every time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.now, d.grace, d.every = now, grace, every
}

// forgetDeparted drops the state of every engine that has been out of
// membership for the grace period and has nothing in flight. The load loop
// calls it every tick; it sweeps at most every engineForgetEvery.
func (s *Server) forgetDeparted() {
	d := &s.ups.departed
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.now != nil {
		now = d.now()
	}
	if !d.last.IsZero() && now.Sub(d.last) < cmp.Or(d.every, engineForgetEvery) {
		return
	}
	d.last = now
	if d.seen == nil {
		d.seen = make(map[string]time.Time)
	}
	d.infos = s.deps.Membership.Engines(d.infos[:0])
	for i := range d.infos {
		d.seen[d.infos[i].ID] = now
	}
	clear(d.infos)
	// Engines with state but never listed (a peer's learned lines of an
	// engine this replica has not seen) start their grace now.
	d.ids = s.stateEngines(d.ids[:0])
	for _, id := range d.ids {
		if _, ok := d.seen[id]; !ok {
			d.seen[id] = now
		}
	}
	clear(d.ids)
	grace := cmp.Or(d.grace, engineForgetGrace)
	for id, at := range d.seen {
		if now.Sub(at) >= grace && s.forgetEngine(id) {
			delete(d.seen, id)
		}
	}
}

// stateEngines appends the ids of the engines this replica keeps state of
// (maybe repeated).
func (s *Server) stateEngines(dst []string) []string {
	dst = s.ups.ids(dst)
	dst = s.health.ids(dst)
	dst = s.pd.gateIDs(dst)
	if s.learn != nil {
		dst = s.learn.Engines(dst)
	}
	return dst
}

// forgetEngine drops engine id's state, false when it has requests or
// prefill legs of this replica in flight (the next sweep tries again).
func (s *Server) forgetEngine(id string) bool {
	if s.ups.busy(id) || s.pd.busy(id) || !s.ups.forget(id) || !s.pd.forget(id) {
		return false
	}
	s.health.forget(id)
	if s.learn != nil {
		s.learn.Forget(id)
	}
	if f, ok := s.deps.Scheduler.(scheduler.Forgetter); ok {
		f.Forget(id)
	}
	if s.deps.Index != nil && len(s.cfg.Cluster.NATSURLs) == 0 {
		// Only this replica's speculative entries: free the slot (with
		// NATS the materializer clears engines that leave gossip).
		s.deps.Index.ClearEngine(id)
	}
	s.log.Info("forgot a departed engine", "engine", id)
	return true
}
