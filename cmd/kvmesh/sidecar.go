package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/sidecar"
)

// runSidecar runs the sidecar next to one engine (or, with repeated
// --engine specs, for every engine on a node) until SIGTERM/SIGINT.
func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := sidecar.DefaultConfig()
	fs := newFlagSet("sidecar", stderr)
	var one sidecar.EngineConfig
	var specs multiFlag
	fs.StringVar(&one.ID, "engine-id", "", "engine id in the mesh (default: host:port of --engine-url)")
	fs.StringVar(&one.Model, "model", "", "served model name")
	fs.StringVar(&one.URL, "engine-url", "", "engine HTTP base URL, e.g. http://127.0.0.1:8000")
	fs.StringVar(&one.MetricsURL, "metrics-url", "", "engine metrics URL (default <engine-url>/metrics; - disables)")
	fs.StringVar(&one.Role, "role", "mixed", "engine role: prefill, decode or mixed")
	fs.StringVar(&one.Events, "events", "", "KV-event ZMQ endpoint of DP rank 0, e.g. tcp://127.0.0.1:5557")
	fs.StringVar(&one.Replay, "replay", "", "KV-event replay endpoint of DP rank 0, e.g. tcp://127.0.0.1:5558")
	fs.BoolVar(&one.Bind, "bind-events", false, "bind the events endpoint (for engines whose PUB connects)")
	fs.IntVar(&one.DPSize, "dp-size", 1, "data-parallel ranks (rank r publishes on port+r)")
	fs.IntVar(&one.BlockSize, "block-size", 0, "tokens per block (0: learned from events)")
	fs.StringVar(&one.TokenizerDir, "tokenizer-dir", "", "model directory with tokenizer.json (+ tokenizer_config.json) to publish to the mesh for the ingresses")
	fs.StringVar(&one.TokenizerRevision, "tokenizer-revision", "", "revision name of the published tokenizer (default: from the files' digests)")
	fs.Var(&specs, "engine", "DaemonSet mode, repeatable: id=ID,model=M,url=URL,events=EP[,replay=EP,metrics=URL,role=R,dp=N,block=B,bind=true,tokenizer=DIR]")

	natsutil.BindFlags(fs, &cfg.NATS.URLs, &cfg.NATS.Auth, "NATS server URLs, comma-separated (empty: start an embedded server)")
	fs.DurationVar(&cfg.NATS.Stream.MaxAge, "stream-max-age", cfg.NATS.Stream.MaxAge, "KVMESH_DELTAS retention by age")
	fs.Int64Var(&cfg.NATS.Stream.MaxBytes, "stream-max-bytes", cfg.NATS.Stream.MaxBytes, "KVMESH_DELTAS retention by size")
	fs.IntVar(&cfg.NATS.Stream.Replicas, "stream-replicas", cfg.NATS.Stream.Replicas, "KVMESH_DELTAS replicas (clustered JetStream)")

	gcfg := gossip.DefaultConfig()
	gossipBind := fs.String("gossip-bind", "", "gossip listen host:port (empty: no gossip)")
	advertise := fs.String("gossip-advertise", "", "gossip host or host:port others dial, when it differs from the bind address")
	join := fs.String("join", "", "gossip seeds host:port, comma-separated (DNS names resolving to several addresses allowed)")
	key := fs.String("gossip-key", os.Getenv("KVMESH_GOSSIP_KEY"), "base64 gossip encryption keys of 16, 24 or 32 bytes, comma-separated: the first encrypts, the rest are accepted during a rotation (env KVMESH_GOSSIP_KEY)")
	fs.StringVar(&gcfg.Profile, "gossip-profile", gcfg.Profile, "gossip timings: local, lan or wan")
	fs.StringVar(&gcfg.Name, "node-name", "", "gossip member name (default hostname-random)")

	fs.StringVar(&cfg.AdminAddr, "admin", "127.0.0.1:9101", "admin address for /health, /ready, /metrics, /debug/state (empty: off)")
	fs.StringVar(&cfg.ResyncPolicy, "resync-policy", cfg.ResyncPolicy, "when event history is lost: rebuild (keep the engine cache, under-report until re-stored) or reset-engine (POST /reset_prefix_cache: exact, costs the cache)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh sidecar --model M --engine-url URL --events tcp://HOST:5557 [--replay tcp://HOST:5558] [--nats URL] [--gossip-bind ADDR --join SEEDS]")
		fmt.Fprintln(stderr, "       kvmesh sidecar --engine id=a,model=M,url=URL,events=EP --engine id=b,... (DaemonSet mode)")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	var problems []string
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		problems = append(problems, "bad --log-level")
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log

	for _, s := range specs {
		e, err := parseEngineSpec(s)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		cfg.Engines = append(cfg.Engines, e)
	}
	if one.Events != "" || one.Model != "" || one.URL != "" {
		if one.ID == "" && one.URL != "" {
			one.ID = sidecarEngineID(one.URL)
		}
		cfg.Engines = append(cfg.Engines, one)
	}
	cfg.NATS.Name = "kvmesh-sidecar"
	if *gossipBind != "" {
		host, port, err := net.SplitHostPort(*gossipBind)
		p, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			problems = append(problems, fmt.Sprintf("bad --gossip-bind %q (want host:port)", *gossipBind))
		}
		gcfg.BindAddr, gcfg.BindPort = host, p
		if *advertise != "" {
			gcfg.AdvertiseAddr = *advertise
			if h, port, err := net.SplitHostPort(*advertise); err == nil {
				ap, perr := strconv.Atoi(port)
				if perr != nil {
					problems = append(problems, fmt.Sprintf("bad --gossip-advertise %q", *advertise))
				}
				gcfg.AdvertiseAddr, gcfg.AdvertisePort = h, ap
			}
		}
		gcfg.Join = commaList(*join)
		k, extra, err := gossip.ParseKeys(*key)
		if err != nil {
			problems = append(problems, "--gossip-key: "+err.Error())
		}
		gcfg.SecretKey, gcfg.ExtraKeys = k, extra
		gcfg.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar}
		if len(cfg.Engines) > 0 {
			e := cfg.Engines[0]
			gcfg.Meta.ID, gcfg.Meta.Model, gcfg.Meta.EngineURL, gcfg.Meta.EngineRole, gcfg.Meta.BlockSize = e.ID, e.Model, e.URL, e.Role, e.BlockSize
		}
		gcfg.Logger = log
		cfg.Gossip = &gcfg
	} else if *join != "" {
		problems = append(problems, "--join needs --gossip-bind")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(problems, "; "))
	}
	s, err := sidecar.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if len(cfg.NATS.URLs) == 0 {
		log.Info("no --nats given: starting an embedded NATS server (single machine only)")
	}
	return s.Run(ctx)
}

// parseEngineSpec parses "id=a,model=m,url=http://...,events=tcp://...".
func parseEngineSpec(s string) (sidecar.EngineConfig, error) {
	e := sidecar.EngineConfig{Role: "mixed", DPSize: 1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return e, fmt.Errorf("engine spec %q: %q is not key=value", s, kv)
		}
		var err error
		switch k {
		case "id":
			e.ID = v
		case "model":
			e.Model = v
		case "url":
			e.URL = v
		case "metrics":
			e.MetricsURL = v
		case "events":
			e.Events = v
		case "replay":
			e.Replay = v
		case "role":
			e.Role = v
		case "dp":
			e.DPSize, err = strconv.Atoi(v)
		case "block":
			e.BlockSize, err = strconv.Atoi(v)
		case "bind":
			e.Bind, err = strconv.ParseBool(v)
		case "tokenizer":
			e.TokenizerDir = v
		default:
			return e, fmt.Errorf("engine spec %q: unknown key %q", s, k)
		}
		if err != nil {
			return e, fmt.Errorf("engine spec %q: %s: %v", s, k, err)
		}
	}
	if e.ID == "" && e.URL != "" {
		e.ID = sidecarEngineID(e.URL)
	}
	return e, nil
}

func sidecarEngineID(url string) string {
	_, rest, ok := strings.Cut(url, "://")
	if !ok {
		rest = url
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}

func commaList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
