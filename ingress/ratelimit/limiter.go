// Package ratelimit enforces per-API-key and per-model token rate limits (input and
// output tokens) for the ingress, cluster-wide.
//
// Each scope has a sliding window estimated from two fixed windows (previous and
// current): usage = prev·(1−elapsed fraction) + curr. Each replica counts only what it
// admitted; it publishes those counters through gossip (AppendState) and adds the
// other replicas' latest counters (MergeState), so the limit holds for the cluster
// within one gossip interval. Without gossip the limiter simply enforces the limits
// per replica.
//
// Input tokens are charged at admission (Admit); output tokens are only known at the
// end and are charged then (Observe), so a scope may run into debt and is refused
// until the window frees enough. The package owns no HTTP and no gossip transport: the
// ingress maps a refusal to 429 with Retry-After and carries the state bytes.
package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Sentinel errors.
var (
	ErrConfig    = errors.New("invalid rate limit config")
	ErrBadState  = errors.New("malformed rate limit state")
	ErrOldWindow = errors.New("state window differs")
)

// Scope kinds, used as hash seeds so a key and a model of the same name never share a
// counter, on every replica alike.
const (
	seedKey   = 0x6b6579 // "key"
	seedModel = 0x6d6f64 // "mod"
)

// dims
const (
	dimIn  = 0
	dimOut = 1
)

// counter is one scope's local usage. win is the window index curr belongs to.
type counter struct {
	win        int64
	curr, prev [2]int64
	limits     Limits
}

// roll advances c to window w, shifting or clearing counts that fell out.
func (c *counter) roll(w int64) {
	switch {
	case w == c.win:
	case w == c.win+1:
		c.prev, c.curr = c.curr, [2]int64{}
	case w > c.win:
		c.prev, c.curr = [2]int64{}, [2]int64{}
	default:
		return // clock went backwards: keep counting into the newest window
	}
	c.win = w
}

// Limiter is safe for concurrent use. One mutex guards all state: every operation is a
// few map lookups and additions, far shorter than a request's other work.
type Limiter struct {
	cfg     Config
	window  int64 // nanoseconds
	metrics *metrics

	mu      sync.Mutex // guards local and origins
	local   map[uint64]*counter
	origins map[string]*origin
}

// New validates cfg (after defaults) and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	return &Limiter{
		cfg:     cfg,
		window:  int64(cfg.Window),
		metrics: newMetrics(),
		local:   make(map[uint64]*counter),
		origins: make(map[string]*origin),
	}, nil
}

// Enabled reports whether any limit is configured at all.
func (l *Limiter) Enabled() bool {
	if !l.cfg.PerKey.zero() || !l.cfg.PerModel.zero() || l.cfg.KeyLimits != nil {
		return true
	}
	for _, v := range l.cfg.Keys {
		if !v.zero() {
			return true
		}
	}
	for _, v := range l.cfg.Models {
		if !v.zero() {
			return true
		}
	}
	return false
}

func (l *Limiter) keyLimits(key string) Limits {
	if l.cfg.KeyLimits != nil {
		if v, ok := l.cfg.KeyLimits(key); ok {
			return v
		}
	}
	if v, ok := l.cfg.Keys[key]; ok {
		return v
	}
	return l.cfg.PerKey
}

func (l *Limiter) modelLimits(model string) Limits {
	if v, ok := l.cfg.Models[model]; ok {
		return v
	}
	return l.cfg.PerModel
}

// Admit decides whether a request of inputTokens from key for model may start now and,
// if so, charges its input tokens. When refused, retryAfter is when it would fit if
// nothing else were admitted meanwhile. A request larger than a whole window's limit is
// admitted only into an otherwise idle window, so it is slow but never starved.
func (l *Limiter) Admit(key, model string, inputTokens int) (retryAfter time.Duration, ok bool) {
	d := l.AdmitAt(key, model, inputTokens, l.cfg.Now())
	return d.RetryAfter, d.Allowed
}

// Observe charges a finished request's output tokens.
func (l *Limiter) Observe(key, model string, outputTokens int) {
	l.ObserveAt(key, model, outputTokens, l.cfg.Now())
}

// Decision explains an AdmitAt result.
type Decision struct {
	Allowed    bool
	RetryAfter time.Duration
	Scope      string // "key" or "model" when refused
	Dim        string // "input" or "output" when refused
}

// AdmitAt is Admit at an explicit time.
func (l *Limiter) AdmitAt(key, model string, inputTokens int, now time.Time) Decision {
	kl, ml := l.keyLimits(key), l.modelLimits(model)
	if kl.zero() && ml.zero() {
		l.metrics.allowed.Inc()
		return Decision{Allowed: true}
	}
	need := int64(max(inputTokens, 0))
	t := now.UnixNano()
	w := t / l.window
	frac := float64(t-w*l.window) / float64(l.window)

	l.mu.Lock()
	defer l.mu.Unlock()
	var (
		ids [2]uint64
		cs  [2]*counter // key scope, model scope; nil when unlimited
	)
	if !kl.zero() {
		ids[0] = xxh3.HashStringSeed(key, seedKey)
		cs[0] = l.counter(ids[0], kl, w)
	}
	if !ml.zero() {
		ids[1] = xxh3.HashStringSeed(model, seedModel)
		cs[1] = l.counter(ids[1], ml, w)
	}
	var worst Decision
	for i, c := range cs {
		if c == nil {
			continue
		}
		id := ids[i]
		for dim, lim := range [2]int64{c.limits.InputTokens, c.limits.OutputTokens} {
			if lim == 0 {
				continue
			}
			n := int64(1) // output: refuse while the scope is at or over its limit
			if dim == dimIn {
				n = min(need, lim)
			}
			prev, curr := l.usage(id, c, w, dim)
			if prev*(1-frac)+curr+float64(n) <= float64(lim) {
				continue
			}
			ra := retryAfter(prev, curr, float64(n), float64(lim), frac, l.cfg.Window)
			if ra > worst.RetryAfter {
				worst = Decision{RetryAfter: ra, Scope: [2]string{"key", "model"}[i], Dim: [2]string{"input", "output"}[dim]}
			}
		}
	}
	if worst.RetryAfter > 0 {
		l.metrics.limited(worst.Scope, worst.Dim).Inc()
		return worst
	}
	for _, c := range cs {
		if c != nil && c != untracked {
			c.curr[dimIn] += need
		}
	}
	l.metrics.allowed.Inc()
	return Decision{Allowed: true}
}

// ObserveAt is Observe at an explicit time.
func (l *Limiter) ObserveAt(key, model string, outputTokens int, now time.Time) {
	if outputTokens <= 0 {
		return
	}
	kl, ml := l.keyLimits(key), l.modelLimits(model)
	if kl.zero() && ml.zero() {
		return
	}
	w := now.UnixNano() / l.window
	l.mu.Lock()
	defer l.mu.Unlock()
	if !kl.zero() {
		if c := l.counter(xxh3.HashStringSeed(key, seedKey), kl, w); c != untracked {
			c.curr[dimOut] += int64(outputTokens)
		}
	}
	if !ml.zero() {
		if c := l.counter(xxh3.HashStringSeed(model, seedModel), ml, w); c != untracked {
			c.curr[dimOut] += int64(outputTokens)
		}
	}
}

// untracked stands in for a scope that did not fit under MaxScopes; it never limits.
var untracked = &counter{}

// counter returns the scope's counter rolled to window w, creating it if needed.
// Caller holds l.mu.
func (l *Limiter) counter(id uint64, lim Limits, w int64) *counter {
	c, ok := l.local[id]
	if !ok {
		if len(l.local) >= l.cfg.MaxScopes {
			l.sweep(w)
			if len(l.local) >= l.cfg.MaxScopes {
				l.metrics.untracked.Inc()
				return untracked
			}
		}
		c = &counter{win: w}
		l.local[id] = c
	}
	c.limits = lim
	c.roll(w)
	return c
}

// sweep drops scopes with nothing left in the sliding window. Caller holds l.mu.
func (l *Limiter) sweep(w int64) {
	for id, c := range l.local {
		if c.win < w-1 || c.win == w-1 && c.curr == [2]int64{} {
			delete(l.local, id)
		}
	}
}

// usage sums the previous- and current-window counts of one scope and dimension over
// this replica and every known origin. Caller holds l.mu.
func (l *Limiter) usage(id uint64, c *counter, w int64, dim int) (prev, curr float64) {
	if c == untracked {
		return 0, 0
	}
	p, q := c.prev[dim], c.curr[dim]
	for _, o := range l.origins {
		e, ok := o.scopes[id]
		if !ok {
			continue
		}
		switch o.win {
		case w:
			p += e.prev[dim]
			q += e.curr[dim]
		case w - 1:
			p += e.curr[dim]
		}
	}
	return float64(p), float64(q)
}

// retryAfter solves prev·(1−f)+curr+n ≤ lim for the earliest f, assuming no further
// admissions: within this window when dropping prev suffices, else in the next one
// (where curr becomes prev).
func retryAfter(prev, curr, n, lim, frac float64, window time.Duration) time.Duration {
	var f float64 // target fraction measured from the start of this window
	switch {
	case curr+n <= lim && prev > 0:
		f = 1 - (lim-curr-n)/prev
	case curr > 0:
		f = 1 + math.Max(0, 1-(lim-n)/curr)
	default:
		f = 1
	}
	d := time.Duration((f - frac) * float64(window))
	return max(d, time.Millisecond)
}
