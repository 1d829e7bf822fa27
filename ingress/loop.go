package ingress

import (
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// Routing loops. An engine URL that points at a kvmesh ingress (a sidecar's
// --engine-url set to the ingress's port in its pod, a Service name that
// selects ingresses) would make an ingress proxy requests to itself or to
// another ingress, which routes them again: one client request recursed
// until the ingress's concurrency limit, and the client got a 429 naming
// the "engine". The ingress's /v1/models lists the model and its /health
// answers, so neither the sidecar nor the probe could tell.
//
// So every request an ingress sends upstream (proxy attempts, P/D legs,
// /tokenize, stored responses: putUpstreamHeaders; its health probes:
// health.go) carries hopHeader with its id, and an ingress answers any
// request carrying it, on any path of its client listener, at once with
// 508 Loop Detected (refuseLoop): before authentication, admission and
// routing, so the loop is one hop deep. A client that sends the header is
// refused the same way: a kvmesh ingress is not chained behind another.
// The sending ingress reads the 508 (loopAnswer) as an attempt failure
// (result routing_loop), tries the next engine before the first byte, and
// ejects the "engine"; its probes, which carry the header too, get the 508
// from /health, so it stays out until its URL is an engine's.

const (
	// hopHeader carries the sending ingress's id on upstream requests.
	hopHeader = "X-Kvmesh-Hop"
	// ingressHeader marks a kvmesh ingress's 508 refusing a loop, with
	// ingressMark: not its id, which a client sending the hop header would
	// learn before any authentication.
	ingressHeader = "X-Kvmesh-Ingress"
	ingressMark   = "routing-loop"
	// loopResult is the attempt result, and the 508's error code.
	loopResult = "routing_loop"
	// loopLogEvery spaces the warnings of refused loops.
	loopLogEvery = 10 * time.Second
)

// ErrRoutingLoop: a request reached a kvmesh ingress as if it were an
// engine (it carried hopHeader), or an "engine" answered that it is one.
var ErrRoutingLoop = errors.New("routing loop")

// refuseLoop answers a request carrying hopHeader with 508 Loop Detected
// and reports true; false (nothing written) for any other request. It
// counts the refusal, writes the access line and warns (at most once per
// loopLogEvery).
func (s *Server) refuseLoop(ctx *fasthttp.RequestCtx) bool {
	from := ctx.Request.Header.Peek(hopHeader)
	if len(from) == 0 {
		return false
	}
	start := time.Now()
	s.m.loops.Inc()
	sender := "kvmesh ingress " + clipBytes(from)
	if string(from) == s.cfg.ID {
		sender = "this kvmesh ingress itself"
	}
	// The answer names no id of this ingress (only the sender's, which the
	// request carried): any client may send the header.
	err := fmt.Errorf("%w: a kvmesh ingress got a request from %s (%s header): an engine URL points at a kvmesh ingress, not at an engine (check that engine's sidecar --engine-url); an ingress routes no request that carries %s",
		ErrRoutingLoop, sender, hopHeader, hopHeader)
	ae := writeError(ctx, newAPIError(fasthttp.StatusLoopDetected, "server_error", loopResult, "", err))
	ctx.Response.Header.Set(ingressHeader, ingressMark)
	if now, last := monotime.Now(), s.loopLastLog.Load(); (last == 0 || now-last >= int64(loopLogEvery)) && s.loopLastLog.CompareAndSwap(last, now) {
		s.log.Warn("refused a request carrying "+hopHeader+" with 508 Loop Detected: an engine URL points at this or another kvmesh ingress (check the sidecars' --engine-url), or a client sent the header; later refusals within 10s are only counted (kvmesh_ingress_routing_loops_total)",
			"from", clipBytes(from), "path", clipBytes(ctx.Path()))
	}
	s.finishOther(ctx, loopResult, start, ae) // otherlog.go
	return true
}

// loopAnswer returns the mark of a kvmesh ingress's 508 refusing a routing
// loop (refuseLoop); "" for any other answer.
func loopAnswer(resp *fasthttp.Response) string {
	if resp.StatusCode() != fasthttp.StatusLoopDetected {
		return ""
	}
	return clipBytes(resp.Header.Peek(ingressHeader))
}

// routingLoop ends an attempt whose "engine" is a kvmesh ingress (resp is
// its 508: loopAnswer): the attempt fails with result routing_loop, before
// any byte reached the client, so the next engine is tried; the engine is
// ejected (ejector.routingLoop) and its pooled connections closed.
func (c *call) routingLoop(up *upstream, resp *fasthttp.Response) error {
	cause := fmt.Errorf("%w: engine %s is a kvmesh ingress (it answered 508 Loop Detected), not an engine: check its sidecar's --engine-url",
		ErrRoutingLoop, up.id)
	err := c.attemptFailed(up, resp, loopResult, cause)
	c.s.loopedEngine(up)
	return err
}

// loopedEngine ejects up, a kvmesh ingress (it answered a 508 refusing a
// loop), and closes its pooled connections (its answer's connection
// released); the P/D legs call it too.
func (s *Server) loopedEngine(up *upstream) {
	if !s.health.routingLoop(up) { // passive ejection off: warn here
		if now, last := monotime.Now(), s.loopSentLog.Load(); (last == 0 || now-last >= int64(loopLogEvery)) && s.loopSentLog.CompareAndSwap(last, now) {
			s.log.Warn("engine is a kvmesh ingress, not an engine (it answered 508 Loop Detected): check its sidecar's --engine-url; kept in routing, as passive ejection is off",
				"engine", up.id, "url", up.url)
		}
	}
	up.hc.CloseIdleConnections()
}
