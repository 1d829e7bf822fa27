package ingress

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

func writeJSON(ctx *fasthttp.RequestCtx, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		writeError(ctx, err)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// handleModels lists the models the live engines serve (OpenAI list shape).
func (s *Server) handleModels(ctx *fasthttp.RequestCtx) {
	if s.deps.Auth != nil {
		if _, err := s.deps.Auth.Check(ctx.Request.Header.Peek("Authorization")); err != nil {
			writeError(ctx, unauthorized(err))
			return
		}
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Parent  string `json:"parent,omitempty"` // a LoRA adapter's base model, as vLLM lists it
	}
	seen := map[string]bool{}
	var out []model
	add := func(id, parent string) {
		if !seen[id] {
			seen[id] = true
			out = append(out, model{ID: id, Object: "model", Created: s.startUnix(), OwnedBy: "kvmesh", Parent: parent})
		}
	}
	engines := s.deps.Membership.Engines(nil)
	for _, e := range engines {
		if e.Healthy {
			add(e.Model, "")
		}
	}
	for _, e := range engines { // adapters after every base model: a name both serve is the base's
		if e.Healthy {
			for _, a := range e.LoRAs {
				add(a, e.Model)
			}
		}
	}
	for a, base := range s.cfg.LoRAAdapters {
		if seen[base] {
			add(a, base)
		}
	}
	for _, id := range s.routeModels() { // route.go: names the routes accept
		add(id, "")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if out == nil {
		out = []model{}
	}
	writeJSON(ctx, map[string]any{"object": "list", "data": out})
}

func (s *Server) startUnix() int64 { return s.created.Unix() }

// readiness is /ready's judgement: the index has synced (or its grace has
// passed), an engine is live, and the ingress is not draining.
func (s *Server) readiness() (ready, synced, degraded bool, engines int) {
	synced = s.deps.Synced == nil || s.deps.Synced()
	grace := s.cfg.Cluster.IndexSyncGrace
	degraded = !synced && grace > 0 && time.Since(s.created) > grace // routes without the index
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.Healthy {
			engines++
		}
	}
	ready = (synced || degraded) && engines > 0 && !s.draining.Load()
	return ready, synced, degraded, engines
}

// handleReady is 200 when the index has synced and an engine is live, 503 otherwise.
func (s *Server) handleReady(ctx *fasthttp.RequestCtx) {
	ready, synced, degraded, engines := s.readiness()
	if !ready {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	writeJSON(ctx, map[string]any{"ready": ready, "index_synced": synced, "index_sync_grace_passed": degraded, "engines": engines, "draining": s.draining.Load()})
}

// handlePing is vLLM's /ping (GET or POST; SageMaker's health check): an
// empty 200 when the ingress is ready (as /ready), else a 503 with the
// OpenAI error body.
func (s *Server) handlePing(ctx *fasthttp.RequestCtx) {
	ready, synced, degraded, engines := s.readiness()
	switch {
	case ready:
		ctx.SetStatusCode(fasthttp.StatusOK)
	case s.draining.Load():
		writeError(ctx, ErrDraining)
	case engines == 0:
		writeError(ctx, fmt.Errorf("%w: not ready: no live engine", ErrNoEngine))
	default:
		writeError(ctx, fmt.Errorf("%w: not ready: the index has not synced (grace passed: %v, synced: %v)", ErrNoEngine, degraded, synced))
	}
}

// handleVersion is vLLM's /version, with kvmesh's version.
func (s *Server) handleVersion(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, map[string]string{"version": version()})
}

// Version is kvmesh's version as /version reports it, when the build sets
// it (-ldflags "-X github.com/kvmesh/kvmesh/ingress.Version=v1.2.3").
// Otherwise it is the module's version from the build information (a
// tagged "go install"), else "dev" with the VCS revision when known.
var Version string

var version = sync.OnceValue(func() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	v := "dev"
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && len(st.Value) >= 12 {
			v += "+" + st.Value[:12]
		}
	}
	for _, st := range bi.Settings {
		if st.Key == "vcs.modified" && st.Value == "true" && v != "dev" {
			v += ".dirty"
		}
	}
	return v
})
