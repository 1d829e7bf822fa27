package autoscale

import (
	"strings"
	"testing"
	"time"
)

// stepBudget takes one step of a fresh autoscaler over roles at cur with
// waiting requests (target 10 per replica, rate limits off) within b.
func stepBudget(t *testing.T, roles map[string]RolePolicy, cur map[string]int32, waiting map[string]float64, b *PodBudget) Result {
	t.Helper()
	p := policy(roles)
	p.MaxUpRate = 1e9
	a, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	obs := map[string]Observation{}
	for r, c := range cur {
		obs[r] = Observation{Current: c, Metrics: map[string]float64{WaitingRequests: waiting[r]}}
	}
	return a.StepWithin(time.Unix(0, 0), obs, nil, b)
}

// TestStepWithinPodBudget: the report's ModelDeployment of 11 groups, a
// decode role with maxReplicas 950 under a demand far above it, beside a
// prefill role the policy does not scale (1 replica, 11 pods): 950 × 11
// pods is over the 10000 a ModelDeployment may have (its controller
// freezes it: TooManyPods). Within the budget decode goes to 908 (9988 +
// 11 pods), says why, and a deployment already over it (frozen at 950) is
// brought back under it.
func TestStepWithinPodBudget(t *testing.T) {
	roles := map[string]RolePolicy{"decode": waitingRole(1, 950)}
	b := &PodBudget{Limit: 10000, PerReplica: map[string]int64{"decode": 11, "prefill": 11}, Of: "ModelDeployment h0"}
	for _, from := range []int32{11, 950} {
		res := stepBudget(t, roles, map[string]int32{"decode": from, "prefill": 1}, map[string]float64{"decode": 1e6}, b)
		d := res.Roles["decode"]
		if d.Desired != 908 || !strings.Contains(d.Reason, "pod budget: ModelDeployment h0 holds at most 10000 pods") {
			t.Errorf("from %d: %+v, want 908 (pod budget)", from, d)
		}
		if res.Budget == nil || !res.Budget.Limited || res.Budget.Infeasible || res.Budget.Pods != 9999 {
			t.Errorf("from %d: budget %+v, want limited at 9999 pods", from, res.Budget)
		}
	}
	// Without a budget (Step) decode would have gone to 950.
	p := policy(roles)
	p.MaxUpRate = 1e9
	a, _ := New(p)
	if d := a.Step(time.Unix(0, 0), map[string]Observation{"decode": {Current: 11, Metrics: map[string]float64{WaitingRequests: 1e6}}}, nil).Roles["decode"]; d.Desired != 950 {
		t.Fatalf("without a budget: %+v, want 950", d)
	}
	// Within it, nothing is lowered.
	res := stepBudget(t, roles, map[string]int32{"decode": 11, "prefill": 1}, map[string]float64{"decode": 500}, b)
	if d := res.Roles["decode"]; d.Desired != 50 || strings.Contains(d.Reason, "pod budget") || res.Budget.Limited || res.Budget.Pods != 561 {
		t.Errorf("within the budget: %+v %+v, want 50 and not limited", d, res.Budget)
	}
}

// TestStepWithinPodBudgetShares: two roles rising together share what is
// left in proportion to their growth (the ratio between them is kept), and
// a role at the budget that would rise stays where it is, which is no
// scale-up (no cool-down starts).
func TestStepWithinPodBudgetShares(t *testing.T) {
	roles := map[string]RolePolicy{"p": waitingRole(1, 100), "d": waitingRole(1, 100)}
	b := &PodBudget{Limit: 100, PerReplica: map[string]int64{"p": 5, "d": 5}, Of: "ModelDeployment m"}
	res := stepBudget(t, roles, map[string]int32{"p": 2, "d": 4}, map[string]float64{"p": 100, "d": 200}, b)
	// p 2 -> 10, d 4 -> 20: 150 pods; 70 left beside the 30 they have, for
	// 120 pods of growth: 7/12 of each one's (rounded down).
	if p, d := res.Roles["p"].Desired, res.Roles["d"].Desired; p != 6 || d != 13 {
		t.Errorf("p=%d d=%d, want 6 and 13 (95 pods)", p, d)
	}
	res = stepBudget(t, roles, map[string]int32{"p": 10, "d": 10}, map[string]float64{"p": 1000, "d": 1000}, b)
	if p, d := res.Roles["p"], res.Roles["d"]; p.Desired != 10 || d.Desired != 10 || res.ScaledUpAny {
		t.Errorf("at the budget: %+v %+v scaled up %v, want both held at 10 and no scale-up", p, d, res.ScaledUpAny)
	}
}

// TestStepWithinPodBudgetInfeasible: roles whose minReplicas alone do not
// fit are held at their mins, and the result says so.
func TestStepWithinPodBudgetInfeasible(t *testing.T) {
	roles := map[string]RolePolicy{"d": waitingRole(3, 10)}
	b := &PodBudget{Limit: 100, PerReplica: map[string]int64{"d": 40}, Of: "ModelDeployment m"}
	res := stepBudget(t, roles, map[string]int32{"d": 5}, map[string]float64{"d": 100}, b)
	if d := res.Roles["d"]; d.Desired != 3 || !res.Budget.Infeasible || !strings.Contains(d.Reason, "minReplicas") {
		t.Errorf("%+v %+v, want 3 (its min), infeasible", d, res.Budget)
	}
}
