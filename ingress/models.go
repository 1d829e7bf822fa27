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

// modelCard is one /v1/models entry, vLLM's model card: root, parent and
// max_model_len are null when not known (vLLM's LoRA cards have no
// max_model_len; a base model's parent is null).
type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        *string           `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

// modelPermission is vLLM's (fixed) ModelPermission.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// handleModels lists the models the live engines serve (OpenAI list shape,
// vLLM's model cards): a base model's max_model_len is the smallest its
// engines report (a request that fits it fits every engine), its root the
// one they report (the first by name if they differ); an adapter's parent
// is its base model. It returns the error it answered with (otherlog.go).
func (s *Server) handleModels(ctx *fasthttp.RequestCtx) *apiError {
	if _, err := s.authenticate(&ctx.Request.Header); err != nil { // server.go: x-api-key too, as Anthropic API clients may send it here
		return writeError(ctx, err)
	}
	writeJSON(ctx, map[string]any{"object": "list", "data": s.modelCards()})
	return nil
}

// handleModel answers GET /v1/models/{id} (the OpenAI API's retrieve
// model): the card /v1/models lists for id, or 404 model_not_found. An id
// may hold slashes (org/name).
func (s *Server) handleModel(ctx *fasthttp.RequestCtx, id string) *apiError {
	if _, err := s.authenticate(&ctx.Request.Header); err != nil {
		return writeError(ctx, err)
	}
	for _, c := range s.modelCards() {
		if c.ID == id {
			writeJSON(ctx, c)
			return nil
		}
	}
	return writeError(ctx, fmt.Errorf("%w: the model %q does not exist", ErrModelNotFound, clip(id)))
}

// modelCards are the cards of the models the live engines serve, by id.
func (s *Server) modelCards() []*modelCard {
	created := s.startUnix()
	cards := map[string]*modelCard{}
	var out []*modelCard
	add := func(id, parent string) *modelCard {
		if c := cards[id]; c != nil {
			return c
		}
		var tag [respTagLen]byte
		engineTag(tag[:], id) // FNV-1a: a stable permission id per model
		c := &modelCard{ID: id, Object: "model", Created: created, OwnedBy: "kvmesh", Permission: []modelPermission{{
			ID: "modelperm-" + string(tag[:]), Object: "model_permission", Created: created,
			AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}}}
		if parent != "" {
			c.Parent = &parent
		}
		cards[id] = c
		out = append(out, c)
		return c
	}
	engines := s.deps.Membership.Engines(nil)
	for _, e := range engines {
		if !e.Healthy {
			continue
		}
		c := add(e.Model, "")
		if e.MaxModelLen > 0 && (c.MaxModelLen == nil || e.MaxModelLen < *c.MaxModelLen) {
			c.MaxModelLen = &e.MaxModelLen
		}
		if e.Root != "" && (c.Root == nil || e.Root < *c.Root) {
			c.Root = &e.Root
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
		if cards[base] != nil {
			add(a, base)
		}
	}
	for _, id := range s.routeModels() { // route.go: names the routes accept
		add(id, "")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if out == nil {
		out = []*modelCard{}
	}
	return out
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
	ready = (synced || degraded) && engines > 0 && !s.draining.Load() && !s.leaving.Load()
	return ready, synced, degraded, engines
}

// handleReady is 200 when the index has synced and an engine is live, 503 otherwise.
func (s *Server) handleReady(ctx *fasthttp.RequestCtx) {
	ready, synced, degraded, engines := s.readiness()
	if !ready {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	body := map[string]any{"ready": ready, "index_synced": synced, "index_sync_grace_passed": degraded, "engines": engines, "draining": s.draining.Load() || s.leaving.Load()}
	if s.cl != nil && s.cl.mat != nil {
		// How long NATS has been unreachable (0: it is not): the index is
		// frozen meanwhile and routing degrades, but the ingress still
		// serves, so readiness does not change (docs/OPERATIONS.md).
		body["index_stale_seconds"] = s.cl.mat.StaleFor().Seconds()
	}
	writeJSON(ctx, body)
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
	writeJSON(ctx, map[string]string{"version": BuildVersion()})
}

// BuildVersion is kvmesh's version: Version when the build sets it, else
// what Go recorded (see Version). `kvmesh version` prints the same.
func BuildVersion() string { return version() }

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
