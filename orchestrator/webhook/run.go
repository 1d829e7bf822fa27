package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// RunConfig is how the orchestrator serves and registers the webhook.
type RunConfig struct {
	// Listen is the HTTPS address (e.g. 0.0.0.0:9443, or 127.0.0.1:0 out of cluster).
	Listen string
	// CAOverlap is how long, after a new CA's certificate is served, the
	// registered bundle still trusts the previous CA (every replica then
	// serves the new certificate); then the new CA alone is registered. It
	// is counted once per CA, from when this replica stopped serving it (or
	// first saw it, for a CA another replica registered). Zero:
	// DefaultCAOverlap.
	CAOverlap time.Duration
	// Certs is where the serving certificate comes from: a SecretSource in
	// cluster, a DirSource for mounted files. Nil generates one in memory
	// for Hosts (or URLHost) at start, as out of cluster.
	Certs CertSource
	// Hosts the generated certificate is valid for.
	Hosts []string
	// URLHost, when set, registers https://URLHost:<bound port>/mutate-pods
	// (out of cluster); otherwise the Service in Target is registered.
	URLHost string
	Target  Target
	Sidecar SidecarConfig
	Logger  *slog.Logger
	// Ready, if set, receives the registered URL or service once the
	// configuration is first in place.
	Ready func(where string)
	// Listening, if set, receives the bound address (Listen may ask for port 0).
	Listening func(addr string)
	// Leader, for a URL (URLHost), says whether this replica leads: the
	// configuration has one URL, so only the leader registers its own, and
	// again on each new term, while the others stand by (reported not
	// registered). Nil: the URL is registered at start and this replica
	// stands by once another replica registers its URL over it. A Service
	// is called whichever replica serves, so every replica registers it.
	Leader Leader

	clock clock // the registrar's (nil: the real one); tests step a fake
}

// Run serves the webhook with the source's current certificate and keeps
// the configuration trusting it, until ctx ends. A failing registration or
// certificate source is retried and logged at once, and /readyz fails
// meanwhile; Run returns early only if the listener or the source fails for
// good.
func Run(ctx context.Context, kube kubernetes.Interface, cfg RunConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	src := cfg.Certs
	if src == nil {
		hosts := cfg.Hosts
		if len(hosts) == 0 && cfg.URLHost != "" {
			hosts = []string{cfg.URLHost}
		}
		src = &GeneratedSource{Hosts: hosts, Log: log}
	}
	st := newCertStore(log)
	reg := &registrar{kube: kube, target: cfg.Target, store: st, log: log, caOverlap: cfg.CAOverlap, leader: cfg.Leader, clock: cfg.clock}
	if reg.clock == nil {
		reg.clock = realClock{}
	}
	if reg.caOverlap <= 0 {
		reg.caOverlap = DefaultCAOverlap
	}
	srv, err := listen(cfg.Listen, st.getCertificate, reg.ready, &Handler{Sidecar: cfg.Sidecar, Log: log})
	if err != nil {
		return fmt.Errorf("webhook listen: %w", err)
	}
	if cfg.Listening != nil {
		cfg.Listening(srv.Addr())
	}
	where := reg.target.ServiceNamespace + "/" + reg.target.Service
	if cfg.URLHost != "" {
		_, p, _ := net.SplitHostPort(srv.Addr())
		reg.target.URL = "https://" + net.JoinHostPort(cfg.URLHost, p) + Path
		where = reg.target.URL
	}
	reg.onRegistered = func() {
		log.Info("sidecar webhook serving", "at", where, "listen", srv.Addr())
		if cfg.Ready != nil {
			cfg.Ready(where)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var srcErr, srvErr error
	wg.Go(func() {
		if err := src.Run(ctx, st.publish); err != nil {
			srcErr = fmt.Errorf("webhook certificate: %w", err)
			cancel()
		}
	})
	wg.Go(func() {
		if err := srv.Serve(ctx); err != nil {
			srvErr = fmt.Errorf("webhook serve: %w", err)
			cancel()
		}
	})
	wg.Go(func() { reg.run(ctx) })
	wg.Wait()
	return errors.Join(srcErr, srvErr)
}

// ParseService reads "namespace/name[:port]" (port default 443).
func ParseService(s string) (ns, name string, port int32, err error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" {
		return "", "", 0, fmt.Errorf("webhook service %q: want namespace/name[:port]", s)
	}
	name, ps, hasPort := strings.Cut(rest, ":")
	if name == "" {
		return "", "", 0, fmt.Errorf("webhook service %q: want namespace/name[:port], the name is empty", s)
	}
	port = 443
	if hasPort {
		n, err := strconv.Atoi(ps)
		if err != nil || n < 1 || n > 65535 {
			return "", "", 0, fmt.Errorf("webhook service %q: bad port", s)
		}
		port = int32(n)
	}
	return ns, name, port, nil
}
