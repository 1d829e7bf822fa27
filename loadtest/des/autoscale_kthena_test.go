package des

import (
	"testing"
	"time"
)

func loads(waiting ...int) []EngineLoad {
	out := make([]EngineLoad, len(waiting))
	for i, w := range waiting {
		out[i] = EngineLoad{Waiting: w}
	}
	return out
}

func TestKthenaRecommend(t *testing.T) {
	role := KthenaRole{Min: 1, Max: 10, Targets: map[string]float64{KthenaWaiting: 4}}
	cases := []struct {
		name   string
		sig    RoleSignals
		want   int32
		wantOK bool
	}{
		{"at target", RoleSignals{Replicas: 2, Ready: 2, Loads: loads(4, 4)}, 2, true},
		{"within tolerance (ratio 1.0625)", RoleSignals{Replicas: 4, Ready: 4, Loads: loads(4, 4, 4, 5)}, 4, true},
		{"outside tolerance up", RoleSignals{Replicas: 2, Ready: 2, Loads: loads(6, 6)}, 3, true},
		{"scale down", RoleSignals{Replicas: 4, Ready: 4, Loads: loads(1, 1, 1, 1)}, 1, true},
		{"clamped to max", RoleSignals{Replicas: 2, Ready: 2, Loads: loads(40, 40)}, 10, true},
		{"below min returns min", RoleSignals{Replicas: 0}, 1, true},
		{"no ready pod: skip", RoleSignals{Replicas: 2, Ready: 0}, 0, false},
		// Starting pods count as idle when the ready ones ask for more:
		// 2 ready at 12 waiting each = 24; over 4 pods 6 each → ceil(1.5 × 4).
		{"unready pods dilute a scale-up", RoleSignals{Replicas: 4, Ready: 2, Loads: loads(12, 12)}, 6, true},
		// 2 ready at 5 each, 2 starting: over 4 pods 2.5 each, ratio flips
		// below 1: keep current.
		{"unready pods flip the direction: hold", RoleSignals{Replicas: 4, Ready: 2, Loads: loads(5, 5)}, 4, true},
		// Ready pods below target: the unready ones are ignored, and the
		// recommendation is from the ready count.
		{"scale-down ignores unready", RoleSignals{Replicas: 4, Ready: 2, Loads: loads(2, 2)}, 1, true},
	}
	for _, c := range cases {
		got, ok := KthenaRecommend(int32(c.sig.Replicas), role, c.sig, 0.1)
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: got %d ok=%v, want %d ok=%v", c.name, got, ok, c.want, c.wantOK)
		}
	}
}

func TestKthenaEnforceRatio(t *testing.T) {
	wide := KthenaRole{Min: 0, Max: 10}
	band := KthenaRatio{Min: 0.5, Max: 1}
	cases := []struct {
		name     string
		n, d     int32
		nr, dr   KthenaRole
		band     KthenaRatio
		wn, wd   int32
		adjusted bool
	}{
		{"inside", 2, 3, wide, wide, band, 2, 3, false},
		{"both zero stay", 0, 0, wide, wide, band, 0, 0, false},
		{"prefill zero seeded", 0, 2, wide, wide, band, 1, 2, true},
		{"decode zero seeded then raised", 3, 0, wide, wide, band, 3, 3, true},
		{"prefill lags: raised", 1, 6, wide, wide, band, 3, 6, true},
		{"decode lags: raised (scale-up bias)", 5, 2, wide, wide, band, 5, 5, true},
		{"prefill at max: decode lowered", 1, 6, KthenaRole{Min: 0, Max: 2}, wide, band, 2, 4, true},
		{"decode at max: prefill lowered", 9, 4, wide, KthenaRole{Min: 0, Max: 6}, band, 6, 6, true},
		{"inputs clamped first", 12, 12, wide, wide, band, 10, 10, false},
		{"infeasible bounds: unchanged", 1, 9, KthenaRole{Min: 0, Max: 1}, KthenaRole{Min: 5, Max: 10}, band, 1, 9, false},
	}
	for _, c := range cases {
		n, d, adj := KthenaEnforceRatio(c.n, c.d, c.nr, c.dr, c.band)
		if n != c.wn || d != c.wd || adj != c.adjusted {
			t.Errorf("%s: got %d/%d adjusted=%v, want %d/%d adjusted=%v", c.name, n, d, adj, c.wn, c.wd, c.adjusted)
		}
	}
}

// kthenaRun steps a Kthena on a per-step waiting load of its prefill role
// (decode held at target) every 15 s and returns the prefill replicas,
// with every decision applied at once and every pod ready.
func kthenaRun(t *testing.T, b KthenaBehavior, start int, load func(i int) int, steps int) []int {
	t.Helper()
	k, err := NewKthena(KthenaConfig{Behavior: b,
		Prefill: KthenaRole{Min: 1, Max: 100, Targets: map[string]float64{KthenaWaiting: 1}},
		Decode:  KthenaRole{Min: 1, Max: 100, Targets: map[string]float64{KthenaRunning: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	p := start
	var out []int
	for i := range steps {
		per := make([]int, p)
		for j := range per {
			per[j] = load(i) / p
			if j < load(i)%p {
				per[j]++
			}
		}
		sig := Signals{Prefill: RoleSignals{Replicas: p, Ready: p, Loads: loads(per...)},
			Decode: RoleSignals{Replicas: 1, Ready: 1, Loads: []EngineLoad{{Running: 10}}}}
		p, _ = k.Decide(time.Duration(i)*15*time.Second, &sig)
		out = append(out, p)
	}
	return out
}

func TestKthenaStableScaleUpRateLimit(t *testing.T) {
	b := DefaultKthenaBehavior()
	b.PanicThresholdPercent = 0 // no panic: the stable policy alone
	// 40 waiting in total, target 1 per pod: wants 40. Per 15 s period the
	// stable policy allows max(+1, +100 %) of the period's lowest value.
	got := kthenaRun(t, b, 2, func(int) int { return 40 }, 6)
	want := []int{4, 8, 16, 32, 40, 40}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("replicas %v, want %v", got, want)
		}
	}
}

func TestKthenaPanicJumpsAndHolds(t *testing.T) {
	b := DefaultKthenaBehavior()
	// Panic (recommended ≥ 200 % of current) jumps straight to the
	// recommendation (panic period 0: no limit) and never scales down
	// while it holds (60 s = 4 periods after the last trigger).
	got := kthenaRun(t, b, 2, func(i int) int {
		if i == 0 {
			return 40
		}
		return 4
	}, 30)
	if got[0] != 40 {
		t.Fatalf("panic did not jump: %v", got)
	}
	for i := 1; i <= 4; i++ {
		if got[i] < 40 {
			t.Fatalf("step %d: scaled down to %d during panic hold: %v", i, got[i], got)
		}
	}
	// After the hold, the 5-minute scale-down stabilization keeps the
	// highest recommendation (40, from step 0) until it expires at 300 s.
	for i := 5; i < 20; i++ {
		if got[i] != 40 {
			t.Fatalf("step %d (%ds): %d, want 40 within the scale-down stabilization window: %v", i, 15*i, got[i], got)
		}
	}
	if got[29] >= 40 || got[29] < 1 {
		t.Fatalf("never scaled down after the window: %v", got)
	}
}

func TestKthenaPanicPercentLimit(t *testing.T) {
	b := DefaultKthenaBehavior()
	b.PanicPeriod, b.PanicPercent = 15*time.Second, 100 // at most doubling per panic period
	got := kthenaRun(t, b, 2, func(int) int { return 64 }, 5)
	want := []int{4, 8, 16, 32, 64}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("replicas %v, want %v", got, want)
		}
	}
}

func TestKthenaToleranceHolds(t *testing.T) {
	b := DefaultKthenaBehavior()
	got := kthenaRun(t, b, 20, func(int) int { return 21 }, 3) // ratio 1.05: within tolerance, hold
	for _, g := range got {
		if g != 20 {
			t.Fatalf("moved within tolerance: %v", got)
		}
	}
}

func TestKthenaSkipsCycleWithoutMetrics(t *testing.T) {
	k, _ := NewKthena(KthenaConfig{Behavior: DefaultKthenaBehavior(),
		Prefill: KthenaRole{Min: 1, Max: 8, Targets: map[string]float64{KthenaWaiting: 1}},
		Decode:  KthenaRole{Min: 1, Max: 8, Targets: map[string]float64{KthenaRunning: 1}}})
	sig := Signals{Prefill: RoleSignals{Replicas: 2, Ready: 0}, Decode: RoleSignals{Replicas: 1, Ready: 1, Loads: []EngineLoad{{Running: 50}}}}
	p, d := k.Decide(0, &sig)
	if p != 2 || d != 1 || k.Skipped != 1 {
		t.Fatalf("got %d/%d skipped %d; want the cycle skipped", p, d, k.Skipped)
	}
}

func TestKthenaRatioAppliedAfterCorrection(t *testing.T) {
	k, _ := NewKthena(KthenaConfig{Behavior: DefaultKthenaBehavior(),
		Prefill: KthenaRole{Min: 1, Max: 20, Targets: map[string]float64{KthenaWaiting: 1}},
		Decode:  KthenaRole{Min: 1, Max: 20, Targets: map[string]float64{KthenaRunning: 10}}, Ratio: &KthenaRatio{Min: 0.5, Max: 1}})
	// Decode wants 8 (80 running / 10), prefill is idle: the band lifts
	// prefill to 4.
	sig := Signals{Prefill: RoleSignals{Replicas: 2, Ready: 2, Loads: loads(0, 0)},
		Decode: RoleSignals{Replicas: 2, Ready: 2, Loads: []EngineLoad{{Running: 40}, {Running: 40}}}}
	p, d := k.Decide(0, &sig)
	if d != 8 || p != 4 {
		t.Fatalf("got P/D %d/%d, want 4/8", p, d)
	}
}

func TestKthenaConfigValidate(t *testing.T) {
	if _, err := NewKthena(KthenaConfig{Prefill: KthenaRole{Min: 2, Max: 1}, Decode: KthenaRole{Max: 1}}); err == nil {
		t.Fatal("invalid config accepted")
	}
}
