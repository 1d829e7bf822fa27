package sidecar

import (
	"context"
	"sync"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/natsrelay"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// startStateLane makes gc publish this sidecar's changed gossip entries
// (its engines' state: load, readiness, adapters, digest) on the NATS state
// lane too, on kvmesh.state.<gossip member name> (gossip/natsrelay,
// docs/DESIGN.md Contract 3), where the ingresses read them within a
// broadcast interval however large the mesh. The sidecar does not
// subscribe: it routes nothing. The publisher's goroutine is owned by Run
// (wg) and ends with ctx.
func (s *Sidecar) startStateLane(ctx context.Context, wg *sync.WaitGroup, gc *gossip.Config, conn *natsutil.Conn) {
	if s.cfg.StateOverNATSOff {
		return
	}
	pub := natsrelay.NewPublisher(s.subj, s.log)
	if _, err := pub.Register(s.reg); err != nil {
		s.log.Warn("state lane: metrics not registered", "err", err)
	}
	gc.Relay = pub
	stopWatch := conn.OnPermissionViolation(pub.PermissionViolation) // a user refused the lane: Run says so and stops
	wg.Add(1)
	go func() { defer wg.Done(); defer stopWatch(); pub.Run(ctx, conn.NC) }()
}
