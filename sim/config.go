package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// Sentinel errors.
var (
	ErrInvalidConfig = errors.New("sim: invalid config")
	ErrClosed        = errors.New("sim: closed")
)

// Tokenizer is the part of internal/tokenizer the simulator uses (its
// *tokenizer.Native satisfies it). Methods must be safe for concurrent use.
type Tokenizer interface {
	AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32
	Decode(ids []uint32, skipSpecialTokens bool) string
}

// ChatRenderer renders chat messages into the prompt text the engine
// tokenizes (the model's chat template). Must be safe for concurrent use.
type ChatRenderer interface {
	RenderChat(messages []openai.ChatMessage, addGenerationPrompt bool) (string, error)
}

// Config configures one simulator instance.
type Config struct {
	// Model is the served model name (--model). Default "kvmesh-sim".
	Model string
	// HTTPAddr is the listen address (--http). Default "127.0.0.1:0" (a free port).
	HTTPAddr string
	// KVEvents is rank 0's PUB endpoint (--kv-events); "" disables events.
	// Binds when the host or port is "*" or the port is 0, connects otherwise
	// (vLLM's rule); rank r uses port+r.
	KVEvents string
	// KVReplay is rank 0's ROUTER replay endpoint (--kv-replay); "" = no replay.
	KVReplay string
	// Topic is frame 0 of every event message. Default "" (vLLM's).
	Topic string
	// EventForm selects array (default) or map-encoded events; ReplayLayout
	// the replay reply layout (default: with topic, vLLM after PR #45177).
	EventForm    kvtest.EventForm
	ReplayLayout kvtest.ReplayLayout
	// ReplayBuffer is how many batches the replay buffer keeps. Default 10000.
	ReplayBuffer int
	// DropRate is the fault switch: the fraction of event batches not sent
	// live (they stay in the replay buffer).
	DropRate float64
	// DP is the number of data-parallel ranks, each an engine. Default 1.
	DP int
	// Engine configures every rank's engine (block size, capacities, profile...).
	// Its HashSeed defaults to Seed; KeepBlockTokens and RecordTokenTimes are
	// forced on and Keyer is set to the kvmesh key of Model (CachedKeys).
	Engine engine.Config
	// TimeScale runs the model faster than real time: modelled seconds per
	// wall second. Default 1; tests use 20–1000.
	TimeScale float64
	// Seed makes hashes, generated tokens and early stops deterministic.
	Seed uint64
	// EOSRate is the per-token chance of a natural stop after min_tokens for
	// requests without ignore_eos. Default 0: every request runs to max_tokens.
	EOSRate float64
	// DefaultMaxTokens is the output cap of requests without max_tokens.
	// Default 16 for completions (vLLM's); chat uses DefaultChatMaxTokens.
	DefaultMaxTokens     int
	DefaultChatMaxTokens int // default 256 (vLLM: up to max_model_len)
	// MediaTokens is the tokens each media item of a chat request (an
	// image, audio or video part) adds to its prompt, where the engine's
	// encoder output would go (text.go). Default 256 (Qwen2-VL's 448×448
	// image).
	MediaTokens int
	// MaxWaiting bounds queued requests per rank; beyond it requests get 503.
	// Default 4096.
	MaxWaiting int
	// MaxBodyBytes bounds request bodies. Default 32 MiB (the ingress's).
	MaxBodyBytes int64
	// Tokenizer tokenizes text; nil = the byte-level fallback (docs/SIMULATOR.md).
	Tokenizer Tokenizer
	// Chat renders chat messages; nil = the built-in Llama-3-style template.
	Chat ChatRenderer
	// LoRA serves LoRA adapters as vLLM does (lora.go).
	LoRA LoRAConfig
	// APIKey, when set, is required on /v1 requests as "Authorization:
	// Bearer <key>" (vLLM's --api-key / VLLM_API_KEY).
	APIKey string
	// ResponsesStore keeps Responses API responses in memory when a request
	// asks to store them (--responses-store; vLLM's
	// VLLM_ENABLE_RESPONSES_API_STORE=1). Off, store=true is silently
	// ignored as in vLLM, so previous_response_id and GET /v1/responses/{id}
	// find nothing (responses.go).
	ResponsesStore bool
	// ReadHeaderTimeout bounds how long a connection may take to send a
	// request's headers (the HTTP server's slowloris guard). Default 10 s;
	// tests on a loaded machine set it longer, since a connection
	// goroutine starved past it is closed without a reply.
	ReadHeaderTimeout time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// PD configures prefill/decode disaggregation (vLLM NIXL or SGLang
	// bootstrap protocol); the zero value is off. See pdconfig.go.
	PD PDConfig
}

// Defaults returns c with zero fields set to their defaults.
func (c Config) Defaults() Config {
	if c.Model == "" {
		c.Model = "kvmesh-sim"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:0"
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = 10000
	}
	if c.DP == 0 {
		c.DP = 1
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = 16
	}
	if c.DefaultChatMaxTokens == 0 {
		c.DefaultChatMaxTokens = 256
	}
	if c.MediaTokens == 0 {
		c.MediaTokens = 256
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = 4096
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.Engine.HashSeed == 0 {
		c.Engine.HashSeed = c.Seed
	}
	c.Engine.KeepBlockTokens = true
	c.Engine.RecordTokenTimes = true
	c.Engine = c.Engine.Defaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PD.Enabled() {
		c.PD = c.PD.defaults()
	}
	return c
}

// Validate lists every problem with c (after Defaults).
func (c Config) Validate() error {
	var errs []error
	if c.DP < 1 || c.DP > 64 {
		errs = append(errs, fmt.Errorf("dp %d: want 1..64", c.DP))
	}
	// Written so NaN fails them: NaN compares false to everything.
	if !(c.TimeScale > 0 && c.TimeScale <= 1e6) {
		errs = append(errs, fmt.Errorf("time scale %g: want (0, 1e6]", c.TimeScale))
	}
	if !(c.DropRate >= 0 && c.DropRate <= 1) {
		errs = append(errs, fmt.Errorf("drop rate %g: want [0, 1]", c.DropRate))
	}
	if !(c.EOSRate >= 0 && c.EOSRate < 1) {
		errs = append(errs, fmt.Errorf("eos rate %g: want [0, 1)", c.EOSRate))
	}
	if c.KVReplay != "" && c.KVEvents == "" {
		errs = append(errs, errors.New("kv replay without kv events"))
	}
	for _, ep := range []string{c.KVEvents, c.KVReplay} {
		if ep == "" {
			continue
		}
		if _, err := kvevents.OffsetEndpoint(ep, c.DP-1); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %q: %w", ep, err))
		}
	}
	if c.ReplayBuffer < 0 || c.MaxWaiting < 1 || c.MaxBodyBytes < 1 || c.DefaultMaxTokens < 1 || c.DefaultChatMaxTokens < 1 || c.MediaTokens < 1 {
		errs = append(errs, errors.New("replay buffer, max waiting, max body bytes, default max tokens and media tokens must be positive"))
	}
	if c.ReadHeaderTimeout < 0 {
		errs = append(errs, fmt.Errorf("read header timeout %v: want ≥ 0 (0: 10s)", c.ReadHeaderTimeout))
	}
	if c.LoRA.MaxLoRAs < 0 {
		errs = append(errs, fmt.Errorf("max loras %d: want ≥ 1 (0: 1)", c.LoRA.MaxLoRAs))
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.PD.validate(c.DP)...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// wallFor converts a modelled duration into wall time.
func (c *Config) wallFor(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.TimeScale)
}
