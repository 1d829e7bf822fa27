package epp

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"time"
)

// TLS modes for the ext_proc listener. Gateways that implement GAIE dial
// the picker over TLS without verifying it by default (the reference EPP
// serves a self-signed certificate; Istio needs a DestinationRule with
// insecureSkipVerify, kgateway does not speak plain text), so the picker
// serves a fresh self-signed certificate unless told otherwise.
const (
	TLSSelfSigned = "self-signed"
	TLSFiles      = "files" // Config.TLSCertFile and TLSKeyFile (cert-manager, a mesh CA)
	TLSOff        = "off"   // plain text (a mesh's mTLS, or a gateway configured for it)
)

// tlsConfig builds the listener's TLS configuration; nil for TLSOff.
func (c *Config) tlsConfig() (*tls.Config, error) {
	switch c.TLS {
	case TLSOff:
		return nil, nil
	case TLSFiles:
		r := &certReloader{certFile: c.TLSCertFile, keyFile: c.TLSKeyFile, log: c.Logger}
		if err := r.load(); err != nil {
			return nil, fmt.Errorf("epp tls: %w", err)
		}
		r.checked = time.Now()
		return &tls.Config{GetCertificate: r.get, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
	default:
		cert, err := selfSigned()
		if err != nil {
			return nil, fmt.Errorf("epp tls: %w", err)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
	}
}

// certCheckEvery is how often, at most, the certificate files are read
// again (at a handshake) to see whether they changed.
var certCheckEvery = 5 * time.Second

// certReloader serves the certificate of TLSCertFile and TLSKeyFile and
// picks up a renewed one (cert-manager rewrites the mounted Secret in place;
// GAIE's picker has --enable-cert-reload): at a handshake at most every
// certCheckEvery it reads both files, and when their bytes changed it loads
// the new pair. A pair that does not load (a half-written renewal) is
// logged and the current certificate kept; the next check tries again.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu              sync.Mutex
	cert            *tls.Certificate
	certPEM, keyPEM []byte
	checked         time.Time
}

// load reads both files and, when they differ from the pair in use, parses
// them; the caller holds mu (or owns r).
func (r *certReloader) load() error {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return err
	}
	if r.cert != nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		return nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	r.cert, r.certPEM, r.keyPEM = &cert, certPEM, keyPEM
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certCheckEvery {
		r.checked = now
		old := r.cert
		if err := r.load(); err != nil {
			if r.log != nil {
				r.log.Warn("epp tls: keeping the current certificate", "cert", r.certFile, "key", r.keyFile, "err", err)
			}
		} else if r.cert != old && r.log != nil {
			r.log.Info("epp tls: certificate reloaded", "cert", r.certFile)
		}
	}
	return r.cert, nil
}

// selfSigned makes a P-256 certificate valid for ten years.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"kvmesh"}, CommonName: "kvmesh-epp"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"kvmesh-epp"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
