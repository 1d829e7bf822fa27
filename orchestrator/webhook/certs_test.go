package webhook

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// A Secret the orchestrator made (with ca.key) is renewed with the same CA,
// so the registered bundle does not change; a Secret whose CA cannot sign
// gets a new CA, and the old CA stays in the bundle only while the old
// certificate still served.
func TestIssueKeepsOrCarriesTheCA(t *testing.T) {
	hosts := []string{"kvmesh-orchestrator.kvmesh.svc"}
	s := &SecretSource{Hosts: hosts}
	now := time.Now()
	first, err := s.issue(nil, false, now)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := s.issue(first, true, now.Add(300*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(renewed[KeyCA], first[KeyCA]) || !bytes.Equal(renewed[KeyCAKey], first[KeyCAKey]) {
		t.Error("renewing the serving certificate changed the CA")
	}
	if bytes.Equal(renewed[KeyCert], first[KeyCert]) {
		t.Error("renewal kept the serving certificate")
	}
	c, err := parseCerts(renewed[KeyCert], renewed[KeyKey], renewed[KeyCA])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(hosts, now.Add(300*24*time.Hour)); err != nil {
		t.Errorf("renewed certificate: %v", err)
	}

	ca := newTestCA(t)
	crt, key := ca.issue(t, now.Add(-time.Hour), now.Add(30*24*time.Hour), hosts...)
	foreign := map[string][]byte{KeyCert: crt, KeyKey: key, KeyCA: ca.pem}
	carried, err := s.issue(foreign, true, now)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(carried[KeyCA], ca.pem) || bytes.HasPrefix(carried[KeyCA], ca.pem) {
		t.Error("a new CA's bundle should start with it and carry the old CA")
	}
	dropped, err := s.issue(foreign, false, now)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(dropped[KeyCA], ca.pem) {
		t.Error("the CA of a certificate that did not serve was kept in the bundle")
	}
}

func TestCheck(t *testing.T) {
	now := time.Now()
	ca := newTestCA(t)
	hosts := []string{"a.svc", "127.0.0.1"}
	cases := []struct {
		name     string
		from, to time.Time
		hosts    []string
		bundle   []byte
		err      bool
	}{
		{"valid", now.Add(-time.Hour), now.Add(30 * time.Hour), hosts, ca.pem, false},
		{"missing a host", now.Add(-time.Hour), now.Add(30 * time.Hour), hosts[:1], ca.pem, true},
		{"expired", now.Add(-30 * time.Hour), now.Add(-time.Hour), hosts, ca.pem, true},
		{"other CA", now.Add(-time.Hour), now.Add(30 * time.Hour), hosts, newTestCA(t).pem, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			crt, key := ca.issue(t, tc.from, tc.to, tc.hosts...)
			c, err := parseCerts(crt, key, tc.bundle)
			if err != nil {
				t.Fatal(err)
			}
			renewAt, err := c.Check(hosts, now)
			if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrCertificate)) {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if want := tc.from.Add(tc.to.Sub(tc.from) * 2 / 3); err == nil && !renewAt.Equal(want.Truncate(time.Second)) && renewAt.Sub(want).Abs() > time.Second {
				t.Errorf("renew at %v, want %v", renewAt, want)
			}
		})
	}
	if _, err := parseCerts([]byte("x"), []byte("y"), nil); !errors.Is(err, ErrCertificate) {
		t.Errorf("garbage: %v", err)
	}
}
