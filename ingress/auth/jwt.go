package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
)

// JWT errors; each wraps ErrUnauthorized (401 at the edge). They are all a
// client is told: what else failed (the signature, a claim, the key id, the
// algorithm) goes to the log at debug level and to the rejection counter's
// reason label, never into the answer.
var (
	ErrInvalidToken = fmt.Errorf("%w: invalid bearer token", ErrUnauthorized)
	ErrExpiredToken = fmt.Errorf("%w: bearer token expired", ErrUnauthorized)
	ErrNotYetValid  = fmt.Errorf("%w: bearer token not yet valid", ErrUnauthorized)
	ErrWrongAudOrIs = fmt.Errorf("%w: bearer token for another audience or issuer", ErrUnauthorized)
)

// Rejection is a token Verify refused: its Error is one of the JWT errors
// above, the same for every way a token can fail in that class; Reason (a
// short label) and Detail (go-jose's or the claim's own message) are for
// logs and metrics.
type Rejection struct {
	Public error  // ErrInvalidToken, ErrExpiredToken, ErrNotYetValid or ErrWrongAudOrIs
	Reason string // malformed, unknown_kid, signature, bad_claim, no_exp, expired, not_yet_valid, audience, issuer, no_identity
	Detail error  // nil when Reason says it all
}

func (r *Rejection) Error() string { return r.Public.Error() }
func (r *Rejection) Unwrap() error { return r.Public }

func reject(public error, reason string, detail error) *Rejection {
	return &Rejection{Public: public, Reason: reason, Detail: detail}
}

// rejectReasons are every Rejection.Reason (the counter's label values).
var rejectReasons = []string{"malformed", "unknown_kid", "signature", "bad_claim", "no_exp", "expired", "not_yet_valid", "audience", "issuer", "no_identity"}

// maxTenantLimits bounds the tenants whose claimed budgets are remembered;
// past it one is forgotten for each new one (its next token sets it again).
const maxTenantLimits = 1 << 16

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
	// Logger receives why a token was refused (debug level; never the
	// token). nil: slog.Default().
	Logger *slog.Logger `yaml:"-"`
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
	if c.Logger == nil {
		c.Logger = slog.Default()
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

	mu     sync.Mutex              // guards limits
	limits map[string]tenantLimits // tenant → the budgets its latest verified token claimed

	rejected *prometheus.CounterVec // tokens refused by Check, by Rejection.Reason
}

type tenantLimits struct{ in, out int64 }

// NewJWT loads the key set once (failing start when it cannot be read).
func NewJWT(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &JWTVerifier{cfg: cfg, limits: map[string]tenantLimits{},
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_jwt_rejected_total",
			Help: "Bearer JWTs refused, by reason (the client is told only invalid, expired, not yet valid or audience/issuer)."}, []string{"reason"})}
	for _, r := range rejectReasons {
		v.rejected.WithLabelValues(r)
	}
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

// Verify checks one compact JWS and returns its claims. A refused token's
// error is a *Rejection.
func (v *JWTVerifier) Verify(token string, now time.Time) (*Claims, error) {
	tok, err := jwt.ParseSigned(token, v.algs)
	if err != nil {
		return nil, reject(ErrInvalidToken, "malformed", err)
	}
	ks := v.keys.Load()
	if len(tok.Headers) > 0 && tok.Headers[0].KeyID != "" && len(ks.Key(tok.Headers[0].KeyID)) == 0 {
		v.maybeRefresh(true)
		return nil, reject(ErrInvalidToken, "unknown_kid", fmt.Errorf("key id %q not in the key set", tok.Headers[0].KeyID))
	}
	v.maybeRefresh(false)
	var std jwt.Claims
	var custom map[string]json.RawMessage
	if err := tok.Claims(ks, &std, &custom); err != nil {
		switch {
		case errors.Is(err, jose.ErrJWKSKidNotFound):
			return nil, reject(ErrInvalidToken, "unknown_kid", err)
		case errors.Is(err, jose.ErrCryptoFailure):
			return nil, reject(ErrInvalidToken, "signature", err)
		}
		return nil, reject(ErrInvalidToken, "bad_claim", err)
	}
	if std.Expiry == nil {
		return nil, reject(ErrInvalidToken, "no_exp", nil)
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: v.cfg.Issuer, AnyAudience: jwt.Audience{v.cfg.Audience}, Time: now}, v.cfg.Leeway)
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return nil, reject(ErrExpiredToken, "expired", nil)
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return nil, reject(ErrNotYetValid, "not_yet_valid", err)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return nil, reject(ErrWrongAudOrIs, "audience", nil)
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return nil, reject(ErrWrongAudOrIs, "issuer", nil)
	case err != nil:
		return nil, reject(ErrInvalidToken, "bad_claim", err)
	}
	c := &Claims{Subject: std.Subject, ExpiresAt: std.Expiry.Time()}
	if raw, ok := custom[v.cfg.TenantClaim]; ok {
		if err := json.Unmarshal(raw, &c.Tenant); err != nil {
			return nil, reject(ErrInvalidToken, "bad_claim", fmt.Errorf("%s claim is not a string", v.cfg.TenantClaim))
		}
	}
	if c.Tenant == "" {
		c.Tenant = c.Subject
	}
	if c.Tenant == "" {
		return nil, reject(ErrInvalidToken, "no_identity", fmt.Errorf("no %s or sub claim", v.cfg.TenantClaim))
	}
	// A null claim is no claim, as an absent one: it must not read as a
	// budget of zeros (unlimited).
	if raw, ok := custom[v.cfg.RateLimitClaim]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		var rl struct {
			In  int64 `json:"input_tpm"`
			Out int64 `json:"output_tpm"`
		}
		if err := json.Unmarshal(raw, &rl); err != nil || rl.In < 0 || rl.Out < 0 {
			return nil, reject(ErrInvalidToken, "bad_claim", fmt.Errorf("bad %s claim", v.cfg.RateLimitClaim))
		}
		c.InputTPM, c.OutputTPM, c.HasRateLimit = rl.In, rl.Out, true
	}
	return c, nil
}

// Check verifies "Bearer <jwt>" and returns the tenant as the identity. Each
// verified token sets its tenant's budgets (TenantLimits) to what it claims,
// or clears them when it claims none, so a tenant's budgets follow its
// current tokens. A refused token is logged (debug) and counted by reason;
// the error returned says no more than Rejection.Public.
func (v *JWTVerifier) Check(authorization []byte) (string, error) {
	tok, err := bearerToken(authorization)
	if err != nil {
		return "", err
	}
	c, err := v.Verify(string(tok), time.Now())
	if err != nil {
		if r, ok := errors.AsType[*Rejection](err); ok {
			v.rejected.WithLabelValues(r.Reason).Inc()
			if v.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
				v.cfg.Logger.Debug("bearer token refused", "reason", r.Reason, "detail", r.Detail, "answer", r.Public.Error())
			}
		}
		return "", err
	}
	v.setLimits(c)
	return c.Tenant, nil
}

// setLimits records (or clears) c's tenant's claimed budgets.
func (v *JWTVerifier) setLimits(c *Claims) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !c.HasRateLimit {
		delete(v.limits, c.Tenant)
		return
	}
	if _, known := v.limits[c.Tenant]; !known && len(v.limits) >= maxTenantLimits {
		for t := range v.limits { // forget one (any); its next token sets it again
			delete(v.limits, t)
			break
		}
	}
	v.limits[c.Tenant] = tenantLimits{in: c.InputTPM, out: c.OutputTPM}
}

// TenantLimits returns the budgets the latest verified token of tenant
// carried (tokens per minute; ok false when it carried none).
func (v *JWTVerifier) TenantLimits(tenant string) (inputTPM, outputTPM int64, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	l, ok := v.limits[tenant]
	return l.in, l.out, ok
}

// Collectors are the verifier's metrics (kvmesh_ingress_jwt_rejected_total).
func (v *JWTVerifier) Collectors() []prometheus.Collector {
	return []prometheus.Collector{v.rejected}
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

// KeyChecker is what Chain needs of its API keys: a *Store, or *Keys (a
// Store re-read when its file changes).
type KeyChecker interface {
	Check(authorization []byte) (string, error)
	Enabled() bool
}

// Chain accepts a JWT (when Verifier is set and the credential is one) or
// an API key from Keys. With neither configured every caller is Anonymous.
type Chain struct {
	Keys     KeyChecker // nil: none
	Verifier *JWTVerifier
}

// Check implements the ingress's Authenticator.
func (c Chain) Check(authorization []byte) (string, error) {
	keysOn := c.Keys != nil && c.Keys.Enabled()
	if c.Verifier != nil {
		if tok, err := bearerToken(authorization); err == nil && LooksLikeJWT(tok) {
			return c.Verifier.Check(authorization)
		}
		if !keysOn { // JWT only: an opaque key is never valid
			if _, err := bearerToken(authorization); err != nil {
				return "", err
			}
			return "", ErrInvalidToken
		}
	}
	if c.Keys == nil {
		return Anonymous, nil
	}
	return c.Keys.Check(authorization)
}

// Run runs the background work of Keys, when it has any (*Keys re-reading
// its file), until stop is closed; else it returns at once.
func (c Chain) Run(stop <-chan struct{}) {
	if r, ok := c.Keys.(interface{ Run(stop <-chan struct{}) }); ok {
		r.Run(stop)
	}
}
