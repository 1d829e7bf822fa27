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
// Input tokens are charged at admission. Output tokens are reserved at admission
// (Reserve: the most the request may produce, max_tokens × sequences) and settled to
// the actual at the end (Settle), which releases the unused part: requests in flight
// together never hold more than the budget, and one that alone asks more than a
// scope's whole limit is refused as too large. A request with no maximum reserves
// what it is expected to produce instead, and Settle charges what it produced beyond
// that (Ask.Unbounded). A charge never fills a window past its
// limit: the rest is carried into the following windows, at most a whole limit each,
// so a debt (a prompt larger than the limit, output beyond a reservation) is paid off
// rather than forgotten when its window slides out. The package owns no HTTP and no
// gossip transport: the ingress maps a refusal to 429 with Retry-After and carries the
// state bytes.
package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
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

// Dimensions of a window's counts. Output that Settle releases is counted apart
// (dimFreed, subtracted from dimOut) so that every count only grows within a window:
// that is what lets replicas merge each other's counts by taking the maximum
// (state.go).
const (
	dimIn    = 0
	dimOut   = 1
	dimFreed = 2
)

// count is a window's count in dim (dimIn or dimOut), net of released output; never
// negative, so no replica's counts can cancel another's.
func count(w [3]int64, dim int) int64 {
	if dim == dimOut {
		return max(w[dimOut]-w[dimFreed], 0)
	}
	return w[dim]
}

func (l Limits) dim(d int) int64 {
	if d == dimIn {
		return l.InputTokens
	}
	return l.OutputTokens
}

// counter is one scope's local usage. win is the window index curr belongs to.
// carry is what was charged beyond a window's limit (input, output), owed to the
// following windows.
type counter struct {
	win        int64
	curr, prev [3]int64
	carry      [2]int64
	limits     Limits
}

// roll advances c to window w, shifting or clearing counts that fell out, and moves
// what it owes into the windows it passes: a whole limit each until it is paid.
func (c *counter) roll(w int64) {
	if w < c.win-1 {
		// The clock stepped back by more than a window (corrected): the
		// counts are this replica's latest usage, so they move to w.
		// Before, they stayed in the future window, which was neither
		// published (AppendState sends window w only) nor rolled until
		// the clock caught up: others ignored this replica's usage and
		// it counted its own against one window for that long.
		c.win = w
		return
	}
	if w <= c.win {
		return // same window, or the clock went back a little: keep counting into the newest
	}
	k := w - c.win
	if k == 1 {
		c.prev = c.curr
	} else {
		c.prev = [3]int64{}
	}
	c.curr = [3]int64{}
	for d, owed := range c.carry {
		if owed == 0 {
			continue
		}
		lim := c.limits.dim(d)
		if lim <= 0 {
			c.carry[d] = 0 // no limit left to pay it against
			continue
		}
		if k > 1 {
			c.prev[d] += payment(owed, lim, k-1)
		}
		c.curr[d] += payment(owed, lim, k)
		if k > owed/lim {
			c.carry[d] = 0
		} else {
			c.carry[d] = owed - k*lim
		}
	}
	c.win = w
}

// payment is what the j-th window after a debt of owed takes of it under limit lim.
func payment(owed, lim, j int64) int64 {
	if j-1 > owed/lim {
		return 0
	}
	return min(owed-(j-1)*lim, lim)
}

// charge counts n tokens of dim in the current window, up to the scope's limit; the
// rest is carried into the next windows.
func (c *counter) charge(dim int, n int64) {
	if n <= 0 || c == untracked {
		return
	}
	now := n
	if lim := c.limits.dim(dim); lim > 0 {
		now = min(n, max(lim-count(c.curr, dim), 0))
	}
	c.curr[dim] += now
	c.carry[dim] += n - now
}

// Limiter is safe for concurrent use. One mutex guards all state: every operation is a
// few map lookups and additions, far shorter than a request's other work.
type Limiter struct {
	cfg     Config
	window  int64 // nanoseconds
	metrics *metrics
	// interval is the gossip interval in nanoseconds (Share's; 250 ms until
	// then), for the grace after a window boundary (state.go).
	interval atomic.Int64

	mu      sync.Mutex // guards local, origins and remote
	local   map[uint64]*counter
	origins map[string]*origin
	remote  map[uint64][]remoteSum // per scope, the origins' counts summed per window they are at (state.go)
}

// New validates cfg (after defaults) and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	l := &Limiter{
		cfg:     cfg,
		window:  int64(cfg.Window),
		metrics: newMetrics(),
		local:   make(map[uint64]*counter),
		origins: make(map[string]*origin),
		remote:  make(map[uint64][]remoteSum),
	}
	l.interval.Store(int64(defaultShareInterval))
	return l, nil
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

// keyLimits is the operator's limits for key (Keys, else PerKey), with each dimension
// the caller's own budget (KeyLimits) sets in its place.
func (l *Limiter) keyLimits(key string) Limits {
	v, ok := l.cfg.Keys[key]
	if !ok {
		v = l.cfg.PerKey
	}
	if l.cfg.KeyLimits != nil {
		if c, ok := l.cfg.KeyLimits(key); ok {
			if c.InputTokens > 0 {
				v.InputTokens = c.InputTokens
			}
			if c.OutputTokens > 0 {
				v.OutputTokens = c.OutputTokens
			}
		}
	}
	return v
}

func (l *Limiter) modelLimits(model string) Limits {
	if v, ok := l.cfg.Models[model]; ok {
		return v
	}
	return l.cfg.PerModel
}

// Ask is what one request asks of its budgets at admission.
type Ask struct {
	// InputTokens are the prompt's tokens, charged at admission.
	InputTokens int
	// OutputTokens is the most output the request may produce (max_tokens × the
	// sequences the engine decodes), reserved at admission and settled to the actual
	// by Settle. More than a scope's whole limit is refused as too large.
	OutputTokens int
	// Unbounded: the request sets no maximum (no max_tokens), so OutputTokens is the
	// output it is expected to produce (the ingress: the model's mean answer, bounded
	// by the context left), not a bound. Each scope then reserves that, or its whole
	// output limit when that is smaller or nothing is expected (0), and never refuses
	// the request as too large; output beyond the reservation is charged at the end
	// (Settle; carried into later windows, so the scope pays it off before it admits
	// more).
	Unbounded bool
}

// Reservation is what an admission reserved of the output budgets, for Settle. It is
// a value: keep it with the request.
type Reservation struct {
	out  [2]int64 // output reserved in the key's and the model's scope
	win  [2]int64 // the window it was reserved in
	held [2]bool  // reserved: a tracked scope with an output limit
}

// Decision explains an admission.
type Decision struct {
	Allowed    bool
	RetryAfter time.Duration
	Scope      string // "key" or "model" when refused
	Dim        string // "input" or "output" when refused
	// TooLarge: refused because the request alone asks more output than the scope's
	// whole limit (Limit), so waiting would not help; Requested is what it asked.
	TooLarge         bool
	Limit, Requested int64
	// Reservation, when Allowed, is what Settle settles at the end.
	Reservation Reservation
}

// Admit decides whether a request of inputTokens from key for model may start now and,
// if so, charges its input tokens; it reserves no output (a scope at or over its
// output limit refuses) and Observe charges the output at the end. When refused,
// retryAfter is when it would fit if nothing else were admitted meanwhile. A prompt
// larger than a whole window's limit is admitted only into an otherwise idle window,
// and the excess is carried into the next windows, so it is slow but never starved.
func (l *Limiter) Admit(key, model string, inputTokens int) (retryAfter time.Duration, ok bool) {
	d := l.AdmitAt(key, model, inputTokens, l.cfg.Now())
	return d.RetryAfter, d.Allowed
}

// Observe charges a finished request's output tokens (for Admit; Reserve's requests
// end with Settle).
func (l *Limiter) Observe(key, model string, outputTokens int) {
	l.ObserveAt(key, model, outputTokens, l.cfg.Now())
}

// AdmitAt is Admit at an explicit time.
func (l *Limiter) AdmitAt(key, model string, inputTokens int, now time.Time) Decision {
	return l.ReserveAt(key, model, Ask{InputTokens: inputTokens}, now)
}

// Reserve decides whether the request a asks for may start now and, if so, charges its
// input tokens and reserves its output (Decision.Reservation), which Settle must settle
// when the request ends, whatever its outcome.
func (l *Limiter) Reserve(key, model string, a Ask) Decision {
	return l.ReserveAt(key, model, a, l.cfg.Now())
}

// ReserveAt is Reserve at an explicit time.
func (l *Limiter) ReserveAt(key, model string, a Ask, now time.Time) Decision {
	kl, ml := l.keyLimits(key), l.modelLimits(model)
	if kl.zero() && ml.zero() {
		l.metrics.allowed.Inc()
		return Decision{Allowed: true}
	}
	need := int64(max(a.InputTokens, 0))
	out := int64(max(a.OutputTokens, 0))
	var want [2]int64 // output to reserve per scope
	for i, lim := range [2]Limits{kl, ml} {
		o := lim.OutputTokens
		switch {
		case o == 0:
		case !a.Unbounded && out > o:
			l.metrics.limitedBy[i][dimOut].Inc()
			return Decision{Scope: scopeNames[i], Dim: "output", TooLarge: true, Limit: o, Requested: out}
		case a.Unbounded && (out == 0 || out > o):
			want[i] = o
		default:
			want[i] = out
		}
	}
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
			n := max(want[i], 1) // output: at least, refuse while the scope is at or over its limit
			if dim == dimIn {
				n = min(need, lim)
			}
			prev, curr := l.usage(id, c, w, dim)
			owed := float64(c.carry[dim])
			if prev*(1-frac)+curr+owed+float64(n) <= float64(lim) {
				continue
			}
			ra := retryAfter(prev, curr, float64(n), float64(lim), frac, l.cfg.Window)
			ra += time.Duration(owed / float64(lim) * float64(l.cfg.Window)) // the debt drains a limit per window
			if ra > worst.RetryAfter {
				worst = Decision{RetryAfter: ra, Scope: scopeNames[i], Dim: dimNames[dim]}
			}
		}
	}
	if worst.RetryAfter > 0 {
		l.metrics.limited(worst.Scope, worst.Dim).Inc()
		return worst
	}
	d := Decision{Allowed: true}
	for i, c := range cs {
		if c == nil || c == untracked {
			continue
		}
		c.charge(dimIn, need)
		if c.limits.OutputTokens > 0 {
			c.charge(dimOut, want[i])
			r := &d.Reservation
			r.out[i], r.win[i], r.held[i] = want[i], c.win, true
		}
	}
	l.metrics.allowed.Inc()
	return d
}

var (
	scopeNames = [2]string{"key", "model"}
	dimNames   = [2]string{"input", "output"}
)

// Settle ends a request Reserve admitted: it charges the output tokens it produced,
// releasing the rest of its reservation. Call it once per admitted request, whatever
// its status (a stream the client cut produced tokens too).
func (l *Limiter) Settle(key, model string, r Reservation, outputTokens int) {
	l.SettleAt(key, model, r, outputTokens, l.cfg.Now())
}

// SettleAt is Settle at an explicit time. Unused output is released in the window it
// was reserved in while that window still counts; output beyond the reservation is
// charged now. A scope reserved nothing in (unlimited or untracked then) is charged
// the output as Observe does.
func (l *Limiter) SettleAt(key, model string, r Reservation, outputTokens int, now time.Time) {
	actual := int64(max(outputTokens, 0))
	if actual == 0 && !r.held[0] && !r.held[1] {
		return
	}
	kl, ml := l.keyLimits(key), l.modelLimits(model)
	if !r.held[0] && !r.held[1] && kl.OutputTokens == 0 && ml.OutputTokens == 0 {
		return
	}
	w := now.UnixNano() / l.window
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, lim := range [2]Limits{kl, ml} {
		var id uint64
		if i == 0 {
			id = xxh3.HashStringSeed(key, seedKey)
		} else {
			id = xxh3.HashStringSeed(model, seedModel)
		}
		delta := actual
		if r.held[i] {
			delta -= r.out[i]
		}
		if delta > 0 {
			if lim.OutputTokens > 0 {
				l.counter(id, lim, w).charge(dimOut, delta)
			}
			continue
		}
		c, ok := l.local[id]
		if delta == 0 || !ok {
			continue // nothing to release, or its window is long gone with the counter
		}
		c.roll(w)
		switch r.win[i] {
		case c.win:
			c.curr[dimFreed] += -delta
		case c.win - 1:
			c.prev[dimFreed] += -delta
		}
		// Older: the window it was reserved in no longer counts.
	}
}

// ObserveAt is Observe at an explicit time.
func (l *Limiter) ObserveAt(key, model string, outputTokens int, now time.Time) {
	if outputTokens <= 0 {
		return
	}
	kl, ml := l.keyLimits(key), l.modelLimits(model)
	if kl.OutputTokens == 0 && ml.OutputTokens == 0 {
		return
	}
	w := now.UnixNano() / l.window
	l.mu.Lock()
	defer l.mu.Unlock()
	if kl.OutputTokens > 0 {
		l.counter(xxh3.HashStringSeed(key, seedKey), kl, w).charge(dimOut, int64(outputTokens))
	}
	if ml.OutputTokens > 0 {
		l.counter(xxh3.HashStringSeed(model, seedModel), ml, w).charge(dimOut, int64(outputTokens))
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

// sweep drops scopes with nothing left in the sliding window and nothing owed. Caller
// holds l.mu.
func (l *Limiter) sweep(w int64) {
	for id, c := range l.local {
		if c.carry == [2]int64{} && (c.win < w-1 || c.win == w-1 && c.curr == [3]int64{}) {
			delete(l.local, id)
		}
	}
}

// usage sums the previous- and current-window counts of one scope and dimension over
// this replica and every known origin: the origins' through their running sums, one
// per window they are at (usually one or two), whatever their number. Caller holds
// l.mu.
func (l *Limiter) usage(id uint64, c *counter, w int64, dim int) (prev, curr float64) {
	if c == untracked {
		return 0, 0
	}
	p, q := count(c.prev, dim), count(c.curr, dim)
	for _, s := range l.remote[id] {
		switch s.win {
		case w:
			p += s.prev[dim]
			q += s.curr[dim]
		case w - 1:
			p += s.curr[dim]
		case w + 1:
			// Origins whose clock is ahead (by a little, or placed so:
			// placeWindow): their previous window is mostly this one,
			// so both count in full. Before, they were not counted.
			q += s.curr[dim] + s.prev[dim]
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
