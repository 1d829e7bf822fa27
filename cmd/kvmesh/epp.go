package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
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
	o := eppOptions{cfg: ingress.DefaultConfig(), ecfg: epp.DefaultConfig()}
	o.cfg.Listen = ":9090"
	o.wiring.level = slog.LevelInfo
	fs := newFlagSet("epp", stderr)
	var probs flagProblems
	eppFlags(fs, &o, &probs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if o.wiring.pool != "" && o.wiring.ns == "" {
		probs.add("--pool-name needs --pool-namespace (or POD_NAMESPACE)")
	}
	if o.wiring.admitMax < 0 {
		probs.add("--admit-max must be >= 0")
	}
	probs.addErr(o.cfg.Validate())
	probs.addErr(o.ecfg.Validate())
	if err := probs.err(); err != nil {
		return err
	}
	return serveEPP(ctx, o.cfg, o.ecfg, o.wiring, stdout, stderr)
}

// eppOptions is what `kvmesh epp` runs: an ingress Config, the picker's
// Config and the process wiring around them.
type eppOptions struct {
	cfg    ingress.Config
	ecfg   epp.Config
	wiring eppWiring
}

// eppFlags binds every `kvmesh epp` flag onto o; bad values go to probs.
func eppFlags(fs *flag.FlagSet, o *eppOptions, probs *flagProblems) {
	cfg, ecfg, w := &o.cfg, &o.ecfg, &o.wiring
	fs.StringVar(&ecfg.Listen, "grpc", ecfg.Listen, "ext_proc + gRPC health address (the InferencePool's endpointPickerRef port)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP address for /metrics, /health, /ready and /debug (it also answers the OpenAI API as an ingress would)")
	fs.StringVar(&cfg.ID, "id", "", "replica id (default ingress-<random>)")
	probs.Var(fs, "engine", "", "static engine [id=]model=url (repeatable; used without gossip)", func(s string) error {
		se, err := ingress.ParseStaticEngine(s)
		if err != nil {
			return fmt.Errorf("--engine: %w", err)
		}
		cfg.Engines = append(cfg.Engines, se)
		return nil
	})
	probs.ModelPaths(fs, &cfg.Tokenizers, "tokenizer", "model=path to tokenizer.json or its directory (repeatable)")
	probs.ModelPaths(fs, &cfg.ChatTemplates, "chat-template", "model=path to tokenizer_config.json with the chat template (repeatable)")
	fs.StringVar(&cfg.Scheduler.Policy, "policy", cfg.Scheduler.Policy, "routing policy (as kvmesh ingress)")
	probs.Var(fs, "scheduler-config", "", "SchedulerConfig YAML file (overrides -policy)", func(path string) error {
		sc, err := registry.LoadConfig(path)
		if err != nil {
			return fmt.Errorf("--scheduler-config: %w", err)
		}
		cfg.Scheduler = sc
		return nil
	})
	fs.IntVar(&cfg.MaxPromptTokens, "max-prompt-tokens", cfg.MaxPromptTokens, "max prompt tokens (0: no limit)")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "max requests in flight through the gateway (429 above)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "engines' KV block size when membership does not say")
	fs.BoolVar(&cfg.AccessLog, "access-log", cfg.AccessLog, "one JSON line per request on stderr")
	fs.IntVar(&w.admitMax, "admit-max", 0, "session-boost admission: max requests in service before queueing (0: off)")
	fs.StringVar(&cfg.Cluster.GossipBind, "gossip-bind", "", "memberlist address host:port (empty: no gossip, use -engine)")
	fs.StringVar(&cfg.Cluster.GossipAdvertise, "gossip-advertise", "", "gossip host or host:port others dial")
	gossipKeyFlag(fs, &cfg.Cluster.GossipKey, &cfg.Cluster.GossipKeys, probs)
	List(fs, &cfg.Cluster.GossipSeeds, "join", "comma-separated gossip seeds host:port")
	fs.StringVar(&cfg.Cluster.GossipProfile, "gossip-profile", "", "memberlist timings: local, lan (default) or wan")
	List(fs, &cfg.Cluster.NATSURLs, "nats", "comma-separated NATS URLs carrying the sidecars' deltas")
	fs.StringVar(&w.pool, "pool-name", "", "InferencePool to serve (empty: every engine of the mesh is a candidate)")
	fs.StringVar(&w.ns, "pool-namespace", os.Getenv("POD_NAMESPACE"), "the InferencePool's namespace (env POD_NAMESPACE)")
	fs.StringVar(&w.kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster)")
	fs.StringVar(&ecfg.DefaultBodyMode, "body-mode", ecfg.DefaultBodyMode, "request body mode when the gateway sends no protocol_config: full-duplex, buffered or streamed")
	fs.IntVar(&ecfg.MaxEndpoints, "max-endpoints", ecfg.MaxEndpoints, "fallback endpoints per answer")
	fs.IntVar(&ecfg.MaxBodyBytes, "max-body", ecfg.MaxBodyBytes, "max request body bytes buffered (413 above)")
	fs.StringVar(&ecfg.TLS, "tls", ecfg.TLS, "ext_proc TLS: self-signed (what GAIE gateways expect), files (--tls-cert/--tls-key) or off")
	fs.StringVar(&ecfg.TLSCertFile, "tls-cert", "", "PEM certificate for --tls=files")
	fs.StringVar(&ecfg.TLSKeyFile, "tls-key", "", "PEM key for --tls=files")
	fs.BoolVar(&ecfg.PD.Enabled, "pd", false, "P/D through llm-d's routing sidecar (x-prefiller-host-port)")
	fs.IntVar(&ecfg.PD.MinUncachedTokens, "pd-min-uncached", ecfg.PD.MinUncachedTokens, "prefill elsewhere from this many uncached prompt tokens")
	probs.LogLevel(fs, &w.level)
}

type eppWiring struct {
	pool, ns, kubeconfig string
	admitMax             int
	level                slog.Level
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
