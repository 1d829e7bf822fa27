package routes

import (
	"strings"
	"sync"
	"time"
)

// Table is an immutable, compiled RouteConfig, safe for concurrent use. A
// request keeps the *Table (and *Route) it started with across a reload.
type Table struct {
	routes []Route
}

// Route is one compiled route.
type Route struct {
	name       string
	model      string // exact model, or the prefix when prefix is set
	prefix     bool
	anyModel   bool
	headers    []headerMatch
	pathPrefix string
	backends   []string
	cum        []uint64 // cumulative weights, parallel to backends
	total      uint64
	fallback   []string
	adapters   []string
	limit      *bucket // nil: no rate limit
}

type headerMatch struct {
	name  string
	value string
}

// NewTable compiles a validated config. Rate-limit state of a route whose
// name and limits are unchanged carries over from prev (nil: fresh), so a
// reload does not refill every budget.
func NewTable(c *Config, prev *Table) *Table {
	t := &Table{routes: make([]Route, len(c.Routes))}
	for i := range c.Routes {
		r := &c.Routes[i]
		ru := &t.routes[i]
		ru.name = r.Name
		m := r.Match.Model
		switch {
		case m == "":
			ru.anyModel = true
		case strings.HasSuffix(m, "*"):
			ru.prefix, ru.model = true, strings.TrimSuffix(m, "*")
		default:
			ru.model = m
		}
		for k, v := range r.Match.Headers {
			ru.headers = append(ru.headers, headerMatch{name: k, value: v})
		}
		ru.pathPrefix = r.Match.PathPrefix
		for _, b := range r.Backends {
			w := 1
			if b.Weight != nil {
				w = *b.Weight
			}
			ru.total += uint64(w)
			ru.backends = append(ru.backends, b.Model)
			ru.cum = append(ru.cum, ru.total)
		}
		ru.fallback = append([]string(nil), r.Fallback...)
		ru.adapters = append([]string(nil), r.LoRAAdapters...)
		if rl := r.RateLimit; rl.RequestsPerMinute > 0 || rl.InputTokensPerMinute > 0 {
			if old := prev.rule(r.Name); old != nil && old.limit != nil && old.limit.rl == rl {
				ru.limit = old.limit
			} else {
				ru.limit = newBucket(rl, time.Now())
			}
		}
	}
	return t
}

func (t *Table) rule(name string) *Route {
	if t == nil {
		return nil
	}
	for i := range t.routes {
		if t.routes[i].name == name {
			return &t.routes[i]
		}
	}
	return nil
}

// Len is the number of routes.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.routes)
}

// Match returns the first route whose match fits the request's model, path
// and headers (header returns a header's value, nil when absent). It does not
// allocate.
func (t *Table) Match(model, path string, header func(string) []byte) (*Route, bool) {
	if t == nil {
		return nil, false
	}
	for i := range t.routes {
		if t.routes[i].matches(model, path, header) {
			return &t.routes[i], true
		}
	}
	return nil, false
}

func (r *Route) matches(model, path string, header func(string) []byte) bool {
	if !r.matchModel(model) {
		return false
	}
	if r.pathPrefix != "" && !strings.HasPrefix(path, r.pathPrefix) {
		return false
	}
	for i := range r.headers {
		h := &r.headers[i]
		if v := header(h.name); v == nil || string(v) != h.value {
			return false
		}
	}
	return true
}

func (r *Route) matchModel(model string) bool {
	switch {
	case r.anyModel:
		return true
	case r.prefix && strings.HasPrefix(model, r.model):
		return true
	case !r.prefix && model == r.model:
		return true
	}
	return r.IsAdapter(model)
}

// IsAdapter reports whether model is one of the route's LoRA adapters.
func (r *Route) IsAdapter(model string) bool {
	for _, a := range r.adapters {
		if a == model {
			return true
		}
	}
	return false
}

// Name is the route's name.
func (r *Route) Name() string { return r.name }

// Pick returns a backend model chosen by weight; rnd is a uniform random
// number from the caller's source (math/rand/v2's Uint64, a test's seeded
// generator). The modulo bias is below total/2^64: negligible.
func (r *Route) Pick(rnd uint64) string {
	x := rnd % r.total
	for i, c := range r.cum {
		if x < c {
			return r.backends[i]
		}
	}
	return r.backends[len(r.backends)-1]
}

// Fallback is the ordered list of models to try after the picked one. The
// caller must not modify it.
func (r *Route) Fallback() []string { return r.fallback }

// Adapters are the route's LoRA adapter names. The caller must not modify it.
func (r *Route) Adapters() []string { return r.adapters }

// Exact is the route's exact match model ("" for a prefix or any model).
func (r *Route) Exact() string {
	if r.prefix || r.anyModel {
		return ""
	}
	return r.model
}

// Admit charges one request of inputTokens to the route's rate limit at
// now; when over budget it charges nothing and says how long to wait.
func (r *Route) Admit(now time.Time, inputTokens int) (retryAfter time.Duration, ok bool) {
	if r.limit == nil {
		return 0, true
	}
	return r.limit.admit(now, inputTokens)
}

// bucket is a pair of token buckets (requests, input tokens), each holding
// up to one minute's budget and refilling continuously. It is local to a
// replica: ingress/ratelimit is cluster-wide but tracks tokens only (no
// request counts), per key and model configured at start; a route's limits
// come and go with reloads, so a small mutex-guarded bucket fits better.
type bucket struct {
	rl     RateLimit
	mu     sync.Mutex // guards the fields below
	last   time.Time
	reqs   float64
	tokens float64
}

func newBucket(rl RateLimit, now time.Time) *bucket {
	return &bucket{rl: rl, last: now, reqs: float64(rl.RequestsPerMinute), tokens: float64(rl.InputTokensPerMinute)}
}

func (b *bucket) admit(now time.Time, n int) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if dt := now.Sub(b.last); dt > 0 {
		f := dt.Minutes()
		b.reqs = min(b.reqs+f*float64(b.rl.RequestsPerMinute), float64(b.rl.RequestsPerMinute))
		b.tokens = min(b.tokens+f*float64(b.rl.InputTokensPerMinute), float64(b.rl.InputTokensPerMinute))
		b.last = now
	}
	var wait time.Duration
	if rpm := b.rl.RequestsPerMinute; rpm > 0 && b.reqs < 1 {
		wait = max(wait, minutes((1-b.reqs)/float64(rpm)))
	}
	if tpm := b.rl.InputTokensPerMinute; tpm > 0 {
		// A request larger than a minute's budget passes when the bucket is
		// full (and leaves it in debt), so it is not refused forever.
		need := min(float64(n), float64(tpm))
		if b.tokens < need {
			wait = max(wait, minutes((need-b.tokens)/float64(tpm)))
		}
	}
	if wait > 0 {
		return wait, false
	}
	if b.rl.RequestsPerMinute > 0 {
		b.reqs--
	}
	if b.rl.InputTokensPerMinute > 0 {
		b.tokens -= float64(n)
	}
	return 0, true
}

func minutes(f float64) time.Duration { return time.Duration(f * float64(time.Minute)) }

// Models are the model names clients can ask for by exact name: every
// route's exact match model and LoRA adapters, deduplicated, in route order.
func (t *Table) Models() []string {
	if t == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	add := func(m string) {
		if m != "" && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for i := range t.routes {
		add(t.routes[i].Exact())
		for _, a := range t.routes[i].adapters {
			add(a)
		}
	}
	return out
}
