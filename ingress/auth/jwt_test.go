package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type testIssuer struct {
	key  *ecdsa.PrivateKey
	kid  string
	jwks []byte
}

func newIssuer(t testing.TB, kid string) *testIssuer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ks := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"}}}
	b, err := json.Marshal(ks)
	if err != nil {
		t.Fatal(err)
	}
	return &testIssuer{key: k, kid: kid, jwks: b}
}

func (is *testIssuer) sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: is.key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", is.kid))
	if err != nil {
		t.Fatal(err)
	}
	s, err := jwt.Signed(sig).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newVerifier(t testing.TB, jwks []byte) *JWTVerifier {
	t.Helper()
	f := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(f, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := NewJWT(t.Context(), JWTConfig{JWKSFile: f, Audience: "kvmesh", Issuer: "https://issuer.test"})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestJWTVerify(t *testing.T) {
	is := newIssuer(t, "k1")
	other := newIssuer(t, "k1") // same kid, another key: a forged token
	v := newVerifier(t, is.jwks)
	now := time.Now()
	base := func() map[string]any {
		return map[string]any{"iss": "https://issuer.test", "aud": "kvmesh", "sub": "user-1", "tenant": "acme",
			"exp": now.Add(time.Hour).Unix(), "iat": now.Unix(), "rate_limit": map[string]int{"input_tpm": 1000, "output_tpm": 50}}
	}
	with := func(k string, val any) map[string]any { c := base(); c[k] = val; return c }
	without := func(k string) map[string]any { c := base(); delete(c, k); return c }

	tenant, err := v.Check([]byte("Bearer " + is.sign(t, base())))
	if err != nil || tenant != "acme" {
		t.Fatalf("valid token: %q %v", tenant, err)
	}
	if in, out, ok := v.TenantLimits("acme"); !ok || in != 1000 || out != 50 {
		t.Fatalf("tenant limits %d %d %v", in, out, ok)
	}
	if id, err := v.Check([]byte("Bearer " + is.sign(t, without("tenant")))); err != nil || id != "user-1" {
		t.Fatalf("token without tenant: %q %v (want sub)", id, err)
	}
	for name, tc := range map[string]struct {
		tok  string
		want error
	}{
		"expired":        {is.sign(t, with("exp", now.Add(-time.Hour).Unix())), ErrExpiredToken},
		"not yet valid":  {is.sign(t, with("nbf", now.Add(time.Hour).Unix())), ErrNotYetValid},
		"wrong audience": {is.sign(t, with("aud", "someone-else")), ErrWrongAudOrIs},
		"wrong issuer":   {is.sign(t, with("iss", "https://evil.test")), ErrWrongAudOrIs},
		"wrong key":      {other.sign(t, base()), ErrInvalidToken},
		"no exp":         {is.sign(t, without("exp")), ErrInvalidToken},
		"bad rate limit": {is.sign(t, with("rate_limit", "lots")), ErrInvalidToken},
		"garbage":        {"a.b.c", ErrInvalidToken},
		"alg none":       {"eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", ErrInvalidToken},
	} {
		_, err := v.Check([]byte("Bearer " + tc.tok))
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := v.Check(nil); !errors.Is(err, ErrMissingKey) {
		t.Errorf("no header: %v", err)
	}
}

func TestChainAcceptsKeysAndJWTs(t *testing.T) {
	is := newIssuer(t, "k1")
	v := newVerifier(t, is.jwks)
	keys := NewStore([]Entry{{Name: "ops", Key: "sk-ops-0123456789"}})
	c := Chain{Keys: keys, Verifier: v}
	if id, err := c.Check([]byte("Bearer sk-ops-0123456789")); err != nil || id != "ops" {
		t.Fatalf("api key: %q %v", id, err)
	}
	tok := is.sign(t, map[string]any{"aud": "kvmesh", "iss": "https://issuer.test", "tenant": "t1", "exp": time.Now().Add(time.Minute).Unix()})
	if id, err := c.Check([]byte("Bearer " + tok)); err != nil || id != "t1" {
		t.Fatalf("jwt: %q %v", id, err)
	}
	if _, err := (Chain{Verifier: v}).Check([]byte("Bearer sk-ops-0123456789")); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("JWT-only chain accepted an opaque key: %v", err)
	}
	if id, err := (Chain{}).Check(nil); err != nil || id != Anonymous {
		t.Fatalf("open chain: %q %v", id, err)
	}
}

func TestJWTConfigValidate(t *testing.T) {
	c := JWTConfig{Algorithms: []string{"HS256"}}
	err := c.Validate()
	if err == nil || !errors.Is(err, ErrConfig) {
		t.Fatalf("bad config accepted: %v", err)
	}
}

func FuzzParseJWKS(f *testing.F) {
	f.Add([]byte(newIssuer(f, "k").jwks))
	f.Add([]byte(`{"keys":[]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ks, err := ParseJWKS(b)
		if err == nil && len(ks.Keys) == 0 {
			t.Fatal("an empty key set was accepted")
		}
	})
}

func FuzzJWTVerify(f *testing.F) {
	is := newIssuer(f, "k1")
	v := newVerifier(f, is.jwks)
	f.Add(is.sign(f, map[string]any{"aud": "kvmesh", "iss": "https://issuer.test", "sub": "x", "exp": time.Now().Add(time.Hour).Unix()}))
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := v.Verify(tok, time.Now())
		if err == nil && c.Tenant == "" {
			t.Fatal("verified without an identity")
		}
		if err != nil && !errors.Is(err, ErrUnauthorized) {
			t.Fatalf("error %v does not map to 401", err)
		}
	})
}

// A 401 says only which class a token failed in: invalid, expired, not yet
// valid, or audience/issuer. go-jose's texts, the claim names and the key
// id stay out of the message; the reason is counted and the detail logged
// at debug level.
func TestJWTRefusalSaysOnlyTheClass(t *testing.T) {
	is := newIssuer(t, "k1")
	other := newIssuer(t, "k2")
	var logBuf strings.Builder
	f := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(f, is.jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := NewJWT(t.Context(), JWTConfig{JWKSFile: f, Audience: "kvmesh", Issuer: "https://issuer.test",
		Logger: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	base := func() map[string]any {
		return map[string]any{"iss": "https://issuer.test", "aud": "kvmesh", "sub": "user-1", "exp": now.Add(time.Hour).Unix()}
	}
	with := func(k string, val any) map[string]any { c := base(); c[k] = val; return c }
	without := func(k string) map[string]any { c := base(); delete(c, k); return c }
	forged := newIssuer(t, "k1") // the issuer's kid, another key
	hs256 := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
	fixed := map[string]bool{ErrInvalidToken.Error(): true, ErrExpiredToken.Error(): true, ErrNotYetValid.Error(): true, ErrWrongAudOrIs.Error(): true}
	for name, tc := range map[string]struct {
		tok, reason string
		want        error
	}{
		"signature":     {forged.sign(t, base()), "signature", ErrInvalidToken},
		"unknown kid":   {other.sign(t, base()), "unknown_kid", ErrInvalidToken},
		"hs256":         {hs256, "malformed", ErrInvalidToken},
		"bad base64":    {"e30.@@@.e30", "malformed", ErrInvalidToken},
		"tenant number": {is.sign(t, with("tenant", 42)), "bad_claim", ErrInvalidToken},
		"rate limit":    {is.sign(t, with("rate_limit", "lots")), "bad_claim", ErrInvalidToken},
		"no exp":        {is.sign(t, without("exp")), "no_exp", ErrInvalidToken},
		"no identity":   {is.sign(t, without("sub")), "no_identity", ErrInvalidToken},
		"expired":       {is.sign(t, with("exp", now.Add(-time.Hour).Unix())), "expired", ErrExpiredToken},
		"not yet valid": {is.sign(t, with("nbf", now.Add(time.Hour).Unix())), "not_yet_valid", ErrNotYetValid},
		"audience":      {is.sign(t, with("aud", "else")), "audience", ErrWrongAudOrIs},
		"issuer":        {is.sign(t, with("iss", "https://evil.test")), "issuer", ErrWrongAudOrIs},
	} {
		_, err := v.Check([]byte("Bearer " + tc.tok))
		if !errors.Is(err, tc.want) || !fixed[err.Error()] {
			t.Errorf("%s: %q, want exactly %q", name, err, tc.want)
		}
		if r, ok := errors.AsType[*Rejection](err); !ok || r.Reason != tc.reason {
			t.Errorf("%s: reason %+v, want %s", name, r, tc.reason)
		}
		if got := testutil.ToFloat64(v.rejected.WithLabelValues(tc.reason)); got < 1 {
			t.Errorf("%s: %s not counted", name, tc.reason)
		}
	}
	for _, leak := range []string{"go-jose", "kid", "HS256", "tenant claim", "rate_limit", "exp claim", "base64", "illegal"} {
		if strings.Contains(strings.ToLower(ErrInvalidToken.Error()+ErrExpiredToken.Error()+ErrNotYetValid.Error()+ErrWrongAudOrIs.Error()), strings.ToLower(leak)) {
			t.Errorf("a client message names %q", leak)
		}
	}
	if !strings.Contains(logBuf.String(), "error in cryptographic primitive") || !strings.Contains(logBuf.String(), "reason=unknown_kid") {
		t.Errorf("the detail is not in the debug log:\n%s", logBuf.String())
	}
}

// "rate_limit": null is no claim (not a budget of zeros, which reads as
// unlimited), and a tenant's claimed budgets follow its latest token: a
// token without the claim clears what an earlier one set.
func TestJWTTenantLimitsFollowTokens(t *testing.T) {
	is := newIssuer(t, "k1")
	v := newVerifier(t, is.jwks)
	tok := func(rl any) []byte {
		c := map[string]any{"iss": "https://issuer.test", "aud": "kvmesh", "tenant": "sticky", "exp": time.Now().Add(time.Hour).Unix()}
		if rl != nil {
			c["rate_limit"] = rl
		}
		return []byte("Bearer " + is.sign(t, c))
	}
	check := func(name string, b []byte, wantOK bool, wantIn, wantOut int64) {
		t.Helper()
		if _, err := v.Check(b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		in, out, ok := v.TenantLimits("sticky")
		if ok != wantOK || in != wantIn || out != wantOut {
			t.Fatalf("%s: limits %d %d %v, want %d %d %v", name, in, out, ok, wantIn, wantOut, wantOK)
		}
	}
	check("null claim", tok(json.RawMessage("null")), false, 0, 0)
	check("large claim", tok(map[string]int64{"input_tpm": 1 << 40, "output_tpm": 1 << 40}), true, 1<<40, 1<<40)
	check("no claim after a large one", tok(nil), false, 0, 0)
	check("small claim", tok(map[string]int64{"input_tpm": 10, "output_tpm": 5}), true, 10, 5)
	check("null claim after a small one", tok(json.RawMessage("null")), false, 0, 0)

	// Bounded: past maxTenantLimits tenants, a new one replaces another.
	v.mu.Lock()
	for i := range maxTenantLimits {
		v.limits["t"+strconv.Itoa(i)] = tenantLimits{in: 1}
	}
	v.mu.Unlock()
	check("claim with the map full", tok(map[string]int64{"input_tpm": 7}), true, 7, 0)
	if n := len(v.limits); n > maxTenantLimits {
		t.Fatalf("%d tenants remembered, bound %d", n, maxTenantLimits)
	}
}
