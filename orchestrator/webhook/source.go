package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/ingress/filewatch"
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

// certStore holds the certificate the source published last and the one
// the server presents. They differ while a certificate whose CA the
// registered bundle does not hold waits for the registrar to write that CA
// (register.go): the API server then trusts the new certificate from its
// first handshake on. publish, latest, current and getCertificate are safe
// for concurrent use; serve is the registrar's; changed is signalled, never
// blocking and coalesced, after each new certificate published.
type certStore struct {
	latest  atomic.Pointer[Certs] // published by the source
	cur     atomic.Pointer[Certs] // served
	changed chan struct{}         // capacity 1: one pending change stands for any number
	log     *slog.Logger
}

func newCertStore(log *slog.Logger) *certStore {
	return &certStore{changed: make(chan struct{}, 1), log: log}
}

// publish hands c to the registrar, which serves it once the API server
// trusts it (at once when it does already); the same chain and bundle
// again is no change.
func (s *certStore) publish(c *Certs) {
	if c == nil || c.same(s.latest.Load()) {
		return
	}
	s.latest.Store(c)
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// serve presents c from the next TLS handshake on.
func (s *certStore) serve(c *Certs) {
	if c.same(s.cur.Swap(c)) {
		return
	}
	certReloads.Inc()
	certNotAfter.Set(float64(c.NotAfter().Unix()))
	notAfter := c.NotAfter().UTC().Format(time.RFC3339)
	if err := c.verify(c.CABundle, time.Now()); err != nil {
		certValid.Set(0)
		s.log.Error("webhook certificate loaded though it does not verify (nothing usable to serve instead): the API server refuses it and /readyz fails until it is replaced",
			"notAfter", notAfter, "err", err)
		return
	}
	certValid.Set(1)
	s.log.Info("webhook certificate loaded", "notAfter", notAfter)
}

// withCAs is bundle followed by the CAs of old that are unexpired at now and
// not in bundle already: across a CA change the registered bundle trusts
// the certificate served before the change as well as the new one.
func withCAs(bundle, old []byte, now time.Time) []byte {
	have := map[string]bool{}
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		have[string(b.Bytes)] = true
	}
	out := bytes.Clone(bundle)
	for rest := unexpiredPEM(old, now); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		if !have[string(b.Bytes)] {
			have[string(b.Bytes)] = true
			if len(out) > 0 && out[len(out)-1] != '\n' {
				out = append(out, '\n')
			}
			out = append(out, pem.EncodeToMemory(b)...)
		}
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
// again every Interval, and within PollEvery of a change of the files.
// Files that do not verify (expired, not yet valid, not for Hosts, not
// signed by ca.crt: a CA changed before ca.crt was written) never replace a
// certificate that still does: they are logged, counted and read again with
// backoff. They are served only when nothing usable is, and then /readyz
// fails and kvmesh_webhook_certificate_valid is 0.
type DirSource struct {
	Dir string
	// Hosts the certificate must be valid for.
	Hosts []string
	// Interval between reads (default 30 s).
	Interval time.Duration
	// PollEvery is how often the files are looked at (modification time,
	// size, content hash) for a change, read at once when they changed
	// (default 2 s; above Interval it is Interval).
	PollEvery time.Duration
	Log       *slog.Logger
}

// Run implements CertSource.
func (d *DirSource) Run(ctx context.Context, publish func(*Certs)) error {
	every := d.Interval
	if every <= 0 {
		every = 30 * time.Second
	}
	poll := d.PollEvery
	if poll <= 0 {
		poll = 2 * time.Second
	}
	poll = min(poll, every)
	files := make(watchedFiles, 0, 3)
	for _, name := range []string{KeyCert, KeyKey, KeyCA} {
		f, _ := filewatch.New(filepath.Join(d.Dir, name)) // a missing file is a change when it appears
		files = append(files, f)
	}
	log := logger(d.Log)
	fails := 0        // in a row
	var served *Certs // published last
	servedOK := false // served verified when published
	for {
		wait := every
		now := time.Now()
		c, err := LoadCerts(d.Dir)
		switch {
		case err != nil:
			certErrors.Inc()
			wait = min(retryBackoff.Delay(fails), every)
			fails++
			log.Error("webhook certificate: cannot read the certificate directory", "dir", d.Dir, "err", err, "retryIn", wait)
		case c.same(served) && servedOK:
			fails = 0
		default:
			_, cerr := c.Check(d.Hosts, now)
			if cerr == nil {
				fails = 0
				served, servedOK = c, true
				publish(c)
				break
			}
			certErrors.Inc()
			wait = min(retryBackoff.Delay(fails), every)
			fails++
			if served != nil && servedOK {
				if _, err := served.Check(d.Hosts, now); err == nil {
					log.Error("webhook certificate from the directory does not verify; keeping the previous certificate (notAfter "+
						served.NotAfter().UTC().Format(time.RFC3339)+")", "dir", d.Dir, "err", cerr, "retryIn", wait)
					break
				}
			}
			log.Error("webhook certificate from the directory does not verify, and nothing usable is served", "dir", d.Dir, "err", cerr, "retryIn", wait)
			served, servedOK = c, false
			publish(c)
		}
		if !d.sleep(ctx, wait, poll, files) {
			return nil
		}
	}
}

// sleep waits for d, or less when the files change (looked at every
// poll); false when ctx ended.
func (d *DirSource) sleep(ctx context.Context, wait, poll time.Duration, files watchedFiles) bool {
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		if !backoff.Sleep(ctx, min(left, poll)) {
			return false
		}
		if files.changed() {
			return true
		}
	}
}

// watchedFiles are a directory's certificate files, looked at together.
type watchedFiles []*filewatch.File

// changed reports whether any file changed since the last look.
func (w watchedFiles) changed() bool {
	changed := false
	for _, f := range w {
		c, _ := f.Poll()
		changed = changed || c
	}
	return changed
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
