package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/scheduler"
)

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// runIngress runs one ingress replica until SIGTERM/SIGINT, then drains.
func runIngress(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := ingress.DefaultConfig()
	// A YAML file, when given, sets the defaults the flags then override.
	if path := configFlag(args); path != "" {
		c, err := ingress.LoadConfigFile(path)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		cfg = c
	}
	fs := newFlagSet("ingress", stderr)
	fs.String("config", "", "YAML config file (ingress.Config fields); flags override it")
	var engines, tokenizers multiFlag
	fs.StringVar(&cfg.ID, "id", "", "replica id (default ingress-<port>)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "client-facing address")
	fs.StringVar(&cfg.AdminListen, "admin", "", "pprof address (empty: off)")
	fs.Var(&engines, "engine", "static engine [id=]model=url (repeatable; used without gossip)")
	fs.Var(&tokenizers, "tokenizer", "model=path to tokenizer.json or its directory (repeatable)")
	var templates multiFlag
	fs.Var(&templates, "chat-template", "model=path to tokenizer_config.json with the chat template (repeatable)")
	pdPolicy := fs.String("pd-policy", cfg.PD.Policy, "prefill/decode step for engines with roles (\"\" = off): kvmesh|kvmesh-always|kthena|llmd|dynamo|sglang|aibrix")
	pdGbps := fs.Float64("pd-transfer-gbps", 100, "prefill → decode KV bandwidth the P/D cost model assumes, Gbit/s")
	policy := fs.String("policy", cfg.Scheduler.Policy, "routing policy: random|round-robin|least-request|kthena|ray|sglang|dynamo|llmd|kvmesh|weighted")
	schedFile := fs.String("scheduler-config", "", "SchedulerConfig YAML file (overrides -policy)")
	fs.StringVar(&cfg.ChatMode, "chat-mode", cfg.ChatMode, "chat forwarding: chat (forward as chat) or completions (send rendered tokens, re-wrap)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body", cfg.MaxBodyBytes, "max request body bytes (413 above)")
	fs.IntVar(&cfg.MaxPromptTokens, "max-prompt-tokens", cfg.MaxPromptTokens, "max prompt tokens (0: no limit)")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "max requests in service (429 above)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "upstream attempts per request")
	fs.DurationVar(&cfg.IdleTimeout, "upstream-idle-timeout", cfg.IdleTimeout, "max wait for upstream bytes")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "graceful drain bound on SIGTERM")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "engines' KV block size when membership does not say")
	fs.BoolVar(&cfg.AccessLog, "access-log", cfg.AccessLog, "one JSON line per request on stderr")
	keysFile := fs.String("api-keys-file", "", "API keys file (also $KVMESH_API_KEYS); none: open")
	limitIn := fs.Int64("key-input-tpm", 0, "per-key input tokens per minute (0: none)")
	limitOut := fs.Int64("key-output-tpm", 0, "per-key output tokens per minute (0: none)")
	modelIn := fs.Int64("model-input-tpm", 0, "per-model input tokens per minute (0: none)")
	modelOut := fs.Int64("model-output-tpm", 0, "per-model output tokens per minute (0: none)")
	admitMax := fs.Int("admit-max", 0, "session-boost admission: max requests in service before queueing (0: off)")
	admitWait := fs.Duration("admit-max-wait", 30*time.Second, "admission queue wait before 504")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.StringVar(&cfg.Cluster.GossipBind, "gossip-bind", "", "memberlist address host:port (empty: no gossip, use -engine)")
	fs.StringVar(&cfg.Cluster.GossipAdvertise, "gossip-advertise", "", "gossip host or host:port others dial, when it differs from the bind address")
	gossipKey := fs.String("gossip-key", os.Getenv("KVMESH_GOSSIP_KEY"), "base64 gossip encryption key of 16, 24 or 32 bytes (env KVMESH_GOSSIP_KEY)")
	join := fs.String("join", "", "comma-separated gossip seeds host:port")
	fs.StringVar(&cfg.Cluster.GossipProfile, "gossip-profile", "", "memberlist timings: local, lan (default) or wan")
	natsURLs := fs.String("nats", "", "comma-separated NATS URLs carrying the sidecars' deltas (empty: no materialized index)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	// Every problem is reported at once (exit 2), not the first only.
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if *join != "" {
		cfg.Cluster.GossipSeeds = strings.Split(*join, ",")
	}
	if *natsURLs != "" {
		cfg.Cluster.NATSURLs = strings.Split(*natsURLs, ",")
	}
	if *gossipKey != "" {
		k, err := base64.StdEncoding.DecodeString(*gossipKey)
		if err != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			bad("--gossip-key must be base64 of 16, 24 or 32 bytes")
		} else {
			cfg.Cluster.GossipKey = k
		}
	}
	for _, e := range engines {
		se, err := ingress.ParseStaticEngine(e)
		if err != nil {
			bad("--engine: %v", err)
			continue
		}
		cfg.Engines = append(cfg.Engines, se)
	}
	if len(tokenizers) > 0 {
		cfg.Tokenizers = map[string]string{}
	}
	for _, t := range tokenizers {
		model, path, ok := strings.Cut(t, "=")
		if !ok {
			bad("--tokenizer %q: want model=path", t)
			continue
		}
		cfg.Tokenizers[model] = path
	}
	for _, t := range templates {
		model, path, ok := strings.Cut(t, "=")
		if !ok {
			bad("--chat-template %q: want model=path", t)
			continue
		}
		if cfg.ChatTemplates == nil {
			cfg.ChatTemplates = map[string]string{}
		}
		cfg.ChatTemplates[model] = path
	}
	for _, l := range []struct {
		name string
		v    int64
	}{{"key-input-tpm", *limitIn}, {"key-output-tpm", *limitOut}, {"model-input-tpm", *modelIn}, {"model-output-tpm", *modelOut}, {"admit-max", int64(*admitMax)}} {
		if l.v < 0 {
			bad("--%s must be >= 0, got %d", l.name, l.v)
		}
	}
	cfg.Scheduler.Policy = *policy
	cfg.PD.Policy, cfg.PD.TransferGbps = *pdPolicy, *pdGbps
	if *schedFile != "" {
		sc, err := scheduler.LoadConfig(*schedFile)
		if err != nil {
			bad("--scheduler-config: %v", err)
		} else {
			cfg.Scheduler = sc
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		bad("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	if err := cfg.Validate(); err != nil {
		bad("%v", err)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	deps := ingress.Deps{Logger: log, AccessLog: log, Registry: reg}

	ac := auth.DefaultConfig()
	ac.KeysFile = *keysFile
	store, err := auth.Load(ac)
	if err != nil {
		return err
	}
	if store.Enabled() {
		deps.Auth = store
	}
	if *limitIn > 0 || *limitOut > 0 || *modelIn > 0 || *modelOut > 0 {
		rc := ratelimit.DefaultConfig()
		rc.PerKey = ratelimit.Limits{InputTokens: *limitIn, OutputTokens: *limitOut}
		rc.PerModel = ratelimit.Limits{InputTokens: *modelIn, OutputTokens: *modelOut}
		lim, err := ratelimit.New(rc)
		if err != nil {
			return err
		}
		reg.MustRegister(lim.Collectors()...)
		deps.Limiter = lim
	}
	aff, err := session.NewAffinity(session.DefaultAffinityConfig())
	if err != nil {
		return err
	}
	deps.Affinity = aff
	if *admitMax > 0 {
		adc := session.DefaultAdmissionConfig()
		adc.MaxConcurrent, adc.MaxWait = *admitMax, *admitWait
		adm, err := session.NewAdmitter(adc)
		if err != nil {
			return err
		}
		reg.MustRegister(adm.Collectors()...)
		deps.Admitter = adm
		deps.ClassifyError = ingress.SessionErrors
	}
	if err := ingress.LoadTokenizers(&cfg, &deps); err != nil {
		return err
	}
	srv, err := ingress.New(cfg, deps)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "kvmesh ingress listening on http://%s\n", srv.Addr())
	<-ctx.Done()
	fmt.Fprintln(stdout, "draining")
	return srv.Close()
}

// configFlag finds -config/--config in args before the flag set is built.
func configFlag(args []string) string {
	for i, a := range args {
		for _, p := range []string{"-config", "--config"} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
	}
	return ""
}
