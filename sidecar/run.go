package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/keyvalue"
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
		if one.DPSize < 1 {
			errs = append(errs, fmt.Errorf("%w: --dp-size %d: want ≥ 1", ErrConfig, one.DPSize)) // 0 ran as 1
		}
		if one.ID == "" && one.URL != "" {
			one.ID = hostOf(one.URL)
		}
		cfg.Engines = append(cfg.Engines, one)
	}
	// Polls of the engine and of NATS: a tiny interval keeps the engine
	// (or the NATS server) busy answering (--models-interval 1ns cost the
	// sidecar 58 % of a core).
	if iv := cfg.ModelsInterval; iv > 0 && iv < MinModelsInterval {
		errs = append(errs, fmt.Errorf("%w: --models-interval %v: want 0 (never) or ≥ %v", ErrConfig, iv, MinModelsInterval))
	}
	if iv := cfg.NATS.Auth.PingInterval; iv > 0 && iv < MinNATSPingInterval {
		errs = append(errs, fmt.Errorf("%w: --nats-ping-interval %v: want 0 (the default) or ≥ %v", ErrConfig, iv, MinNATSPingInterval))
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
			// The URL as the sidecar gossips it (New trims a trailing slash).
			m := gossip.NodeMeta{Role: gossip.RoleSidecar, ID: e.ID, Model: e.Model, EngineURL: strings.TrimSuffix(e.URL, "/"), EngineRole: e.Role, BlockSize: e.BlockSize}
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

// The shortest intervals Build accepts for the sidecar's polls.
const (
	MinModelsInterval   = time.Second
	MinNATSPingInterval = 100 * time.Millisecond
)

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
//
// Instead of url=, events= and replay=, "host=H,port=P,events-port=E[,replay-port=R]"
// gives the engine's host once, and the URL http://H:P and the endpoints
// tcp://H:E and tcp://H:R are built with an IPv6 host bracketed
// (JoinHostPort): a manifest's host=$(NODE_IP) reads the same on IPv4 and
// IPv6 nodes, where url=http://$(NODE_IP):8000 is no URL on IPv6. A key
// and the one it stands for (host= or port= and url=, events-port= and
// events=, replay-port= and replay=) are refused together.
func ParseEngineSpec(s string) (EngineConfig, error) {
	e := EngineConfig{Role: "mixed", DPSize: 1}
	var host string
	var port, eventsPort, replayPort int
	pairs, err := keyvalue.Split(s)
	if err != nil {
		return e, fmt.Errorf("%w: engine spec %q: %w", ErrConfig, s, err)
	}
	given := make(map[string]bool, len(pairs))
	for _, p := range pairs {
		k, v := p.Key, p.Value
		given[k] = true
		var err error
		switch k {
		case "id":
			e.ID = v
		case "model":
			e.Model = v
		case "url":
			e.URL = v
		case "host":
			host = v
		case "port":
			port, err = strconv.Atoi(v)
		case "metrics":
			e.MetricsURL = v
		case "events":
			e.Events = v
		case "events-port":
			eventsPort, err = strconv.Atoi(v)
		case "replay":
			e.Replay = v
		case "replay-port":
			replayPort, err = strconv.Atoi(v)
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
	if e.DPSize < 1 {
		return e, fmt.Errorf("%w: engine spec %q: dp=%d: want ≥ 1", ErrConfig, s, e.DPSize)
	}
	if err := e.fromHost(given, host, port, eventsPort, replayPort); err != nil {
		return e, fmt.Errorf("%w: engine spec %q: %w", ErrConfig, s, err)
	}
	if e.ID == "" && e.URL != "" {
		e.ID = hostOf(e.URL)
	}
	return e, nil
}

// fromHost sets e's URL, Events and Replay from an engine spec's host=,
// port=, events-port= and replay-port= (given says which keys the spec
// has), refusing them beside the url=, events= or replay= they build.
func (e *EngineConfig) fromHost(given map[string]bool, host string, port, eventsPort, replayPort int) error {
	switch {
	case !given["host"] && !given["port"] && !given["events-port"] && !given["replay-port"]:
		return nil
	case given["url"] && (given["host"] || given["port"]):
		return errors.New("host= and port= build the engine URL, http://HOST:PORT: give them or url=, not both")
	case given["events"] && given["events-port"]:
		return errors.New("events-port= builds the events endpoint, tcp://HOST:PORT with host=: give it or events=, not both")
	case given["replay"] && given["replay-port"]:
		return errors.New("replay-port= builds the replay endpoint, tcp://HOST:PORT with host=: give it or replay=, not both")
	case !given["host"]:
		return errors.New("port=, events-port= and replay-port= are ports on host=, which is missing")
	case !given["port"]:
		return errors.New("host= and port= go together (the engine URL is http://HOST:PORT)")
	}
	hp, err := JoinHostPort(host, port)
	if err != nil {
		return err
	}
	e.URL = "http://" + hp
	for _, ep := range []struct {
		key  string
		port int
		dst  *string
	}{{"events-port", eventsPort, &e.Events}, {"replay-port", replayPort, &e.Replay}} {
		if !given[ep.key] {
			continue
		}
		hp, err := JoinHostPort(host, ep.port)
		if err != nil {
			return fmt.Errorf("%s: %w", ep.key, err)
		}
		*ep.dst = "tcp://" + hp
	}
	return nil
}

// JoinHostPort is "host:port" for a URL or a tcp:// endpoint, an IPv6
// host bracketed (net.JoinHostPort): the downward API gives $(POD_IP) and
// $(NODE_IP) bare, and http://fd00::1:8000 is no URL. host may come
// bracketed already; one with a port, or with a character no IP address
// or host name has, is refused, as is a port outside 1..65535.
func JoinHostPort(host string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", fmt.Errorf("port %d: want 1..65535", port)
	}
	bare := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if bare == "" || strings.Contains(bare, ":") && net.ParseIP(bare) == nil || strings.ContainsAny(bare, "/[]@?#% ") {
		return "", fmt.Errorf("host %q: want an IP address or a host name, without a port", host)
	}
	return net.JoinHostPort(bare, strconv.Itoa(port)), nil
}

// hostOf is the host:port of a URL (the default engine id), without its
// userinfo: the id is gossiped, labels metrics, is logged and reaches
// clients in X-Kvmesh-Engine, so "http://user:secret@[::1]:8000" gives
// "[::1]:8000", as the ingress's static engines' ids do.
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		rest = raw
	}
	// An unparsable URL's userinfo may itself hold a '/' (a password
	// pasted unescaped): drop everything up to its last '@' before cutting
	// the path, as natsutil.RedactURL does.
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}
