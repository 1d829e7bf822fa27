package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA signs the certificates of TLS tests, made in memory.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate (tls.Config.RootCAs or ClientCAs as a file).
	PEM []byte
}

// serial numbers the certificates of a test binary: a CA's leaves must not
// share one.
var serial atomic.Int64

func nextSerial() *big.Int { return big.NewInt(serial.Add(1)) }

// NewCA makes a CA valid from an hour ago for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "kvmesh test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf is a certificate for 127.0.0.1 named cn, valid from notBefore to
// notAfter, for servers and clients alike, as PEM certificate and key.
func (ca *CA) Leaf(t testing.TB, cn string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// ValidLeaf is Leaf valid from an hour ago for a day.
func (ca *CA) ValidLeaf(t testing.TB, cn string) (certPEM, keyPEM []byte) {
	return ca.Leaf(t, cn, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
}

// ValidPair is ValidLeaf as a tls.Certificate.
func (ca *CA) ValidPair(t testing.TB, cn string) tls.Certificate {
	crt, key := ca.ValidLeaf(t, cn)
	return Pair(t, crt, key)
}

// Pool is a certificate pool holding ca.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Pair is a PEM certificate and key as a tls.Certificate.
func Pair(t testing.TB, certPEM, keyPEM []byte) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WriteFile writes b to name in dir and returns its path.
func WriteFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ServerCert makes a CA and a certificate for 127.0.0.1 signed by it, and
// writes the certificate and its key as PEM files in dir; caPEM verifies
// it (tls.Config.RootCAs).
func ServerCert(t testing.TB, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	ca := NewCA(t)
	crt, key := ca.ValidLeaf(t, "127.0.0.1")
	return ca.PEM, WriteFile(t, dir, "cert.pem", crt), WriteFile(t, dir, "key.pem", key)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
