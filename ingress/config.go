package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/internal/keyvalue"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// Chat forwarding modes (Config.ChatMode).
const (
	// ChatModeChat forwards a chat request to the engine's /v1/chat/completions
	// as it came: the engine renders and tokenizes it again.
	ChatModeChat = "chat"
	// ChatModeCompletions sends the tokens the ingress rendered to the engine's
	// /v1/completions and re-wraps the answer as chat chunks, so the engine
	// does no templating or tokenization. Needs a tokenizer for the model.
	ChatModeCompletions = "completions"
)

// StaticEngine is an engine given on the command line instead of learned
// through gossip (tests, benchmarks, a fixed fleet).
type StaticEngine struct {
	ID    string `yaml:"id"`    // unique engine id; also the index's engine name
	Model string `yaml:"model"` // served model name
	URL   string `yaml:"url"`   // base URL, e.g. http://127.0.0.1:8001
	// P/D (docs/PD.md), as gossip carries them for sidecar-run engines:
	// role prefill, decode or mixed (default), the P/D group, the wire
	// protocol ("" or nixl: vLLM's NIXL; sglang: bootstrap fields) and an
	// SGLang prefill engine's bootstrap host:port (default the URL's host,
	// port 8998).
	Role       string `yaml:"role"`
	Group      string `yaml:"group"`
	PDProtocol string `yaml:"pdProtocol"`
	Bootstrap  string `yaml:"bootstrap"`
}

// Config is one ingress replica's configuration. DefaultConfig fills every
// field; Validate lists every problem at once.
type Config struct {
	// ID names this replica in gossip, logs and metrics; unique per cluster.
	// Default: "ingress-" + 8 random hex digits.
	ID string `yaml:"id"`
	// Listen is the client-facing address. Default 127.0.0.1:8000; ":0" picks a free port (see Server.Addr).
	Listen string `yaml:"listen"`
	// AdminListen serves /debug/* (pprof, engines, index, config, health)
	// and /metrics on a separate port; the client port answers 404 for
	// /debug/* and, with an admin listener, serves no /metrics. Empty: no
	// admin server (and /metrics stays on the client port).
	AdminListen string `yaml:"adminListen"`
	// AdminToken, when set, is required on the admin listener as
	// "Authorization: Bearer <token>". Not read from YAML (a secret).
	AdminToken string `yaml:"-"`
	// OpsOnly narrows the client listener to /metrics, /health and /ready
	// and answers 404 to every other path: kvmesh epp's listener, where the
	// API would be a proxy around the gateway and its authentication. Not
	// read from YAML (epp.Run sets it).
	OpsOnly bool `yaml:"-"`
	// TLS for the client listener and (optionally mutual) TLS to engines.
	TLS TLSConfig `yaml:"tls"`
	// LoRAAdapters maps a LoRA adapter's name to its base model: requests naming
	// the adapter go to the base model's engines and are keyed under the base
	// with the adapter's name, as the sidecar keys the adapter's blocks.
	LoRAAdapters map[string]string `yaml:"loraAdapters"`
	// TenantHeader names a request header that identifies the tenant for fair
	// admission when the request is not authenticated (auth's identity wins).
	// Trust it only behind a gateway that sets it. Empty: none.
	TenantHeader string `yaml:"tenantHeader"`
	// CORSOrigins are the browser origins allowed to call the client port
	// ("*": any, as vLLM's default; cors.go). Empty (default): no CORS
	// headers, so browsers refuse cross-origin answers.
	CORSOrigins []string `yaml:"corsOrigins"`
	// EngineHeader names the engine that answered in every answer's
	// X-Kvmesh-Engine header (and lets browsers read it: CORS's
	// Access-Control-Expose-Headers). The load tools (kvmesh loadtest,
	// bench, demo) read it to count requests per engine. An engine's id
	// is the sidecar's --engine-id, by default its URL's host:port, so
	// turn it off where clients must not learn engine addresses (or give
	// the engines ids that are not addresses). Default true.
	EngineHeader bool `yaml:"engineHeader"`
	// EngineAPIKey is sent to the engines as "Authorization: Bearer <key>"
	// on every /v1 request (vLLM's --api-key / VLLM_API_KEY protect those
	// paths). Empty (default): none. kvmesh ingress also reads it from
	// $KVMESH_ENGINE_API_KEY.
	EngineAPIKey string `yaml:"engineAPIKey"`
	// FairQueue turns on weighted fair admission across tenants (ingress/fair)
	// instead of the session-boost queue. Nil: off.
	FairQueue *fair.Config `yaml:"fairQueue"`

	// MaxBodyBytes bounds a request body; larger bodies get 413. Default
	// 32 MiB: images and audio come inline as base64 data URLs (a phone
	// photo is 4–7 MB of base64, and a conversation carries every turn's).
	// vLLM itself sets no limit.
	MaxBodyBytes int `yaml:"maxBodyBytes"`
	// MaxBodyBytesInFlight bounds the request body bytes the ingress
	// holds at once, summed over the requests in service (bodybudget.go):
	// a body that would take the sum past it is refused at once, before
	// it is parsed, with 503, Retry-After: 1 and the code
	// ingress_body_budget_exhausted. A body of at most 64 KiB always
	// passes (and is counted), so ordinary requests are served while
	// large ones are refused; a compressed body is charged again at its
	// decoded size. Pick (kvmesh epp) charges nothing. A body costs the ingress several times its size while it is
	// parsed and tokenized (buffers, the unquoted prompt, tokenizer
	// scratch, GC headroom: up to ~15×), so the default 128 MiB keeps the
	// shipped 4 GiB pod well under its limit. 0: off (counted, never
	// refused). When set it must be at least MaxBodyBytes.
	MaxBodyBytesInFlight int64 `yaml:"maxBodyBytesInFlight"`
	// MaxPromptTokens caps the prompt after tokenization (each prompt of a
	// batch) below the served model's context length: a prompt is refused
	// with 400 (context_length_exceeded) past the largest max_model_len its
	// engines report (longer fits no engine's context) or past this cap,
	// whichever is smaller, and its tokenizing stops there. 0 (the
	// default): no cap of its own; the engines' max_model_len alone, and no
	// limit for a model whose engines report none.
	MaxPromptTokens int `yaml:"maxPromptTokens"`
	// MaxConcurrent bounds requests being served at once; the excess gets 429
	// with Retry-After at once rather than queueing (the engines queue).
	// Default 4096.
	MaxConcurrent int `yaml:"maxConcurrent"`

	// MaxAttempts bounds the upstream attempts per request that reached an
	// engine (first try + retries on the next-best engines); a refused
	// connection sent nothing and is not counted, each ranked engine being
	// dialed at most once. Default 3.
	MaxAttempts int `yaml:"maxAttempts"`
	// ConnectTimeout bounds dialing an engine. Default 2s.
	ConnectTimeout time.Duration `yaml:"connectTimeout"`
	// IdleTimeout bounds each wait for upstream bytes once the answer
	// commits to the client: between a stream's events. A timeout there
	// ends the stream with an error event. Before the commit the wait is
	// FirstByteTimeout's (with the stall watch off and no FirstByteTimeout,
	// IdleTimeout bounds that wait too). Default 5m.
	IdleTimeout time.Duration `yaml:"idleTimeout"`
	// FirstByteTimeout bounds the wait for an answer until it commits to the
	// client: a non-streamed answer's whole generation (a healthy engine
	// sends nothing until it is done) or a stream's queueing and prefill up
	// to its first event. Default 0: no bound of its own while the stall
	// watch is on (health.stallAfter): a hung engine is the watch's to find
	// (it is ejected and its waiting requests move on), a client that
	// leaves is the client watcher's (clientwatch.go; plain TCP client
	// connections only: behind the ingress's own TLS a live engine
	// finishes the generation, bounded by its max_tokens), and a live
	// engine finishes what it started, however long. A timeout with the watch on is a live engine's
	// slowness: the client gets 504, the request is not retried (another
	// engine would start the generation over) and the engine is not
	// ejected. With the watch off (or health disabled) nothing tells a slow
	// engine from a hung one: the wait is FirstByteTimeout, else
	// IdleTimeout, and a timeout is retried on the next engine and ejects,
	// as a dead engine's. With the watch on it must exceed
	// stallAfter + 1.25 × probeTimeout, the time the watch takes to judge.
	FirstByteTimeout time.Duration `yaml:"firstByteTimeout"`
	// ReadTimeout bounds reading a client's request, head and body (a slow
	// upload of a large body needs more). It does not bound the answer:
	// once the request is read, a client may wait for it as long as the
	// engine takes, and its leaving is still seen (clientwatch.go).
	// Default 60s.
	ReadTimeout time.Duration `yaml:"readTimeout"`
	// ClientIdleTimeout closes a client's keep-alive connection idle
	// between requests for this long. A load balancer or client pool that
	// keeps connections to the ingress must close its idle ones sooner, or
	// it may send a request on one the ingress is closing (some, such as
	// Google Cloud's, keep backend connections for 600 s and ask backends
	// for more). Default 90s.
	ClientIdleTimeout time.Duration `yaml:"clientIdleTimeout"`
	// SendTimeout bounds how long a write of an answer to a client may go
	// without the client taking a byte of it (nginx's send_timeout): a
	// client that stops reading a stream, or a large answer, is cut then,
	// its engine's request cancelled and its MaxConcurrent slot freed (the
	// access log says 499, "client stopped reading"). It bounds each write,
	// not the answer: a stream may run as long as its engine sends and its
	// client reads (sendtimeout.go). Default 60s; 0 turns it off: an
	// answer nobody reads then holds its MaxConcurrent slot until the TCP
	// connection dies, and Close waits out DrainTimeout for it.
	SendTimeout time.Duration `yaml:"sendTimeout"`
	// MaxConnsPerEngine bounds pooled upstream connections per engine. Default 4096.
	MaxConnsPerEngine int `yaml:"maxConnsPerEngine"`
	// DrainTimeout bounds the graceful drain in Close. Default 30s.
	DrainTimeout time.Duration `yaml:"drainTimeout"`

	// ChatMode is ChatModeChat (default) or ChatModeCompletions.
	ChatMode string `yaml:"chatMode"`
	// Tokenizers maps a model name to its tokenizer (a tokenizer.json path or a
	// directory holding tokenizer.json and tokenizer_config.json). A model
	// without one is keyed on its engines' /tokenize (EngineTokenizeTimeout),
	// or routed on load only when that is off or fails, and its text is
	// forwarded untouched.
	Tokenizers map[string]string `yaml:"tokenizers"`
	// ChatTemplates maps a model to the tokenizer_config.json holding its
	// chat template (default: the one beside a directory in Tokenizers);
	// only a model in Tokenizers may have one (Validate).
	// Without one, chat for the model is keyed on the engines' /tokenize,
	// or routed on load only.
	ChatTemplates map[string]string `yaml:"chatTemplates"`
	// EngineTokenizeTimeout bounds asking an engine's /tokenize for the
	// tokens of a prompt the ingress cannot tokenize itself (no tokenizer
	// for the model, or a chat template that fails here: enginetok.go),
	// plus 1ms per KiB of the prompt (a long prompt takes longer to
	// tokenize; one past the timeout's own allowance is put down to its
	// size, not to the engines). Default 250ms; 0 turns the fallback off
	// (such requests are routed by load, unkeyed).
	EngineTokenizeTimeout time.Duration `yaml:"engineTokenizeTimeout"`
	// TokenizeBudget bounds the time the ingress spends tokenizing (and
	// encoding a rendered chat prompt for) one request. Past it the
	// request is routed as one the ingress cannot tokenize: keyed on an
	// engine's /tokenize (EngineTokenizeTimeout), else unkeyed with the
	// estimate of 4 bytes a token for the limits, and counted in
	// kvmesh_ingress_tokenize_stopped_total{reason="budget"}. Ordinary
	// text tokenizes at 5–20 MB/s a core, so the default 2s only catches
	// prompts of tens of megabytes or hostile ones (a megabyte-long run of
	// one character). 0: no bound.
	TokenizeBudget time.Duration `yaml:"tokenizeBudget"`
	// BlockSize is the engines' KV block size in tokens, used for keys when
	// membership does not tell it. Default 16.
	BlockSize int `yaml:"blockSize"`

	// Scheduler selects and configures the routing policy (scheduler.Config:
	// policy "kvmesh" by default, "random", "round-robin", ...). Used when
	// Deps.Scheduler is nil.
	Scheduler scheduler.Config `yaml:"scheduler"`
	// PD is the prefill/decode path's admission control (pd.go).
	PD PDConfig `yaml:"pd"`
	// Learn is the online cost learner the kvmesh policies price with
	// (learn.go).
	Learn LearnConfig `yaml:"learn"`

	// Cluster joins gossip (membership, load, shared rate limits) and NATS
	// (the materialized index). Zero: standalone with Engines.
	Cluster ClusterConfig `yaml:"cluster"`

	// Engines is a static engine list, used when no membership is wired (Deps.Membership nil).
	Engines []StaticEngine `yaml:"engines"`

	// LoadInterval is how often this replica's in-flight counts are handed to
	// gossip. Default 200ms.
	LoadInterval time.Duration `yaml:"loadInterval"`
	// SpeculativeTTL is how long a routed request's keys count as cached on
	// its engine before events confirm them (passed to the index). Default
	// index.DefaultSpeculativeTTL, 5s.
	SpeculativeTTL time.Duration `yaml:"speculativeTTL"`
	// ExactLookup makes every index lookup read each key of the request's
	// chain instead of searching it (index.Config.ExactLookup): for KV
	// sources whose eviction can leave holes in a cached prefix. Default
	// false (vLLM evicts a chain's tail first, so the search is exact).
	ExactLookup bool `yaml:"exactLookup"`

	// SessionSlack is how many more requests (in flight + waiting) than the
	// least-loaded candidate a session's engine may have and still keep the
	// session (X-Session-ID); beyond it the policy's choice wins. Default 8.
	SessionSlack int `yaml:"sessionSlack"`

	// AccessLog writes one JSON line per request. Default true.
	AccessLog bool `yaml:"accessLog"`

	// Routes is a RouteConfig file (ingress/routes, docs/REQUESTS.md): model
	// routes with weighted splits, fallbacks, LoRA adapters and rate limits,
	// reloaded when it changes. Empty: none. Loaded by Run (embedders set
	// Deps.Routes).
	Routes string `yaml:"routesFile"`
	// RoutesOptional lets the routes file not exist yet (no routes until it
	// appears): a ConfigMap the orchestrator renders from ModelRoutes,
	// mounted optional. A file that exists must be valid.
	RoutesOptional bool `yaml:"routesOptional"`

	// Health configures passive ejection of failing engines (health.go).
	Health HealthConfig `yaml:"health"`

	// Hold bounds the kvmesh policy's router-side hold (hold.go).
	Hold HoldConfig `yaml:"hold"`
}

// DefaultConfig returns the defaults for every field.
func DefaultConfig() Config {
	return Config{
		Listen:                "127.0.0.1:8000",
		MaxBodyBytes:          32 << 20,
		MaxBodyBytesInFlight:  128 << 20,
		MaxConcurrent:         4096,
		MaxAttempts:           3,
		ConnectTimeout:        2 * time.Second,
		IdleTimeout:           5 * time.Minute,
		ReadTimeout:           60 * time.Second,
		ClientIdleTimeout:     90 * time.Second,
		SendTimeout:           60 * time.Second,
		MaxConnsPerEngine:     4096,
		DrainTimeout:          30 * time.Second,
		ChatMode:              ChatModeChat,
		EngineTokenizeTimeout: 250 * time.Millisecond,
		TokenizeBudget:        2 * time.Second,
		BlockSize:             16,
		LoadInterval:          200 * time.Millisecond,
		SpeculativeTTL:        index.DefaultSpeculativeTTL,
		AccessLog:             true,
		EngineHeader:          true,
		SessionSlack:          8,
		Scheduler:             registry.DefaultConfig(),
		Health:                DefaultHealthConfig(),
		Hold:                  DefaultHoldConfig(),
		Cluster:               ClusterConfig{IndexSyncGrace: 30 * time.Second},
	}
}

// ErrConfig marks an invalid configuration.
var ErrConfig = errors.New("invalid ingress config")

// Validate reports every problem in c, or nil.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if c.Cluster.IndexSyncGrace < 0 {
		bad("cluster index sync grace %v must be >= 0 (0: wait forever)", c.Cluster.IndexSyncGrace)
	}
	if c.FairQueue != nil {
		if err := c.FairQueue.Validate(); err != nil {
			bad("fairQueue: %v", err)
		}
	}
	// The addresses are checked whole here, not at the bind: a port out
	// of range or a host that is no address failed there, after the
	// other listeners opened, and one at a time (exit 1, the flag unnamed).
	if err := checkListenAddr(c.Listen); err != nil {
		bad("listen address (--listen, listen) %q: %v", c.Listen, err)
	}
	if c.AdminListen != "" {
		if err := checkListenAddr(c.AdminListen); err != nil {
			bad("admin address (--admin, adminListen) %q: %v", c.AdminListen, err)
		}
	}
	if c.MaxBodyBytes <= 0 {
		bad("max body bytes must be > 0, got %d", c.MaxBodyBytes)
	}
	if c.MaxBodyBytesInFlight < 0 {
		bad("max body bytes in flight must be >= 0 (0: off), got %d", c.MaxBodyBytesInFlight)
	} else if c.MaxBodyBytesInFlight > 0 && c.MaxBodyBytesInFlight < int64(c.MaxBodyBytes) {
		bad("max body bytes in flight (--max-body-in-flight, maxBodyBytesInFlight) %d must be 0 (off) or at least max body bytes %d: a body that size could never pass", c.MaxBodyBytesInFlight, c.MaxBodyBytes)
	}
	if c.MaxPromptTokens < 0 {
		bad("max prompt tokens must be >= 0, got %d", c.MaxPromptTokens)
	}
	if c.MaxConcurrent <= 0 {
		bad("max concurrent must be > 0, got %d", c.MaxConcurrent)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 16 {
		bad("max attempts must be in 1..16, got %d", c.MaxAttempts)
	}
	if c.ConnectTimeout <= 0 {
		bad("connect timeout must be > 0")
	}
	if c.IdleTimeout <= 0 {
		bad("idle timeout must be > 0")
	}
	if c.ReadTimeout <= 0 {
		bad("read timeout must be > 0")
	}
	if c.ClientIdleTimeout <= 0 {
		bad("clientIdleTimeout must be > 0 (the idle close of a client's keep-alive connection has no off), got %v", c.ClientIdleTimeout)
	}
	if c.SendTimeout < 0 {
		bad("send timeout must be >= 0 (0: off), got %v", c.SendTimeout)
	}
	if c.FirstByteTimeout < 0 {
		bad("first byte timeout must be >= 0 (0: none while the stall watch is on), got %v", c.FirstByteTimeout)
	} else if judge := c.Health.StallAfter + c.Health.ProbeTimeout*5/4; c.FirstByteTimeout > 0 && c.stallWatch() && c.FirstByteTimeout <= judge {
		bad("first byte timeout %v must exceed health.stallAfter + 1.25 × health.probeTimeout (%v), the stall watch's time to judge a hung engine", c.FirstByteTimeout, judge)
	}
	if c.MaxConnsPerEngine <= 0 {
		bad("max conns per engine must be > 0")
	}
	if c.DrainTimeout <= 0 {
		bad("drain timeout must be > 0")
	}
	if c.ChatMode != ChatModeChat && c.ChatMode != ChatModeCompletions {
		bad("chat mode must be %q or %q, got %q", ChatModeChat, ChatModeCompletions, c.ChatMode)
	}
	if c.TokenizeBudget < 0 {
		bad("tokenize budget must be >= 0 (0: no bound), got %v", c.TokenizeBudget)
	}
	if c.EngineTokenizeTimeout < 0 {
		bad("engine tokenize timeout must be >= 0 (0: off), got %v", c.EngineTokenizeTimeout)
	}
	if c.BlockSize <= 0 {
		bad("block size must be > 0, got %d", c.BlockSize)
	}
	if c.SessionSlack < 0 {
		bad("session slack must be >= 0, got %d", c.SessionSlack)
	}
	if c.LoadInterval <= 0 {
		bad("load interval must be > 0")
	}
	if c.SpeculativeTTL < 0 {
		bad("speculative ttl must be >= 0")
	}
	c.Cluster.problems(bad)
	if len(c.Cluster.NATSURLs) > 0 {
		// What natsutil.Connect checks (cluster.go), here so a URL without
		// a scheme or a negative ping interval is a usage error before
		// anything starts, not an exit after the listeners opened.
		nc := natsutil.DefaultConfig()
		nc.URLs, nc.Auth, nc.Stream.Disabled = c.Cluster.NATSURLs, c.Cluster.NATSAuth, true
		if err := nc.Validate(); err != nil {
			bad("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	}
	c.PD.problems(bad)
	c.Learn.problems(bad)
	c.Health.problems(bad)
	c.Hold.problems(bad)
	c.TLS.problems(bad)
	for _, m := range slices.Sorted(maps.Keys(c.ChatTemplates)) {
		// Templates are read with the model's tokenizer only (LoadTokenizers):
		// without one, chat is keyed on the engines' /tokenize, which render
		// their own template; the path was never even opened.
		if _, ok := c.Tokenizers[m]; !ok {
			bad("chat template for %q is not read without a tokenizer for it (tokenizers, --tokenizer %s=PATH)", m, m)
		}
	}
	sc := c.Scheduler
	sc.Defaults()
	if err := registry.Validate(&sc); err != nil {
		bad("scheduler: %v", err)
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		if e.ID == "" {
			bad("engines[%d]: empty id", i)
		} else if seen[e.ID] {
			bad("engines[%d]: duplicate id %q", i, e.ID)
		}
		seen[e.ID] = true
		if e.Model == "" {
			bad("engines[%d]: empty model", i)
		}
		if u, err := url.Parse(e.URL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			bad("engines[%d]: url %q must be http(s)://host:port", i, e.URL)
		} else if p := u.Port(); p != "" && !validPort(p) {
			// url.Parse takes any digits: :65536 and :0 failed at every
			// dial, which looked like an engine outage, not a typo.
			bad("engines[%d]: url %q: port %s: want 1..65535", i, e.URL, p)
		} else if pastedAPIBase(u.Path) || u.RawQuery != "" || u.Fragment != "" {
			// The ingress appends /v1/... to it: an OpenAI base URL
			// pasted here (…/v1) made every request 404 (/v1/v1/...).
			// Another path is kept: a prefix a path-routing proxy strips
			// (http://gw/engines/a).
			bad("engines[%d]: url %q ends in /v1 or has a query or fragment: give the engine's base URL, http(s)://host:port[/prefix] without /v1", i, e.URL)
		}
		if _, ok := scheduler.ParseRole(e.Role); !ok {
			bad("engines[%d]: role %q: want prefill, decode or mixed", i, e.Role)
		}
		switch e.PDProtocol {
		case "", "nixl", "sglang":
		default:
			bad("engines[%d]: pdProtocol %q: want nixl or sglang", i, e.PDProtocol)
		}
		if _, _, err := net.SplitHostPort(e.Bootstrap); e.Bootstrap != "" && err != nil {
			bad("engines[%d]: bootstrap %q: want host:port", i, e.Bootstrap)
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(probs, "; "))
	}
	return nil
}

// checkListenAddr is nil when addr is host:port a listener can bind: a
// port from 0 (a free one) to 65535 in digits, and a host that is empty
// (every address), an IP address (IPv6 in brackets) or a host name.
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port (IPv6 in brackets): %w", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return fmt.Errorf("port %q: want 0..65535 (0: a free port)", port)
	}
	if host != "" && !validHost(host) {
		return fmt.Errorf("host %q: want an IP address, a host name, or none (every address)", host)
	}
	return nil
}

// validHost reports whether host is an IP address (an IPv6 zone allowed)
// or a host name: dot-separated labels of letters, digits, '-' and '_',
// the last not all digits (999.1.1.1 is neither).
func validHost(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return false
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// validPort reports whether p is a TCP port a dial can use.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

// stallWatch reports whether the stall watch (health.go) judges the engines'
// liveness.
func (c *Config) stallWatch() bool { return !c.Health.Disabled && c.Health.StallAfter > 0 }

// watchSeesDials reports whether the stall watch sees a dial that hangs
// before ConnectTimeout ends it: the dial must outlast StallAfter and one
// tick of the watch (the probe loop's, EjectionTime ÷ 4, at least 1 ms).
// Only then may a connect timeout be left to the watch (health.go,
// healthKind).
func (c *Config) watchSeesDials() bool {
	return c.stallWatch() && c.ConnectTimeout > c.Health.StallAfter+max(c.Health.EjectionTime/4, time.Millisecond)
}

// firstByteWait is how long an upstream read may wait before the answer
// commits to the client (FirstByteTimeout); 0: no bound.
func (c *Config) firstByteWait() time.Duration {
	if c.FirstByteTimeout > 0 || c.stallWatch() {
		return c.FirstByteTimeout
	}
	return c.IdleTimeout
}

// ParseStaticEngine parses "id=model=url" or "model=url" (id defaults to the
// URL's host:port), the command-line form of a static engine, or its
// key=value form, whose keys are the sidecar's --engine spec's:
// "[id=ID,]model=M,url=URL[,role=R,group=G,pd=nixl|sglang,bootstrap=HOST:PORT]",
// for the P/D fields the positional form has no room for.
func ParseStaticEngine(s string) (StaticEngine, error) {
	if strings.Contains(s, ",") && (strings.Contains(s, "url=") || strings.Contains(s, "model=")) {
		return parseStaticEngineSpec(s)
	}
	parts := strings.SplitN(s, "=", 3)
	if last := parts[len(parts)-1]; len(parts) > 1 && last == "" {
		// "m=" used to report an empty id (taken from the missing URL's host).
		return StaticEngine{}, fmt.Errorf("%w: engine %q: no url: want [id=]model=url", ErrConfig, s)
	}
	var e StaticEngine
	switch len(parts) {
	case 2:
		e = StaticEngine{Model: parts[0], URL: parts[1]}
	case 3:
		e = StaticEngine{ID: parts[0], Model: parts[1], URL: parts[2]}
	default:
		return StaticEngine{}, fmt.Errorf("%w: engine %q: want [id=]model=url", ErrConfig, s)
	}
	return e, staticEngineURL(s, &e)
}

// staticEngineURL checks e's URL is http(s)://host... and defaults e's id
// to its host:port. A URL without its scheme (m=localhost:8000) was
// reported as an empty id, and as engines[0], not the --engine given.
func staticEngineURL(s string, e *StaticEngine) error {
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("%w: engine %q: url %q: want http(s)://host:port", ErrConfig, s, e.URL)
	}
	if e.ID == "" {
		e.ID = u.Host
	}
	return nil
}

// staticEngineKeys are the keys of ParseStaticEngine's key=value form.
const staticEngineKeys = "id, model, url, role, group, pd, bootstrap"

// parseStaticEngineSpec parses ParseStaticEngine's key=value form.
func parseStaticEngineSpec(s string) (StaticEngine, error) {
	var e StaticEngine
	pairs, err := keyvalue.Split(s)
	if err != nil {
		return StaticEngine{}, fmt.Errorf("%w: engine %q: %w (keys: %s)", ErrConfig, s, err, staticEngineKeys)
	}
	for _, p := range pairs {
		k, v := p.Key, p.Value
		switch k {
		case "id":
			e.ID = v
		case "model":
			e.Model = v
		case "url":
			e.URL = v
		case "role":
			e.Role = v
		case "group":
			e.Group = v
		case "pd":
			e.PDProtocol = v
		case "bootstrap":
			e.Bootstrap = v
		default:
			return StaticEngine{}, fmt.Errorf("%w: engine %q: unknown key %q (keys: %s)", ErrConfig, s, k, staticEngineKeys)
		}
	}
	if e.Model == "" || e.URL == "" {
		return StaticEngine{}, fmt.Errorf("%w: engine %q: model= and url= are required", ErrConfig, s)
	}
	return e, staticEngineURL(s, &e)
}

// PDWarning is why the P/D step can never run with c, or "": a P/D
// policy is set, no gossip brings engines with roles, and no static engine
// is a prefill engine (--engine's positional form is always mixed).
func (c *Config) PDWarning() string {
	if c.PD.Policy == "" || c.Cluster.GossipBind != "" {
		return ""
	}
	for _, e := range c.Engines {
		if r, _ := scheduler.ParseRole(e.Role); r == scheduler.RolePrefill {
			return ""
		}
	}
	return fmt.Sprintf("P/D policy %q, but no engine can prefill: static engines are mixed unless given role=prefill "+
		"(--engine model=M,url=URL,role=prefill, or the config's engines[].role); every request is served whole", c.PD.Policy)
}

// LoadConfigFile reads a YAML ingress config (field names as in the yaml
// tags) over DefaultConfig. Unknown fields are errors; call Validate after
// applying command-line overrides.
func LoadConfigFile(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return DefaultConfig(), fmt.Errorf("%w: %w", ErrConfig, err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	// The scheduler: block's plugin blocks are decoded by Validate, after
	// the flags, whose error named no file (the line numbers are this
	// file's): checked here too, as the rest of the file is.
	sc := cfg.Scheduler
	sc.Defaults()
	if err := registry.Validate(&sc); err != nil {
		return cfg, fmt.Errorf("%s: %w: scheduler: %v", path, ErrConfig, err)
	}
	return cfg, nil
}

// ParseConfig decodes a YAML ingress config over DefaultConfig (unknown
// fields are errors; call Validate afterwards).
func ParseConfig(data []byte) (Config, error) {
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&cfg)
	if err != nil && !errors.Is(err, io.EOF) {
		if strings.Contains(err.Error(), "into time.Duration") {
			// yaml reads a duration from a string with its unit only.
			return cfg, fmt.Errorf("%w: %w (a duration takes its unit: 30s, 500ms, 0s for off)", ErrConfig, err)
		}
		return cfg, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err == nil {
		// A second document (after ---) would be ignored, unknown keys and
		// all: one config is one document.
		for {
			var more yaml.Node
			err := dec.Decode(&more)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return cfg, fmt.Errorf("%w: %w", ErrConfig, err)
			}
			if c := more.Content; len(c) > 0 && !(c[0].Kind == yaml.ScalarNode && c[0].Tag == "!!null") {
				return cfg, fmt.Errorf("%w: more than one YAML document (line %d): give one config per file", ErrConfig, c[0].Line)
			}
		}
	}
	cfg.Scheduler.Defaults()
	return cfg, nil
}

// pastedAPIBase reports whether an engine URL's path is a pasted OpenAI base
// URL: its last segment is v1 (/v1, /v1/, /openai/v1). Requests are built as
// URL + /v1/..., so such a URL sends every one to .../v1/v1/... .
func pastedAPIBase(path string) bool {
	return strings.HasSuffix(strings.TrimSuffix(path, "/"), "/v1")
}
