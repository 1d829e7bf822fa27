package ingress

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/scheduler"
)

// The interfaces below are what the ingress needs from the packages it does
// not own. Each is defined here, where it is used, and kept to the methods
// called. Unless a comment says otherwise, implementations must be safe for
// concurrent use from many request goroutines and must not block.

// EngineInfo is one live engine as membership reports it.
type EngineInfo struct {
	scheduler.Engine        // id, model, role, load snapshot; InFlight = other replicas' in-flight
	URL              string // base URL of its OpenAI server
	BlockSize        int    // tokens per KV block; 0: Config.BlockSize
	// P/D (docs/PD.md, pd.go; the wire protocol is Engine.PDProtocol): an
	// SGLang prefill engine's bootstrap host:port ("": the URL's host,
	// port 8998), and the prefill legs the other ingress replicas have on
	// it (in flight, queued at their admission), from gossip.
	Bootstrap     string
	PrefillLegs   int
	PrefillQueued int
	// The base model's max_model_len and root as the engine's /v1/models
	// lists them (from its sidecar; 0 and "" when unknown), for the
	// ingress's /v1/models (models.go).
	MaxModelLen int
	Root        string

	// panicOK: this replica's passive health ejected the engine for its
	// answers while its sidecar calls it ready (health.go): Healthy is
	// false, and panic routing may set it back.
	panicOK bool
}

// prefillOnly reports whether the engine takes prefill legs only, never
// a whole request: SGLang's prefill servers (vLLM's kv_both engines serve
// whole requests too).
func (e *EngineInfo) prefillOnly() bool {
	return e.PrefillOnly || (e.Role == scheduler.RolePrefill && e.PDProtocol == gossip.PDProtocolSGLang)
}

// Membership lists the live engines (gossip; or the static list).
type Membership interface {
	// Engines appends every live engine to dst. InFlight must hold the
	// in-flight counts other ingress replicas shared, not this one's.
	Engines(dst []EngineInfo) []EngineInfo
}

// LoadSharer carries this replica's in-flight counts to the others (gossip).
// ShareInFlight is called from one goroutine every Config.LoadInterval; it
// must copy what it keeps.
type LoadSharer interface {
	ShareInFlight(loads []EngineLoad)
}

// Scheduler picks engines; *scheduler.Scheduler implements it.
type Scheduler interface {
	Schedule(req *scheduler.Request, engines []scheduler.Engine, d *scheduler.Decision) error
	Policy() string
}

// The packages the ingress wires by default implement these interfaces.
var (
	_ Scheduler     = (*scheduler.Scheduler)(nil)
	_ Authenticator = (*auth.Store)(nil)
	_ RateLimiter   = (*ratelimit.Limiter)(nil)
	_ stateSharer   = (*ratelimit.Limiter)(nil)
	_ Affinity      = (*session.Affinity)(nil)
	_ Admitter      = (*session.Admitter)(nil)
)

// Tokenizer turns prompts into token ids for one model. Encode and
// RenderChat append to dst. A nil Tokenizer for a model means "route on load
// only and forward the text untouched".
type Tokenizer interface {
	Encode(dst []uint32, text []byte) ([]uint32, error)
	// RenderChat applies the model's chat template (with the generation
	// prompt) and encodes the result exactly as the engine would.
	RenderChat(dst []uint32, msgs []Message) ([]uint32, error)
}

// Tokenizers finds a model's tokenizer; (nil, false) when there is none.
type Tokenizers interface {
	For(model string) (Tokenizer, bool)
}

// Authenticator checks the Authorization header. The error wraps
// ErrUnauthorized (or is mapped to it); keyID names the caller stably.
type Authenticator interface {
	Check(authorization []byte) (keyID string, err error)
}

// RateLimiter enforces token budgets per key and model. Admit charges the
// prompt tokens or says how long to wait; Observe charges output tokens.
type RateLimiter interface {
	Admit(keyID, model string, inputTokens int) (retryAfter time.Duration, ok bool)
	Observe(keyID, model string, outputTokens int)
}

// Affinity remembers which engine a session's last turn went to.
type Affinity interface {
	Engine(sessionID string) (engineID string, ok bool)
	Remember(sessionID, engineID string)
}

// Admitter bounds the requests in service when the cluster saturates and
// lets follow-up turns of recent sessions in first. Acquire may block until
// admitted, ctx is done or its queue wait expires; release must be called
// once when the request ends.
type Admitter interface {
	Acquire(ctx context.Context, sessionID string) (release func(), err error)
}

// Deps are the collaborators of one Server. Nil fields turn the feature off
// (no membership: Config.Engines; no scheduler: a load-only default).
type Deps struct {
	// PD is the prefill/decode step (nil: no P/D; prefill-role engines
	// are then never chosen for whole requests by the role filter alone).
	PD         PDPlanner
	Logger     *slog.Logger // default slog.Default()
	AccessLog  *slog.Logger // default: JSON to stderr when Config.AccessLog
	Registry   *prometheus.Registry
	Membership Membership
	LoadSharer LoadSharer
	Scheduler  Scheduler
	// Index is the local prefix index (materialized from NATS); the ingress
	// adds speculative entries for the engines it routes to.
	Index      *index.Index
	Tokenizers Tokenizers
	Auth       Authenticator
	Limiter    RateLimiter
	Affinity   Affinity
	Admitter   Admitter
	// Routes are the model routes (route.go); nil: every request is served
	// by the model it names. Run sets a hot-reloading routes.Watcher from
	// Config.Routes.
	Routes RouteSource
	// Synced reports whether the index has caught up (for /ready); nil: always.
	Synced func() bool
	// PropagationLag returns the index's delta propagation lag in seconds.
	PropagationLag func() float64
	// ClassifyError maps an error from Admitter (queue timeout → ErrQueueTimeout,
	// queue full → ErrOverloaded) to the ingress sentinels; nil: as is.
	ClassifyError func(error) error
}
