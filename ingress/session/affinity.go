// Package session keeps conversations on their engine and admits requests when the
// cluster is saturated.
//
// Affinity maps an X-Session-ID to the engine that served the session last, in bounded
// memory (sharded LRU with an idle TTL). Admitter bounds concurrent requests; when all
// slots are taken, requests wait in a bounded queue for at most MaxWait (then
// ErrQueueTimeout, which the ingress answers with 504), and follow-up turns of
// recently finished sessions are admitted before everyone else ("session boost"): they
// are likely to hit a warm prefix cache and finish a conversation the user is waiting
// on.
//
// The package decides nothing about load: the ingress tells Affinity's caller whether
// the remembered engine is overloaded (from its load view) and sets the Admitter's
// limit from the cluster's saturation. It writes no HTTP.
package session

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors.
var (
	ErrConfig       = errors.New("invalid session config")
	ErrQueueTimeout = errors.New("admission queue wait expired")
	ErrQueueFull    = errors.New("admission queue full")
)

// AffinityConfig configures an Affinity.
type AffinityConfig struct {
	// MaxSessions bounds the remembered sessions; the least recently used are forgotten
	// first. Default 100,000 (about 10 MB).
	MaxSessions int
	// TTL forgets a session idle this long. Default 30 minutes; an engine's prefix cache
	// rarely keeps a conversation longer.
	TTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultAffinityConfig returns the defaults described on AffinityConfig.
func DefaultAffinityConfig() AffinityConfig {
	return AffinityConfig{MaxSessions: 100_000, TTL: 30 * time.Minute, Now: time.Now}
}

// Validate lists every problem with the configuration.
func (c AffinityConfig) Validate() error {
	var errs []error
	if c.MaxSessions < 1 {
		errs = append(errs, fmt.Errorf("%w: max sessions %d < 1", ErrConfig, c.MaxSessions))
	}
	if c.TTL < 0 {
		errs = append(errs, fmt.Errorf("%w: ttl %v < 0", ErrConfig, c.TTL))
	}
	return errors.Join(errs...)
}

func (c AffinityConfig) withDefaults() AffinityConfig {
	d := DefaultAffinityConfig()
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	return c
}

// Affinity remembers which engine each session was routed to. Safe for concurrent use.
type Affinity struct {
	now     func() time.Time
	entries *lru[string]
}

// NewAffinity validates cfg (after defaults) and returns an empty Affinity.
func NewAffinity(cfg AffinityConfig) (*Affinity, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return &Affinity{now: cfg.Now, entries: newLRU[string](cfg.MaxSessions, cfg.TTL)}, nil
}

// Engine returns the engine the session was last routed to. The caller keeps the
// session there unless that engine is gone or overloaded, and then calls Remember with
// the new engine. It does not allocate.
func (a *Affinity) Engine(sessionID string) (string, bool) {
	if sessionID == "" {
		return "", false
	}
	return a.entries.get(sessionID, a.now(), true)
}

// Remember records the engine a session's request was routed to.
func (a *Affinity) Remember(sessionID, engineID string) {
	if sessionID == "" || engineID == "" {
		return
	}
	a.entries.put(sessionID, engineID, a.now())
}

// Forget drops one session.
func (a *Affinity) Forget(sessionID string) { a.entries.remove(sessionID) }

// ForgetEngine drops every session bound to an engine that left the cluster, so their
// next turns are routed afresh (by prefix) rather than checked against a dead engine.
func (a *Affinity) ForgetEngine(engineID string) int {
	return a.entries.removeIf(func(e string) bool { return e == engineID })
}

// Len is the number of remembered sessions (expired ones included until touched).
func (a *Affinity) Len() int { return a.entries.len() }
