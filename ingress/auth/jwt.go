package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// JWT errors; each wraps ErrUnauthorized (401 at the edge).
var (
	ErrInvalidToken = fmt.Errorf("%w: invalid bearer token", ErrUnauthorized)
	ErrExpiredToken = fmt.Errorf("%w: bearer token expired or not yet valid", ErrUnauthorized)
	ErrWrongAudOrIs = fmt.Errorf("%w: bearer token for another audience or issuer", ErrUnauthorized)
)

// JWTConfig verifies bearer JWTs against a JSON Web Key Set. go-jose does
// the JOSE work (signature, algorithms, key ids); this file adds only the
// kvmesh claims and the key set's loading.
type JWTConfig struct {
	// JWKSFile or JWKSURL holds the issuer's public keys (one of the two).
	JWKSFile string `yaml:"jwksFile"`
	JWKSURL  string `yaml:"jwksURL"`
	// Refresh is how often the key set is re-read (a new kid also triggers a
	// re-read, at most once per MinRefresh). Default 5m and 10s.
	Refresh    time.Duration `yaml:"refresh"`
	MinRefresh time.Duration `yaml:"minRefresh"`
	// Audience must be in the token's aud. Required.
	Audience string `yaml:"audience"`
	// Issuer, when set, must equal the token's iss.
	Issuer string `yaml:"issuer"`
	// Algorithms accepted. Default RS256, ES256, EdDSA (never "none", never HMAC:
	// a public key set cannot verify a shared secret).
	Algorithms []string `yaml:"algorithms"`
	// Leeway for exp/nbf/iat clock skew. Default 30s.
	Leeway time.Duration `yaml:"leeway"`
	// TenantClaim names the caller's tenant; it becomes the identity the
	// rate limiter and the access log use. Default "tenant" (then "sub").
	TenantClaim string `yaml:"tenantClaim"`
	// RateLimitClaim holds the tenant's token budgets, an object
	// {"input_tpm": N, "output_tpm": N}. Default "rate_limit".
	RateLimitClaim string `yaml:"rateLimitClaim"`
	// HTTPClient fetches JWKSURL; nil: a client with a 10s timeout.
	HTTPClient *http.Client `yaml:"-"`
}

func (c *JWTConfig) defaults() {
	if c.Refresh == 0 {
		c.Refresh = 5 * time.Minute
	}
	if c.MinRefresh == 0 {
		c.MinRefresh = 10 * time.Second
	}
	if len(c.Algorithms) == 0 {
		c.Algorithms = []string{string(jose.RS256), string(jose.ES256), string(jose.EdDSA)}
	}
	if c.Leeway == 0 {
		c.Leeway = 30 * time.Second
	}
	if c.TenantClaim == "" {
		c.TenantClaim = "tenant"
	}
	if c.RateLimitClaim == "" {
		c.RateLimitClaim = "rate_limit"
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
}

// Validate lists every problem.
func (c *JWTConfig) Validate() error {
	var errs []error
	add := func(f string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: jwt: "+f, append([]any{ErrConfig}, a...)...))
	}
	if (c.JWKSFile == "") == (c.JWKSURL == "") {
		add("give exactly one of a JWKS file and a JWKS URL")
	}
	if c.Audience == "" {
		add("an audience is required (a token minted for another service must not pass)")
	}
	for _, a := range c.Algorithms {
		if strings.HasPrefix(a, "HS") || strings.EqualFold(a, "none") {
			add("algorithm %q cannot be verified with a public key set", a)
		}
	}
	if c.Refresh < 0 || c.MinRefresh < 0 || c.Leeway < 0 {
		add("durations must not be negative")
	}
	return errors.Join(errs...)
}

// Claims are what a verified token says about its caller.
type Claims struct {
	Tenant       string
	InputTPM     int64 // 0: no budget in the token
	OutputTPM    int64
	Subject      string
	ExpiresAt    time.Time
	HasRateLimit bool
}

// JWTVerifier checks bearer JWTs. Safe for concurrent use; it starts no
// goroutine that outlives a refresh (one bounded fetch at a time).
type JWTVerifier struct {
	cfg  JWTConfig
	algs []jose.SignatureAlgorithm

	keys       atomic.Pointer[jose.JSONWebKeySet]
	loadedAt   atomic.Int64 // unix nanos of the last load attempt
	refreshing atomic.Bool

	mu     sync.Mutex         // guards limits
	limits map[string]*Claims // tenant → the latest token's budgets
}

// NewJWT loads the key set once (failing start when it cannot be read).
func NewJWT(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &JWTVerifier{cfg: cfg, limits: map[string]*Claims{}}
	for _, a := range cfg.Algorithms {
		v.algs = append(v.algs, jose.SignatureAlgorithm(a))
	}
	if err := v.load(ctx); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *JWTVerifier) load(ctx context.Context) error {
	v.loadedAt.Store(time.Now().UnixNano())
	var b []byte
	var err error
	if v.cfg.JWKSFile != "" {
		b, err = os.ReadFile(v.cfg.JWKSFile)
	} else {
		b, err = v.fetch(ctx)
	}
	if err != nil {
		return fmt.Errorf("auth: jwks: %w", err)
	}
	ks, err := ParseJWKS(b)
	if err != nil {
		return fmt.Errorf("auth: jwks: %w", err)
	}
	v.keys.Store(ks)
	return nil
}

func (v *JWTVerifier) fetch(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.cfg.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET jwks: status %d", resp.StatusCode)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// ParseJWKS decodes a JSON Web Key Set, keeping public signing keys only.
func ParseJWKS(b []byte) (*jose.JSONWebKeySet, error) {
	var raw jose.JSONWebKeySet
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("decode key set: %w", err)
	}
	out := &jose.JSONWebKeySet{}
	for _, k := range raw.Keys {
		if !k.Valid() || !k.IsPublic() || (k.Use != "" && k.Use != "sig") {
			continue
		}
		out.Keys = append(out.Keys, k)
	}
	if len(out.Keys) == 0 {
		return nil, errors.New("no public signing key in the set")
	}
	return out, nil
}

// maybeRefresh re-reads the key set in the background when it is older
// than Refresh (or, for an unknown kid, MinRefresh); one refresh at a time.
func (v *JWTVerifier) maybeRefresh(unknownKid bool) {
	age := time.Duration(time.Now().UnixNano() - v.loadedAt.Load())
	if age < v.cfg.Refresh && (!unknownKid || age < v.cfg.MinRefresh) {
		return
	}
	if !v.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() { // bounded by the HTTP client's timeout; ends by itself
		defer v.refreshing.Store(false)
		_ = v.load(context.Background()) // keep the old set on failure
	}()
}

// LooksLikeJWT says whether a bearer credential has the JWS compact shape.
func LooksLikeJWT(tok []byte) bool { return bytes.Count(tok, []byte{'.'}) == 2 }

// Verify checks one compact JWS and returns its claims.
func (v *JWTVerifier) Verify(token string, now time.Time) (*Claims, error) {
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	ks := v.keys.Load()
	if len(tok.Headers) > 0 && tok.Headers[0].KeyID != "" && len(ks.Key(tok.Headers[0].KeyID)) == 0 {
		v.maybeRefresh(true)
		return nil, fmt.Errorf("%w: unknown key id", ErrInvalidToken)
	}
	v.maybeRefresh(false)
	var std jwt.Claims
	var custom map[string]json.RawMessage
	if err := tok.Claims(ks, &std, &custom); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if std.Expiry == nil {
		return nil, fmt.Errorf("%w: no exp claim", ErrInvalidToken)
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: v.cfg.Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: now}, v.cfg.Leeway)
	switch {
	case errors.Is(err, jwt.ErrExpired), errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return nil, ErrExpiredToken
	case errors.Is(err, jwt.ErrInvalidAudience), errors.Is(err, jwt.ErrInvalidIssuer):
		return nil, ErrWrongAudOrIs
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	c := &Claims{Subject: std.Subject, ExpiresAt: std.Expiry.Time()}
	if raw, ok := custom[v.cfg.TenantClaim]; ok {
		if err := json.Unmarshal(raw, &c.Tenant); err != nil {
			return nil, fmt.Errorf("%w: %s claim is not a string", ErrInvalidToken, v.cfg.TenantClaim)
		}
	}
	if c.Tenant == "" {
		c.Tenant = c.Subject
	}
	if c.Tenant == "" {
		return nil, fmt.Errorf("%w: no %s or sub claim", ErrInvalidToken, v.cfg.TenantClaim)
	}
	if raw, ok := custom[v.cfg.RateLimitClaim]; ok {
		var rl struct {
			In  int64 `json:"input_tpm"`
			Out int64 `json:"output_tpm"`
		}
		if err := json.Unmarshal(raw, &rl); err != nil || rl.In < 0 || rl.Out < 0 {
			return nil, fmt.Errorf("%w: bad %s claim", ErrInvalidToken, v.cfg.RateLimitClaim)
		}
		c.InputTPM, c.OutputTPM, c.HasRateLimit = rl.In, rl.Out, true
	}
	return c, nil
}

// Check verifies "Bearer <jwt>" and returns the tenant as the identity,
// remembering the token's budgets for TenantLimits.
func (v *JWTVerifier) Check(authorization []byte) (string, error) {
	tok, err := bearerToken(authorization)
	if err != nil {
		return "", err
	}
	c, err := v.Verify(string(tok), time.Now())
	if err != nil {
		return "", err
	}
	if c.HasRateLimit {
		v.mu.Lock()
		v.limits[c.Tenant] = c
		v.mu.Unlock()
	}
	return c.Tenant, nil
}

// TenantLimits returns the budgets the latest verified token of tenant
// carried (tokens per minute; ok false when none did).
func (v *JWTVerifier) TenantLimits(tenant string) (inputTPM, outputTPM int64, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	c := v.limits[tenant]
	if c == nil {
		return 0, 0, false
	}
	return c.InputTPM, c.OutputTPM, true
}

func bearerToken(authorization []byte) ([]byte, error) {
	h := bytes.TrimSpace(authorization)
	if len(h) < len(bearer) || !bytes.EqualFold(h[:len(bearer)], bearer) {
		return nil, ErrMissingKey
	}
	tok := bytes.TrimSpace(h[len(bearer):])
	if len(tok) == 0 {
		return nil, ErrMissingKey
	}
	return tok, nil
}

// Chain accepts a JWT (when Verifier is set and the credential is one) or
// an API key from Keys. With neither configured every caller is Anonymous.
type Chain struct {
	Keys     *Store
	Verifier *JWTVerifier
}

// Check implements the ingress's Authenticator.
func (c Chain) Check(authorization []byte) (string, error) {
	if c.Verifier != nil {
		if tok, err := bearerToken(authorization); err == nil && LooksLikeJWT(tok) {
			return c.Verifier.Check(authorization)
		}
		if !c.Keys.Enabled() { // JWT only: an opaque key is never valid
			if _, err := bearerToken(authorization); err != nil {
				return "", err
			}
			return "", ErrInvalidToken
		}
	}
	return c.Keys.Check(authorization)
}
