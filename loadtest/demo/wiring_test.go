package demo

import (
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/ingress/session"
)

// The demo engineer's packages plug into the ingress's Deps interfaces as they are.
var (
	_ ingress.Authenticator = (*auth.Store)(nil)
	_ ingress.RateLimiter   = (*ratelimit.Limiter)(nil)
	_ ingress.Affinity      = (*session.Affinity)(nil)
	_ ingress.Admitter      = (*session.Admitter)(nil)
)
