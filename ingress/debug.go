package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// staticMembership serves Config.Engines as always-healthy engines.
type staticMembership struct{ engines []EngineInfo }

var _ Membership = (*staticMembership)(nil)

func newStaticMembership(list []StaticEngine) *staticMembership {
	m := &staticMembership{}
	for _, e := range list {
		m.engines = append(m.engines, EngineInfo{Engine: scheduler.Engine{ID: e.ID, Model: e.Model, Healthy: true}, URL: e.URL})
	}
	return m
}

func (m *staticMembership) Engines(dst []EngineInfo) []EngineInfo { return append(dst, m.engines...) }

// defaultScheduler builds the configured policy over the index (a local one
// holding only speculative entries when no materialized index is wired, so
// routing still follows recent prefixes).
func defaultScheduler(cfg *Config, deps *Deps) (Scheduler, error) {
	if deps.Index == nil {
		idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL, ExactLookup: cfg.ExactLookup})
		if err != nil {
			return nil, fmt.Errorf("local index: %w", err)
		}
		deps.Index = idx
	}
	sc := cfg.Scheduler
	s, err := registry.New(sc, deps.Index, deps.Logger)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return s, nil
}

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
	}
	seen := map[string]bool{}
	var out []model
	for _, e := range s.deps.Membership.Engines(nil) {
		if !e.Healthy || seen[e.Model] {
			continue
		}
		seen[e.Model] = true
		out = append(out, model{ID: e.Model, Object: "model", Created: s.startUnix(), OwnedBy: "kvmesh"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if out == nil {
		out = []model{}
	}
	writeJSON(ctx, map[string]any{"object": "list", "data": out})
}

func (s *Server) startUnix() int64 { return s.created.Unix() }

// handleReady is 200 when the index has synced and an engine is live, 503 otherwise.
func (s *Server) handleReady(ctx *fasthttp.RequestCtx) {
	synced := s.deps.Synced == nil || s.deps.Synced()
	engines := 0
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.Healthy {
			engines++
		}
	}
	ready := synced && engines > 0 && !s.draining.Load()
	if !ready {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	writeJSON(ctx, map[string]any{"ready": ready, "index_synced": synced, "engines": engines, "draining": s.draining.Load()})
}

// handleDebugEngines shows every engine with its load as this replica sees it.
func (s *Server) handleDebugEngines(ctx *fasthttp.RequestCtx) {
	type engine struct {
		EngineInfo
		LocalInFlight int    `json:"local_inflight"`
		Requests      uint64 `json:"requests"`
		Failures      uint64 `json:"failures"`
	}
	var out []engine
	for _, e := range s.deps.Membership.Engines(nil) {
		en := engine{EngineInfo: e, LocalInFlight: s.ups.inflight(e.ID)}
		s.ups.mu.RLock()
		if up := s.ups.m[e.ID]; up != nil {
			en.Requests, en.Failures = up.total.Load(), up.failures.Load()
		}
		s.ups.mu.RUnlock()
		out = append(out, en)
	}
	writeJSON(ctx, out)
}

// handleDebugIndex shows the local index's per-engine key counts and memory.
func (s *Server) handleDebugIndex(ctx *fasthttp.RequestCtx) {
	if s.deps.Index == nil {
		writeJSON(ctx, map[string]any{"index": nil})
		return
	}
	writeJSON(ctx, map[string]any{"engines": s.deps.Index.Engines(), "mem": s.deps.Index.MemStats(),
		"synced": s.deps.Synced == nil || s.deps.Synced()})
}

// handleDebugConfig shows the effective configuration, secrets redacted.
func (s *Server) handleDebugConfig(ctx *fasthttp.RequestCtx) {
	cfg := s.cfg
	if len(cfg.Cluster.GossipKey) > 0 {
		cfg.Cluster.GossipKey = []byte("redacted")
	}
	writeJSON(ctx, map[string]any{"config": cfg, "policy": s.deps.Scheduler.Policy()})
}

// debugEnabled guards hot-path debug logging so it costs nothing when off.
func (s *Server) debugEnabled() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }
