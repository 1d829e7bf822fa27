package auth

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// keySet is the JWKS of issuers' public keys.
func keySet(t testing.TB, issuers ...*testIssuer) []byte {
	t.Helper()
	var ks jose.JSONWebKeySet
	for _, is := range issuers {
		ks.Keys = append(ks.Keys, jose.JSONWebKey{Key: &is.key.PublicKey, KeyID: is.kid, Algorithm: string(jose.ES256), Use: "sig"})
	}
	b, err := json.Marshal(ks)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fileVerifier is a verifier of the key set in a file the test may rewrite,
// with a clock the test sets.
func fileVerifier(t testing.TB, jwks []byte, cfg JWTConfig) (*JWTVerifier, string, *atomic.Pointer[time.Time]) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(f, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.JWKSFile, cfg.Audience, cfg.Issuer = f, "kvmesh", "https://issuer.test"
	v, err := NewJWT(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	v.now = func() time.Time { return *clock.Load() }
	return v, f, &clock
}

func claimsAt(now time.Time, tenant string, exp time.Duration) map[string]any {
	return map[string]any{"iss": "https://issuer.test", "aud": "kvmesh", "tenant": tenant,
		"exp": now.Add(exp).Unix(), "iat": now.Unix(), "rate_limit": map[string]int{"input_tpm": 100, "output_tpm": 10}}
}

// A token verified once is remembered: sent again it gives the same
// tenant and budgets without a signature check (and without allocating).
func TestJWTCacheRemembersVerifiedTokens(t *testing.T) {
	is := newIssuer(t, "k1")
	v, _, clock := fileVerifier(t, is.jwks, JWTConfig{})
	hdr := []byte("Bearer " + is.sign(t, claimsAt(*clock.Load(), "acme", time.Hour)))
	if id, err := v.Check(hdr); err != nil || id != "acme" {
		t.Fatalf("first check: %q %v", id, err)
	}
	if n := v.cache.len(); n != 1 {
		t.Fatalf("%d tokens remembered, want 1", n)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if id, err := v.Check(hdr); err != nil || id != "acme" {
			t.Fatalf("cached check: %q %v", id, err)
		}
	})
	if allocs != 0 {
		t.Errorf("a remembered token costs %.0f allocations, want 0", allocs)
	}
	if in, out, ok := v.TenantLimits("acme"); !ok || in != 100 || out != 10 {
		t.Errorf("tenant limits from a remembered token: %d %d %v", in, out, ok)
	}
	// No cache: every check verifies.
	off, _, _ := fileVerifier(t, is.jwks, JWTConfig{TokenCache: -1})
	if id, err := off.Check(hdr); err != nil || id != "acme" || off.cache.len() != 0 {
		t.Fatalf("without a cache: %q %v, %d remembered", id, err, off.cache.len())
	}
}

// A remembered token's exp and nbf still hold at each use: past exp (and
// the leeway) it is refused as expired, before its nbf as not yet valid;
// past the cache's TTL it is verified again.
func TestJWTCacheEnforcesTimesAtUse(t *testing.T) {
	is := newIssuer(t, "k1")
	v, _, clock := fileVerifier(t, is.jwks, JWTConfig{Leeway: time.Second})
	t0 := *clock.Load()
	set := func(d time.Duration) { t := t0.Add(d); clock.Store(&t) }
	c := claimsAt(t0, "acme", time.Minute)
	c["nbf"] = t0.Unix()
	hdr := []byte("Bearer " + is.sign(t, c))
	if _, err := v.Check(hdr); err != nil {
		t.Fatal(err)
	}
	set(time.Minute + 2*time.Second)
	if _, err := v.Check(hdr); !errors.Is(err, ErrExpiredToken) {
		t.Fatalf("a remembered token past its exp: %v, want %v", err, ErrExpiredToken)
	}
	if v.cache.len() != 0 {
		t.Fatalf("an expired token is still remembered")
	}

	set(0)
	if _, err := v.Check(hdr); err != nil {
		t.Fatal(err)
	}
	set(-time.Minute) // the clock stepped back before nbf
	if _, err := v.Check(hdr); !errors.Is(err, ErrNotYetValid) {
		t.Fatalf("a remembered token before its nbf: %v, want %v", err, ErrNotYetValid)
	}

	long := []byte("Bearer " + is.sign(t, claimsAt(t0, "acme", time.Hour)))
	set(0)
	if _, err := v.Check(long); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(long[len("Bearer "):])
	first := v.cache.m[sum].until
	set(tokenCacheTTL + time.Second)
	if _, err := v.Check(long); err != nil {
		t.Fatal(err)
	}
	if again := v.cache.m[sum].until; !again.After(first) {
		t.Fatalf("a token remembered past the cache TTL was not verified again (until %v, then %v)", first, again)
	}
}

// A token signed by a key that leaves the key set is refused once the set
// is re-read, though it was remembered; an unchanged set keeps what is
// remembered.
func TestJWTCacheForgetsOnKeySetChange(t *testing.T) {
	k1, k2 := newIssuer(t, "k1"), newIssuer(t, "k2")
	v, f, clock := fileVerifier(t, keySet(t, k1, k2), JWTConfig{})
	hdr := []byte("Bearer " + k2.sign(t, claimsAt(*clock.Load(), "acme", time.Hour)))
	if _, err := v.Check(hdr); err != nil {
		t.Fatal(err)
	}
	if err := v.load(t.Context()); err != nil { // unchanged
		t.Fatal(err)
	}
	if v.cache.len() != 1 {
		t.Fatalf("re-reading an unchanged key set forgot the tokens")
	}
	if err := os.WriteFile(f, keySet(t, k1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := v.load(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err := v.Check(hdr)
	if r, ok := errors.AsType[*Rejection](err); !ok || r.Reason != "unknown_kid" {
		t.Fatalf("a remembered token of a removed key: %v, want refused (unknown_kid)", err)
	}
}

// The cache holds at most TokenCache tokens, and a forgotten one is
// verified again.
func TestJWTCacheIsBounded(t *testing.T) {
	is := newIssuer(t, "k1")
	const bound = 4
	v, _, clock := fileVerifier(t, is.jwks, JWTConfig{TokenCache: bound})
	var hdrs [][]byte
	for i := range 3 * bound {
		hdrs = append(hdrs, []byte("Bearer "+is.sign(t, claimsAt(*clock.Load(), "t"+strconv.Itoa(i), time.Hour))))
	}
	for round := range 2 {
		for i, h := range hdrs {
			if id, err := v.Check(h); err != nil || id != "t"+strconv.Itoa(i) {
				t.Fatalf("round %d token %d: %q %v", round, i, id, err)
			}
			if n := v.cache.len(); n > bound {
				t.Fatalf("%d tokens remembered, bound %d", n, bound)
			}
		}
	}
	if n := v.cache.len(); n != bound {
		t.Fatalf("%d tokens remembered, want the bound %d", n, bound)
	}
}

// The key set is re-read by Run (through Chain.Run, as the ingress server
// runs it): a token naming a new kid is refused, asks for a re-read, and
// passes once Run has read the new set. Run returns when stop closes.
func TestJWTRunRefreshesOnUnknownKid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k1, k2 := newIssuer(t, "k1"), newIssuer(t, "k2")
		v, f, clock := fileVerifier(t, keySet(t, k1), JWTConfig{})
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { defer close(done); Chain{Verifier: v}.Run(stop) }()
		if err := os.WriteFile(f, keySet(t, k1, k2), 0o600); err != nil {
			t.Fatal(err)
		}
		later := clock.Load().Add(time.Minute) // past MinRefresh
		clock.Store(&later)
		hdr := []byte("Bearer " + k2.sign(t, claimsAt(later, "acme", time.Hour)))
		if _, err := v.Check(hdr); !errors.Is(err, ErrInvalidToken) {
			t.Fatalf("a new kid before the re-read: %v", err)
		}
		synctest.Wait()
		if id, err := v.Check(hdr); err != nil || id != "acme" {
			t.Fatalf("a new kid after the re-read: %q %v", id, err)
		}
		close(stop)
		<-done
	})
}

// The key set was read 30 s ago, and then the host's wall clock was stepped
// back 2 minutes (NTP): a token naming a new kid still asks for a re-read
// (MinRefresh is 10 s of real time) and passes once Run has read the new
// set. On the wall clock the set read "-90 s ago" and the re-read was
// refused until the step had passed (tester h-clock).
func TestJWTRefreshOnUnknownKidAfterWallStepBack(t *testing.T) {
	// Not in a synctest bubble: its clock has no monotonic reading to keep
	// while the wall reading steps.
	k1, k2 := newIssuer(t, "k1"), newIssuer(t, "k2")
	v, f, clock := fileVerifier(t, keySet(t, k1), JWTConfig{})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); Chain{Verifier: v}.Run(stop) }()
	defer func() { close(stop); <-done }()
	if err := os.WriteFile(f, keySet(t, k1, k2), 0o600); err != nil {
		t.Fatal(err)
	}
	later := testutil.WallStepped(clock.Load().Add(30*time.Second), -2*time.Minute)
	clock.Store(&later)
	hdr := []byte("Bearer " + k2.sign(t, claimsAt(later, "acme", time.Hour)))
	if _, err := v.Check(hdr); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a new kid before the re-read: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the new kid passes after the re-read", func() bool {
		id, err := v.Check(hdr) // each refusal asks again
		return err == nil && id == "acme"
	})
}

// Closing stop cancels a key set fetch in flight: Run does not outlive its
// owner by the HTTP client's timeout.
func TestJWTRunStopCancelsFetch(t *testing.T) {
	is := newIssuer(t, "k1")
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			_, _ = w.Write(is.jwks)
			return
		}
		entered <- struct{}{}
		select { // hangs until the client gives up (or the test ends)
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	v, err := NewJWT(t.Context(), JWTConfig{JWKSURL: srv.URL, Audience: "kvmesh", HTTPClient: &http.Client{Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	v.now = func() time.Time { return later }
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); v.Run(stop) }()
	other := newIssuer(t, "k2")
	_, _ = v.Check([]byte("Bearer " + other.sign(t, claimsAt(later, "x", time.Hour))))
	<-entered
	close(stop)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after stop, a fetch in flight")
	}
}

// BenchmarkJWTCheck compares a token's check verified every time with one
// remembered by the cache.
func BenchmarkJWTCheck(b *testing.B) {
	is := newIssuer(b, "k1")
	hdr := []byte("Bearer " + is.sign(b, claimsAt(time.Now(), "acme", time.Hour)))
	for _, bc := range []struct {
		name  string
		cache int
	}{{"uncached", -1}, {"cached", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			v, _, _ := fileVerifier(b, is.jwks, JWTConfig{TokenCache: bc.cache})
			v.now = time.Now
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Check(hdr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
