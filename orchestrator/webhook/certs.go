package webhook

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Lifetimes of generated certificates. A certificate is renewed once two
// thirds of its lifetime have passed (cert-manager's default), so a serving
// certificate is replaced four months before it expires and the CA, which
// stays the same across serving renewals, three years before.
const (
	CALifetime      = 10 * 365 * 24 * time.Hour
	ServingLifetime = 365 * 24 * time.Hour
)

// Keys of a kubernetes.io/tls Secret (tls.crt, tls.key), cert-manager's
// ca.crt, and ca.key, which only a Secret the orchestrator generated holds
// (it renews the serving certificate with the same CA).
const (
	KeyCert  = "tls.crt"
	KeyKey   = "tls.key"
	KeyCA    = "ca.crt"
	KeyCAKey = "ca.key"
)

// ErrCertificate is a key pair or CA bundle that cannot serve the webhook:
// unparsable, expired, not for the webhook's hosts, or not signed by the
// bundle.
var ErrCertificate = errors.New("webhook certificate unusable")

// Certs are the webhook's serving key pair and the CA bundle the API server
// verifies it with.
type Certs struct {
	Cert     tls.Certificate
	CABundle []byte
}

// same reports whether c and o present the same certificate chain and bundle.
func (c *Certs) same(o *Certs) bool {
	if c == nil || o == nil {
		return c == o
	}
	if !bytes.Equal(c.CABundle, o.CABundle) || len(c.Cert.Certificate) != len(o.Cert.Certificate) {
		return false
	}
	for i := range c.Cert.Certificate {
		if !bytes.Equal(c.Cert.Certificate[i], o.Cert.Certificate[i]) {
			return false
		}
	}
	return true
}

// parseCerts builds Certs from PEM: the key pair and the bundle (tls.crt
// itself when there is no CA, a self-signed certificate).
func parseCerts(crt, key, ca []byte) (*Certs, error) {
	cert, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
	}
	if len(bytes.TrimSpace(ca)) == 0 {
		ca = crt
	}
	return &Certs{Cert: cert, CABundle: ca}, nil
}

// LoadCerts reads tls.crt, tls.key and (optionally) ca.crt from dir, the
// layout of a mounted kubernetes.io/tls Secret (cert-manager adds ca.crt).
// Without ca.crt the bundle is tls.crt itself.
func LoadCerts(dir string) (*Certs, error) {
	crt, err := os.ReadFile(filepath.Join(dir, KeyCert))
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(filepath.Join(dir, KeyKey))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(dir, KeyCA))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return parseCerts(crt, key, ca)
}

// Check verifies that c serves every host (DNS names or IPs) at now with a
// chain the bundle trusts, and returns when it should be renewed (two thirds
// into the serving certificate's lifetime).
func (c *Certs) Check(hosts []string, now time.Time) (renewAt time.Time, err error) {
	leaf, err := c.verifyChain(c.CABundle, hosts, now)
	if err != nil {
		return time.Time{}, err
	}
	return renewalTime(leaf), nil
}

// verify checks that bundle trusts c's chain at now for a server (whatever
// the host name: a source checks those). It is the served certificate's
// verdict for /readyz and kvmesh_webhook_certificate_valid, and tells the
// registrar whether a registered bundle already trusts a new certificate.
func (c *Certs) verify(bundle []byte, now time.Time) error {
	_, err := c.verifyChain(bundle, nil, now)
	return err
}

// verifyChain checks that bundle trusts c's chain at now for a server, for
// every host (none: any host name), and returns the leaf.
func (c *Certs) verifyChain(bundle []byte, hosts []string, now time.Time) (*x509.Certificate, error) {
	if len(c.Cert.Certificate) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrCertificate)
	}
	leaf, err := x509.ParseCertificate(c.Cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return nil, fmt.Errorf("%w: the CA bundle holds no certificate", ErrCertificate)
	}
	inter := x509.NewCertPool()
	for _, der := range c.Cert.Certificate[1:] {
		if ic, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(ic)
		}
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if len(hosts) == 0 {
		if _, err := leaf.Verify(opts); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCertificate, err)
		}
	}
	for _, h := range hosts {
		opts.DNSName = h
		if _, err := leaf.Verify(opts); err != nil {
			return nil, fmt.Errorf("%w: for %s: %w", ErrCertificate, h, err)
		}
	}
	return leaf, nil
}

func renewalTime(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// NotAfter is the serving certificate's expiry (zero when unparsable).
func (c *Certs) NotAfter() time.Time {
	if len(c.Cert.Certificate) == 0 {
		return time.Time{}
	}
	leaf, err := x509.ParseCertificate(c.Cert.Certificate[0])
	if err != nil {
		return time.Time{}
	}
	return leaf.NotAfter
}

// issuer is a CA that signs serving certificates.
type issuer struct {
	cert            *x509.Certificate
	key             crypto.Signer
	certPEM, keyPEM []byte
}

// newIssuer makes a self-signed CA valid for CALifetime from now.
func newIssuer(now time.Time) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "kvmesh-webhook-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(CALifetime),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der), keyPEM: pemBlock("EC PRIVATE KEY", kb)}, nil
}

// parseIssuer reads a CA the orchestrator generated earlier; it must be a
// CA, unexpired at now and not yet due for renewal.
func parseIssuer(certPEM, keyPEM []byte, now time.Time) (*issuer, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("not a CA")
	}
	if !now.Before(renewalTime(cert)) {
		return nil, errors.New("CA due for renewal")
	}
	return &issuer{cert: cert, key: signer, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// serving issues a certificate for the hosts (IPs or DNS names), valid for
// ServingLifetime from now, and returns it and its key in PEM.
func (is *issuer) serving(hosts []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "kvmesh-webhook"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(ServingLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(is.cert.NotAfter) {
		tmpl.NotAfter = is.cert.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, key.Public(), is.key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kb), nil
}

// GenerateCerts makes a CA and a serving certificate for the hosts (IPs or
// DNS names), valid for ServingLifetime.
func GenerateCerts(hosts ...string) (*Certs, error) {
	now := time.Now()
	is, err := newIssuer(now)
	if err != nil {
		return nil, err
	}
	crt, key, err := is.serving(hosts, now)
	if err != nil {
		return nil, err
	}
	return parseCerts(crt, key, is.certPEM)
}

// unexpiredPEM keeps the certificates of a PEM bundle that are still valid
// at now: a new CA's bundle carries the old CA along, so replicas still
// serving a certificate of the old one stay trusted until they switch.
func unexpiredPEM(bundle []byte, now time.Time) []byte {
	var out []byte
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return out
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err == nil && c.IsCA && now.Before(c.NotAfter) {
			out = append(out, pem.EncodeToMemory(b)...)
		}
	}
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
