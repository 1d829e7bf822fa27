package autoscale

import (
	"testing"
	"time"
)

// TestReconfigureKeepsRoleState: an edit of the policy (here only max 6 ->
// 7) keeps the surviving role's cool-down and windows, so the idle role is
// not halved at the next step; a role the edit adds starts empty and one it
// drops is no longer decided.
func TestReconfigureKeepsRoleState(t *testing.T) {
	p := policy(map[string]RolePolicy{"decode": waitingRole(1, 6), "prefill": waitingRole(1, 6)})
	p.DownCooldown = 300 * time.Second
	a, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	obs := func(cur int32, waiting float64) map[string]Observation {
		return map[string]Observation{"decode": {Current: cur, Metrics: map[string]float64{WaitingRequests: waiting}}}
	}
	if d := a.Step(t0, obs(3, 60), nil).Roles["decode"]; d.Desired != 6 {
		t.Fatalf("scale-up: %+v", d)
	}
	if d := a.Step(t0.Add(70*time.Second), obs(6, 0), nil).Roles["decode"]; d.Desired != 6 {
		t.Fatalf("within the cool-down: %+v", d)
	}
	q := policy(map[string]RolePolicy{"decode": waitingRole(1, 7), "mixed": waitingRole(1, 4)})
	q.DownCooldown = 300 * time.Second
	if err := a.Reconfigure(q); err != nil {
		t.Fatal(err)
	}
	res := a.Step(t0.Add(75*time.Second), map[string]Observation{
		"decode":  {Current: 6, Metrics: map[string]float64{WaitingRequests: 0}},
		"prefill": {Current: 2, Metrics: map[string]float64{WaitingRequests: 0}},
		"mixed":   {Current: 4, Metrics: map[string]float64{WaitingRequests: 0}},
	}, nil)
	if d := res.Roles["decode"]; d.Desired != 6 || d.Reason != "scale-down cool-down" {
		t.Errorf("decode after the edit: %+v, want 6 held by the cool-down", d)
	}
	if d := res.Roles["mixed"]; d.Desired != 2 {
		t.Errorf("the new role: %+v, want 4 -> 2 (fresh state, no cool-down)", d)
	}
	if _, ok := res.Roles["prefill"]; ok {
		t.Error("a role the edit dropped is still decided")
	}
	bad := q
	bad.PanicWindow = 2 * bad.StableWindow
	if err := a.Reconfigure(bad); err == nil {
		t.Error("an invalid policy was taken")
	}
	if a.p.StableWindow != q.StableWindow || a.p.PanicWindow != q.PanicWindow {
		t.Error("an invalid policy changed the autoscaler")
	}
}

// TestSeedLastScale: a new autoscaler seeded with the last scale time (a
// restart) keeps the scale-down cool-down; unseeded, one idle sample
// halves the role.
func TestSeedLastScale(t *testing.T) {
	p := policy(map[string]RolePolicy{"decode": waitingRole(1, 6)})
	p.DownCooldown = 300 * time.Second
	t0 := time.Unix(1000, 0)
	idle := map[string]Observation{"decode": {Current: 6, Metrics: map[string]float64{WaitingRequests: 0}}}
	a, _ := New(p)
	if d := a.Step(t0.Add(50*time.Second), idle, nil).Roles["decode"]; d.Desired != 3 {
		t.Fatalf("unseeded: %+v, want 3", d)
	}
	b, _ := New(p)
	b.SeedLastScale(t0, t0)
	if d := b.Step(t0.Add(50*time.Second), idle, nil).Roles["decode"]; d.Desired != 6 {
		t.Errorf("seeded 50 s after the last scale: %+v, want 6 (cool-down 300 s)", d)
	}
	if d := b.Step(t0.Add(301*time.Second), idle, nil).Roles["decode"]; d.Desired != 3 {
		t.Errorf("after the cool-down: %+v, want 3", d)
	}
}

// TestSeedLastScaleFromAClockAhead: a lastScaleTime in the future (written
// by a leader whose clock was an hour ahead) counts as the seed's now, so
// the cool-down ends 300 s later, not an hour and 300 s later (tester
// h-clock); one in the past is taken as is.
func TestSeedLastScaleFromAClockAhead(t *testing.T) {
	p := policy(map[string]RolePolicy{"decode": waitingRole(1, 6)})
	p.DownCooldown = 300 * time.Second
	now := time.Unix(100_000, 0)
	idle := map[string]Observation{"decode": {Current: 6, Metrics: map[string]float64{WaitingRequests: 0}}}
	a, _ := New(p)
	a.SeedLastScale(now.Add(time.Hour), now)
	if d := a.Step(now.Add(299*time.Second), idle, nil).Roles["decode"]; d.Desired != 6 || d.Reason != "scale-down cool-down" {
		t.Fatalf("299 s after the seed: %+v, want 6 held by the cool-down", d)
	}
	if d := a.Step(now.Add(301*time.Second), idle, nil).Roles["decode"]; d.Desired != 3 {
		t.Fatalf("301 s after the seed: %+v, want 3 (the cool-down ended)", d)
	}
	b, _ := New(p)
	b.SeedLastScale(now.Add(-100*time.Second), now)
	if d := b.Step(now.Add(201*time.Second), idle, nil).Roles["decode"]; d.Desired != 3 {
		t.Fatalf("a last scale 100 s before the seed, 201 s after it: %+v, want 3", d)
	}
}
