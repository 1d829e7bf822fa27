package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// ErrEngineIDTaken is returned by Run when another gossip member serves one
// of this sidecar's engine ids at another URL and keeps answering there as
// that engine for Config.EngineIDWait.
var ErrEngineIDTaken = errors.New("engine id taken")

// engineIDRecheck spaces the checks of an engine id held by another member.
const engineIDRecheck = 500 * time.Millisecond

// engineIDProbeTimeout bounds one probe of the holder's URL. A timeout
// proves nothing (a dead pod's address, or a NetworkPolicy that lets only the
// ingresses reach the engines): the sidecar keeps waiting.
const engineIDProbeTimeout = 2 * time.Second

// engineIDsFree waits, before this sidecar gossips, until no other live
// member serves one of its engine ids at another URL: two engines under one
// id would each replace the other's index and load in every ingress (a
// copied manifest). The same URL is the same engine (a sidecar restarted
// beside its old self), which the ingresses resolve by the newer epoch.
//
// A holder at another URL is often the same engine's previous pod, dead but
// not yet declared dead by gossip (memberlist takes seconds to tens of
// seconds: probes, then suspicion), rescheduled with the same id (a
// StatefulSet or LeaderWorkerSet pod keeps its name, and the injected
// sidecar's id is the pod name). Exiting then would crash-loop the new
// sidecar under the kubelet's backoff. So the id is free once gossip drops
// the holder (dead or left) or the holder's URL shows its engine gone: the
// connection is refused, or what answers does not list the holder's model
// (another engine has the address). No answer at all (a timeout, a DNS or
// routing error) is unknown, not gone: sidecars are often not allowed to
// reach other engines (a NetworkPolicy that admits only the ingresses), and
// taking the id then would let a copied manifest in at once. Only a holder
// that gossip keeps alive, and whose URL does not show its engine gone, for
// EngineIDWait is a real conflict.
//
// node's view is the seed's from the join plus what gossip brought since;
// two sidecars started at once can both pass.
func (s *Sidecar) engineIDsFree(ctx context.Context, node *gossip.Node) error {
	client := &http.Client{Timeout: engineIDProbeTimeout}
	deadline := time.Now().Add(s.cfg.EngineIDWait)
	waiting := map[string]bool{} // "id\x00member" logged as waited for
	t := time.NewTicker(engineIDRecheck)
	defer t.Stop()
	for {
		var taken error
		for _, e := range s.engines {
			v, ok := node.Engine(e.cfg.ID)
			if !ok || v.Node == node.Name() || v.URL == e.cfg.URL {
				continue
			}
			free, why := s.probeHolder(ctx, client, v)
			if ctx.Err() != nil {
				return ctx.Err() // the probe failed for being stopped, not for the holder
			}
			if free {
				s.log.Info("taking over an engine id whose holder no longer answers as that engine", "engine", e.cfg.ID,
					"member", v.Node, "holder_url", natsutil.RedactURL(v.URL), "why", why, "url", natsutil.RedactURL(e.cfg.URL))
				continue
			}
			if k := e.cfg.ID + "\x00" + v.Node; !waiting[k] {
				waiting[k] = true
				s.log.Warn("engine id held by another live gossip member at another URL: waiting for gossip to declare it dead or its URL to stop answering as that engine",
					"engine", e.cfg.ID, "member", v.Node, "holder_url", natsutil.RedactURL(v.URL), "holder", why,
					"url", natsutil.RedactURL(e.cfg.URL), "wait", s.cfg.EngineIDWait.String())
			}
			taken = fmt.Errorf("%w: %q is served by gossip member %s at %s, which %s after %v, not %s; give each engine its own id",
				ErrEngineIDTaken, e.cfg.ID, v.Node, natsutil.RedactURL(v.URL), why, s.cfg.EngineIDWait, natsutil.RedactURL(e.cfg.URL))
			break // one holder at a time: the others are checked once it is gone
		}
		if taken == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return taken
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// probeHolder asks the holder's URL whether it still serves the holder's
// model (/v1/models). free: the connection is refused (nothing listens at the
// address), or what answers lists other models. Anything else is not proof
// the holder is gone: an answer that says neither (an error status, a body
// that is no model list), or no answer (a timeout: a dead pod's address or a
// NetworkPolicy dropping sidecar-to-engine traffic look the same).
func (s *Sidecar) probeHolder(ctx context.Context, client *http.Client, v gossip.EngineView) (free bool, why string) {
	if v.URL == "" {
		return false, "gossips no URL to probe"
	}
	m, err := fetchModels(ctx, client, v.URL+"/v1/models", s.cfg.EngineAPIKey, v.Model)
	var status statusError
	switch {
	case errors.As(err, &status):
		return false, fmt.Sprintf("answers /v1/models with status %d", int(status))
	case err != nil && isReadError(err):
		return false, "answers /v1/models with no model list"
	case errors.Is(err, syscall.ECONNREFUSED):
		return true, "refuses connections: " + err.Error()
	case err != nil:
		return false, "gives no answer (unknown whether its engine is gone; can this sidecar reach it?): " + err.Error()
	case !m.listed:
		return true, fmt.Sprintf("answers as another engine: serves %s, not %s", strings.Join(m.served, ", "), v.Model)
	}
	return false, "answers there as that engine, serving " + v.Model
}

// isReadError: err came from reading or decoding the answer, not from
// reaching the engine.
func isReadError(err error) bool {
	return errors.Is(err, errModelsDecode) || errors.Is(err, io.ErrUnexpectedEOF)
}
