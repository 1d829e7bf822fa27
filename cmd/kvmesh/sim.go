package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/kvevents"
)

// runSim runs the vLLM-compatible engine simulator until interrupted.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sim", stderr)
	var cfg sim.Config
	fs.StringVar(&cfg.Model, "model", "kvmesh-sim", "served model name")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8000", "HTTP listen address (port 0 = pick a free port)")
	fs.StringVar(&cfg.KVEvents, "kv-events", "", "ZMQ PUB endpoint of DP rank 0, e.g. tcp://*:5557 (binds with * or port 0, connects otherwise); empty = no events")
	fs.StringVar(&cfg.KVReplay, "kv-replay", "", "ZMQ ROUTER replay endpoint of DP rank 0, e.g. tcp://*:5558; empty = no replay")
	fs.IntVar(&cfg.Engine.BlockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&cfg.Engine.GPUBlocks, "gpu-blocks", 4096, "GPU KV capacity in blocks")
	fs.IntVar(&cfg.Engine.CPUBlocks, "cpu-blocks", 0, "CPU tier capacity in blocks (0 = no CPU tier)")
	fs.IntVar(&cfg.DP, "dp", 1, "data-parallel ranks (each an engine; event ports offset by rank)")
	tokPath := fs.String("tokenizer", "", "Hugging Face tokenizer.json for text prompts (default: byte-level fallback)")
	chatPath := fs.String("chat-template", "", "tokenizer_config.json whose chat_template renders chat requests (default: built-in Llama 3 markup)")
	profile := fs.String("profile", engine.DefaultProfile, "timing profile: "+strings.Join(engine.ProfileNames(), ", "))
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "modelled seconds per wall second (>1 runs faster than real time)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for block hashes, generated tokens and early stops")
	fs.IntVar(&cfg.Engine.MaxRunning, "max-num-seqs", 0, "largest batch in sequences (0 = vLLM's default on the profile's GPU)")
	fs.IntVar(&cfg.Engine.MaxBatchTokens, "max-num-batched-tokens", 0, "token budget per step, longer prefills are chunked (0 = vLLM's default on the profile's GPU)")
	fs.IntVar(&cfg.Engine.MaxModelLen, "max-model-len", 0, "max prompt+output tokens (default: GPU capacity)")
	fs.StringVar(&cfg.Topic, "topic", "", "topic frame of KV-event messages")
	form := fs.String("event-form", "array", "KV-event encoding: array (msgspec array_like) or map (vLLM ≥ PR #42892)")
	layout := fs.String("replay-layout", "new", "replay reply layout: new (with topic frame, vLLM ≥ PR #45177) or old")
	fs.IntVar(&cfg.ReplayBuffer, "replay-buffer", 10000, "event batches kept for replay")
	fs.Float64Var(&cfg.DropRate, "drop-rate", 0, "fault switch: fraction of event batches not sent live (replay still has them)")
	fs.Float64Var(&cfg.EOSRate, "eos-rate", 0, "per-token chance of stopping after min_tokens without ignore_eos (0 = always max_tokens)")
	fs.IntVar(&cfg.MaxWaiting, "max-waiting", 4096, "queued requests per rank before answering 503")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	finishPD := cfg.PD.BindFlags(fs) // P/D flags: --kv-transfer-config, --nixl-side-channel, --disaggregation-mode, ...
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if err := finishPD(cfg.HTTPAddr); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level: %w", errUsage, err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	p, err := engine.LookupProfile(*profile)
	if err != nil {
		return fmt.Errorf("%w: --profile: %w", errUsage, err)
	}
	cfg.Engine.Profile = p
	switch *form {
	case "array":
		cfg.EventForm = kvevents.ArrayForm
	case "map":
		cfg.EventForm = kvevents.MapForm
	default:
		return fmt.Errorf("%w: --event-form %q: want array or map", errUsage, *form)
	}
	switch *layout {
	case "new":
		cfg.ReplayLayout = kvevents.ReplayWithTopic
	case "old":
		cfg.ReplayLayout = kvevents.ReplayLegacy
	default:
		return fmt.Errorf("%w: --replay-layout %q: want new or old", errUsage, *layout)
	}
	if *tokPath != "" {
		tok, err := tokenizer.LoadFile(*tokPath)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		cfg.Tokenizer = tok
	}
	if *chatPath != "" {
		ct, err := tokenizer.LoadChatTemplateFile(*chatPath)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		cfg.Chat = sim.TemplateChat{T: ct}
	}
	srv, err := sim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.KVEvents != "" && !kvevents.PublisherBinds(cfg.KVEvents) {
		// vLLM's rule: an endpoint without a wildcard host or port is connected
		// to, not bound; a subscriber that also connects would see no events.
		fmt.Fprintf(stderr, "kvmesh sim: the KV-event PUB connects to %s (vLLM's rule); subscribers must bind it, or use tcp://*:PORT to bind here\n", cfg.KVEvents)
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
