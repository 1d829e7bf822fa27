package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/filewatch"
)

// TLSConfig secures the client listener and, optionally, the connections to
// the engines. Files are PEM. The zero value is plain HTTP both ways.
type TLSConfig struct {
	// CertFile and KeyFile make the client listener (Config.Listen) HTTPS.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ClientCAFile, when set, requires every client to present a certificate
	// signed by it (mutual TLS at the edge).
	ClientCAFile string `yaml:"clientCAFile"`

	// UpstreamCAFile verifies https:// engine URLs (default: system roots).
	UpstreamCAFile string `yaml:"upstreamCAFile"`
	// UpstreamCertFile and UpstreamKeyFile are this ingress's client
	// certificate towards engines that require mutual TLS.
	UpstreamCertFile string `yaml:"upstreamCertFile"`
	UpstreamKeyFile  string `yaml:"upstreamKeyFile"`
}

func (c *TLSConfig) problems(bad func(string, ...any)) {
	if (c.CertFile == "") != (c.KeyFile == "") {
		bad("tls: cert and key files go together")
	}
	if c.ClientCAFile != "" && c.CertFile == "" {
		bad("tls: a client CA needs the listener's cert and key")
	}
	if (c.UpstreamCertFile == "") != (c.UpstreamKeyFile == "") {
		bad("tls: upstream cert and key files go together")
	}
}

// The certificates are re-read when their files change, as the API keys
// file and the routes file are (filewatch: modification time, size and a
// content hash, polled every tlsPollEvery by a goroutine the Server owns),
// so a certificate renewed in a mounted Secret (cert-manager, a mesh CA)
// is served from the next handshake on, without a restart. Handshakes read
// the current pair from an atomic pointer: the listener's through
// GetConfigForClient (the client CA pool goes with it), the engines'
// through GetClientCertificate. A reload that fails (a cert written before
// its key, a file half written) keeps the pair in force, is logged once per
// change of the files and counted; the next change is tried again.

// tlsPollEvery is how often the certificate files are polled.
const tlsPollEvery = 2 * time.Second

// certExpiryWarning is how close to its expiry a certificate loaded is
// warned of.
const certExpiryWarning = 7 * 24 * time.Hour

// tlsMetrics are the certificates' series; every label exists from the
// start.
type tlsMetrics struct {
	expiry     *prometheus.GaugeVec   // cert: server, client
	reloads    *prometheus.CounterVec // cert: server, client_ca, client
	reloadErrs *prometheus.CounterVec // cert
	// handshakeErrs counts the client listener's failed handshakes by
	// reason (tlshandshake.go).
	handshakeErrs *prometheus.CounterVec
}

func newTLSMetrics(reg prometheus.Registerer, constLabels prometheus.Labels) *tlsMetrics {
	m := &tlsMetrics{
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvmesh_ingress_tls_cert_expiry_timestamp_seconds",
			Help: "When the certificate in force expires (Unix time): the client listener's (server) and the ingress's own towards engines (client).", ConstLabels: constLabels}, []string{"cert"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tls_cert_reloads_total",
			Help: "TLS certificate files loaded (at start and on change), by cert (server, client_ca, client).", ConstLabels: constLabels}, []string{"cert"}),
		reloadErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tls_cert_reload_errors_total",
			Help: "TLS certificate file reloads rejected (unreadable, unparsable, key not matching); the previous certificate stays.", ConstLabels: constLabels}, []string{"cert"}),
	}
	m.handshakeErrs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tls_handshake_errors_total",
		Help: "TLS handshakes with clients that failed, by reason (not_tls, client_cert, timeout, closed, protocol); not counted as requests.", ConstLabels: constLabels}, []string{"reason"})
	for _, r := range handshakeReasons {
		m.handshakeErrs.WithLabelValues(r)
	}
	for _, c := range []string{certServer, certClientCA, certClient} {
		m.reloads.WithLabelValues(c)
		m.reloadErrs.WithLabelValues(c)
	}
	reg.MustRegister(m.expiry, m.reloads, m.reloadErrs, m.handshakeErrs)
	return m
}

// The cert label's values.
const (
	certServer   = "server"    // the client listener's certificate
	certClientCA = "client_ca" // the CA client certificates are verified with
	certClient   = "client"    // the ingress's certificate towards engines
)

// watchedFiles is the files one credential is read from, polled together.
type watchedFiles []*filewatch.File

func watchFiles(paths ...string) (watchedFiles, error) {
	var w watchedFiles
	for _, p := range paths {
		f, err := filewatch.New(p)
		if err != nil {
			return nil, err
		}
		w = append(w, f)
	}
	return w, nil
}

// poll is whether any file changed since the last poll; err is a file
// found unreadable (once until it is back).
func (w watchedFiles) poll() (changed bool, err error) {
	var errs []error
	for _, f := range w {
		c, err := f.Poll()
		changed = changed || c
		errs = append(errs, err)
	}
	return changed, errors.Join(errs...)
}

// tlsCerts holds the TLS credentials in force and reloads them. The
// atomic pointers are read by handshakes on any goroutine; the rest is the
// poller's (Run), after newTLSCerts.
type tlsCerts struct {
	cfg *TLSConfig
	log *slog.Logger
	m   *tlsMetrics
	now func() time.Time

	// server is the listener's config (certificate and client CA pool),
	// nil for plain HTTP; client is the ingress's certificate towards
	// engines, nil when it has none.
	server atomic.Pointer[tls.Config]
	client atomic.Pointer[tls.Certificate]

	serverFiles, caFiles, clientFiles watchedFiles
	serverCert                        *tls.Certificate
	clientCAs                         *x509.CertPool
}

// newTLSCerts loads every configured credential (a problem fails here: bad
// configuration fails at start) and warns of a certificate expired, not yet
// valid or expiring within certExpiryWarning.
func newTLSCerts(cfg *TLSConfig, log *slog.Logger, m *tlsMetrics) (*tlsCerts, error) {
	// log is the server's (component=ingress): a second component key
	// made its lines carry the key twice (TestTLSLogKeysUnique).
	t := &tlsCerts{cfg: cfg, log: log, m: m, now: time.Now}
	var err error
	if cfg.CertFile != "" {
		if t.serverFiles, err = watchFiles(cfg.CertFile, cfg.KeyFile); err != nil {
			return nil, fmt.Errorf("tls listener: %w", err)
		}
		if t.serverCert, err = t.loadPair(certServer, cfg.CertFile, cfg.KeyFile); err != nil {
			return nil, fmt.Errorf("tls listener: %w", err)
		}
	}
	if cfg.ClientCAFile != "" {
		if t.caFiles, err = watchFiles(cfg.ClientCAFile); err != nil {
			return nil, fmt.Errorf("tls client ca: %w", err)
		}
		if t.clientCAs, err = t.loadCA(); err != nil {
			return nil, fmt.Errorf("tls client ca: %w", err)
		}
	}
	t.publishServer()
	if cfg.UpstreamCertFile != "" {
		if t.clientFiles, err = watchFiles(cfg.UpstreamCertFile, cfg.UpstreamKeyFile); err != nil {
			return nil, fmt.Errorf("upstream tls cert: %w", err)
		}
		c, err := t.loadPair(certClient, cfg.UpstreamCertFile, cfg.UpstreamKeyFile)
		if err != nil {
			return nil, fmt.Errorf("upstream tls cert: %w", err)
		}
		t.client.Store(c)
	}
	return t, nil
}

// watching reports whether any file is to be polled.
func (t *tlsCerts) watching() bool {
	return len(t.serverFiles)+len(t.caFiles)+len(t.clientFiles) > 0
}

// Run polls the files every tlsPollEvery until stop is closed. The Server
// owns the goroutine.
func (t *tlsCerts) Run(stop <-chan struct{}) {
	tk := time.NewTicker(tlsPollEvery)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
			t.poll()
		}
	}
}

// poll reloads what changed. Run calls it; tests call it directly. Not
// safe to call concurrently.
func (t *tlsCerts) poll() {
	if t.reload(certServer, t.serverFiles, func() error {
		c, err := t.loadPair(certServer, t.cfg.CertFile, t.cfg.KeyFile)
		if err == nil {
			t.serverCert = c
		}
		return err
	}) {
		t.publishServer()
	}
	if t.reload(certClientCA, t.caFiles, func() error {
		pool, err := t.loadCA()
		if err == nil {
			t.clientCAs = pool
		}
		return err
	}) {
		t.publishServer()
	}
	t.reload(certClient, t.clientFiles, func() error {
		c, err := t.loadPair(certClient, t.cfg.UpstreamCertFile, t.cfg.UpstreamKeyFile)
		if err == nil {
			t.client.Store(c)
		}
		return err
	})
}

// reload runs load when files changed, and reports whether it succeeded.
// A failure is logged (once per change) and counted; what is in force
// stays.
func (t *tlsCerts) reload(cert string, files watchedFiles, load func() error) bool {
	changed, err := files.poll()
	if err != nil {
		t.m.reloadErrs.WithLabelValues(cert).Inc()
		t.log.Warn("TLS certificate file unreadable; keeping the certificate in force", "cert", cert, "err", err)
	}
	if !changed {
		return false
	}
	if err := load(); err != nil {
		t.m.reloadErrs.WithLabelValues(cert).Inc()
		t.log.Warn("TLS certificate files changed but cannot be loaded; keeping the certificate in force", "cert", cert, "err", err)
		return false
	}
	return true
}

// loadPair reads a key pair, counts it, sets its expiry gauge and warns
// when it is not valid now or expires soon.
func (t *tlsCerts) loadPair(cert, certFile, keyFile string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	leaf := c.Leaf // parsed by LoadX509KeyPair, unless GODEBUG x509keypairleaf=0
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, err
		}
	}
	t.m.reloads.WithLabelValues(cert).Inc()
	t.m.expiry.WithLabelValues(cert).Set(float64(leaf.NotAfter.Unix()))
	log := t.log.With("cert", cert, "file", certFile, "subject", leaf.Subject.String(), "notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	switch now := t.now(); {
	case now.After(leaf.NotAfter):
		log.Warn("TLS certificate loaded has expired: peers will refuse it")
	case now.Before(leaf.NotBefore):
		log.Warn("TLS certificate loaded is not valid yet: peers will refuse it", "notBefore", leaf.NotBefore.UTC().Format(time.RFC3339))
	case leaf.NotAfter.Sub(now) < certExpiryWarning:
		log.Warn("TLS certificate loaded expires within 7 days; renew it (its files are re-read on change)")
	default:
		log.Info("TLS certificate loaded")
	}
	return &c, nil
}

func (t *tlsCerts) loadCA() (*x509.CertPool, error) {
	pool, err := loadPool(t.cfg.ClientCAFile)
	if err != nil {
		return nil, err
	}
	t.m.reloads.WithLabelValues(certClientCA).Inc()
	return pool, nil
}

// publishServer builds the listener's config from the pair and pool in
// force: handshakes from then on use it.
func (t *tlsCerts) publishServer() {
	if t.serverCert == nil {
		return
	}
	tc := &tls.Config{Certificates: []tls.Certificate{*t.serverCert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if t.clientCAs != nil {
		tc.ClientCAs, tc.ClientAuth = t.clientCAs, tls.RequireAndVerifyClientCert
	}
	t.server.Store(tc)
}

// serverTLS is the listener's TLS config, nil for plain HTTP. Each
// handshake takes the config in force (GetConfigForClient).
func (t *tlsCerts) serverTLS() *tls.Config {
	if t.server.Load() == nil {
		return nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.server.Load(), nil
		},
	}
}

// upstreamTLS is the engines' TLS config, nil for the defaults. The
// ingress's certificate is the one in force at each handshake.
func (t *tlsCerts) upstreamTLS() (*tls.Config, error) {
	c := t.cfg
	if c.UpstreamCAFile == "" && c.UpstreamCertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.UpstreamCAFile != "" {
		pool, err := loadPool(c.UpstreamCAFile)
		if err != nil {
			return nil, fmt.Errorf("upstream tls ca: %w", err)
		}
		tc.RootCAs = pool
	}
	if c.UpstreamCertFile != "" {
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return t.client.Load(), nil
		}
	}
	return tc, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificates", file)
	}
	return pool, nil
}
