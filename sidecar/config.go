package sidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Resync policies for lost history (see the package doc).
const (
	ResyncRebuild     = "rebuild"
	ResyncResetEngine = "reset-engine"
)

// EngineConfig describes one engine the sidecar serves.
type EngineConfig struct {
	// ID is the engine's id in the mesh (unique; used in subjects and the index).
	ID string
	// Model is the served model name (part of the root key and the subjects).
	Model string
	// URL is the engine's HTTP base ("http://10.0.0.5:8000"): gossiped for the
	// ingress to proxy to, and the base of /metrics, /v1/models and
	// /reset_prefix_cache. No path (not ".../v1"); a trailing "/" is dropped.
	URL string
	// MetricsURL is scraped for load; default URL + "/metrics". "-" disables scraping.
	MetricsURL string
	// Role is the engine role: prefill, decode or mixed (default mixed).
	Role string
	// Events is rank 0's ZMQ PUB endpoint ("tcp://10.0.0.5:5557",
	// "tcp://[fd00::1]:5557"); rank r is at port+r. A host name is dialled
	// at its first address only (libzmq's rule): a name that resolves to a
	// dead address first is never followed to a live one, so give an IP.
	// With Bind the host must be an IP address, "*" or an interface name.
	Events string
	// Replay is rank 0's ZMQ ROUTER replay endpoint; "" when the engine has none.
	Replay string
	// RankEvents and RankReplay list every DP rank's endpoints explicitly when
	// they are not rank 0's port + r (they override Events, Replay and DPSize).
	RankEvents []string
	RankReplay []string
	// Bind makes the sidecar bind Events (for engines whose PUB connects).
	Bind bool
	// DPSize is the number of data-parallel ranks publishing events (default 1).
	DPSize int
	// BlockSize in tokens; 0 learns it from the events (vLLM sends it in BlockStored).
	BlockSize int
	// TokenizerDir is the engine's model directory holding tokenizer.json (and
	// tokenizer_config.json): published to the mesh's tokenizer object store
	// for the ingresses (internal/tokenstore). "" publishes nothing.
	TokenizerDir string
	// TokenizerRevision names the published files (e.g. the model's Hugging
	// Face revision); "" derives it from their digests.
	TokenizerRevision string
	// PDGroup is the engine's P/D group, gossiped for the ingresses: they
	// pair prefill and decode engines only within one group. The
	// orchestrator sets it per group (pod label kvmesh.io/pd-group, env
	// KVMESH_PD_GROUP). "" is a group like any other.
	PDGroup string
	// PDProtocol is the engine's P/D wire protocol: "" or "nixl" (vLLM's
	// NixlConnector: kv_transfer_params) or "sglang" (SGLang's
	// --disaggregation-mode: bootstrap_host/port/room).
	PDProtocol string
	// BootstrapPort is an SGLang prefill engine's bootstrap port
	// (--disaggregation-bootstrap-port; 0: SGLang's default 8998), gossiped
	// with the URL's host as the bootstrap address.
	BootstrapPort int
}

// Bootstrap is the SGLang bootstrap address ingresses send decode engines
// to: host:port of a prefill engine run with --disaggregation-mode; ""
// for every other engine or without a URL.
func (e *EngineConfig) Bootstrap() string {
	if e.PDProtocol != PDProtocolSGLang || e.Role != "prefill" || e.URL == "" {
		return ""
	}
	u, err := url.Parse(e.URL)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := e.BootstrapPort
	if port == 0 {
		port = DefaultBootstrapPort
	}
	return net.JoinHostPort(u.Hostname(), strconv.Itoa(port))
}

// P/D protocols of EngineConfig.PDProtocol.
const (
	PDProtocolNIXL   = "nixl"
	PDProtocolSGLang = "sglang"
	// DefaultBootstrapPort is SGLang's default --disaggregation-bootstrap-port.
	DefaultBootstrapPort = 8998
)

// Config configures a Sidecar. Start from DefaultConfig.
type Config struct {
	// Engines served: one (sidecar container) or several (DaemonSet mode).
	Engines []EngineConfig
	// NATS connection; with no URL an embedded server is started.
	NATS natsutil.Config
	// Gossip membership; nil disables gossip (deltas and snapshots still work).
	Gossip *gossip.Config
	// StateOverNATSOff stops publishing the engines' gossip entries on the
	// NATS state lane (staterelay.go); the ingresses then learn engine load
	// by gossip alone. Default false (published).
	StateOverNATSOff bool
	// AdminAddr serves /health, /ready, /metrics and /debug/state; "" disables.
	AdminAddr string
	// ResyncPolicy for lost event history: "rebuild" (default) or "reset-engine".
	ResyncPolicy string
	// MaxDeltaKeys bounds the keys in one delta (default 16384: ~130 KB, well
	// under NATS's 1 MB default payload; a server's smaller max_payload lowers
	// it). Larger change sets span several deltas.
	MaxDeltaKeys int
	// PublishQueue bounds the deltas encoded but not yet handed to NATS
	// (all engines together). The event loops enqueue without blocking and
	// never hold an engine lock across a NATS call; when the queue is full
	// (NATS slow or gone) a delta is dropped and counted, and the receivers
	// see the gap and take a snapshot. Default 4096.
	PublishQueue int
	// BatchWindow is how long the sidecar waits for more engine batches before
	// publishing what it has. Batches that arrive together become one delta,
	// which keeps NATS message rates sane under load. Default 200µs.
	BatchWindow time.Duration
	// IdleProbe: after an engine rank has been quiet this long, the
	// subscriber replays from its next sequence number, which finds lost tail
	// batches and an engine that restarted and stayed idle. 0 disables.
	// Default 5s (one tiny replay request per idle rank per period).
	IdleProbe time.Duration
	// SnapshotChunkKeys bounds the keys in one snapshot reply message (default 65536: ~520 KB);
	// a NATS server's smaller max_payload lowers it (kvevents.MaxKeysIn).
	SnapshotChunkKeys int
	// ScrapeInterval for engine /metrics (default 1s).
	ScrapeInterval time.Duration
	// EventsSilentAfter: an engine its metrics show serving requests over
	// this long with no KV-event batch arriving meanwhile is warned about
	// and marked (kvmesh_sidecar_events_silent, /debug/state events_silent;
	// silent.go): the sidecar listens where the engine does not publish.
	// Default 30s; 0 disables. Needs the engine's metrics.
	EventsSilentAfter time.Duration
	// GossipInterval for publishing load, head and digest (default 250ms).
	GossipInterval time.Duration
	// ModelsInterval is how often the engine's /v1/models is read for the
	// LoRA adapters it serves, gossiped to the ingresses (default 10s; 0
	// disables).
	ModelsInterval time.Duration
	// EngineIDWait is how long Run waits, before gossiping, while another
	// live member serves one of its engine ids at another URL and that URL
	// does not show its engine gone; it then exits with ErrEngineIDTaken
	// (a copied manifest). The id is taken over earlier once gossip drops
	// the holder or its URL refuses connections or lists other models
	// (engineid.go): a rescheduled engine's old pod, dead but not yet
	// declared dead. A URL that does not answer (a timeout) frees nothing.
	// Default
	// 60s, beyond memberlist's LAN failure detection (probes, then up to
	// ~24s of suspicion); give more with the wan profile. 0 checks once.
	EngineIDWait time.Duration
	// EngineAPIKey is sent as a bearer token on the /v1/models reads, for
	// engines started with vLLM's --api-key (the command takes it from
	// $KVMESH_ENGINE_API_KEY, as the ingress does). /metrics needs none.
	EngineAPIKey string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registerer for kvmesh_sidecar_* metrics; nil uses a private registry
	// (served on AdminAddr either way).
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		NATS:              natsutil.DefaultConfig(),
		ResyncPolicy:      ResyncRebuild,
		MaxDeltaKeys:      16384,
		PublishQueue:      4096,
		BatchWindow:       200 * time.Microsecond,
		IdleProbe:         5 * time.Second,
		SnapshotChunkKeys: 65536,
		ScrapeInterval:    time.Second,
		EventsSilentAfter: 30 * time.Second,
		GossipInterval:    250 * time.Millisecond,
		ModelsInterval:    10 * time.Second,
		EngineIDWait:      time.Minute,
	}
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid sidecar config")

// Validate lists every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if len(c.Engines) == 0 {
		add("no engine")
	}
	ids := map[string]bool{}
	for i, e := range c.Engines {
		if e.ID == "" {
			add("engine %d: no id", i)
		} else if ids[e.ID] {
			add("engine %d: duplicate id %q", i, e.ID)
		}
		ids[e.ID] = true
		if e.Model == "" {
			add("engine %q: no model", e.ID)
		}
		if e.Events == "" && len(e.RankEvents) == 0 {
			add("engine %q: no KV-event endpoint", e.ID)
		}
		if e.URL != "" {
			if err := checkEngineURL(e.URL); err != nil {
				add("engine %q: bad url %q: %v", e.ID, natsutil.RedactURL(e.URL), err)
			} else if u, _ := url.Parse(e.URL); pastedAPIBase(u.Path) || u.RawQuery != "" || u.Fragment != "" {
				// The ingresses append /v1/completions and the sidecar /metrics
				// and /v1/models to this URL: a pasted OpenAI base URL
				// (".../v1") would make every request a 404. Another path is
				// kept: a prefix a path-routing proxy strips
				// (http://gw/engines/a).
				add("engine %q: url %q ends in /v1 or has a query or fragment; give the engine's base URL, scheme://host:port[/prefix] (drop /v1)", e.ID, natsutil.RedactURL(e.URL))
			}
		}
		if e.MetricsURL != "" && e.MetricsURL != "-" {
			if err := checkEngineURL(e.MetricsURL); err != nil {
				add("engine %q: bad metrics url %q: %v", e.ID, e.MetricsURL, err)
			}
		}
		switch e.Role {
		case "", "mixed", "prefill", "decode":
		default:
			add("engine %q: role %q; want prefill, decode or mixed", e.ID, e.Role)
		}
		switch e.PDProtocol {
		case "", PDProtocolNIXL, PDProtocolSGLang:
		default:
			add("engine %q: P/D protocol %q; want nixl or sglang", e.ID, e.PDProtocol)
		}
		if e.BootstrapPort < 0 || e.BootstrapPort > 65535 {
			add("engine %q: bootstrap port %d out of range", e.ID, e.BootstrapPort)
		}
		for _, ep := range slices.Concat([]string{e.Events, e.Replay}, e.RankEvents, e.RankReplay) {
			if _, err := kvevents.OffsetEndpoint(ep, 0); ep != "" && err != nil {
				add("engine %q: %v", e.ID, err)
			}
		}
		if e.Bind {
			for _, ep := range slices.Concat([]string{e.Events}, e.RankEvents) {
				if err := kvevents.CheckBindEndpoint(ep); ep != "" && err != nil {
					add("engine %q: --bind-events: %v", e.ID, err)
				}
			}
		}
		if len(e.RankReplay) > 0 && len(e.RankReplay) != len(e.RankEvents) {
			add("engine %q: %d replay endpoints for %d event endpoints", e.ID, len(e.RankReplay), len(e.RankEvents))
		}
		if e.DPSize < 0 || e.BlockSize < 0 {
			add("engine %q: dp size %d and block size %d must not be negative", e.ID, e.DPSize, e.BlockSize)
		}
		if e.BlockSize > MaxBlockSize {
			add("engine %q: block size %d: at most %d tokens", e.ID, e.BlockSize, MaxBlockSize)
		}
		if e.DPSize > kvevents.MaxDPSize || len(e.RankEvents) > kvevents.MaxDPSize {
			add("engine %q: %d data-parallel ranks; at most %d", e.ID, max(e.DPSize, len(e.RankEvents)), kvevents.MaxDPSize)
		}
	}
	if c.AdminAddr != "" {
		// Checked here, not at the admin server's bind: that comes after
		// NATS (an embedded server included) has started.
		if err := checkListenAddr(c.AdminAddr); err != nil {
			add("admin address %q: %v", c.AdminAddr, err)
		}
	}
	if err := c.NATS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	if c.Gossip != nil {
		if err := c.Gossip.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	switch c.ResyncPolicy {
	case ResyncRebuild:
	case ResyncResetEngine:
		for _, e := range c.Engines {
			if e.URL == "" {
				add("engine %q: reset-engine policy needs the engine url", e.ID)
			}
		}
	default:
		add("resync policy %q; want %s or %s", c.ResyncPolicy, ResyncRebuild, ResyncResetEngine)
	}
	if c.PublishQueue <= 0 {
		add("publish queue %d must be positive", c.PublishQueue)
	}
	if c.MaxDeltaKeys <= 0 || c.SnapshotChunkKeys <= 0 {
		add("max delta keys %d and snapshot chunk keys %d must be positive", c.MaxDeltaKeys, c.SnapshotChunkKeys)
	}
	if c.SnapshotChunkKeys > 100000 {
		add("snapshot chunk keys %d exceed a 1 MB NATS payload", c.SnapshotChunkKeys)
	}
	if c.IdleProbe < 0 {
		add("idle probe %v must not be negative", c.IdleProbe)
	}
	if c.EventsSilentAfter < 0 {
		add("events silent after %v must not be negative", c.EventsSilentAfter)
	}
	if c.BatchWindow < 0 || c.ScrapeInterval <= 0 || c.GossipInterval <= 0 {
		add("batch window %v must not be negative; scrape %v and gossip %v intervals must be positive", c.BatchWindow, c.ScrapeInterval, c.GossipInterval)
	}
	if c.EngineIDWait < 0 {
		add("engine id wait %v must not be negative", c.EngineIDWait)
	}
	if c.ModelsInterval < 0 {
		add("models interval %v must not be negative", c.ModelsInterval)
	}
	return errors.Join(errs...)
}

// MaxBlockSize bounds an engine's block size in tokens: vLLM's are 1..256
// (hybrid models' attention blocks a few thousand); beyond it no prompt
// fills a block, so no block is ever keyed.
const MaxBlockSize = 1 << 16

// checkEngineURL is nil when raw is an http or https URL with a host and,
// if it names one, a port in 1..65535: what the ingresses and the
// sidecar's own reads can dial. Anything else failed only at the first
// read, reported as an engine that does not answer.
func checkEngineURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil && strings.Contains(raw, "@"):
		// url.Parse's error quotes the URL, and its inner error the piece
		// it choked on: with userinfo either may hold the password.
		return errors.New("does not parse as a URL; percent-encode any / ? # @ in its user name or password")
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: want http:// or https://", u.Scheme)
	case u.Hostname() == "":
		return errors.New("no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %s: want 1..65535", p)
		}
	}
	return nil
}

// checkListenAddr is nil when addr is HOST:PORT (HOST may be empty) with a
// numeric port in 0..65535, the form net.Listen takes.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT (IPv6 in brackets): %w", err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q: want 0..65535", port)
	}
	return nil
}

// pastedAPIBase reports whether an engine URL's path is a pasted OpenAI base
// URL: its last segment is v1 (/v1, /v1/, /openai/v1). Requests are built as
// URL + /v1/..., so such a URL sends every one to .../v1/v1/... .
func pastedAPIBase(path string) bool {
	return strings.HasSuffix(strings.TrimSuffix(path, "/"), "/v1")
}

// warnLocalEngineURLs warns, at start, of every engine whose URL names
// this host only (localEngineURL) while its gossip address does not:
// ingresses on other hosts dial the gossiped URL and reach themselves (an
// ingress listening on the engine's port loops), and the default engine
// id, the URL's host:port, is then the same on every pod.
func (c *Config) warnLocalEngineURLs(log *slog.Logger) {
	if c.Gossip == nil {
		return
	}
	addr := c.Gossip.AdvertiseAddr
	if addr == "" {
		addr = c.Gossip.BindAddr
	}
	if isLocalHost(addr) {
		return // a single-host mesh (the demo, tests): loopback is right
	}
	for _, e := range c.Engines {
		if localEngineURL(e.URL) {
			log.Warn("engine URL names this host only, but it is gossiped to other hosts, which will dial themselves: "+
				"give an address they can reach (--engine-host=$(POD_IP) --engine-port=PORT in a pod) and --engine-id=$(POD_NAME)",
				"engine", e.ID, "url", natsutil.RedactURL(e.URL), "gossip_addr", addr)
		}
	}
}

// localEngineURL reports whether an engine URL's host is loopback,
// "localhost" or unspecified (0.0.0.0, ::): reachable from this host only.
func localEngineURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return false
	}
	h := u.Hostname()
	ip := net.ParseIP(h)
	return isLocalHost(h) || ip != nil && ip.IsUnspecified()
}

// isLocalHost reports whether host is a loopback address or localhost.
func isLocalHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}
