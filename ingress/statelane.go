package ingress

import (
	"context"
	"strings"

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
	subj, _ := s.cfg.Cluster.NATSAuth.Subjects() // valid: Config.Validate checked the prefix
	s.cl.lane = &stateLane{pub: natsrelay.NewPublisher(subj, s.log)}
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
	// Each watcher is told before its subject is used, so no refusal goes
	// unseen, and lives as long as what it watches: the publisher's as
	// long as Run, the subscription's until its check ends.
	stopPubWatch := conn.OnPermissionViolation(cl.lane.pub.PermissionViolation)
	cl.wg.Go(func() {
		defer stopPubWatch()
		cl.lane.pub.Run(ctx, conn.NC)
	})
	refused := make(chan error, 1)
	stopWatch := conn.OnPermissionViolation(func(err error) {
		if strings.Contains(err.Error(), "Subscription to \""+conn.Subjects.StateWildcard()+"\"") {
			select {
			case refused <- err:
			default: // one is pending already
			}
		}
	})
	sub, err := natsrelay.Subscribe(conn.NC, conn.Subjects, cl.node, s.log)
	if err != nil {
		stopWatch()
		s.log.Error("state lane off: gossip alone carries engine load", "err", err)
		return
	}
	if _, err := sub.Register(s.deps.Registry); err != nil {
		s.log.Warn("state lane: metrics not registered", "err", err)
	}
	cl.wg.Go(func() {
		defer stopWatch()
		s.watchLaneSubscription(ctx, sub, conn.Subjects.StateWildcard(), refused)
	})
}

// watchLaneSubscription says so when the server refused the lane's
// subscription (a NATS user whose permissions predate the lane: a half
// applied upgrade), whenever that happens: NATS refuses a subscription
// asynchronously, when it is first sent (the ingress may start before
// NATS) or sent again after a reconnect. It ends at the first refusal or
// with ctx.
func (s *Server) watchLaneSubscription(ctx context.Context, sub *natsrelay.Subscription, wildcard string, refused <-chan error) {
	select {
	case <-ctx.Done():
	case err := <-refused:
		_ = sub.Unsubscribe()
		s.log.Error("state lane off: the NATS user may not subscribe to "+wildcard+"; allow it (manifests/base/nats.yaml) and restart, or turn the lane off; gossip alone carries engine load meanwhile", "err", err)
	}
}
