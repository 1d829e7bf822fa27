package epp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
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
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("epp tls: %w", err)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
	default:
		cert, err := selfSigned()
		if err != nil {
			return nil, fmt.Errorf("epp tls: %w", err)
		}
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}, nil
	}
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
