package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// runIngress runs one ingress replica until SIGTERM/SIGINT, then drains
// (ingress.Run).
func runIngress(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := ingressOptions(args, stderr)
	if err != nil {
		return err
	}
	return ingress.Run(ctx, opts, stdout, stderr)
}

// ingressOptions reads `kvmesh ingress`'s command line (and its --config
// file) into checked options.
func ingressOptions(args []string, stderr io.Writer) (ingress.Options, error) {
	opts := ingress.DefaultOptions()
	// A YAML file, when given, sets the defaults the flags then override.
	path, err := configFlag(args)
	if err != nil {
		return opts, err
	}
	if path != "" {
		c, err := ingress.LoadConfigFile(path)
		if err != nil {
			return opts, fmt.Errorf("%w: %w", errUsage, err)
		}
		opts.Config = c
	}
	fs := newFlagSet("ingress", stderr)
	var probs flagProblems
	ingressFlags(fs, &opts, &probs)
	listenTLSFlags(fs, &opts.Config)
	// `kvmesh epp` defines its own: it charges the bodies it buffers itself.
	fs.Int64Var(&opts.Config.MaxBodyBytesInFlight, "max-body-in-flight", opts.Config.MaxBodyBytesInFlight, "max request body bytes held at once over all requests, this ingress's own memory bound (503 above; bodies up to 64 KiB always pass; 0: off; else >= --max-body)")
	// Only the ingress answers clients: the picker's answers are the gateway's.
	fs.BoolVar(&opts.Config.EngineHeader, "engine-header", opts.Config.EngineHeader, "name the engine that answered in each answer's X-Kvmesh-Engine header (the load tools count engines by it; config engineHeader); an engine's id defaults to its URL's host:port, so set it false, or give the engines ids (sidecar --engine-id), where clients must not see engine addresses")
	if err := parseFlags(fs, args, 0); err != nil {
		return opts, durationHint(fs, err)
	}
	probs.addErr(opts.Validate())
	ingressFlagsRead(fs, &opts, &probs)
	return opts, probs.err()
}

// ingressFlagsRead adds a problem for each ingress flag given whose
// feature o (flags over --config) leaves off, where it would be ignored:
// --admin-token without --admin would leave the client port's /metrics as
// open as before. first are a caller's own rules (kvmesh epp's), which
// come before the ingress's: a flag is refused once, for the first reason.
func ingressFlagsRead(fs *flag.FlagSet, o *ingress.Options, probs *flagProblems, first ...offFlag) {
	cfg := &o.Config
	fair := cfg.FairQueue != nil
	noJWKS := o.JWT.JWKSFile == "" && o.JWT.JWKSURL == ""
	noNATS := len(cfg.Cluster.NATSURLs) == 0
	noGossip := cfg.Cluster.GossipBind == ""
	const jwks, nats, gossipBind = "without --jwks-file or --jwks-url", "without --nats", "without --gossip-bind"
	const fairOn = "with fair admission on (--fair-max-concurrent, --tenant or the config's fairQueue), which replaces it"
	rules := append(first, []offFlag{
		{"admit-max", fair, fairOn},
		{"admit-max-wait", fair, fairOn},
		{"admit-max-wait", o.AdmitMax == 0, "without --admit-max"},
		{"tenant-header", !fair, "without fair admission (--fair-max-concurrent, --tenant or the config's fairQueue)"},
		{"admin-token", cfg.AdminListen == "", "without --admin (/metrics on --listen takes a client credential, never the admin token)"},
		{"jwt-audience", noJWKS, jwks},
		{"jwt-issuer", noJWKS, jwks},
		{"jwt-tenant-claim", noJWKS, jwks},
		{"pd-transfer-gbps", cfg.PD.Policy == "", "without --pd-policy"},
		{"routes-optional", cfg.Routes == "", "without --routes"},
		{"tokenizer-store", noNATS && o.TokenizerStore, nats}, // --tokenizer-store=false is read: it says so
		{"tokenizer-cache", noNATS, nats},
		{"tokenizer-cache", !o.TokenizerStore, "without --tokenizer-store"},
		{"gossip-advertise", noGossip, gossipBind},
		{"gossip-profile", noGossip, gossipBind},
		{"gossip-key", noGossip, gossipBind},
		{"state-over-nats", noNATS, nats},
		{"state-over-nats", noGossip, gossipBind},
	}...)
	rules = append(rules, natsFlagsOff(noNATS)...)
	probs.refuseOff(fs, rules)
	tokenFlag, policyFlag, schedFlag, engineFlag := false, false, false, false
	fs.Visit(func(f *flag.Flag) {
		engineFlag = engineFlag || f.Name == "engine" // a bad one is a problem of its own
		tokenFlag = tokenFlag || f.Name == "admin-token"
		policyFlag = policyFlag || f.Name == "policy"
		schedFlag = schedFlag || f.Name == "scheduler-config"
	})
	if policyFlag && schedFlag { // else the later of the two won, half of the file kept
		probs.add("--policy and --scheduler-config are both given: the SchedulerConfig file names the policy (its policy:); give one")
	}
	if cfg.AdminToken != "" && cfg.AdminListen == "" && !tokenFlag { // the flag is refused by name above
		probs.add("the admin token ($KVMESH_ADMIN_TOKEN) is not read without --admin (/metrics on --listen takes a client credential, never the admin token)")
	}
	if len(cfg.Engines) == 0 && noGossip && !engineFlag {
		// It started, and answered every request 503 (no live engines).
		probs.add("no engines: give --engine [id=]model=url (static engines), the config's engines, or --gossip-bind (the sidecars' gossip lists the engines)")
	}
	if len(cfg.Engines) > 0 && !noGossip {
		probs.add("static engines (--engine, the config's engines) are not used with gossip (--gossip-bind, the config's cluster.gossipBind): the sidecars' gossip lists the engines; give one or the other")
	}
}

// listenTLSFlags binds the client listener's TLS. `kvmesh epp` leaves them
// out: there --tls-cert and --tls-key are the ext_proc listener's.
func listenTLSFlags(fs *flag.FlagSet, cfg *ingress.Config) {
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", cfg.TLS.CertFile, "PEM certificate: serve HTTPS on --listen")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", cfg.TLS.KeyFile, "PEM key for --tls-cert")
	fs.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca", cfg.TLS.ClientCAFile, "PEM CA: require client certificates signed by it")
}

// ingressFlags binds the `kvmesh ingress` flags that `kvmesh epp` shares
// onto opts (listenTLSFlags has the rest); bad values go to probs.
func ingressFlags(fs *flag.FlagSet, opts *ingress.Options, probs *flagProblems) {
	cfg := &opts.Config
	fs.String("config", "", "YAML config file (ingress.Config fields); flags override it")
	fs.StringVar(&cfg.ID, "id", cfg.ID, "replica id (default ingress-<random hex>)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "client-facing address")
	fs.StringVar(&cfg.AdminListen, "admin", cfg.AdminListen, "admin address for /debug/* (pprof, engines, index, config, health, tokenizers) and /metrics (empty: off; /metrics then stays on the client port, behind the client credential when API keys or JWTs are on)")
	secretEnvFlag(fs, &cfg.AdminToken, "admin-token", "KVMESH_ADMIN_TOKEN", "bearer `token` required on the admin address (empty: none)")
	fs.StringVar(&cfg.TLS.UpstreamCAFile, "upstream-ca", cfg.TLS.UpstreamCAFile, "PEM CA verifying https:// engines")
	fs.StringVar(&cfg.TLS.UpstreamCertFile, "upstream-cert", cfg.TLS.UpstreamCertFile, "PEM client certificate towards engines (mutual TLS)")
	fs.StringVar(&cfg.TLS.UpstreamKeyFile, "upstream-key", cfg.TLS.UpstreamKeyFile, "PEM key for --upstream-cert")
	fs.StringVar(&opts.JWT.JWKSFile, "jwks-file", "", "JSON Web Key Set file: accept bearer JWTs signed by its keys (besides API keys)")
	fs.StringVar(&opts.JWT.JWKSURL, "jwks-url", "", "JSON Web Key Set URL (re-read every 5m and on an unknown kid)")
	fs.StringVar(&opts.JWT.Audience, "jwt-audience", "", "audience a JWT must carry (required with --jwks-*)")
	fs.StringVar(&opts.JWT.Issuer, "jwt-issuer", "", "issuer a JWT must carry (empty: any)")
	fs.StringVar(&opts.JWT.TenantClaim, "jwt-tenant-claim", "tenant", "JWT claim naming the tenant (the rate-limit identity; falls back to sub)")
	freshEngines := true
	probs.Var(fs, "engine", "", "static engine [id=]model=url, or [id=ID,]model=M,url=URL[,role=prefill|decode|mixed,group=G,pd=nixl|sglang,bootstrap=HOST:PORT] for P/D (the positional form is mixed) (repeatable; used without gossip; given at all, replaces the config file's engines)", func(s string) error {
		se, err := ingress.ParseStaticEngine(s)
		if err != nil {
			return fmt.Errorf("--engine: %w", err)
		}
		if freshEngines { // as every list flag: the flags replace the config file's list
			cfg.Engines, freshEngines = nil, false
		}
		cfg.Engines = append(cfg.Engines, se)
		return nil
	})
	probs.ModelPaths(fs, &cfg.Tokenizers, "tokenizer", "model=path", "model=path to tokenizer.json or its directory (repeatable)")
	fs.BoolVar(&opts.TokenizerStore, "tokenizer-store", opts.TokenizerStore, "load the tokenizers the sidecars publish to NATS for models without --tokenizer")
	fs.StringVar(&opts.TokenizerCache, "tokenizer-cache", "", "directory for tokenizers fetched from NATS (default: a temporary directory)")
	probs.ModelPaths(fs, &cfg.ChatTemplates, "chat-template", "model=path", "model=path to the chat template: tokenizer_config.json, chat_template.jinja/.json, a Jinja file or a model directory (repeatable; only for a model with a --tokenizer; default: the --tokenizer directory's)")
	probs.ModelPaths(fs, &cfg.LoRAAdapters, "lora-adapter", "adapter=base-model", "LoRA adapter=base model: the adapter's requests go to the base model's engines, keyed as the sidecar keys the adapter's blocks (repeatable)")
	fs.StringVar(&cfg.PD.Policy, "pd-policy", cfg.PD.Policy, "prefill/decode step for engines with roles (\"\" = off): kvmesh|kvmesh-always|kthena|llmd|dynamo|sglang|aibrix")
	fs.Float64Var(&cfg.PD.TransferGbps, "pd-transfer-gbps", cfg.PD.TransferGbps, "prefill → decode KV bandwidth the P/D cost model assumes, Gbit/s (0: 100)")
	fs.StringVar(&cfg.Scheduler.Policy, "policy", cfg.Scheduler.Policy, "routing policy: "+strings.Join(registry.PolicyNames(), "|")+" (weighted has no scorers by default: name it in a --scheduler-config file, or --config's scheduler: block, that lists them)")
	probs.Var(fs, "scheduler-config", "", "SchedulerConfig YAML file: the policy and its parameters (not with --policy)", func(path string) error {
		sc, err := registry.LoadConfig(path)
		if err != nil {
			return fmt.Errorf("--scheduler-config: %w", err)
		}
		cfg.Scheduler = sc
		return nil
	})
	fs.StringVar(&cfg.Routes, "routes", cfg.Routes, "model routes file (RouteConfig YAML: weighted splits, fallbacks, LoRA adapters, rate limits; reloaded on change)")
	fs.BoolVar(&cfg.RoutesOptional, "routes-optional", cfg.RoutesOptional, "the --routes file may not exist yet: no routes until it appears (a ConfigMap rendered from ModelRoutes, mounted optional)")
	fs.StringVar(&cfg.ChatMode, "chat-mode", cfg.ChatMode, "chat forwarding: chat (forward as chat) or completions (send rendered tokens, re-wrap)")
	fs.DurationVar(&cfg.EngineTokenizeTimeout, "engine-tokenize-timeout", cfg.EngineTokenizeTimeout, "bound on asking an engine's /tokenize for a prompt the ingress cannot tokenize itself, plus 1ms per KiB of the prompt (0: off, such requests are routed unkeyed)")
	fs.DurationVar(&cfg.TokenizeBudget, "tokenize-budget", cfg.TokenizeBudget, "bound on tokenizing one request here; past it the request is routed as one the ingress cannot tokenize (engine /tokenize, else unkeyed; 0: no bound)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body", cfg.MaxBodyBytes, "max request body bytes (413 above)")
	fs.IntVar(&cfg.MaxPromptTokens, "max-prompt-tokens", cfg.MaxPromptTokens, "cap on the prompt tokens of a prompt, below the engines' max_model_len, which limits it anyway (0: no cap of its own)")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "max requests in service (429 above)")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "upstream attempts per request that reached an engine (a refused connection is not counted; each engine is dialed at most once)")
	fs.DurationVar(&cfg.IdleTimeout, "upstream-idle-timeout", cfg.IdleTimeout, "max wait between upstream bytes once the answer reached the client")
	fs.DurationVar(&cfg.FirstByteTimeout, "upstream-first-byte-timeout", cfg.FirstByteTimeout, "max wait for an answer before it reaches the client (0: none while the stall watch is on; else the idle timeout)")
	fs.DurationVar(&cfg.SendTimeout, "send-timeout", cfg.SendTimeout, "max time a write of an answer may wait for a client that takes none of it; the request is then cut and its engine's request cancelled (0: off)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "graceful drain bound on SIGTERM")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "engines' KV block size when membership does not say")
	fs.BoolVar(&cfg.AccessLog, "access-log", cfg.AccessLog, "one JSON line per request on stderr")
	fs.StringVar(&opts.APIKeysFile, "api-keys-file", "", "API keys file, re-read on change (also $KVMESH_API_KEYS); neither: open; one that holds no key is refused")
	if k := os.Getenv("KVMESH_ENGINE_API_KEY"); k != "" {
		// The engines' own key (vLLM --api-key), sent on every /v1 request.
		// Over the config's engineAPIKey, as the other settings from the
		// environment are: a Secret rotated under a key left in the YAML
		// kept the old one going out.
		cfg.EngineAPIKey = k
	}
	probs.NonNegative(fs, &opts.KeyLimits.InputTokens, "key-input-tpm", "per-key input tokens per minute (0: none)")
	probs.NonNegative(fs, &opts.KeyLimits.OutputTokens, "key-output-tpm", "per-key output tokens per minute (0: none)")
	probs.NonNegative(fs, &opts.ModelLimits.InputTokens, "model-input-tpm", "per-model input tokens per minute (0: none)")
	probs.NonNegative(fs, &opts.ModelLimits.OutputTokens, "model-output-tpm", "per-model output tokens per minute (0: none)")
	fs.IntVar(&opts.AdmitMax, "admit-max", 0, "session-boost admission: max requests in service before queueing (0: off)")
	fs.DurationVar(&opts.AdmitMaxWait, "admit-max-wait", opts.AdmitMaxWait, "admission queue wait before 504")
	fairQueueFlags(fs, cfg, probs)
	probs.LogLevel(fs, &opts.LogLevel)
	probs.LogFormat(fs, &opts.LogFormat)
	fs.StringVar(&cfg.Cluster.GossipBind, "gossip-bind", cfg.Cluster.GossipBind, "memberlist address IP:port (IPv6 in brackets; empty: no gossip, use -engine)")
	fs.StringVar(&cfg.Cluster.GossipAdvertise, "gossip-advertise", cfg.Cluster.GossipAdvertise, "the IP, or IP:port (IPv6 in brackets), others dial, when it differs from the bind address")
	gossipKeyFlag(fs, &cfg.Cluster.GossipKey, &cfg.Cluster.GossipKeys, probs)
	List(fs, &cfg.Cluster.GossipSeeds, "join", "comma-separated gossip seeds host:port")
	fs.StringVar(&cfg.Cluster.GossipProfile, "gossip-profile", cfg.Cluster.GossipProfile, "memberlist timings: local, lan (default) or wan")
	natsutil.BindFlags(fs, &cfg.Cluster.NATSURLs, &cfg.Cluster.NATSAuth, "comma-separated NATS URLs carrying the sidecars' deltas (empty: no materialized index)")
	stateLaneFlag(fs, &cfg.Cluster.StateOverNATSOff, "read engine load and the other replicas' state from NATS (<prefix>.state.>, default kvmesh.state.>) besides gossip, and publish this replica's (default true)", probs)
}

// durationHint adds to a parse error of a duration flag (--tokenize-budget
// 2) how to write one, as a config file's duration gets: the flag
// package says only "parse error".
func durationHint(fs *flag.FlagSet, err error) error {
	_, after, ok := strings.Cut(err.Error(), " for flag -")
	name, _, _ := strings.Cut(after, ":")
	if !ok {
		return err
	}
	if f := fs.Lookup(name); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			if _, ok := g.Get().(time.Duration); ok {
				return fmt.Errorf("%w (a duration takes its unit: 30s, 500ms, 0s for off)", err)
			}
		}
	}
	return err
}

// gossipKeyFlag binds --gossip-key (default $KVMESH_GOSSIP_KEY) onto dst.
// Comma-separated keys: the first encrypts, the rest are accepted during a
// rotation (gossip.Config.ExtraKeys).
func gossipKeyFlag(fs *flag.FlagSet, dst *[]byte, extra *[][]byte, probs *flagProblems) {
	set := func(s string) error {
		k, more, err := gossip.ParseKeys(s)
		if err != nil {
			return fmt.Errorf("--gossip-key: %w", err)
		}
		*dst, *extra = k, more
		return nil
	}
	env, state := os.Getenv("KVMESH_GOSSIP_KEY"), ""
	if err := set(env); err != nil {
		probs.unlessGiven("gossip-key", err) // a bad environment value matters only when no flag replaces it
	}
	if env != "" { // as the other secrets' help says (secretflag), never the value
		state = "; set"
	}
	probs.Var(fs, "gossip-key", "", "base64 gossip encryption keys of 16, 24 or 32 bytes, comma-separated: the first encrypts, the rest are accepted during a rotation (env KVMESH_GOSSIP_KEY"+state+")", set)
}

// configFlag finds -config/--config in args before the flag set is built;
// given twice, it is a usage error (the first used to win, the second file
// never read).
func configFlag(args []string) (string, error) {
	var paths []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		for _, p := range []string{"-config", "--config"} {
			if a == p && i+1 < len(args) {
				i++
				paths = append(paths, args[i])
			} else if v, ok := strings.CutPrefix(a, p+"="); ok {
				paths = append(paths, v)
			}
		}
	}
	switch len(paths) {
	case 0:
		return "", nil
	case 1:
		if paths[0] == "" { // a template's --config "$CFG" with CFG unset ran on the defaults
			return "", fmt.Errorf("%w: --config is given an empty path: give the file, or leave --config out", errUsage)
		}
		return paths[0], nil
	}
	return "", fmt.Errorf("%w: --config given %d times (%q): give one file", errUsage, len(paths), paths)
}

// fairQueueFlags binds the weighted fair admission queue (ingress/fair):
// --fair-max-concurrent turns it on; --tenant sets a tenant's share.
func fairQueueFlags(fs *flag.FlagSet, cfg *ingress.Config, probs *flagProblems) {
	fq := func() *fair.Config {
		if cfg.FairQueue == nil {
			c := fair.DefaultConfig()
			cfg.FairQueue = &c
		}
		return cfg.FairQueue
	}
	fairOff, tenantFlag := false, false // --fair-max-concurrent 0 and --tenant, in either order
	List(fs, &cfg.CORSOrigins, "cors-origins", "browser origins allowed to call the API, comma-separated, each scheme://host[:port] as browsers send it (* for any, as vLLM's default); empty: no CORS")
	fs.StringVar(&cfg.TenantHeader, "tenant-header", cfg.TenantHeader, "request header naming the tenant of unauthenticated requests (fair admission); trust it only behind a gateway that sets it")
	probs.Var(fs, "fair-max-concurrent", "0", "weighted fair admission across tenants: max requests in service before queueing (0: off, also over the config's fairQueue)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return fmt.Errorf("--fair-max-concurrent %q: want a whole number >= 0", s)
		}
		if n == 0 && tenantFlag {
			return fmt.Errorf("--fair-max-concurrent 0 turns fair admission off, which --tenant needs: give one or the other")
		}
		fairOff = n == 0
		if fairOff { // off, also when the config file has a fairQueue
			cfg.FairQueue = nil
		} else {
			fq().MaxConcurrent = n
		}
		return nil
	})
	freshTenants := true
	probs.Var(fs, "tenant", "", "a tenant's fair share, repeatable: NAME[=WEIGHT][:PRIORITY] (NAME, NAME=2, NAME=2:1 or NAME=:1; higher priority first; weight 1 when left out, as the config's; given at all, replaces the config file's tenants)", func(s string) error {
		name, spec, _ := strings.Cut(s, "=")
		w, p, _ := strings.Cut(spec, ":")
		weight, err := 1.0, error(nil) // left out, as a fairQueue tenant's weight in the YAML
		if w != "" {
			weight, err = strconv.ParseFloat(w, 64)
		}
		prio := 0
		if err == nil && p != "" {
			prio, err = strconv.Atoi(p)
		}
		if name == "" || strings.Contains(name, ":") || err != nil || !(weight > 0) || math.IsInf(weight, 1) { // NaN fails > 0
			return fmt.Errorf("--tenant %q: want NAME[=WEIGHT][:PRIORITY] with WEIGHT a finite value > 0 (1 when left out) and PRIORITY a whole number", s)
		}
		if fairOff {
			return fmt.Errorf("--tenant %q: --fair-max-concurrent 0 turns fair admission off, which --tenant needs: give one or the other", s)
		}
		tenantFlag = true
		c := fq()
		if c.Tenants == nil || freshTenants { // the flags replace the config file's tenants
			c.Tenants, freshTenants = map[string]fair.Tenant{}, false
		}
		c.Tenants[name] = fair.Tenant{Weight: weight, Priority: prio}
		return nil
	})
}
