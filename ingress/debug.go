package ingress

import (
	"context"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// The /debug/* endpoints below are served on the admin listener only
// (admin.go): they show internal engine URLs and configuration.

// handleDebugEngines shows every engine with its load as this replica sees it.
func (s *Server) handleDebugEngines(ctx *fasthttp.RequestCtx) {
	type engine struct {
		EngineInfo
		LocalInFlight int `json:"local_inflight"`
		// RecentTTFT and RecentTPOT are the means this replica's streamed
		// answers saw (latency.go): what its scheduler reads as the
		// engine's TTFT and TPOT.
		RecentTTFT float64 `json:"recent_ttft_s,omitempty"`
		RecentTPOT float64 `json:"recent_tpot_s,omitempty"`
		Requests   uint64  `json:"requests"`
		Failures   uint64  `json:"failures"`
		// Learned is the cost learner's estimate (learn.go); absent when off.
		Learned *learnedRates `json:"learned,omitempty"`
	}
	var out []engine
	for _, e := range s.deps.Membership.Engines(nil) {
		e.URL = natsutil.RedactURL(e.URL)
		en := engine{EngineInfo: e, LocalInFlight: s.ups.inflight(e.ID)}
		s.ups.mu.RLock()
		if up := s.ups.m[e.ID]; up != nil {
			en.Requests, en.Failures = up.total.Load(), up.failures.Load()
			ttft, tpot := up.lat.get(time.Now())
			en.RecentTTFT, en.RecentTPOT = ttft.Seconds(), tpot.Seconds()
		}
		s.ups.mu.RUnlock()
		en.Learned = s.learned(e.ID)
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

// handleDebugConfig shows the effective configuration, secrets redacted:
// the gossip keys, the admin token, NATS secrets and every URL's userinfo.
func (s *Server) handleDebugConfig(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, map[string]any{"config": redactConfig(s.cfg), "policy": s.deps.Scheduler.Policy()})
}

// redactConfig returns a copy of cfg fit to show.
func redactConfig(cfg Config) Config {
	cc := &cfg.Cluster
	if len(cc.GossipKey) > 0 {
		cc.GossipKey = []byte(natsutil.Redacted)
	}
	if len(cc.GossipKeys) > 0 {
		keys := make([][]byte, len(cc.GossipKeys))
		for i := range keys {
			keys[i] = []byte(natsutil.Redacted)
		}
		cc.GossipKeys = keys
	}
	cc.NATSURLs = natsutil.RedactURLs(cc.NATSURLs)
	cc.NATSAuth = cc.NATSAuth.Redacted()
	if cfg.AdminToken != "" {
		cfg.AdminToken = natsutil.Redacted
	}
	if cfg.EngineAPIKey != "" {
		cfg.EngineAPIKey = natsutil.Redacted
	}
	engines := make([]StaticEngine, len(cfg.Engines))
	for i, e := range cfg.Engines {
		e.URL = natsutil.RedactURL(e.URL)
		engines[i] = e
	}
	cfg.Engines = engines
	return cfg
}

// handleDebugHealth lists the engines passive ejection has taken out.
func (s *Server) handleDebugHealth(ctx *fasthttp.RequestCtx) {
	ej := s.health.ejected()
	if ej == nil {
		ej = []string{}
	}
	writeJSON(ctx, map[string]any{"ejected": ej, "enabled": s.health != nil})
}

// debugEnabled guards hot-path debug logging so it costs nothing when off.
func (s *Server) debugEnabled() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }
