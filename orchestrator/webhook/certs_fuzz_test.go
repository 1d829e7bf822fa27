package webhook

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"testing"
	"time"
)

// fuzzPEM is a CA, a serving certificate it signed and their keys, made
// once for the certificate fuzz targets' seeds.
type fuzzPEM struct{ caCert, caKey, crt, key []byte }

func makeFuzzPEM(f *testing.F, now time.Time) fuzzPEM {
	is, err := newIssuer(now)
	if err != nil {
		f.Fatal(err)
	}
	crt, key, err := is.serving([]string{"kvmesh-webhook.kvmesh-system.svc", "10.0.0.7"}, now)
	if err != nil {
		f.Fatal(err)
	}
	return fuzzPEM{is.certPEM, is.keyPEM, crt, key}
}

// FuzzPEMBundles: the caBundle readers (Secret data and the webhook
// configuration's caBundle, both writable by others in the cluster) take
// exactly the CERTIFICATE blocks, in order; unexpiredPEM keeps a subset of
// them, only CAs valid at now, and is idempotent; mergeBundles keeps its
// own bundle first and lists no certificate twice.
func FuzzPEMBundles(f *testing.F) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	p := makeFuzzPEM(f, now)
	f.Add(p.caCert, p.crt, int64(0))
	f.Add(slices.Concat(p.caCert, p.crt, p.caKey), p.caCert, int64(0))
	f.Add(slices.Concat([]byte("junk\n"), p.caCert, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), p.caCert), []byte{}, int64(1<<40))
	f.Add(p.caCert, p.caCert, int64(-1<<40))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte("-----BEGIN CERTIFICATE-----"), int64(0))
	f.Fuzz(func(t *testing.T, bundle, keep []byte, shift int64) {
		at := now.Add(time.Duration(shift%(1<<50)) * time.Second / (1 << 10))
		var want [][]byte
		for rest := bundle; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if b.Type == "CERTIFICATE" {
				want = append(want, b.Bytes)
			}
		}
		got := pemCerts(bundle)
		if len(got) != len(want) {
			t.Fatalf("pemCerts: %d certificates, want %d", len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("pemCerts[%d] differs", i)
			}
		}
		kept := unexpiredPEM(bundle, at)
		if again := unexpiredPEM(kept, at); !bytes.Equal(again, kept) {
			t.Fatal("unexpiredPEM is not idempotent")
		}
		j := 0
		for _, der := range pemCerts(kept) {
			c, err := x509.ParseCertificate(der)
			if err != nil || !c.IsCA || !at.Before(c.NotAfter) {
				t.Fatalf("unexpiredPEM kept a certificate that is no CA valid at %v (%v)", at, err)
			}
			for j < len(got) && !bytes.Equal(got[j], der) {
				j++
			}
			if j == len(got) {
				t.Fatal("unexpiredPEM kept a certificate not in the bundle, or out of order")
			}
			j++
		}
		merged := mergeBundles(bundle, keep, nil, at)
		if !bytes.HasPrefix(merged, bundle) {
			t.Fatal("mergeBundles does not start with its own bundle")
		}
		seen := map[string]int{}
		for _, der := range got {
			seen[string(der)]++
		}
		for _, der := range pemCerts(merged[len(bundle):]) {
			if seen[string(der)]++; seen[string(der)] > 1 {
				t.Fatal("mergeBundles repeats a certificate")
			}
		}
	})
}

// FuzzParseCerts: the webhook Secret's tls.crt / tls.key / ca.crt and the
// stored CA read as a usable key pair or a clear error: parseCerts wraps
// ErrCertificate and its bundle is ca.crt, else tls.crt; parseIssuer gives
// only a CA not due for renewal at now.
func FuzzParseCerts(f *testing.F) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	p := makeFuzzPEM(f, now)
	f.Add(p.crt, p.key, p.caCert, int64(0))
	f.Add(p.crt, p.key, []byte(" \n"), int64(0))
	f.Add(p.caCert, p.caKey, []byte{}, int64(0))
	f.Add(p.caCert, p.caKey, []byte{}, int64(1<<40))
	f.Add(p.crt, p.caKey, p.caCert, int64(0))
	f.Add(slices.Concat(p.crt, p.caCert), p.key, []byte{}, int64(0))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n"), p.key, []byte{}, int64(0))
	f.Fuzz(func(t *testing.T, crt, key, ca []byte, shift int64) {
		c, err := parseCerts(crt, key, ca)
		if err != nil {
			if c != nil || !errors.Is(err, ErrCertificate) {
				t.Fatalf("error %v with certs %v", err, c)
			}
		} else {
			wantCA := ca
			if len(bytes.TrimSpace(ca)) == 0 {
				wantCA = crt
			}
			if !bytes.Equal(c.CABundle, wantCA) || len(c.Cert.Certificate) == 0 || c.Cert.PrivateKey == nil {
				t.Fatalf("certs %+v", c)
			}
		}
		at := now.Add(time.Duration(shift%(1<<50)) * time.Second / (1 << 10))
		is, err := parseIssuer(crt, key, at)
		if err != nil {
			if is != nil {
				t.Fatal("an issuer with an error")
			}
			return
		}
		if !is.cert.IsCA || !at.Before(renewalTime(is.cert)) || is.key == nil || !bytes.Equal(is.certPEM, crt) || !bytes.Equal(is.keyPEM, key) {
			t.Fatalf("issuer %+v at %v", is.cert, at)
		}
	})
}
