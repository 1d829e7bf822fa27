package ratelimit

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newClock starts at the beginning of a minute window so fractions are predictable.
func newClock() *clock { return &clock{t: time.Unix(1_800_000_000, 0).Truncate(time.Minute)} }

func newLimiter(t testing.TB, cfg Config, c *clock) *Limiter {
	t.Helper()
	cfg.Now = c.now
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestAdmitTable(t *testing.T) {
	type step struct {
		advance time.Duration
		key     string
		model   string
		in      int // Admit when >= 0
		out     int // Observe when > 0
		want    bool
		dim     string
		scope   string
	}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "no limits admits everything",
			cfg:  Config{},
			steps: []step{
				{key: "a", model: "m", in: 1 << 30, want: true},
				{key: "a", model: "m", in: 1 << 30, want: true},
			},
		},
		{
			name: "per-key input limit",
			cfg:  Config{PerKey: Limits{InputTokens: 1000}},
			steps: []step{
				{key: "a", model: "m", in: 600, want: true},
				{key: "a", model: "m", in: 400, want: true},
				{key: "a", model: "m", in: 1, want: false, scope: "key", dim: "input"},
				{key: "b", model: "m", in: 1000, want: true}, // other keys are separate
				{advance: 2 * time.Minute, key: "a", model: "m", in: 1000, want: true},
			},
		},
		{
			name: "key override",
			cfg:  Config{PerKey: Limits{InputTokens: 100}, Keys: map[string]Limits{"big": {InputTokens: 10_000}}},
			steps: []step{
				{key: "small", model: "m", in: 101, want: true}, // oversized, idle window: admitted once
				{key: "small", model: "m", in: 1, want: false, scope: "key", dim: "input"},
				{key: "big", model: "m", in: 5000, want: true},
				{key: "big", model: "m", in: 5000, want: true},
				{key: "big", model: "m", in: 1, want: false, scope: "key", dim: "input"},
			},
		},
		{
			name: "per-model limit across keys",
			cfg:  Config{Models: map[string]Limits{"llama": {InputTokens: 1000}}},
			steps: []step{
				{key: "a", model: "llama", in: 700, want: true},
				{key: "b", model: "llama", in: 400, want: false, scope: "model", dim: "input"},
				{key: "b", model: "other", in: 400, want: true},
				{key: "b", model: "llama", in: 300, want: true},
			},
		},
		{
			name: "output debt refuses until it drains",
			cfg:  Config{PerKey: Limits{OutputTokens: 500}},
			steps: []step{
				{key: "a", model: "m", in: 10, want: true},
				{key: "a", model: "m", in: -1, out: 800},
				{key: "a", model: "m", in: 10, want: false, scope: "key", dim: "output"},
				{advance: 61 * time.Second, key: "a", model: "m", in: 10, want: false, scope: "key", dim: "output"}, // 800·(59/60) left
				{advance: 59 * time.Second, key: "a", model: "m", in: 10, want: true},
			},
		},
		{
			name: "sliding window weights the previous window",
			cfg:  Config{PerKey: Limits{InputTokens: 1000}},
			steps: []step{
				{key: "a", model: "m", in: 1000, want: true},
				{advance: 90 * time.Second, key: "a", model: "m", in: 600, want: false, scope: "key", dim: "input"}, // 1000·0.5 + 600 > 1000
				{key: "a", model: "m", in: 500, want: true},                                                         // 500 + 500 = 1000
				{key: "a", model: "m", in: 1, want: false, scope: "key", dim: "input"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			l := newLimiter(t, tt.cfg, c)
			for i, s := range tt.steps {
				c.add(s.advance)
				if s.out > 0 {
					l.Observe(s.key, s.model, s.out)
				}
				if s.in < 0 {
					continue
				}
				d := l.AdmitAt(s.key, s.model, s.in, c.now())
				if d.Allowed != s.want {
					t.Fatalf("step %d: allowed = %v, want %v (%+v)", i, d.Allowed, s.want, d)
				}
				if !s.want {
					if d.Scope != s.scope || d.Dim != s.dim {
						t.Fatalf("step %d: refused by %s/%s, want %s/%s", i, d.Scope, d.Dim, s.scope, s.dim)
					}
					if d.RetryAfter <= 0 || d.RetryAfter > 2*time.Minute {
						t.Fatalf("step %d: retry after %v", i, d.RetryAfter)
					}
				}
			}
		})
	}
}

// TestRetryAfterIsTight checks that waiting RetryAfter is enough and not much more.
func TestRetryAfterIsTight(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second int
		advance       time.Duration
	}{
		{"next window", 900, 300, 10 * time.Second},
		{"same window as prev drains", 900, 300, 70 * time.Second},
		{"full window", 1000, 1000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
			if !l.AdmitAt("a", "m", tc.first, c.now()).Allowed {
				t.Fatal("first refused")
			}
			c.add(tc.advance)
			d := l.AdmitAt("a", "m", tc.second, c.now())
			if d.Allowed {
				t.Fatal("second admitted")
			}
			early := c.now().Add(d.RetryAfter - 50*time.Millisecond)
			if l.AdmitAt("a", "m", tc.second, early).Allowed {
				t.Fatalf("admitted before RetryAfter %v", d.RetryAfter)
			}
			if !l.AdmitAt("a", "m", tc.second, c.now().Add(d.RetryAfter+time.Millisecond)).Allowed {
				t.Fatalf("still refused after RetryAfter %v", d.RetryAfter)
			}
		})
	}
}

func TestMaxScopesFailsOpen(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 10}, MaxScopes: 2}, c)
	for _, k := range []string{"a", "b"} {
		if !l.AdmitAt(k, "m", 10, c.now()).Allowed {
			t.Fatalf("%s refused", k)
		}
	}
	for i := 0; i < 3; i++ {
		if !l.AdmitAt("c", "m", 10, c.now()).Allowed {
			t.Fatal("untracked scope refused")
		}
	}
	if l.AdmitAt("a", "m", 10, c.now()).Allowed {
		t.Fatal("tracked scope lost its count")
	}
	// Two windows later a and b are idle and get swept; c is tracked again.
	c.add(2 * time.Minute)
	for i, want := range []bool{true, false} {
		if got := l.AdmitAt("c", "m", 10, c.now()).Allowed; got != want {
			t.Fatalf("after sweep, admit %d = %v, want %v", i, got, want)
		}
	}
}

func TestConfigValidateListsEveryProblem(t *testing.T) {
	_, err := New(Config{
		Window: time.Millisecond, MaxScopes: -1, MaxOrigins: -2,
		PerKey: Limits{InputTokens: -1}, Models: map[string]Limits{"m": {OutputTokens: -5}},
	})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"window", "max_scopes", "max_origins", "per_key", "models[m]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestConcurrentAdmitRespectsLimit(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				if _, ok := l.Admit("a", "m", 7); ok {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 1000/7 {
		t.Fatalf("admitted %d requests of 7 tokens under a 1000 limit, want %d", admitted, 1000/7)
	}
}

func BenchmarkAdmitObserve(b *testing.B) {
	l, err := New(Config{PerKey: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}, PerModel: Limits{InputTokens: 1 << 50}})
	if err != nil {
		b.Fatal(err)
	}
	keys := []string{"alice", "bob", "carol", "dave"}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := keys[i&3]
		if _, ok := l.Admit(k, "llama-3-8b", 2176); !ok {
			b.Fatal("refused")
		}
		l.Observe(k, "llama-3-8b", 64)
	}
}

func BenchmarkAdmitParallel(b *testing.B) {
	l, err := New(Config{PerKey: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Admit("alice", "llama-3-8b", 2176)
		}
	})
}

func TestCollectorsRegisterAndCount(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 10}}, c)
	reg := prometheus.NewRegistry()
	if err := registerAll(reg, l.Collectors()); err != nil {
		t.Fatal(err)
	}
	l.AdmitAt("a", "m", 10, c.now())
	l.AdmitAt("a", "m", 10, c.now())
	if got := counterValue(t, l.metrics.limitedBy[0][0]); got != 1 {
		t.Fatalf("limited{key,input} = %v, want 1", got)
	}
	if got := counterValue(t, l.metrics.allowed); got != 1 {
		t.Fatalf("allowed = %v, want 1", got)
	}
}

func registerAll(reg *prometheus.Registry, cs []prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
