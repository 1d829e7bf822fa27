package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
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

// serverTLS is the listener's TLS config, nil for plain HTTP.
func (c *TLSConfig) serverTLS() (*tls.Config, error) {
	if c.CertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls listener: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if c.ClientCAFile != "" {
		pool, err := loadPool(c.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls client ca: %w", err)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// upstreamTLS is the engines' TLS config, nil for the defaults.
func (c *TLSConfig) upstreamTLS() (*tls.Config, error) {
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
		cert, err := tls.LoadX509KeyPair(c.UpstreamCertFile, c.UpstreamKeyFile)
		if err != nil {
			return nil, fmt.Errorf("upstream tls cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
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
