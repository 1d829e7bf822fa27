package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/sidecar"
)

// runSidecar runs the sidecar next to one engine (or, with repeated
// --engine specs, for every engine on a node) until SIGTERM/SIGINT
// (sidecar.Run).
func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := sidecarOptions(args, stderr)
	if err != nil {
		return err
	}
	err = sidecar.Run(ctx, opts, stderr)
	if errors.Is(err, sidecar.ErrConfig) {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return err
}

// sidecarOptions reads `kvmesh sidecar`'s command line into checked
// options: every problem, the flags' and the configuration's, at once.
func sidecarOptions(args []string, stderr io.Writer) (sidecar.Options, error) {
	opts := sidecar.DefaultOptions()
	fs := newFlagSet("sidecar", stderr)
	var probs flagProblems
	sidecarFlags(fs, &opts, &probs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh sidecar --model M (--engine-url URL | --engine-host HOST --engine-port PORT) --events tcp://HOST:5557 [--replay tcp://HOST:5558] [--nats URL] [--gossip-bind ADDR --join SEEDS]")
		fmt.Fprintln(stderr, "       kvmesh sidecar --engine id=a,model=M,url=URL,events=EP --engine id=b,... (DaemonSet mode)")
		fmt.Fprintln(stderr, "       kvmesh sidecar --engine id=a,model=M,host=HOST,port=PORT,events-port=PORT --engine id=b,... (DaemonSet mode, IPv6 HOST bracketed)")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return opts, durationHint(fs, err)
	}
	sidecarFlagsRead(fs, &opts, &probs)
	// The configuration's problems with the flags' (sidecar.Run checks
	// them again): they came a run later, after the flags' were fixed.
	cfg, err := opts.Build(slog.New(slog.DiscardHandler))
	probs.addErr(err)
	probs.addErr(cfg.Validate())
	return opts, probs.err()
}

// sidecarFlagsRead adds a problem for each sidecar flag given whose
// feature o leaves off, where it would be ignored: the one-engine flags
// beside DaemonSet-mode --engine specs (the two forms are separate: each
// spec carries its own id=, model=, role=, dp=, ...; a --model there used
// to fail as a nameless engine, a whole one-engine set to run both forms)
// and without that engine (--model, --engine-url or --events), gossip's
// without --gossip-bind, the NATS connection's without --nats (the
// embedded server takes no credentials).
func sidecarFlagsRead(fs *flag.FlagSet, o *sidecar.Options, probs *flagProblems) {
	e := &o.Engine
	specs := len(o.EngineSpecs) > 0
	if !specs {
		engineURLFromHostPort(fs, e, probs)
	}
	noEngine := e.Events == "" && e.Model == "" && e.URL == ""
	const withSpecs = "beside DaemonSet --engine specs (give each engine's settings in its spec: id=, model=, url= or host=/port=, events=, role=, dp=, ...; or run one engine without specs)"
	const engine = "without --model, --engine-url or --events (a DaemonSet --engine spec takes its own: role=, dp=, ...)"
	var rules []offFlag
	for _, f := range []string{"engine-id", "model", "engine-url", "engine-host", "engine-port", "metrics-url", "role", "events", "replay", "bind-events", "dp-size", "block-size",
		"tokenizer-dir", "tokenizer-revision", "pd-group", "pd-protocol", "bootstrap-port"} {
		rules = append(rules, offFlag{f, specs, withSpecs})
	}
	for _, f := range []string{"engine-id", "metrics-url", "role", "replay", "bind-events", "dp-size", "block-size",
		"tokenizer-dir", "tokenizer-revision", "pd-group", "pd-protocol", "bootstrap-port"} {
		rules = append(rules, offFlag{f, noEngine, engine})
	}
	rules = append(rules, offFlag{"tokenizer-revision", e.TokenizerDir == "", "without --tokenizer-dir"})
	for _, f := range []string{"gossip-advertise", "gossip-profile", "gossip-key", "node-name", "state-over-nats"} {
		rules = append(rules, offFlag{f, o.GossipBind == "", "without --gossip-bind"})
	}
	rules = append(rules, natsFlagsOff(len(o.Config.NATS.URLs) == 0)...)
	rules = append(rules, offFlag{"embedded-nats-port", len(o.Config.NATS.URLs) > 0, "with --nats (no embedded server is started)"})
	probs.refuseOff(fs, rules)
}

// engineURLFromHostPort sets e.URL to http://HOST:PORT from --engine-host
// and --engine-port, joined with net.JoinHostPort: an IPv6 host gets its
// brackets, so one manifest (--engine-host=$(POD_IP) --engine-port=8000)
// works on IPv4 and IPv6 clusters, where http://$(POD_IP):8000 is no URL
// on IPv6. Both or neither, and not with --engine-url.
func engineURLFromHostPort(fs *flag.FlagSet, e *sidecar.EngineConfig, probs *flagProblems) {
	host, port := fs.Lookup("engine-host").Value.String(), fs.Lookup("engine-port").Value.String()
	if host == "" && port == "0" {
		return
	}
	switch {
	case e.URL != "":
		probs.add("--engine-host and --engine-port build the engine URL: give them or --engine-url, not both")
		return
	case host == "" || port == "0":
		probs.add("--engine-host and --engine-port go together (the engine URL is http://HOST:PORT)")
		return
	}
	p, _ := strconv.Atoi(port) // an Int flag's value
	hp, err := sidecar.JoinHostPort(host, p)
	if err != nil {
		probs.add("--engine-%v", err) // "--engine-host ..." or "--engine-port ..."
		return
	}
	e.URL = "http://" + hp
}

// natsFlagsOff are the NATS connection's flags (natsutil.BindFlags) but
// --nats itself, off when noNATS.
func natsFlagsOff(noNATS bool) []offFlag {
	var rules []offFlag
	nfs := flag.NewFlagSet("", flag.ContinueOnError)
	natsutil.BindFlags(nfs, new([]string), new(natsutil.Auth), "")
	nfs.VisitAll(func(f *flag.Flag) {
		if f.Name != "nats" {
			rules = append(rules, offFlag{f.Name, noNATS, "without --nats"})
		}
	})
	return rules
}

// streamReplicasFlag binds --stream-replicas (default
// $KVMESH_STREAM_REPLICAS, else auto) onto dst.
func streamReplicasFlag(fs *flag.FlagSet, dst *int, probs *flagProblems) {
	set := func(s string) error {
		n, err := natsutil.ParseReplicas(s)
		if err != nil {
			return fmt.Errorf("--stream-replicas: %w", err)
		}
		*dst = n
		return nil
	}
	if env := os.Getenv("KVMESH_STREAM_REPLICAS"); env != "" {
		if err := set(env); err != nil {
			probs.unlessGiven("stream-replicas", err) // a bad environment value matters only when no flag replaces it
		}
	}
	probs.Var(fs, "stream-replicas", natsutil.FormatReplicas(*dst), "replicas of the delta stream (KVMESH_DELTAS by default) and the tokenizer object store: auto "+
		"(3 where the JetStream cluster can place them, else 1) or 1..5 (env KVMESH_STREAM_REPLICAS)", set)
}

// sidecarFlags binds every `kvmesh sidecar` flag onto opts; bad values go
// to probs.
func sidecarFlags(fs *flag.FlagSet, opts *sidecar.Options, probs *flagProblems) {
	one, cfg := &opts.Engine, &opts.Config
	fs.StringVar(&one.ID, "engine-id", "", "engine id in the mesh (default: host:port of --engine-url)")
	fs.StringVar(&one.Model, "model", "", "served model name")
	fs.StringVar(&one.URL, "engine-url", "", "engine HTTP base URL other hosts can reach, e.g. http://10.0.0.5:8000 (ingresses dial it: not a loopback address in a cluster)")
	fs.String("engine-host", "", "instead of --engine-url: the engine's IP address or host name, e.g. $(POD_IP); with --engine-port the URL is http://HOST:PORT (IPv6 bracketed)")
	fs.Int("engine-port", 0, "instead of --engine-url: the engine's HTTP port, with --engine-host")
	fs.StringVar(&one.MetricsURL, "metrics-url", "", "engine metrics URL (default <engine-url>/metrics; - disables)")
	fs.StringVar(&one.Role, "role", one.Role, "engine role: prefill, decode or mixed")
	fs.StringVar(&one.Events, "events", "", "KV-event ZMQ endpoint of DP rank 0, e.g. tcp://127.0.0.1:5557")
	fs.StringVar(&one.Replay, "replay", "", "KV-event replay endpoint of DP rank 0, e.g. tcp://127.0.0.1:5558")
	fs.BoolVar(&one.Bind, "bind-events", false, "bind the events endpoint (for engines whose PUB connects)")
	fs.IntVar(&one.DPSize, "dp-size", one.DPSize, "data-parallel ranks (rank r publishes on port+r)")
	fs.IntVar(&one.BlockSize, "block-size", 0, "tokens per block (0: learned from events)")
	fs.StringVar(&one.TokenizerDir, "tokenizer-dir", "", "model directory with tokenizer.json (+ tokenizer_config.json) to publish to the mesh for the ingresses")
	fs.StringVar(&one.TokenizerRevision, "tokenizer-revision", "", "revision name of the published tokenizer (default: from the files' digests)")
	fs.StringVar(&one.PDGroup, "pd-group", os.Getenv("KVMESH_PD_GROUP"), "P/D group: ingresses pair prefill and decode engines only within one (default $KVMESH_PD_GROUP, which the orchestrator sets; its pod label is kvmesh.io/pd-group)")
	fs.StringVar(&one.PDProtocol, "pd-protocol", "", "P/D wire protocol of the engine: nixl (vLLM NixlConnector, the default) or sglang (--disaggregation-mode)")
	fs.IntVar(&one.BootstrapPort, "bootstrap-port", 0, "SGLang prefill engine's --disaggregation-bootstrap-port (0: 8998)")
	fs.Var((*multiFlag)(&opts.EngineSpecs), "engine", "DaemonSet mode, repeatable: id=ID,model=M,url=URL,events=EP[,replay=EP,metrics=URL,role=R,dp=N,block=B,bind=true,tokenizer=DIR,group=G,pd=nixl|sglang,bootstrap=PORT]; "+
		"instead of url=, events= and replay=: host=HOST,port=PORT,events-port=PORT[,replay-port=PORT] (http://HOST:PORT and tcp://HOST:PORT, an IPv6 HOST bracketed, e.g. host=$(NODE_IP))")

	natsutil.BindFlags(fs, &cfg.NATS.URLs, &cfg.NATS.Auth, "NATS server URLs, comma-separated (empty: start an embedded server)")
	cfg.NATS.Name = "kvmesh-sidecar"
	probs.Var(fs, "embedded-nats-port", "", "without --nats: the embedded NATS server's port on 127.0.0.1, which ingresses on this machine give as --nats nats://127.0.0.1:PORT (default: a free port, logged at start)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("--embedded-nats-port %q: want a port from 1 to 65535", s)
		}
		cfg.NATS.Embedded.Port = n
		return nil
	})
	fs.DurationVar(&cfg.NATS.Stream.MaxAge, "stream-max-age", cfg.NATS.Stream.MaxAge, "delta stream (KVMESH_DELTAS by default) retention by age")
	cfg.EngineAPIKey = os.Getenv("KVMESH_ENGINE_API_KEY")
	fs.DurationVar(&cfg.ModelsInterval, "models-interval", cfg.ModelsInterval, "how often the engine's /v1/models is read for the LoRA adapters it serves and checked for --model (gossiped to the ingresses; 0: never)")
	fs.DurationVar(&cfg.EventsSilentAfter, "events-silent-after", cfg.EventsSilentAfter, "warn, and set kvmesh_sidecar_events_silent, when the engine's metrics show it working this long with no KV event batch arriving (a wrong --events or --replay endpoint; 0: never)")
	fs.DurationVar(&cfg.EngineIDWait, "engine-id-wait", cfg.EngineIDWait, "at start, how long to wait while another live gossip member serves this engine id at another URL, before exiting (a member declared dead, or whose URL refuses connections or lists other models, frees the id at once; a URL that does not answer frees nothing)")
	fs.Int64Var(&cfg.NATS.Stream.MaxBytes, "stream-max-bytes", cfg.NATS.Stream.MaxBytes, "delta stream (KVMESH_DELTAS by default) retention by size")
	streamReplicasFlag(fs, &cfg.NATS.Stream.Replicas, probs)

	fs.StringVar(&opts.GossipBind, "gossip-bind", "", "gossip listen IP:port (IPv6 in brackets; empty: no gossip)")
	fs.StringVar(&opts.GossipAdvertise, "gossip-advertise", "", "the IP, or IP:port (IPv6 in brackets), others dial, when it differs from the bind address")
	List(fs, &opts.GossipSeeds, "join", "gossip seeds host:port, comma-separated (DNS names resolving to several addresses allowed)")
	gossipKeyFlag(fs, &opts.Gossip.SecretKey, &opts.Gossip.ExtraKeys, probs)
	fs.StringVar(&opts.Gossip.Profile, "gossip-profile", opts.Gossip.Profile, "gossip timings: local, lan or wan")
	fs.StringVar(&opts.Gossip.Name, "node-name", "", "gossip member name (default hostname-random)")
	stateLaneFlag(fs, &cfg.StateOverNATSOff, "publish the engines' gossip state on NATS too (<prefix>.state.<node-name>), where the ingresses read it within a broadcast interval (default true)", probs)

	fs.StringVar(&cfg.AdminAddr, "admin", "127.0.0.1:9101", "admin address for /health, /ready, /metrics, /debug/state (empty: off)")
	fs.StringVar(&cfg.ResyncPolicy, "resync-policy", cfg.ResyncPolicy, "when event history is lost: rebuild (keep the engine cache, under-report until re-stored) or reset-engine (POST /reset_prefix_cache: exact, costs the cache)")
	probs.LogLevel(fs, &opts.LogLevel)
	probs.LogFormat(fs, &opts.LogFormat)
}
