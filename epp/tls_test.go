package epp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/ingress"
)

// staticPicker is a picker over one static engine (never contacted).
func staticPicker(t *testing.T, cfg Config) *Server {
	t.Helper()
	icfg := ingress.DefaultConfig()
	icfg.Listen = "127.0.0.1:0"
	icfg.AccessLog = false
	icfg.Engines = []ingress.StaticEngine{{ID: "e1", Model: "m", URL: "http://10.0.0.1:8000"}}
	ing, err := ingress.New(icfg, ingress.Deps{Logger: quiet, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Logger = "127.0.0.1:0", quiet
	cfg.DrainDelay = 0 // Close at once (TestDrainDelay covers the delay)
	s, err := New(cfg, Deps{Ingress: ing})
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
		ing.Close()
	})
	return s
}

// routeOnce asks for one route over conn and returns the destination.
func routeOnce(t *testing.T, conn *grpc.ClientConn) (string, error) {
	t.Helper()
	env := &envoyStandIn{conn: conn, client: extprocv3.NewExternalProcessorClient(conn),
		reqMode: extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, respMode: extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, chunk: 64}
	res, err := env.do(context.Background(), httpRequest{method: "POST", path: "/v1/completions", body: []byte(`{"model":"m","prompt":[1,2,3]}`)}, false)
	if err != nil {
		return "", err
	}
	return res.dest, nil
}

func TestTLS(t *testing.T) {
	skipVerify := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // what GAIE gateways do
	t.Run("self-signed by default", func(t *testing.T) {
		s := staticPicker(t, DefaultConfig())
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(skipVerify))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if dest, err := routeOnce(t, conn); err != nil || dest != "10.0.0.1:8000" {
			t.Fatalf("over TLS: %q %v", dest, err)
		}
		plain, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer plain.Close()
		if _, err := routeOnce(t, plain); err == nil {
			t.Fatal("plain text accepted by a TLS listener")
		}
	})
	t.Run("files", func(t *testing.T) {
		cert, err := selfSigned()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.TLS, cfg.TLSCertFile, cfg.TLSKeyFile = TLSFiles, certFile, keyFile
		s := staticPicker(t, cfg)
		// A client that trusts exactly this certificate verifies it.
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(leaf)
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "kvmesh-epp"})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if dest, err := routeOnce(t, conn); err != nil || dest != "10.0.0.1:8000" {
			t.Fatalf("verified TLS: %q %v", dest, err)
		}
	})
	t.Run("bad config lists every problem", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.TLS = TLSFiles
		cfg.MaxEndpoints = -1
		err := cfg.Validate()
		if err == nil || !containsAll(err.Error(), "--grpc-tls-key", "maxEndpoints") {
			t.Fatalf("%v", err)
		}
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// writePair writes cert's PEM files into dir (tls.crt, tls.key) as a
// mounted Secret holds them, and returns a pool trusting exactly it.
func writePair(t *testing.T, dir string, cert tls.Certificate) *x509.CertPool {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return roots
}

// TestTLSFilesReload: --grpc-tls=files picks up a renewed certificate
// (cert-manager rewrites the mounted Secret; the pod does not restart): a
// new connection gets the new one, and a pair that does not load keeps the
// current one.
func TestTLSFilesReload(t *testing.T) {
	defer func(d time.Duration) { certCheckEvery = d }(certCheckEvery)
	certCheckEvery = 0 // every handshake reads the files: no waiting in the test
	certA, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	certB, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rootsA := writePair(t, dir, certA)
	cfg := DefaultConfig()
	cfg.TLS, cfg.TLSCertFile, cfg.TLSKeyFile = TLSFiles, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	s := staticPicker(t, cfg)
	dial := func(roots *x509.CertPool) error {
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "kvmesh-epp"})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = routeOnce(t, conn)
		return err
	}
	if err := dial(rootsA); err != nil {
		t.Fatalf("certificate A: %v", err)
	}
	rootsB := writePair(t, dir, certB)
	if err := dial(rootsB); err != nil {
		t.Fatalf("renewed certificate B not served: %v", err)
	}
	if err := dial(rootsA); err == nil {
		t.Fatal("the old certificate A is still served after the renewal")
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("half-written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dial(rootsB); err != nil {
		t.Fatalf("a pair that does not load must keep B: %v", err)
	}
}
