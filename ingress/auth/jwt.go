package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	"github.com/kvmesh/kvmesh/internal/monotime"
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

// DefaultTokenCache is JWTConfig.TokenCache's default, and tokenCacheTTL
// how long a verified token is trusted without verifying it again.
const (
	DefaultTokenCache = 10000
	tokenCacheTTL     = 5 * time.Minute
)

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
	// re-read, at most once per MinRefresh). Default 5m and 10s. The reads
	// happen in Run.
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
	// TokenCache bounds the verified tokens remembered (by the SHA-256 of
	// the token), so a client sending the same token again is not verified
	// again. Default DefaultTokenCache; negative: no cache.
	TokenCache int `yaml:"tokenCache"`
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
	if c.TokenCache == 0 {
		c.TokenCache = DefaultTokenCache
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

	validFrom time.Time // the later of nbf and iat; zero: neither
}

// JWTVerifier checks bearer JWTs. Safe for concurrent use. Its checks
// start no goroutine: the key set is re-read by Run, which its owner runs
// (the ingress server, through Chain.Run) and stops; without Run the set
// loaded by NewJWT stays.
//
// Check remembers the tokens it verified (TokenCache of them, each for at
// most 5 minutes), so a token sent again costs a hash and a map look-up,
// not a signature check. A remembered token's exp and nbf are checked at
// each use, and a key set that changes forgets every token.
type JWTVerifier struct {
	cfg  JWTConfig
	algs []jose.SignatureAlgorithm
	now  func() time.Time // time.Now; tests set it

	keys     atomic.Pointer[jose.JSONWebKeySet]
	keysSum  [sha256.Size]byte // of the key set's bytes; owned by load's caller (NewJWT, then Run)
	loadedAt atomic.Int64      // monotime reading of v.now at the last load attempt
	kick     chan struct{}     // an unknown kid asks Run for a re-read (cap 1)

	cache tokenCache

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
	v := &JWTVerifier{cfg: cfg, now: time.Now, limits: map[string]tenantLimits{}, kick: make(chan struct{}, 1),
		cache: tokenCache{max: cfg.TokenCache, m: map[[sha256.Size]byte]cachedToken{}},
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

// load reads the key set. A set whose bytes are those already loaded is
// kept (and the tokens verified against it); another replaces it and
// forgets every remembered token, so a token signed by a key that left the
// set is refused from then on.
func (v *JWTVerifier) load(ctx context.Context) error {
	v.loadedAt.Store(monotime.Of(v.now()))
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
	sum := sha256.Sum256(b)
	if v.keys.Load() != nil && sum == v.keysSum {
		return nil
	}
	ks, err := ParseJWKS(b)
	if err != nil {
		return fmt.Errorf("auth: jwks: %w", err)
	}
	v.keysSum = sum
	v.cache.mu.Lock() // with put's check of the set, no token of the old set stays
	v.keys.Store(ks)
	clear(v.cache.m)
	v.cache.mu.Unlock()
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

// Run re-reads the key set every Refresh, and when a token names a key id
// the set lacks (at most once per MinRefresh), until stop is closed; a read
// in flight is cancelled then. A failed read keeps the old set. The caller
// owns the goroutine; run it once.
func (v *JWTVerifier) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with Run: stop closes or Run's cancel runs
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(v.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			v.reload(ctx)
		case <-v.kick:
			if v.age() >= v.cfg.MinRefresh {
				v.reload(ctx)
			}
		}
	}
}

func (v *JWTVerifier) reload(ctx context.Context) {
	if err := v.load(ctx); err != nil && ctx.Err() == nil {
		v.cfg.Logger.Warn("JWKS refresh failed; keeping the previous key set", "err", err)
	}
}

// age is how long ago the key set was last read (or tried), on the
// monotonic clock: on the wall clock, a step back held the re-read for a
// token naming a new key id for the size of the step.
func (v *JWTVerifier) age() time.Duration {
	return time.Duration(monotime.Of(v.now()) - v.loadedAt.Load())
}

// askRefresh asks Run for a re-read, for a token naming an unknown key id;
// it never blocks.
func (v *JWTVerifier) askRefresh() {
	if v.age() < v.cfg.MinRefresh {
		return
	}
	select {
	case v.kick <- struct{}{}:
	default: // one is pending
	}
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
		v.askRefresh()
		return nil, reject(ErrInvalidToken, "unknown_kid", fmt.Errorf("key id %q not in the key set", tok.Headers[0].KeyID))
	}
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
	for _, t := range []*jwt.NumericDate{std.NotBefore, std.IssuedAt} {
		if t != nil && t.Time().After(c.validFrom) {
			c.validFrom = t.Time()
		}
	}
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
// the error returned says no more than Rejection.Public. A token verified
// before (and still remembered, in its validity window, under the same key
// set) is not verified again; that path does not allocate.
func (v *JWTVerifier) Check(authorization []byte) (string, error) {
	tok, err := bearerToken(authorization)
	if err != nil {
		return "", err
	}
	now := v.now()
	var sum [sha256.Size]byte
	if v.cache.max > 0 {
		sum = sha256.Sum256(tok)
		if c, ok := v.cache.get(sum, now, v.cfg.Leeway); ok {
			v.setLimits(&c)
			return c.Tenant, nil
		}
	}
	ks := v.keys.Load()
	c, err := v.Verify(string(tok), now)
	if err != nil {
		if r, ok := errors.AsType[*Rejection](err); ok {
			v.rejected.WithLabelValues(r.Reason).Inc()
			if v.cfg.Logger.Enabled(context.Background(), slog.LevelDebug) {
				v.cfg.Logger.Debug("bearer token refused", "reason", r.Reason, "detail", r.Detail, "answer", r.Public.Error())
			}
		}
		return "", err
	}
	if v.cache.max > 0 {
		v.cache.put(sum, c, ks, &v.keys, now)
	}
	v.setLimits(c)
	return c.Tenant, nil
}

// tokenCache remembers verified tokens by the SHA-256 of their bytes. It
// holds at most max; when full, an entry past its time is dropped if the
// first few looked at include one, else an arbitrary one (Go's map order):
// a forgotten token is only verified again.
type tokenCache struct {
	max int // <= 0: off
	mu  sync.RWMutex
	m   map[[sha256.Size]byte]cachedToken
}

type cachedToken struct {
	claims Claims
	until  time.Time // verified at + tokenCacheTTL
}

// usable says whether e may stand for a verification at now: within the
// cache's TTL and the token's own exp and nbf/iat (with leeway, as go-jose
// checks them).
func (e *cachedToken) usable(now time.Time, leeway time.Duration) bool {
	return now.Before(e.until) && !now.Add(-leeway).After(e.claims.ExpiresAt) &&
		(e.claims.validFrom.IsZero() || !now.Add(leeway).Before(e.claims.validFrom))
}

// get returns the claims of a remembered token usable at now. One that is
// remembered but not usable is forgotten (Check then verifies the token
// afresh and answers as it would have without the cache).
func (tc *tokenCache) get(sum [sha256.Size]byte, now time.Time, leeway time.Duration) (Claims, bool) {
	tc.mu.RLock()
	e, ok := tc.m[sum]
	tc.mu.RUnlock()
	if !ok {
		return Claims{}, false
	}
	if !e.usable(now, leeway) {
		tc.mu.Lock()
		if cur, ok := tc.m[sum]; ok && cur.until.Equal(e.until) {
			delete(tc.m, sum)
		}
		tc.mu.Unlock()
		return Claims{}, false
	}
	return e.claims, true
}

// put remembers c, verified at now against ks, unless the key set has
// changed since (load swaps the set and clears the map under mu).
func (tc *tokenCache) put(sum [sha256.Size]byte, c *Claims, ks *jose.JSONWebKeySet, cur *atomic.Pointer[jose.JSONWebKeySet], now time.Time) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if cur.Load() != ks {
		return
	}
	if _, known := tc.m[sum]; !known && len(tc.m) >= tc.max {
		tc.evict(now)
	}
	tc.m[sum] = cachedToken{claims: *c, until: now.Add(tokenCacheTTL)}
}

// evict drops one entry: the first past its cache time or its exp among
// the first 8 map order gives, else the first of them.
func (tc *tokenCache) evict(now time.Time) {
	var victim [sha256.Size]byte
	n := 0
	for k, e := range tc.m {
		if n == 0 {
			victim = k
		}
		if !now.Before(e.until) || now.After(e.claims.ExpiresAt) {
			victim = k
			break
		}
		n++
		if n == 8 {
			break
		}
	}
	delete(tc.m, victim)
}

// len is the number of tokens remembered (tests).
func (tc *tokenCache) len() int {
	tc.mu.RLock()
	defer tc.mu.RUnlock()
	return len(tc.m)
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

// Run runs the background work of Keys (*Keys re-reading its file) and of
// Verifier (re-reading its key set), those it has, until stop is closed;
// with neither it returns at once. It returns when both have.
func (c Chain) Run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	if r, ok := c.Keys.(interface{ Run(stop <-chan struct{}) }); ok {
		wg.Go(func() { r.Run(stop) })
	}
	if c.Verifier != nil {
		c.Verifier.Run(stop)
	}
	wg.Wait()
}
