package ingress

import (
	"context"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/natsrelay"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// stateLane is the ingress's end of the NATS state lane (gossip/natsrelay,
// docs/DESIGN.md Contract 3): it publishes this replica's own gossip
// entries (in-flight loads, shared rate-limit and learned-cost state) and
// merges every member's, so engine load reaches routing straight from the
// sidecars instead of across the gossip mesh. It runs when the replica
// has both gossip and NATS; gossip stays the membership and the fallback.
type stateLane struct {
	pub *natsrelay.Publisher
}

// stateLaneRelay returns the relay for this replica's gossip config: the
// lane's publisher when NATS is configured too, else nil (gossip only).
func (s *Server) stateLaneRelay() gossip.Relay {
	if len(s.cfg.Cluster.NATSURLs) == 0 || s.cfg.Cluster.StateOverNATSOff {
		return nil
	}
	s.cl.lane = &stateLane{pub: natsrelay.NewPublisher(s.log)}
	return s.cl.lane.pub
}

// startStateLane starts publishing on conn (a goroutine owned by the
// cluster: cl.wg, ended by ctx) and subscribes the gossip node to every
// member's entries (the subscription ends when conn closes). A failure
// leaves gossip alone to carry the state, as before the lane.
func (s *Server) startStateLane(ctx context.Context, conn *natsutil.Conn) {
	cl := s.cl
	if cl.lane == nil || cl.node == nil {
		return
	}
	if _, err := cl.lane.pub.Register(s.deps.Registry); err != nil {
		s.log.Warn("state lane: metrics not registered", "err", err)
	}
	cl.wg.Go(func() { cl.lane.pub.Run(ctx, conn.NC) })
	sub, err := natsrelay.Subscribe(conn.NC, cl.node, s.log)
	if err != nil {
		s.log.Error("state lane off: gossip alone carries engine load", "err", err)
		return
	}
	if _, err := sub.Register(s.deps.Registry); err != nil {
		s.log.Warn("state lane: metrics not registered", "err", err)
	}
}
