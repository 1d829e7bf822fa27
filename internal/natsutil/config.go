package natsutil

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Config is how a kvmesh process reaches NATS. The zero value is not usable;
// start from DefaultConfig.
type Config struct {
	// URLs of the NATS servers ("nats://host:4222"). Empty: start an embedded
	// server (Embedded) and connect to it — the single-machine default.
	URLs []string
	// Name is the client connection name shown by `nats server report connections`.
	Name string

	// Auth holds the credentials and TLS settings (BindFlags sets them).
	Auth

	// ConnectTimeout bounds each dial. Default 2s.
	ConnectTimeout time.Duration
	// ReconnectWait is the pause between reconnect attempts to one server.
	// Default 250ms: deltas that cannot be sent are a gap on the other side,
	// which costs a snapshot, so we want to be back quickly.
	ReconnectWait time.Duration
	// MaxReconnects is the number of reconnect attempts; -1 (default) retries forever,
	// because a sidecar or ingress without NATS is useless but must recover by itself.
	MaxReconnects int
	// ReconnectBufSize bounds the bytes buffered while disconnected. Default 8 MiB;
	// when full, publishes fail (and the receivers resync on the gap).
	ReconnectBufSize int
	// WaitForServer starts without a server: Connect returns at once and the
	// connection is made in the background (nats.RetryOnFailedConnect), so a
	// sidecar or ingress started before NATS (a fresh install, a restart
	// during an outage) runs and catches up instead of exiting. The stream is
	// ensured on every (re)connect. Off for one-shot commands, which should
	// fail fast.
	WaitForServer bool

	// Stream is the JetStream stream capturing the deltas.
	Stream StreamConfig
	// Embedded configures the server started when URLs is empty.
	Embedded EmbeddedConfig
}

// Auth is how a client proves itself to NATS and verifies the servers. The
// secrets (Password, Token) never go into YAML files: flags or environment.
type Auth struct {
	// Credentials: at most one of user/password, token, nkey seed file or creds file.
	User         string `yaml:"user"`
	Password     string `yaml:"-"`
	Token        string `yaml:"-"`
	NKeySeedFile string `yaml:"nkeySeedFile"`
	CredsFile    string `yaml:"credsFile"`

	// TLS: CA file to verify the server, optional client certificate, and an
	// escape hatch for test clusters with self-signed certificates.
	TLSCAFile             string `yaml:"tlsCAFile"`
	TLSCertFile           string `yaml:"tlsCertFile"`
	TLSKeyFile            string `yaml:"tlsKeyFile"`
	TLSInsecureSkipVerify bool   `yaml:"tlsInsecureSkipVerify"`

	// PingInterval and MaxPingsOutstanding find a path that stays up but
	// carries nothing (a hung server, a blackholing middlebox, a stopped
	// relay): the client pings every PingInterval and, once more than
	// MaxPingsOutstanding pings went unanswered, declares the connection
	// stale, drops it and reconnects; the ingress's materializer then
	// reports its index stale and resyncs once reconnected. Zero: the
	// defaults, 5s and 2, which find a dead path 10 to 15 s after it died
	// (nats.go's own, 2 min and 2, took up to 6 minutes). They live here,
	// beside the credentials, because every component binds them with
	// BindFlags (--nats-ping-interval, --nats-max-pings-outstanding) and an
	// ingress YAML file sets them in cluster.natsAuth.
	PingInterval        time.Duration `yaml:"pingInterval"`
	MaxPingsOutstanding int           `yaml:"maxPingsOutstanding"`

	// Prefix namespaces the installation on a shared NATS: its subjects
	// are Prefix.delta.>, Prefix.snap.*, Prefix.state.> and its stream
	// StreamNameFor(Prefix) (Subjects). Empty: DefaultPrefix, "kvmesh",
	// the names of every release before it. Every process of one
	// installation must use the same prefix. It lives here, beside the
	// credentials, for the reason the ping settings do: every component
	// binds it with BindFlags (--nats-prefix, $KVMESH_NATS_PREFIX) and an
	// ingress YAML file sets it in cluster.natsAuth.prefix.
	Prefix string `yaml:"prefix"`
}

// Subjects are the subjects of a.Prefix; an invalid prefix is an error
// (Validate reports it first).
func (a Auth) Subjects() (Subjects, error) { return NewSubjects(a.Prefix) }

// Liveness defaults (Auth.PingInterval, Auth.MaxPingsOutstanding).
const (
	DefaultPingInterval        = 5 * time.Second
	DefaultMaxPingsOutstanding = 2
)

// pings are the effective ping settings: a zero field takes its default.
func (a Auth) pings() (time.Duration, int) {
	iv, n := a.PingInterval, a.MaxPingsOutstanding
	if iv == 0 {
		iv = DefaultPingInterval
	}
	if n == 0 {
		n = DefaultMaxPingsOutstanding
	}
	return iv, n
}

// StaleAfter is the longest a dead path goes unnoticed with a's ping
// settings: (MaxPingsOutstanding + 1) ping intervals. It also bounds one
// write to the server (Connect's write timeout), since a stuck write holds
// off the pings.
func (a Auth) StaleAfter() time.Duration {
	iv, n := a.pings()
	return time.Duration(n+1) * iv
}

// Redacted is a copy with the secrets replaced, for logs and /debug/config.
func (a Auth) Redacted() Auth {
	if a.Password != "" {
		a.Password = Redacted
	}
	if a.Token != "" {
		a.Token = Redacted
	}
	return a
}

// StreamConfig bounds the KVMESH_DELTAS stream. Retention must be bounded:
// the stream is for operators and catch-up, the snapshot is the source of truth.
//
// The stream is shared by every sidecar, so its limits follow one rule
// (EnsureStream): an absent stream is created with these limits; on an
// existing stream only the limits set to something other than their default
// (MaxAge, MaxBytes, Replicas) are applied, each change logged old → new.
// Limits left at their defaults never overwrite what is there: another
// sidecar's explicit flags, or an operator's `nats stream edit`.
type StreamConfig struct {
	// MaxAge drops deltas older than this. Default 10m.
	MaxAge time.Duration
	// MaxBytes caps the stream size, oldest dropped first. Default 256 MiB.
	MaxBytes int64
	// Replicas of the stream (and of the tokenizer object store) on
	// clustered JetStream: 1..5 exactly, or AutoReplicas (0, the default):
	// 3 where the cluster can place them, else 1 — quietly on a single
	// server (nothing to replicate to), with one warning on a cluster that
	// cannot place 3 now (asked again every minute). Auto never lowers an
	// existing stream's count; an explicit count is applied either way.
	Replicas int
	// Memory keeps the stream in memory instead of on disk. Default false.
	Memory bool
	// Disabled skips ensuring the stream (and publishes with core NATS):
	// for servers without JetStream. Default false.
	Disabled bool
}

// EmbeddedConfig is the in-process nats-server used when no URL is given.
type EmbeddedConfig struct {
	// Host to listen on. Default 127.0.0.1 (never exposed by default).
	Host string
	// Port to listen on; -1 (default) picks a free port.
	Port int
	// StoreDir for JetStream files. Empty: with PortStore and a Port, the
	// port's own directory, StableStoreDir(Port) (kvmesh-nats-PORT in the
	// temporary directory), kept at Shutdown and used again by the next
	// server on the port, so a restart keeps the stream and a crash leaves
	// no further directory; else a temporary directory removed at Shutdown.
	StoreDir string
	// PortStore: see StoreDir. DefaultConfig sets it (the sidecar's
	// --embedded-nats-port); the zero EmbeddedConfig (tests, the demo)
	// keeps a temporary store.
	PortStore bool
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		Name:             "kvmesh",
		ConnectTimeout:   2 * time.Second,
		ReconnectWait:    250 * time.Millisecond,
		MaxReconnects:    -1,
		ReconnectBufSize: 8 << 20,
		Stream: StreamConfig{
			MaxAge:   10 * time.Minute,
			MaxBytes: 256 << 20,
			Replicas: AutoReplicas,
		},
		Embedded: EmbeddedConfig{Host: "127.0.0.1", Port: -1, PortStore: true},
	}
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid nats config")

// natsSchemes are the URL schemes the NATS client dials.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// hostProblem says what is wrong with the host part of u (a URL with a
// scheme), "" when nothing: an IPv6 address without brackets
// ("nats://::1:4222" dials nothing, and the process waited for NATS for
// ever), no host, or a port that is not a number.
func hostProblem(u string) string {
	scheme, rest, _ := strings.Cut(u, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if rest == "" {
		return "no host (want " + scheme + "://host:4222)"
	}
	if !strings.HasPrefix(rest, "[") && strings.Count(rest, ":") > 1 {
		host, port := rest, "4222"
		if i := strings.LastIndexByte(rest, ':'); net.ParseIP(rest) == nil && net.ParseIP(rest[:i]) != nil {
			host, port = rest[:i], rest[i+1:]
		}
		return fmt.Sprintf("an IPv6 address goes in brackets: %s://[%s]:%s", scheme, host, port)
	}
	host, port := rest, ""
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return "no closing ] after the IPv6 address"
		}
		host, port = rest[1:end], rest[end+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return "want [address]:port"
		}
		port = strings.TrimPrefix(port, ":")
		if ip, _, _ := strings.Cut(host, "%"); net.ParseIP(ip) == nil { // a zone (fe80::1%eth0) is the dialer's
			return fmt.Sprintf("%q in brackets is not an IP address", host)
		}
	} else if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		host, port = rest[:i], rest[i+1:]
	}
	if host == "" {
		return "no host (want " + scheme + "://host:4222)"
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("port %q is not a number from 1 to 65535", port)
		}
	}
	return ""
}

// Validate lists every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	var urls []string
	for _, u := range c.URLs { // a list from a config file may hold "a,b", as the flag does
		for _, one := range strings.Split(u, ",") {
			if one = strings.TrimSpace(one); one != "" {
				urls = append(urls, one)
			}
		}
	}
	for _, u := range urls {
		scheme, _, ok := strings.Cut(u, "://")
		switch {
		case !ok:
			shown := u // a user:password@ shown only as redacted
			if i := strings.LastIndexByte(u, '@'); i >= 0 {
				shown = Redacted + u[i:]
			}
			add("url %q has no scheme (want nats://, tls://, ws:// or wss://)", shown)
		case !natsSchemes[strings.ToLower(scheme)]:
			// http:// was taken and then never connected.
			add("url %q: scheme %q: want nats://, tls://, ws:// or wss://", RedactURL(u), scheme)
		default:
			if why := hostProblem(u); why != "" {
				add("url %q: %s", RedactURL(u), why)
			}
		}
	}
	creds := 0
	if c.User != "" || c.Password != "" {
		creds++
		if c.User == "" {
			add("password without user")
		}
	}
	for _, s := range []string{c.Token, c.NKeySeedFile, c.CredsFile} {
		if s != "" {
			creds++
		}
	}
	if creds > 1 {
		add("give at most one of user/password, token, nkey seed and creds file")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		add("tls cert and key files go together")
	}
	if c.ConnectTimeout <= 0 {
		add("connect timeout %v must be positive", c.ConnectTimeout)
	}
	if c.ReconnectWait <= 0 {
		add("reconnect wait %v must be positive", c.ReconnectWait)
	}
	if c.MaxReconnects < -1 {
		add("max reconnects %d must be -1 (forever) or more", c.MaxReconnects)
	}
	if c.PingInterval < 0 {
		add("ping interval %v must not be negative (0: the default %v)", c.PingInterval, DefaultPingInterval)
	}
	if c.MaxPingsOutstanding < 0 {
		add("max pings outstanding %d must not be negative (0: the default %d)", c.MaxPingsOutstanding, DefaultMaxPingsOutstanding)
	}
	if c.Prefix != "" {
		if err := ValidatePrefix(c.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	if c.ReconnectBufSize < 0 {
		add("reconnect buffer %d must not be negative", c.ReconnectBufSize)
	}
	if !c.Stream.Disabled {
		if c.Stream.MaxAge <= 0 {
			add("stream max age %v must be positive (retention must be bounded)", c.Stream.MaxAge)
		}
		if c.Stream.MaxBytes <= 0 {
			add("stream max bytes %d must be positive (retention must be bounded)", c.Stream.MaxBytes)
		}
		if c.Stream.Replicas < 0 || c.Stream.Replicas > 5 {
			add("stream replicas %d must be 1..5 (or 0: auto)", c.Stream.Replicas)
		}
	}
	if len(c.URLs) == 0 {
		if c.Embedded.Host == "" {
			add("embedded server host is empty")
		}
		if c.Embedded.Port < -1 || c.Embedded.Port > 65535 {
			add("embedded server port %d out of range", c.Embedded.Port)
		}
	}
	return errors.Join(errs...)
}
