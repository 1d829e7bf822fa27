package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// runSim runs the vLLM-compatible engine simulator until interrupted
// (sim.Run).
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := sim.DefaultOptions()
	fs := newFlagSet("sim", stderr)
	var probs flagProblems
	simFlags(fs, &opts, &probs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	simFlagsRead(fs, &probs)
	if err := probs.err(); err != nil {
		return err
	}
	err := sim.Run(ctx, opts, stdout, stderr)
	if errors.Is(err, sim.ErrConfig) {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return err
}

// simFlagsRead adds a problem for each `kvmesh sim` flag given with a value
// the simulator's configuration would misread, and for each whose feature
// the rest of the command line leaves off (OPERATIONS.md: such a flag is
// refused by name, not ignored). The values sim.Config.Validate checks
// again are checked here by flag name.
func simFlagsRead(fs *flag.FlagSet, probs *flagProblems) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		given[f.Name] = true
		v := f.Value.String()
		switch f.Name {
		case "time-scale", "drop-rate", "eos-rate", "kv-transfer-gbps":
			// NaN passes every "x <= 0" test, and NaN or Inf in the time
			// scale or a rate makes every modelled time NaN.
			if x, err := strconv.ParseFloat(v, 64); err == nil && (math.IsNaN(x) || math.IsInf(x, 0)) {
				probs.add("--%s %s: want a finite value", f.Name, v)
				return
			}
		}
		switch f.Name {
		case "time-scale", "dp", "block-size", "gpu-blocks", "kv-transfer-gbps", "max-waiting", "replay-buffer", "max-loras":
			// The configuration reads 0 as "the default" for these; given
			// on the command line, 0 (or less) is a mistake to report, not
			// to replace.
			if x, err := strconv.ParseFloat(v, 64); err == nil && x <= 0 {
				probs.add("--%s %s: want > 0", f.Name, v)
			}
		case "disaggregation-bootstrap-port":
			if p, err := strconv.Atoi(v); err == nil && (p < 0 || p > 65535) { // failed at the bind, after start-up began
				probs.add("--%s %s: want 0..65535", f.Name, v)
			}
		case "nixl-abort-timeout", "disaggregation-timeout":
			if d, err := time.ParseDuration(v); err == nil && d <= 0 {
				probs.add("--%s %s: want > 0", f.Name, v)
			}
		}
	})
	noEvents := fs.Lookup("kv-events").Value.String() == ""
	mode := fs.Lookup("disaggregation-mode").Value.String()
	nixl := given["kv-transfer-config"]
	var rules []offFlag
	for _, f := range []string{"drop-rate", "event-form", "topic", "replay-layout", "replay-buffer"} {
		rules = append(rules, offFlag{f, noEvents, "without --kv-events"})
	}
	noLoRA := fs.Lookup("enable-lora").Value.String() != "true"
	rules = append(rules, offFlag{"max-loras", noLoRA, "without --enable-lora"},
		offFlag{"lora-modules", noLoRA, "without --enable-lora"},
		offFlag{"nixl-side-channel", !nixl, "without --kv-transfer-config"},
		offFlag{"kv-transfer-gbps", !nixl && mode == "", "without --kv-transfer-config or --disaggregation-mode"},
		offFlag{"nixl-abort-timeout", !nixl && mode == "", "without --kv-transfer-config or --disaggregation-mode"},
		offFlag{"disaggregation-bootstrap-port", mode != "prefill", "without --disaggregation-mode prefill"},
		offFlag{"disaggregation-timeout", mode == "", "without --disaggregation-mode"})
	probs.refuseOff(fs, rules)
}

// simFlags binds every `kvmesh sim` flag onto opts; bad values go to probs.
func simFlags(fs *flag.FlagSet, opts *sim.Options, probs *flagProblems) {
	cfg := &opts.Config
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	fs.StringVar(&cfg.HTTPAddr, "http", cfg.HTTPAddr, "HTTP listen address (port 0 = pick a free port)")
	fs.StringVar(&cfg.KVEvents, "kv-events", "", "ZMQ PUB endpoint of DP rank 0, e.g. tcp://*:5557 (binds with * or port 0, connects otherwise); empty = no events")
	fs.StringVar(&cfg.KVReplay, "kv-replay", "", "ZMQ ROUTER replay endpoint of DP rank 0, e.g. tcp://*:5558; empty = no replay")
	fs.IntVar(&cfg.Engine.BlockSize, "block-size", cfg.Engine.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.Engine.GPUBlocks, "gpu-blocks", cfg.Engine.GPUBlocks, "GPU KV capacity in blocks")
	fs.IntVar(&cfg.Engine.CPUBlocks, "cpu-blocks", 0, "CPU tier capacity in blocks (0 = no CPU tier)")
	fs.IntVar(&cfg.DP, "dp", cfg.DP, "data-parallel ranks (each an engine; event ports offset by rank)")
	fs.StringVar(&opts.TokenizerPath, "tokenizer", "", "Hugging Face tokenizer.json for text prompts (default: byte-level fallback)")
	fs.StringVar(&opts.ChatTemplatePath, "chat-template", "", "chat template: a model directory (chat_template.jinja, chat_template.json or tokenizer_config.json, as transformers finds it), one of those files, or a Jinja file (default: built-in Llama 3 markup)")
	fs.StringVar(&opts.Profile, "profile", opts.Profile, "timing profile: "+strings.Join(engine.ProfileNames(), ", "))
	fs.StringVar(&opts.ProfileFile, "profile-file", opts.ProfileFile, "timing profile from a YAML file (engine.ProfileFile documents the fields; overrides --profile)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "modelled seconds per wall second (>1 runs faster than real time)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for block hashes, generated tokens and early stops")
	fs.IntVar(&cfg.Engine.MaxRunning, "max-num-seqs", 0, "largest batch in sequences (0 = vLLM's default on the profile's GPU)")
	fs.IntVar(&cfg.Engine.MaxBatchTokens, "max-num-batched-tokens", 0, "token budget per step, longer prefills are chunked (0 = vLLM's default on the profile's GPU)")
	fs.IntVar(&cfg.Engine.MaxModelLen, "max-model-len", 0, "max prompt+output tokens (default: GPU capacity)")
	fs.StringVar(&cfg.Topic, "topic", "", "topic frame of KV-event messages")
	fs.StringVar(&opts.EventForm, "event-form", opts.EventForm, "KV-event encoding: array (msgspec array_like) or map (vLLM ≥ PR #42892)")
	fs.StringVar(&opts.ReplayLayout, "replay-layout", opts.ReplayLayout, "replay reply layout: new (with topic frame, vLLM ≥ PR #45177) or old")
	fs.IntVar(&cfg.ReplayBuffer, "replay-buffer", cfg.ReplayBuffer, "event batches kept for replay")
	fs.Float64Var(&cfg.DropRate, "drop-rate", 0, "fault switch: fraction of event batches not sent live (replay still has them)")
	fs.Float64Var(&cfg.EOSRate, "eos-rate", 0, "per-token chance of stopping after min_tokens without ignore_eos (0 = always max_tokens)")
	fs.IntVar(&cfg.MaxWaiting, "max-waiting", cfg.MaxWaiting, "queued requests per rank before answering 503")
	fs.BoolVar(&cfg.LoRA.Enable, "enable-lora", false, "serve LoRA adapters (vLLM's --enable-lora; runtime /v1/load_lora_adapter is allowed)")
	fs.IntVar(&cfg.LoRA.MaxLoRAs, "max-loras", 1, "adapters loaded at once")
	fs.BoolVar(&cfg.ResponsesStore, "responses-store", false, "keep Responses API responses in memory for previous_response_id and GET /v1/responses/{id} (vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1)")
	secretEnvFlag(fs, &cfg.APIKey, "api-key", "VLLM_API_KEY", "require this `key` on /v1 requests (Authorization: Bearer; vLLM's --api-key)")
	fs.IntVar(&cfg.MediaTokens, "media-tokens", 256, "tokens each media item (an image, audio or video part) of a chat or Responses request adds to its prompt")
	probs.Var(fs, "lora-modules", "", "LoRA adapter name=path served from the start (repeatable)", func(v string) error {
		name, path, ok := strings.Cut(v, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("--lora-modules %q: want name=path", v)
		}
		if cfg.LoRA.Modules == nil {
			cfg.LoRA.Modules = map[string]string{}
		}
		cfg.LoRA.Modules[name] = path
		return nil
	})
	probs.LogLevel(fs, &opts.LogLevel)
	probs.LogFormat(fs, &opts.LogFormat)
	opts.BindPDFlags(fs) // --kv-transfer-config, --nixl-side-channel, --kv-transfer-gbps, --disaggregation-mode, ...
}
