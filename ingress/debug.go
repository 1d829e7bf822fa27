package ingress

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// The /debug/* endpoints below are served on the admin listener only
// (admin.go): they show internal engine URLs and configuration.

// handleDebugEngines shows every engine with its load as this replica's
// scheduler sees it: gossip's view with this replica's own requests added
// (addLocalLoad: InFlight, LocalPrefillTokens, LocalActiveTokens,
// LocalKVTokens, and TTFT and TPOT when gossip carries none), not the
// membership copy alone, whose scheduler-side fields are zeros.
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
		e.PrefillOnly = e.prefillOnly() // as the scheduler sees it (SGLang's prefill servers)
		en := engine{EngineInfo: e, LocalInFlight: s.ups.inflight(e.ID)}
		now := time.Now()
		s.ups.mu.RLock()
		if up := s.ups.m[e.ID]; up != nil {
			en.Requests, en.Failures = up.total.Load(), up.failures.Load()
			ttft, tpot := up.lat.get(now)
			en.RecentTTFT, en.RecentTPOT = ttft.Seconds(), tpot.Seconds()
			addLocalLoad(&en.Engine, up, now)
		}
		s.ups.mu.RUnlock()
		en.Learned = s.learned(e.ID)
		out = append(out, en)
	}
	writeJSON(ctx, out)
}

// handleDebugIndex shows the local index's per-engine key counts and memory
// and, with NATS, how the materializer follows each engine's deltas
// (materialize.EngineStatus: epoch and sequence, synced, lag, buffered
// deltas, snapshots in flight and failed in a row).
func (s *Server) handleDebugIndex(ctx *fasthttp.RequestCtx) {
	if s.deps.Index == nil {
		writeJSON(ctx, map[string]any{"index": nil})
		return
	}
	out := map[string]any{"engines": s.deps.Index.Engines(), "mem": s.deps.Index.MemStats(),
		"synced": s.deps.Synced == nil || s.deps.Synced()}
	if s.cl != nil && s.cl.mat != nil {
		out["materializer"] = s.cl.mat.Status()
	}
	writeJSON(ctx, out)
}

// handleDebugConfig shows the effective configuration, secrets redacted:
// the gossip keys, the admin token, NATS secrets and every URL's userinfo.
func (s *Server) handleDebugConfig(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, map[string]any{"config": showConfig(redactConfig(s.cfg)), "policy": s.deps.Scheduler.Policy()})
}

// shownConfig is Config as /debug/config shows it. The scheduler's plugin
// blocks are kept as yaml.Nodes (for their line numbers in errors), whose
// JSON would be the parser's internals (Kind, Tag, Line, ...): shownScheduler
// replaces them with the values they hold.
type shownConfig struct {
	Config
	Scheduler shownScheduler
	Cluster   shownCluster
}

// shownCluster shows the gossip keys as the text "redacted" (docs/SECURITY.md):
// as the []byte they are, JSON showed its base64, "cmVkYWN0ZWQ=", which
// reads as a key.
type shownCluster struct {
	ClusterConfig
	GossipKey  string
	GossipKeys []string
}

type shownScheduler struct {
	scheduler.Config
	Params map[string]any
}

func showConfig(cfg Config) shownConfig {
	out := shownConfig{Config: cfg, Scheduler: shownScheduler{Config: cfg.Scheduler}, Cluster: shownCluster{ClusterConfig: cfg.Cluster}}
	if len(cfg.Cluster.GossipKey) > 0 {
		out.Cluster.GossipKey = natsutil.Redacted
	}
	for range cfg.Cluster.GossipKeys {
		out.Cluster.GossipKeys = append(out.Cluster.GossipKeys, natsutil.Redacted)
	}
	if len(cfg.Scheduler.Params) > 0 {
		out.Scheduler.Params = make(map[string]any, len(cfg.Scheduler.Params))
	}
	for name, n := range cfg.Scheduler.Params {
		var v any
		if err := n.Decode(&v); err != nil {
			v = "undecodable: " + err.Error() // Validate has refused such a block already
		}
		out.Scheduler.Params[name] = jsonValue(v)
	}
	return out
}

// jsonValue makes a decoded YAML value encodable as JSON: a mapping with
// keys other than strings (yaml's map[any]any) gets its keys printed.
func jsonValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonValue(e)
		}
		return v
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = jsonValue(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = jsonValue(e)
		}
		return v
	}
	return v
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
