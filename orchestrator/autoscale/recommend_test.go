package autoscale

import (
	"strings"
	"testing"
	"time"
)

func TestRecommend(t *testing.T) {
	waiting := []Target{{WaitingRequests, 4}}
	cases := []struct {
		name     string
		current  int32
		targets  []Target
		observed map[string]float64
		want     int32
	}{
		{"total over per-replica target", 2, waiting, map[string]float64{WaitingRequests: 20}, 5},
		{"within tolerance keeps current", 4, waiting, map[string]float64{WaitingRequests: 17}, 4},
		{"just outside tolerance", 4, waiting, map[string]float64{WaitingRequests: 18}, 5},
		{"average metric", 4, []Target{{KVUsage, 0.8}}, map[string]float64{KVUsage: 0.4}, 2},
		{"max over metrics", 2, []Target{{WaitingRequests, 4}, {KVUsage, 0.5}}, map[string]float64{WaitingRequests: 4, KVUsage: 1}, 4},
		{"no observation keeps current", 3, waiting, map[string]float64{}, 3},
		{"from zero with load", 0, waiting, map[string]float64{WaitingRequests: 1}, 1},
		{"from zero, average metric has no signal", 0, []Target{{KVUsage, 0.5}}, map[string]float64{KVUsage: 0}, 0},
		{"idle scales to zero", 3, waiting, map[string]float64{WaitingRequests: 0}, 0},
		{"latency percentile", 2, []Target{{TTFTP90, 0.5}}, map[string]float64{TTFTP90: 1.2}, 5},
	}
	for _, c := range cases {
		if got := Recommend(c.current, c.targets, c.observed, 0.1); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func policy(roles map[string]RolePolicy) Policy {
	p := DefaultPolicy()
	p.StableWindow, p.PanicWindow, p.DownCooldown = 60*time.Second, 10*time.Second, 120*time.Second
	p.Roles = roles
	return p
}

func waitingRole(min, max int32) RolePolicy {
	return RolePolicy{Bounds: Bounds{min, max}, Targets: []Target{{WaitingRequests, 10}}}
}

// run steps every 5 s with the load function, applying each decision as the
// next current, and returns the replicas after each step.
func run(t *testing.T, a *Autoscaler, steps int, start map[string]int32, load func(i int) map[string]float64) []map[string]int32 {
	t.Helper()
	cur := start
	var out []map[string]int32
	t0 := time.Unix(0, 0)
	for i := range steps {
		obs := map[string]Observation{}
		l := load(i)
		for r, c := range cur {
			obs[r] = Observation{Current: c, Metrics: map[string]float64{WaitingRequests: l[r]}}
		}
		res := a.Step(t0.Add(time.Duration(i)*5*time.Second), obs, nil)
		next := map[string]int32{}
		for r, d := range res.Roles {
			next[r] = d.Desired
		}
		cur = next
		out = append(out, next)
	}
	return out
}

func TestStepRateLimitsAndBounds(t *testing.T) {
	a, err := New(policy(map[string]RolePolicy{"d": waitingRole(1, 20)}))
	if err != nil {
		t.Fatal(err)
	}
	// A sudden 100× load: panic mode, but each step at most doubles.
	got := run(t, a, 6, map[string]int32{"d": 1}, func(int) map[string]float64 { return map[string]float64{"d": 1000} })
	want := []int32{2, 4, 8, 16, 20, 20}
	for i, w := range want {
		if got[i]["d"] != w {
			t.Fatalf("step %d: %d replicas, want %d (all: %v)", i, got[i]["d"], w, got)
		}
	}
}

func TestStepPanicNeverScalesDownAndCooldown(t *testing.T) {
	a, _ := New(policy(map[string]RolePolicy{"d": waitingRole(0, 50)}))
	// 4 steps of a burst, then idle.
	got := run(t, a, 40, map[string]int32{"d": 2}, func(i int) map[string]float64 {
		if i < 4 {
			return map[string]float64{"d": 80}
		}
		return map[string]float64{"d": 0}
	})
	peak := int32(0)
	for i, g := range got {
		peak = max(peak, g["d"])
		// Panic holds for the stable window (60 s = 12 steps) and the
		// cool-down for 120 s (24 steps) after the last scale-up.
		if i < 24 && g["d"] < peak {
			t.Fatalf("step %d: scaled down to %d from %d during panic or cool-down", i, g["d"], peak)
		}
	}
	if peak != 8 {
		t.Errorf("peak %d, want 8 (80 waiting / 10 per replica)", peak)
	}
	last := got[len(got)-1]["d"]
	if last >= peak {
		t.Errorf("never scaled down after the cool-down: %v", got)
	}
	for i := 1; i < len(got); i++ {
		if p, c := got[i-1]["d"], got[i]["d"]; c < p && c < p/2 {
			t.Fatalf("step %d: %d -> %d breaks the scale-down rate", i, p, c)
		}
	}
}

// TestStepUnobservedRoleHolds: a role no metric observes holds its replicas,
// also after a scale by hand (4 -> 1): its old size is no demand, so no panic
// takes it back up; its bounds still apply.
func TestStepUnobservedRoleHolds(t *testing.T) {
	a, _ := New(policy(map[string]RolePolicy{"d": waitingRole(1, 8)}))
	t0 := time.Unix(0, 0)
	step := func(i int, current int32) Decision {
		t.Helper()
		return a.Step(t0.Add(time.Duration(i)*5*time.Second), map[string]Observation{"d": {Current: current}}, nil).Roles["d"]
	}
	for i := range 6 {
		if d := step(i, 4); d.Desired != 4 {
			t.Fatalf("step %d at 4: %+v, want held", i, d)
		}
	}
	for i := 6; i < 30; i++ {
		if d := step(i, 1); d.Desired != 1 {
			t.Fatalf("step %d after a scale by hand to 1: %+v, want held", i, d)
		}
	}
	if d := step(30, 0); d.Desired != 1 || !strings.Contains(d.Reason, "bounds") {
		t.Errorf("below its min: %+v, want 1 (bounds)", d)
	}
}

// TestStepRatioOscillationGuard: a steady load that alone would settle the
// roles outside the band; with the band they settle and then never change
// (the ratio's raise counts as a scale-up, so the cool-down stops the
// raised role's own metric from lowering it back each step).
func TestStepRatioOscillationGuard(t *testing.T) {
	p := policy(map[string]RolePolicy{"p": waitingRole(0, 10), "d": waitingRole(0, 10)})
	p.Ratio = &Ratio{Numerator: "p", Denominator: "d", Min: 0.5, Max: 1}
	a, _ := New(p)
	got := run(t, a, 80, map[string]int32{"p": 1, "d": 1}, func(int) map[string]float64 {
		return map[string]float64{"p": 10, "d": 60} // p wants 1, d wants 6: ratio 1/6 < 0.5
	})
	final := got[len(got)-1]
	if final["d"] != 6 || final["p"] != 3 {
		t.Fatalf("settled at %v, want p=3 d=6", final)
	}
	changes := 0
	for i := 1; i < len(got); i++ {
		if got[i]["p"] != got[i-1]["p"] || got[i]["d"] != got[i-1]["d"] {
			changes++
		}
		q := float64(got[i]["p"]) / float64(got[i]["d"])
		if q < 0.5-1e-9 || q > 1+1e-9 {
			t.Fatalf("step %d: ratio %v outside the band: %v", i, q, got[i])
		}
	}
	if changes > 4 {
		t.Errorf("%d changes over %d steps of a steady load: oscillating (%v)", changes, len(got), got)
	}
}

func TestStepRoleAtZeroAndBothAtZero(t *testing.T) {
	p := policy(map[string]RolePolicy{"p": waitingRole(0, 10), "d": waitingRole(0, 10)})
	p.Ratio = &Ratio{Numerator: "p", Denominator: "d", Min: 0.5, Max: 2}
	a, _ := New(p)
	// Idle: both stay at zero.
	got := run(t, a, 3, map[string]int32{"p": 0, "d": 0}, func(int) map[string]float64 { return map[string]float64{} })
	if got[2]["p"] != 0 || got[2]["d"] != 0 {
		t.Fatalf("idle: %v, want both at zero", got[2])
	}
	// Load only on decode: prefill is seeded beside it.
	a, _ = New(p)
	got = run(t, a, 2, map[string]int32{"p": 0, "d": 0}, func(int) map[string]float64 { return map[string]float64{"d": 10} })
	if got[0]["d"] != 1 || got[0]["p"] != 1 {
		t.Fatalf("decode load from zero: %v, want p=1 d=1", got[0])
	}
}

func TestPolicyValidate(t *testing.T) {
	p := DefaultPolicy()
	p.Roles = map[string]RolePolicy{"a": {Bounds: Bounds{3, 2}}}
	p.Ratio = &Ratio{Numerator: "a", Denominator: "missing", Min: 1, Max: 2}
	p.PanicThreshold = 1
	if _, err := New(p); err == nil {
		t.Fatal("invalid policy accepted")
	}
}
