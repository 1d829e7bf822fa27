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

	"github.com/kvmesh/kvmesh/epp"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// runEPP runs the Gateway API Inference Extension endpoint picker: an
// ingress replica (mesh, index, scheduler) answering the gateway over
// ext_proc instead of proxying.
func runEPP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := ingress.DefaultConfig()
	cfg.Listen = ":9090"
	ecfg := epp.DefaultConfig()
	fs := newFlagSet("epp", stderr)
	var engines, tokenizers, templates multiFlag
	fs.StringVar(&ecfg.Listen, "grpc", ecfg.Listen, "ext_proc + gRPC health address (the InferencePool's endpointPickerRef port)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP address for /metrics, /health, /ready and /debug (it also answers the OpenAI API as an ingress would)")
	fs.StringVar(&cfg.ID, "id", "", "replica id (default ingress-<random>)")
	fs.Var(&engines, "engine", "static engine [id=]model=url (repeatable; used without gossip)")
	fs.Var(&tokenizers, "tokenizer", "model=path to tokenizer.json or its directory (repeatable)")
	fs.Var(&templates, "chat-template", "model=path to tokenizer_config.json with the chat template (repeatable)")
	policy := fs.String("policy", cfg.Scheduler.Policy, "routing policy (as kvmesh ingress)")
	schedFile := fs.String("scheduler-config", "", "SchedulerConfig YAML file (overrides -policy)")
	fs.IntVar(&cfg.MaxPromptTokens, "max-prompt-tokens", cfg.MaxPromptTokens, "max prompt tokens (0: no limit)")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "max requests in flight through the gateway (429 above)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "engines' KV block size when membership does not say")
	fs.BoolVar(&cfg.AccessLog, "access-log", cfg.AccessLog, "one JSON line per request on stderr")
	admitMax := fs.Int("admit-max", 0, "session-boost admission: max requests in service before queueing (0: off)")
	fs.StringVar(&cfg.Cluster.GossipBind, "gossip-bind", "", "memberlist address host:port (empty: no gossip, use -engine)")
	fs.StringVar(&cfg.Cluster.GossipAdvertise, "gossip-advertise", "", "gossip host or host:port others dial")
	gossipKey := fs.String("gossip-key", os.Getenv("KVMESH_GOSSIP_KEY"), "base64 gossip key of 16, 24 or 32 bytes (env KVMESH_GOSSIP_KEY)")
	join := fs.String("join", "", "comma-separated gossip seeds host:port")
	fs.StringVar(&cfg.Cluster.GossipProfile, "gossip-profile", "", "memberlist timings: local, lan (default) or wan")
	natsURLs := fs.String("nats", "", "comma-separated NATS URLs carrying the sidecars' deltas")
	poolName := fs.String("pool-name", "", "InferencePool to serve (empty: every engine of the mesh is a candidate)")
	poolNS := fs.String("pool-namespace", os.Getenv("POD_NAMESPACE"), "the InferencePool's namespace (env POD_NAMESPACE)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (empty: in-cluster)")
	fs.StringVar(&ecfg.DefaultBodyMode, "body-mode", ecfg.DefaultBodyMode, "request body mode when the gateway sends no protocol_config: full-duplex, buffered or streamed")
	fs.IntVar(&ecfg.MaxEndpoints, "max-endpoints", ecfg.MaxEndpoints, "fallback endpoints per answer")
	fs.IntVar(&ecfg.MaxBodyBytes, "max-body", ecfg.MaxBodyBytes, "max request body bytes buffered (413 above)")
	fs.StringVar(&ecfg.TLS, "tls", ecfg.TLS, "ext_proc TLS: self-signed (what GAIE gateways expect), files (--tls-cert/--tls-key) or off")
	fs.StringVar(&ecfg.TLSCertFile, "tls-cert", "", "PEM certificate for --tls=files")
	fs.StringVar(&ecfg.TLSKeyFile, "tls-key", "", "PEM key for --tls=files")
	fs.BoolVar(&ecfg.PD.Enabled, "pd", false, "P/D through llm-d's routing sidecar (x-prefiller-host-port)")
	fs.IntVar(&ecfg.PD.MinUncachedTokens, "pd-min-uncached", ecfg.PD.MinUncachedTokens, "prefill elsewhere from this many uncached prompt tokens")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
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
		}
		cfg.Cluster.GossipKey = k
	}
	for _, e := range engines {
		se, err := ingress.ParseStaticEngine(e)
		if err != nil {
			bad("--engine: %v", err)
			continue
		}
		cfg.Engines = append(cfg.Engines, se)
	}
	cfg.Tokenizers = modelPaths(tokenizers, "--tokenizer", bad)
	cfg.ChatTemplates = modelPaths(templates, "--chat-template", bad)
	cfg.Scheduler.Policy = *policy
	if *schedFile != "" {
		sc, err := registry.LoadConfig(*schedFile)
		if err != nil {
			bad("--scheduler-config: %v", err)
		} else {
			cfg.Scheduler = sc
		}
	}
	if *poolName != "" && *poolNS == "" {
		bad("--pool-name needs --pool-namespace (or POD_NAMESPACE)")
	}
	if *admitMax < 0 {
		bad("--admit-max must be >= 0")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		bad("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	if err := cfg.Validate(); err != nil {
		bad("%v", err)
	}
	if err := ecfg.Validate(); err != nil {
		bad("%v", err)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	return serveEPP(ctx, cfg, ecfg, eppWiring{pool: *poolName, ns: *poolNS, kubeconfig: *kubeconfig, admitMax: *admitMax, level: level}, stdout, stderr)
}

type eppWiring struct {
	pool, ns, kubeconfig string
	admitMax             int
	level                slog.Level
}

// modelPaths turns repeated model=path flags into a map.
func modelPaths(vals []string, flag string, bad func(string, ...any)) map[string]string {
	if len(vals) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, v := range vals {
		model, path, ok := strings.Cut(v, "=")
		if !ok {
			bad("%s %q: want model=path", flag, v)
			continue
		}
		out[model] = path
	}
	return out
}

func serveEPP(ctx context.Context, cfg ingress.Config, ecfg epp.Config, w eppWiring, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: w.level}))
	reg := prometheus.NewRegistry()
	deps := ingress.Deps{Logger: log, AccessLog: log, Registry: reg}
	aff, err := session.NewAffinity(session.DefaultAffinityConfig())
	if err != nil {
		return err
	}
	deps.Affinity = aff
	if w.admitMax > 0 {
		adc := session.DefaultAdmissionConfig()
		adc.MaxConcurrent = w.admitMax
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
	ing, err := ingress.New(cfg, deps)
	if err != nil {
		return err
	}
	ecfg.Logger, ecfg.Registerer = log, reg
	var edeps epp.Deps
	edeps.Ingress = ing
	poolCtx, stopPool := context.WithCancel(context.Background())
	defer stopPool()
	poolDone := make(chan error, 1)
	if w.pool != "" {
		rc, err := kubeConfig(w.kubeconfig)
		if err != nil {
			return err
		}
		pool, err := epp.NewPool(rc, w.ns, w.pool, log)
		if err != nil {
			return err
		}
		edeps.Pool = pool
		go func() { poolDone <- pool.Run(poolCtx) }()
	} else {
		poolDone <- nil
	}
	picker, err := epp.New(ecfg, edeps)
	if err != nil {
		return err
	}
	if err := ing.Start(nil); err != nil {
		return err
	}
	if err := picker.Start(); err != nil {
		ing.Close()
		return err
	}
	fmt.Fprintf(stdout, "kvmesh epp: ext_proc on %s, metrics on http://%s\n", picker.Addr(), ing.Addr())
	<-ctx.Done()
	fmt.Fprintln(stdout, "draining")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout+5*time.Second)
	defer cancel()
	picker.Close(sctx)
	err = ing.Close()
	stopPool()
	if perr := <-poolDone; perr != nil && err == nil {
		err = perr
	}
	return err
}
