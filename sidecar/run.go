package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/logutil"
)

// Options is what `kvmesh sidecar` runs: the sidecar's Config plus the
// forms the command line gives engines and gossip in, resolved by Build.
// The command's flags bind onto it (cmd/kvmesh/sidecar.go).
type Options struct {
	Config Config
	// Engine is the single-engine form (one engine beside its sidecar):
	// used when its Events, Model or URL is set. ID defaults to the URL's
	// host:port.
	Engine EngineConfig
	// EngineSpecs are DaemonSet-mode engines, one spec each
	// (ParseEngineSpec); they come before Engine.
	EngineSpecs []string
	// GossipBind is the memberlist "host:port"; "" disables gossip.
	// GossipAdvertise is "host" or "host:port" others dial when it differs
	// (gossip.Config.SetAddrs). GossipSeeds are members to join.
	GossipBind, GossipAdvertise string
	GossipSeeds                 []string
	// Gossip holds the other gossip settings (Profile, Name, SecretKey);
	// its addresses, seeds, meta and logger are set by Build.
	Gossip gossip.Config
	// LogLevel of the log on stderr. Default info.
	LogLevel slog.Level
	// LogFormat of that log: logutil.JSON (default) or logutil.Text.
	LogFormat string
}

// DefaultOptions are DefaultConfig, gossip's defaults and one mixed engine
// with one DP rank.
func DefaultOptions() Options {
	return Options{Config: DefaultConfig(), Engine: EngineConfig{Role: "mixed", DPSize: 1}, Gossip: gossip.DefaultConfig(),
		LogFormat: logutil.JSON}
}

// Build resolves o into the Config New takes, listing every problem (each
// wrapping ErrConfig). log becomes the sidecar's and gossip's logger.
func (o *Options) Build(log *slog.Logger) (Config, error) {
	cfg := o.Config
	cfg.Logger = log
	cfg.Engines = append([]EngineConfig(nil), cfg.Engines...)
	var errs []error
	for _, s := range o.EngineSpecs {
		e, err := ParseEngineSpec(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.Engines = append(cfg.Engines, e)
	}
	if one := o.Engine; one.Events != "" || one.Model != "" || one.URL != "" {
		if one.ID == "" && one.URL != "" {
			one.ID = hostOf(one.URL)
		}
		cfg.Engines = append(cfg.Engines, one)
	}
	switch {
	case o.GossipBind != "":
		g := o.Gossip
		if err := g.SetAddrs(o.GossipBind, o.GossipAdvertise); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
		g.Join = o.GossipSeeds
		g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar}
		for i, e := range cfg.Engines {
			m := gossip.NodeMeta{Role: gossip.RoleSidecar, ID: e.ID, Model: e.Model, EngineURL: e.URL, EngineRole: e.Role, BlockSize: e.BlockSize}
			if i == 0 {
				g.Meta = m // the first engine's is the member's (Contract 3)
			}
			// Every engine's must fit, whatever the --engine order.
			if err := gossip.CheckMeta(m); err != nil && i > 0 {
				errs = append(errs, fmt.Errorf("%w: --engine %d: %w", ErrConfig, i+1, err))
			}
		}
		g.Logger = log
		cfg.Gossip = &g
	case len(o.GossipSeeds) > 0:
		errs = append(errs, fmt.Errorf("%w: gossip seeds (--join) need a gossip bind address", ErrConfig))
	}
	return cfg, errors.Join(errs...)
}

// Run builds and runs a sidecar until ctx ends, logging to stderr.
// Configuration problems wrap ErrConfig.
func Run(ctx context.Context, o Options, stderr io.Writer) error {
	log := logutil.New(stderr, o.LogFormat, o.LogLevel)
	cfg, err := o.Build(log)
	if err != nil {
		return err
	}
	cfg.warnLocalEngineURLs(log)
	s, err := New(cfg)
	if err != nil {
		return err
	}
	if len(cfg.NATS.URLs) == 0 {
		log.Info("no NATS URLs given: starting an embedded NATS server (single machine only)")
	}
	return s.Run(ctx)
}

// ParseEngineSpec parses a DaemonSet-mode engine,
// "id=a,model=m,url=http://...,events=tcp://...[,replay=EP,metrics=URL,role=R,dp=N,block=B,bind=true,group=G,pd=nixl|sglang,bootstrap=PORT]".
// Role defaults to mixed, dp to 1 and id to the URL's host:port.
func ParseEngineSpec(s string) (EngineConfig, error) {
	e := EngineConfig{Role: "mixed", DPSize: 1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return e, fmt.Errorf("%w: engine spec %q: %q is not key=value", ErrConfig, s, kv)
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
		case "tokenizer":
			e.TokenizerDir = v
		case "group":
			e.PDGroup = v
		case "pd":
			e.PDProtocol = v
		case "bootstrap":
			e.BootstrapPort, err = strconv.Atoi(v)
		case "bind":
			e.Bind, err = strconv.ParseBool(v)
		default:
			return e, fmt.Errorf("%w: engine spec %q: unknown key %q", ErrConfig, s, k)
		}
		if err != nil {
			return e, fmt.Errorf("%w: engine spec %q: %s: %v", ErrConfig, s, k, err)
		}
	}
	if e.ID == "" && e.URL != "" {
		e.ID = hostOf(e.URL)
	}
	return e, nil
}

// hostOf is the host:port of a URL (the default engine id).
func hostOf(url string) string {
	_, rest, ok := strings.Cut(url, "://")
	if !ok {
		rest = url
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}
