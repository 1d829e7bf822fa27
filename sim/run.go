package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/kvmesh/kvmesh/internal/logutil"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// ErrConfig wraps every problem Options.Build finds.
var ErrConfig = errors.New("invalid simulator config")

// Options is what `kvmesh sim` runs: the simulator's Config plus the parts
// the command line names (timing profile, event encoding, tokenizer and
// chat-template files), resolved by Build. The command's flags bind onto
// it (cmd/kvmesh/sim.go).
type Options struct {
	Config Config
	// Profile names the timing profile (engine.ProfileNames).
	Profile string
	// ProfileFile, when set, is a user-written timing profile
	// (engine.ProfileFile documents its fields); it overrides Profile.
	ProfileFile string
	// EventForm is "array" (msgspec array_like) or "map" (vLLM ≥ PR #42892).
	EventForm string
	// ReplayLayout is "new" (with the topic frame, vLLM ≥ PR #45177) or "old".
	ReplayLayout string
	// TokenizerPath is a Hugging Face tokenizer.json for text prompts ("":
	// the byte-level fallback). ChatTemplatePath is the chat template
	// (tokenizer.LoadChatTemplateFile: a model directory, tokenizer_config.json,
	// chat_template.jinja/.json or a Jinja file; "": built-in Llama 3 markup).
	TokenizerPath, ChatTemplatePath string
	// LogLevel of the log on stderr. Default info.
	LogLevel slog.Level
	// LogFormat of that log: logutil.Text (the default: the simulator is a
	// developer's tool) or logutil.JSON.
	LogFormat string

	// pdFinish applies the P/D flags (BindPDFlags) onto a Config's PD.
	pdFinish func(c *PDConfig, httpAddr string) error
}

// DefaultOptions is one rank of a 7B-class engine on loopback:8000
// without KV events.
func DefaultOptions() Options {
	var c Config
	c.Model, c.HTTPAddr, c.DP = "kvmesh-sim", "127.0.0.1:8000", 1
	c.Engine.BlockSize, c.Engine.GPUBlocks = 16, 4096
	c.TimeScale, c.ReplayBuffer, c.MaxWaiting = 1, 10000, 4096
	return Options{Config: c, Profile: engine.DefaultProfile, EventForm: "array", ReplayLayout: "new", LogFormat: logutil.Text}
}

// Build resolves o into the Config Start takes: every naming problem is
// listed (wrapping ErrConfig); a tokenizer or template that fails to load
// is returned as it is.
func (o *Options) Build(log *slog.Logger) (Config, error) {
	cfg := o.Config
	cfg.Logger = log
	var errs []error
	if o.ProfileFile != "" {
		if p, err := engine.LoadProfileFile(o.ProfileFile); err != nil {
			errs = append(errs, fmt.Errorf("%w: profile file: %w", ErrConfig, err))
		} else {
			cfg.Engine.Profile = p
		}
	} else if p, err := engine.LookupProfile(o.Profile); err != nil {
		errs = append(errs, fmt.Errorf("%w: profile: %w", ErrConfig, err))
	} else {
		cfg.Engine.Profile = p
	}
	profiled := len(errs) == 0 // else Validate would report the empty profile too
	switch o.EventForm {
	case "array":
		cfg.EventForm = kvtest.ArrayForm
	case "map":
		cfg.EventForm = kvtest.MapForm
	default:
		errs = append(errs, fmt.Errorf("%w: event form %q: want array or map", ErrConfig, o.EventForm))
	}
	switch o.ReplayLayout {
	case "new":
		cfg.ReplayLayout = kvtest.ReplayWithTopic
	case "old":
		cfg.ReplayLayout = kvtest.ReplayLegacy
	default:
		errs = append(errs, fmt.Errorf("%w: replay layout %q: want new or old", ErrConfig, o.ReplayLayout))
	}
	if o.pdFinish != nil {
		if err := o.pdFinish(&cfg.PD, cfg.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	if profiled {
		// Every problem Start's own Validate would find, found before
		// anything starts (a copy: Defaults picks a random P/D engine id
		// Start must pick itself).
		if err := cfg.Defaults().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	if len(errs) > 0 {
		return cfg, errors.Join(errs...)
	}
	if o.TokenizerPath != "" {
		tok, err := tokenizer.LoadPath(o.TokenizerPath) // tokenizer.json, or a model directory (tiktoken.model too)
		if err != nil {
			return cfg, fmt.Errorf("sim: %w", err)
		}
		cfg.Tokenizer = tok
	}
	if o.ChatTemplatePath != "" {
		ct, err := tokenizer.LoadChatTemplateFile(o.ChatTemplatePath)
		if err != nil {
			return cfg, fmt.Errorf("sim: %w", err)
		}
		cfg.Chat = TemplateChat{T: ct}
	}
	return cfg, nil
}

// Run serves the simulator until ctx ends: it writes its HTTP URL and
// every rank's event endpoints to stdout and logs to stderr.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	log := logutil.New(stderr, o.LogFormat, o.LogLevel)
	cfg, err := o.Build(log)
	if err != nil {
		return err
	}
	srv, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.KVEvents != "" && !kvevents.PublisherBinds(cfg.KVEvents) {
		// vLLM's rule: an endpoint without a wildcard host or port is connected
		// to, not bound; a subscriber that also connects would see no events.
		// Through the logger: with --log-format json, stderr holds JSON lines only.
		log.Warn("the KV-event PUB connects to its endpoint (vLLM's rule); subscribers must bind it, or use tcp://*:PORT to bind here",
			"endpoint", cfg.KVEvents)
	}
	fmt.Fprintf(stdout, "http %s\n", srv.URL())
	for r := 0; r < srv.DP(); r++ {
		if a := srv.SideChannelAddr(r); a != "" {
			fmt.Fprintf(stdout, "nixl-side-channel rank %d %s engine %s\n", r, a, srv.EngineID(r))
		}
	}
	if a := srv.BootstrapAddr(); a != "" {
		fmt.Fprintf(stdout, "bootstrap %s\n", a)
	}
	for r := 0; r < srv.DP(); r++ {
		if ep := srv.EventsEndpoint(r); ep != "" {
			fmt.Fprintf(stdout, "kv-events rank %d %s\n", r, ep)
		}
		if ep := srv.ReplayEndpoint(r); ep != "" {
			fmt.Fprintf(stdout, "kv-replay rank %d %s\n", r, ep)
		}
	}
	<-ctx.Done()
	return srv.Close()
}
