package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// RunConfig is how the orchestrator serves and registers the webhook.
type RunConfig struct {
	// Listen is the HTTPS address (e.g. 0.0.0.0:9443, or 127.0.0.1:0 out of cluster).
	Listen string
	// CertDir holds tls.crt/tls.key[/ca.crt] (a mounted Secret); empty
	// generates a CA and a certificate for Hosts at start.
	CertDir string
	// Hosts the generated certificate is valid for.
	Hosts []string
	// URLHost, when set, registers https://URLHost:<bound port>/mutate-pods
	// (out of cluster); otherwise the Service in Target is registered.
	URLHost string
	Target  Target
	Sidecar SidecarConfig
	Logger  *slog.Logger
	// Ready, if set, receives the registered URL or service once the
	// configuration is in place.
	Ready func(where string)
}

// Run serves the webhook and keeps it registered until ctx ends.
func Run(ctx context.Context, kube kubernetes.Interface, cfg RunConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var certs *Certs
	var err error
	if cfg.CertDir != "" {
		certs, err = LoadCerts(cfg.CertDir)
	} else {
		hosts := cfg.Hosts
		if len(hosts) == 0 && cfg.URLHost != "" {
			hosts = []string{cfg.URLHost}
		}
		if len(hosts) == 0 {
			return errors.New("webhook: a generated certificate needs hosts")
		}
		certs, err = GenerateCerts(hosts...)
	}
	if err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	srv, err := Listen(cfg.Listen, certs.Cert, &Handler{Sidecar: cfg.Sidecar, Log: cfg.Logger})
	if err != nil {
		return fmt.Errorf("webhook listen: %w", err)
	}
	t := cfg.Target
	where := t.ServiceNamespace + "/" + t.Service
	if cfg.URLHost != "" {
		_, p, _ := net.SplitHostPort(srv.Addr())
		t.URL = "https://" + net.JoinHostPort(cfg.URLHost, p) + Path
		where = t.URL
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx) }()
	if err := Ensure(ctx, kube, t, certs.CABundle); err != nil {
		<-errc
		return err
	}
	cfg.Logger.Info("sidecar webhook registered", "at", where, "listen", srv.Addr())
	if cfg.Ready != nil {
		cfg.Ready(where)
	}
	return <-errc
}

// ParseService reads "namespace/name[:port]" (port default 443).
func ParseService(s string) (ns, name string, port int32, err error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" {
		return "", "", 0, fmt.Errorf("webhook service %q: want namespace/name[:port]", s)
	}
	name, ps, hasPort := strings.Cut(rest, ":")
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
