package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/internal/logutil"
)

// Options is what `kvmesh ingress` runs: the replica's Config plus the
// request-path components the process builds around it (API keys, token
// rate limits, session admission) and its log level. The command's flags
// bind onto it (cmd/kvmesh/ingress.go) over a YAML Config file.
type Options struct {
	Config Config
	// APIKeysFile is an API keys file (auth.ParseKeys format), re-read when
	// it changes (a reload that fails or finds no key keeps the keys in
	// force). "": the keys in $KVMESH_API_KEYS, and no such variable means an
	// open ingress. A file, or a set variable, that holds no key is refused.
	APIKeysFile string
	// KeyLimits and ModelLimits are token rate limits per minute, per API
	// key and per model. Zero: none.
	KeyLimits, ModelLimits ratelimit.Limits
	// AdmitMax turns on session-boost admission: at most this many requests
	// in service before new sessions queue (0: off). AdmitMaxWait bounds
	// the queueing (504 after). Default 30s.
	AdmitMax     int
	AdmitMaxWait time.Duration
	// LogLevel of the log (and the access log) on stderr. Default info.
	LogLevel slog.Level
	// LogFormat of that log: logutil.JSON (default) or logutil.Text.
	LogFormat string
	// JWT, when its JWKSFile or JWKSURL is set, accepts bearer JWTs besides
	// the API keys; a token's rate-limit claim sets its tenant's budget.
	JWT auth.JWTConfig
	// TokenizerStore loads the tokenizers the sidecars publish to NATS
	// (internal/tokenstore) for models with no local tokenizer. Default on;
	// needs Config.Cluster.NATSURLs. TokenizerCache is where fetched files go
	// ("": a temporary directory).
	TokenizerStore bool
	TokenizerCache string
}

// DefaultOptions is DefaultConfig with no keys, limits or admission.
func DefaultOptions() Options {
	return Options{Config: DefaultConfig(), AdmitMaxWait: 30 * time.Second, LogLevel: slog.LevelInfo, LogFormat: logutil.JSON, TokenizerStore: true}
}

// Validate lists every problem, each wrapping ErrConfig.
func (o *Options) Validate() error {
	errs := []error{o.Config.Validate()}
	for _, l := range []struct {
		name string
		v    int64
	}{{"key input limit", o.KeyLimits.InputTokens}, {"key output limit", o.KeyLimits.OutputTokens},
		{"model input limit", o.ModelLimits.InputTokens}, {"model output limit", o.ModelLimits.OutputTokens},
		{"admit max", int64(o.AdmitMax)}} {
		if l.v < 0 {
			errs = append(errs, fmt.Errorf("%w: %s must be >= 0, got %d", ErrConfig, l.name, l.v))
		}
	}
	if o.AdmitMax > 0 && o.AdmitMaxWait <= 0 {
		errs = append(errs, fmt.Errorf("%w: admit max wait must be > 0", ErrConfig))
	}
	errs = append(errs, checkCORSOrigins(o.Config.CORSOrigins)) // cors.go
	if o.JWT.JWKSFile != "" || o.JWT.JWKSURL != "" {
		// Checked again by auth.NewJWT, after start-up began (exit 1).
		if err := o.JWT.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	// The routes file too: a missing or invalid one failed at start-up,
	// exit 1 with a log line, where the flags' problems are usage errors.
	if path := o.Config.Routes; path != "" {
		if _, err := routes.Load(path); err != nil && !(o.Config.RoutesOptional && errors.Is(err, fs.ErrNotExist)) {
			errs = append(errs, fmt.Errorf("%w: routes file (--routes, routesFile): %s", ErrConfig, oneLine(err)))
		}
	}
	// The keys are read here too, so a keys file of comments or an empty
	// $KVMESH_API_KEYS is a configuration error at start, not an open ingress.
	if _, err := auth.Load(o.authConfig()); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	return errors.Join(errs...)
}

// oneLine is err's text on one line: a YAML decoder's list of errors
// ("yaml: unmarshal errors:\n  line 3: ...") joined with "; ", as the
// command line's problems are.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), ":\n  ", ": ")
	s = strings.ReplaceAll(s, "\n  ", "; ")
	return strings.ReplaceAll(s, "\n", "; ")
}

// authConfig is where the API keys come from: keys are required from each
// source named (the file, or $KVMESH_API_KEYS when it is set at all).
func (o *Options) authConfig() auth.Config {
	ac := auth.DefaultConfig()
	ac.KeysFile = o.APIKeysFile
	ac.Required = len(ac.Sources()) > 0
	return ac
}

// Run serves one ingress replica until ctx ends, then drains: it builds
// the components o asks for, starts the server, writes its address to
// stdout and logs JSON to stderr.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	log := logutil.New(stderr, o.LogFormat, o.LogLevel)
	if w := o.Config.PDWarning(); w != "" {
		log.Warn(w)
	}
	srv, err := o.NewServer(ctx, log)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	scheme := "http"
	if o.Config.TLS.CertFile != "" {
		scheme = "https"
	}
	// The banner stays text in both formats: `kvmesh orchestrator --local`
	// reads it from this line's start (orchestrator/local) whatever the
	// format. In JSON mode it is also logged, so a JSON-only pipeline has it.
	fmt.Fprintf(stdout, "kvmesh ingress listening on %s://%s\n", scheme, srv.Addr())
	banner := Banner(stdout, o.LogFormat)
	if o.LogFormat == logutil.JSON {
		log.Info("listening", "addr", scheme+"://"+srv.Addr())
	}
	select {
	case <-ctx.Done():
	case err := <-srv.Failed():
		// A listener stopped accepting: exit, so a supervisor restarts the
		// replica, instead of living on unreachable.
		banner("draining", "err", err.Error())
		return errors.Join(err, srv.Close())
	}
	banner("draining")
	return srv.Close()
}

// Banner returns how a command prints its lines on stdout (the address it
// listens on, "draining"): as they are in text format, as one JSON object
// each ({"time":...,"level":"INFO","msg":line, attrs...}) in JSON format,
// so every line of a JSON-mode process parses.
func Banner(stdout io.Writer, format string) func(line string, attrs ...any) {
	if format != logutil.JSON {
		return func(line string, _ ...any) { fmt.Fprintln(stdout, line) }
	}
	l := logutil.New(stdout, logutil.JSON, slog.LevelInfo)
	return func(line string, attrs ...any) { l.Info(line, attrs...) }
}

// deps builds the optional request-path components o configures, their
// metrics registered on one registry.
func (o *Options) deps(ctx context.Context, log *slog.Logger) (Deps, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	deps := Deps{Logger: log, AccessLog: log, Registry: reg}
	// Every kvmesh_ingress_* series carries the replica's ingress label,
	// as the server's own do (metrics.go): the components' below included.
	own := prometheus.WrapRegistererWith(prometheus.Labels{"ingress": o.Config.ID}, reg)
	keys, nkeys, err := o.apiKeys(log, own)
	if err != nil {
		return deps, err
	}
	if nkeys > 0 {
		deps.Auth = keys
	}
	var jwtv *auth.JWTVerifier
	if o.JWT.JWKSFile != "" || o.JWT.JWKSURL != "" {
		jc := o.JWT
		if jc.Logger == nil {
			jc.Logger = log
		}
		if jwtv, err = auth.NewJWT(ctx, jc); err != nil {
			return deps, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		own.MustRegister(jwtv.Collectors()...)
		deps.Auth = auth.Chain{Keys: keys, Verifier: jwtv}
	}
	o.logAuth(log, nkeys, jwtv != nil)
	if o.KeyLimits != (ratelimit.Limits{}) || o.ModelLimits != (ratelimit.Limits{}) || jwtv != nil {
		rc := ratelimit.DefaultConfig()
		rc.PerKey, rc.PerModel = o.KeyLimits, o.ModelLimits
		rc.Logger = log.With("component", "ratelimit")
		if jwtv != nil { // a token's rate_limit claim sets its tenant's budget
			rc.KeyLimits = func(tenant string) (ratelimit.Limits, bool) {
				in, out, ok := jwtv.TenantLimits(tenant)
				return ratelimit.Limits{InputTokens: in, OutputTokens: out}, ok
			}
		}
		lim, err := ratelimit.New(rc)
		if err != nil {
			return deps, err
		}
		reg.MustRegister(lim.Collectors()...)
		deps.Limiter = lim
	}
	aff, err := session.NewAffinity(session.DefaultAffinityConfig())
	if err != nil {
		return deps, err
	}
	deps.Affinity = aff
	if o.Config.Routes != "" {
		w, err := routes.NewWatcher(routes.WatcherConfig{Path: o.Config.Routes, Optional: o.Config.RoutesOptional, Logger: log, Registerer: own})
		if err != nil {
			return deps, err
		}
		deps.Routes = w // the server runs its polling (a runner) and stops it with Close
	}
	if fc := o.Config.FairQueue; fc != nil {
		q, err := fair.New(*fc)
		if err != nil {
			return deps, err
		}
		own.MustRegister(q.Collectors()...) // kvmesh_ingress_tenant_*
		deps.Admitter, deps.ClassifyError = q, FairErrors
	} else if o.AdmitMax > 0 {
		adc := session.DefaultAdmissionConfig()
		adc.MaxConcurrent, adc.MaxWait = o.AdmitMax, o.AdmitMaxWait
		adm, err := session.NewAdmitter(adc)
		if err != nil {
			return deps, err
		}
		reg.MustRegister(adm.Collectors()...)
		deps.Admitter = adm
		deps.ClassifyError = SessionErrors
	}
	return deps, nil
}

// apiKeys loads the API keys: from a file, re-read on change (the server
// runs the watcher: Server.Start); else from $KVMESH_API_KEYS once.
func (o *Options) apiKeys(log *slog.Logger, reg prometheus.Registerer) (auth.KeyChecker, int, error) {
	ac := o.authConfig()
	if ac.KeysFile != "" {
		k, err := auth.WatchKeys(ac, auth.WatchConfig{Logger: log, Registerer: reg})
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		return k, k.Len(), nil
	}
	store, err := auth.Load(ac)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return store, store.Len(), nil
}

// logAuth says at start how clients authenticate: API keys (how many, from
// where), JWTs, both, or not at all (a warning: anyone reaching the client
// port is served).
func (o *Options) logAuth(log *slog.Logger, keys int, jwt bool) {
	metrics := "admin listener"
	if o.Config.AdminListen == "" {
		metrics = "client port, with a client credential"
	}
	switch {
	case keys > 0 || jwt:
		var args []any
		if keys > 0 {
			args = append(args, "api_keys", keys, "api_keys_from", strings.Join(o.authConfig().Sources(), ","))
		}
		if jwt {
			jwks := o.JWT.JWKSFile
			if u, err := url.Parse(o.JWT.JWKSURL); jwks == "" && err == nil {
				jwks = u.Redacted()
			}
			args = append(args, "jwt_jwks", jwks, "jwt_audience", o.JWT.Audience)
		}
		log.Info("client authentication on", append(args, "metrics", metrics)...)
	default:
		if o.Config.AdminListen == "" {
			metrics = "client port, open"
		}
		log.Warn("client authentication off: every request is served as anonymous (--api-keys-file, $KVMESH_API_KEYS or --jwks-file/--jwks-url turn it on)", "metrics", metrics)
	}
	if a := o.Config.AdminListen; a != "" && o.Config.AdminToken == "" && !loopbackListen(a) {
		log.Warn("the admin listener is on a non-loopback address without a token: anyone who reaches it reads pprof, /debug/* (the index, the config, the engines) and the metrics; set --admin-token (or $KVMESH_ADMIN_TOKEN), or bind it to 127.0.0.1", "admin", a)
	}
}

// loopbackListen reports whether a listen address (host:port) is on
// loopback only: an empty host, 0.0.0.0 or :: listen everywhere.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(host, "localhost")
}
