package openai

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// TestTLSAndJWTWithOpenAIClient: the official client reaches the ingress
// over HTTPS and authenticates with JWTs checked against a JWKS; a valid
// token is served, an expired one, one signed by another key and one for
// another audience get 401 in the OpenAI error shape, whose message says
// only the class of the failure (docs/SECURITY.md): none of go-jose's
// texts, key ids or claim names.
func TestTLSAndJWTWithOpenAIClient(t *testing.T) {
	node, dir := installClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	caPEM, certFile, keyFile := testutil.ServerCert(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	issuer, other := newKey(t), newKey(t)
	jwks, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &issuer.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	jwksFile := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(jwksFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := auth.NewJWT(ctx, auth.JWTConfig{JWKSFile: jwksFile, Audience: "kvmesh-e2e"})
	if err != nil {
		t.Fatal(err)
	}

	const model = "e2e-model"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine, err := sim.Start(ctx, sim.Config{Model: model, TimeScale: 200, Seed: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	cfg := ingress.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TLS.CertFile, cfg.TLS.KeyFile = certFile, keyFile
	cfg.Engines = []ingress.StaticEngine{{ID: "sim", Model: model, URL: engine.URL()}}
	srv, err := ingress.New(cfg, ingress.Deps{Logger: quiet, AccessLog: quiet, Auth: auth.Chain{Verifier: v}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	now := time.Now()
	claims := func(aud string, exp time.Time) map[string]any {
		return map[string]any{"aud": aud, "sub": "user", "tenant": "acme", "exp": exp.Unix(), "iat": now.Unix()}
	}
	badTenant := claims("kvmesh-e2e", now.Add(time.Hour))
	badTenant["tenant"] = 42
	tokens := map[string]string{
		"valid":          sign(t, issuer, claims("kvmesh-e2e", now.Add(time.Hour))),
		"expired":        sign(t, issuer, claims("kvmesh-e2e", now.Add(-time.Hour))),
		"wrong_key":      sign(t, other, claims("kvmesh-e2e", now.Add(time.Hour))),
		"wrong_audience": sign(t, issuer, claims("another-service", now.Add(time.Hour))),
		"unknown_kid":    signKid(t, other, "k9", claims("kvmesh-e2e", now.Add(time.Hour))),
		"bad_tenant":     sign(t, issuer, badTenant),
		"hs256":          "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",
	}
	tj, _ := json.Marshal(tokens)
	run := exec.CommandContext(ctx, node, "security.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "KVMESH_BASE_URL=https://"+srv.Addr()+"/v1", "KVMESH_MODEL="+model,
		"KVMESH_TOKENS="+string(tj), "NODE_EXTRA_CA_CERTS="+caFile)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node security.mjs: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), out)
	}
	var res map[string]struct {
		OK     bool   `json:"ok"`
		Status int    `json:"status"`
		Type   string `json:"type"`
		Msg    string `json:"message"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if r := res["valid"]; !r.OK {
		t.Errorf("valid token over TLS: %+v", r)
	}
	for name, want := range map[string]string{"expired": "bearer token expired", "wrong_key": "invalid bearer token",
		"wrong_audience": "bearer token for another audience or issuer", "unknown_kid": "invalid bearer token",
		"bad_tenant": "invalid bearer token", "hs256": "invalid bearer token"} {
		r := res[name]
		if r.OK || r.Status != 401 || r.Type == "" {
			t.Errorf("%s: %+v, want a 401 OpenAI error", name, r)
		}
		if !strings.HasSuffix(r.Msg, want) {
			t.Errorf("%s: message %q, want only %q", name, r.Msg, want)
		}
	}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sign(t *testing.T, k *ecdsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	return signKid(t, k, "k1", claims)
}

func signKid(t *testing.T, k *ecdsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	s, err := jwt.Signed(sig).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
