package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/backoff"
)

// CertSource yields the webhook's serving certificate and keeps it current.
type CertSource interface {
	// Run publishes a certificate as soon as it has one and again whenever
	// it changes (rotation, renewal), until ctx ends; then it returns nil.
	// It retries failures it may recover from itself, logging each, and
	// returns an error only for one it cannot. publish never blocks and is
	// called from Run's goroutine only.
	Run(ctx context.Context, publish func(*Certs)) error
}

var (
	_ CertSource = (*SecretSource)(nil)
	_ CertSource = (*DirSource)(nil)
	_ CertSource = (*GeneratedSource)(nil)
)

// certStore holds the certificate the server presents. publish, current and
// getCertificate are safe for concurrent use; changed is signalled, never
// blocking and coalesced, after each new certificate.
type certStore struct {
	cur       atomic.Pointer[Certs]
	changed   chan struct{} // capacity 1: one pending change stands for any number
	first     chan struct{} // closed on the first certificate
	firstOnce sync.Once
	log       *slog.Logger
}

func newCertStore(log *slog.Logger) *certStore {
	return &certStore{changed: make(chan struct{}, 1), first: make(chan struct{}), log: log}
}

// publish serves c from the next TLS handshake on; the same chain and
// bundle again is no change.
func (s *certStore) publish(c *Certs) {
	if c == nil || c.same(s.cur.Load()) {
		return
	}
	s.cur.Store(c)
	certReloads.Inc()
	certNotAfter.Set(float64(c.NotAfter().Unix()))
	s.log.Info("webhook certificate loaded", "notAfter", c.NotAfter().UTC().Format(time.RFC3339))
	s.firstOnce.Do(func() { close(s.first) })
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *certStore) current() *Certs { return s.cur.Load() }

func (s *certStore) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.cur.Load()
	if c == nil {
		return nil, errors.New("webhook: no certificate yet")
	}
	return &c.Cert, nil
}

// retryBackoff is how sources and the registration retry: 1 s doubling to
// 2 min, with 10 % jitter (Delay(n) for the n-th failure in a row, from 0).
var retryBackoff = backoff.Backoff{Min: time.Second, Max: 2 * time.Minute, Jitter: 0.1}

// GeneratedSource makes a CA and a serving certificate in memory at start
// (out of cluster: nothing else needs them) and renews the certificate, with
// the same CA, two thirds into its lifetime.
type GeneratedSource struct {
	// Hosts the certificate is for (IPs or DNS names).
	Hosts []string
	Log   *slog.Logger
}

// Run implements CertSource.
func (g *GeneratedSource) Run(ctx context.Context, publish func(*Certs)) error {
	if len(g.Hosts) == 0 {
		return errors.New("webhook: a generated certificate needs hosts")
	}
	var is *issuer
	var bundle []byte
	for {
		now := time.Now()
		if is == nil || !now.Before(renewalTime(is.cert)) {
			next, err := newIssuer(now)
			if err != nil {
				return err
			}
			is, bundle = next, append(append([]byte{}, next.certPEM...), unexpiredPEM(bundle, now)...)
		}
		crt, key, err := is.serving(g.Hosts, now)
		if err != nil {
			return err
		}
		c, err := parseCerts(crt, key, bundle)
		if err != nil {
			return err
		}
		publish(c)
		renewAt, _ := c.Check(g.Hosts, now)
		if !backoff.Sleep(ctx, time.Until(renewAt)) {
			return nil
		}
	}
}

// DirSource reads tls.crt, tls.key and optionally ca.crt from a directory
// (a mounted Secret, which the kubelet refreshes in place) and reads them
// again every Interval, serving whatever they hold once it parses.
type DirSource struct {
	Dir string
	// Hosts the certificate should be for: a mismatch is logged, not refused
	// (the files are the operator's).
	Hosts []string
	// Interval between reads (default 30 s).
	Interval time.Duration
	Log      *slog.Logger
}

// Run implements CertSource.
func (d *DirSource) Run(ctx context.Context, publish func(*Certs)) error {
	every := d.Interval
	if every <= 0 {
		every = 30 * time.Second
	}
	fails := 0 // in a row
	var last *Certs
	for {
		wait := every
		c, err := LoadCerts(d.Dir)
		switch {
		case err != nil:
			certErrors.Inc()
			wait = min(retryBackoff.Delay(fails), every)
			fails++
			logger(d.Log).Error("webhook certificate: cannot read the certificate directory", "dir", d.Dir, "err", err, "retryIn", wait)
		case !c.same(last):
			fails = 0
			if _, cerr := c.Check(d.Hosts, time.Now()); cerr != nil {
				logger(d.Log).Warn("webhook certificate from the directory does not verify", "dir", d.Dir, "err", cerr)
			}
			last = c
			publish(c)
		}
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
