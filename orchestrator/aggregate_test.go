package orchestrator

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// sloBlobs is an SLOSource holding fixed summaries.
type sloBlobs map[string][]byte

func (b sloBlobs) AppStates(name string) map[string][]byte {
	if name != SLOStateName {
		return nil
	}
	return b
}

// TestSLOAggregateBelowReadsDecodeEngines: with aggregateBelow the prefill
// demand and TTFT include the requests the ingresses recorded on decode
// engines (served whole there), so a prefill role at zero still sees its
// load; without it only the prefill engines count. The sizing reaches the
// autoscaler and the condition says prefill is aggregated.
func TestSLOAggregateBelowReadsDecodeEngines(t *testing.T) {
	sum, err := json.Marshal(sloSummary{Version: 1, WindowSeconds: 1, Engines: []sloEngine{
		{ID: "dec-0", TTFT: 0.2, TTFTN: 10, TPOT: 0.02, TPOTN: 10, PromptTokens: 300},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{cfg: Config{SLO: sloBlobs{"ingress-1": sum}}}
	targets := map[string]roleTarget{"prefill": {current: 0}, "decode": {current: 1, engines: []string{"dec-0"}}}
	engines := map[string]gossip.EngineView{}
	for _, v := range []float64{0, 0.8} {
		ap := sloPolicy()
		ap.Spec.Roles[0].MinReplicas = 0
		ap.Spec.SLO.AggregateBelow = v
		obs := observe(targets, engines)
		pc := &policyConds{}
		in := c.observeSLO(ap, targets, engines, obs, pc)
		if in == nil {
			t.Fatal("no SLO observation")
		}
		wantTok, wantTTFT := 0.0, 0.0
		if v > 0 {
			wantTok, wantTTFT = 300, 0.2
		}
		if in.PromptTokensPerSecond != wantTok || in.MeasuredTTFT != wantTTFT {
			t.Errorf("aggregateBelow %v: prompt tokens/s %v, TTFT %v; want %v and %v", v, in.PromptTokensPerSecond, in.MeasuredTTFT, wantTok, wantTTFT)
		}
		p := PolicyFromSpec(&ap.Spec)
		if p.SLO.AggregateBelow != v {
			t.Fatalf("PolicyFromSpec: aggregateBelow %v, want %v", p.SLO.AggregateBelow, v)
		}
		a, err := autoscale.New(p)
		if err != nil {
			t.Fatal(err)
		}
		res := a.Step(time.Unix(1000, 0), obs, in)
		sloCondition(pc, ap.Spec.SLO, in, res)
		cnd := meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionSLOAtRisk)
		// 300 tok/s ÷ 1000 = 0.3 prefill and no streams: within 0.8.
		if got := res.SLO.Aggregated; got != (v > 0) || cnd == nil || strings.Contains(cnd.Message, "aggregated on decode") != got {
			t.Errorf("aggregateBelow %v: aggregated %v, condition %+v", v, got, cnd)
		}
	}
}

// TestSLOAtRiskAggregatedOnlyAtZero: SLOAtRisk's message says "aggregated
// on decode" only when the prefill role's decision is zero; with the load
// within aggregateBelow but the role held at 1 (its minReplicas) it says
// the role is held, not that its load runs on decode (h-orchagg F4 note).
func TestSLOAtRiskAggregatedOnlyAtZero(t *testing.T) {
	sum, err := json.Marshal(sloSummary{Version: 1, WindowSeconds: 1, Engines: []sloEngine{
		{ID: "dec-0", TTFT: 0.2, TTFTN: 10, TPOT: 0.02, TPOTN: 10, PromptTokens: 300},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := &Controller{cfg: Config{SLO: sloBlobs{"ingress-1": sum}}}
	for _, min := range []int32{0, 1} {
		targets := map[string]roleTarget{"prefill": {current: min}, "decode": {current: 1, engines: []string{"dec-0"}}}
		ap := sloPolicy()
		ap.Spec.Roles[0].MinReplicas = min
		ap.Spec.SLO.AggregateBelow = 0.8
		obs := observe(targets, map[string]gossip.EngineView{})
		pc := &policyConds{}
		in := c.observeSLO(ap, targets, nil, obs, pc)
		a, err := autoscale.New(PolicyFromSpec(&ap.Spec))
		if err != nil {
			t.Fatal(err)
		}
		res := a.Step(time.Unix(1000, 0), obs, in)
		sloCondition(pc, ap.Spec.SLO, in, res)
		cnd := meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionSLOAtRisk)
		if res.SLO == nil || !res.SLO.Aggregated || cnd == nil {
			t.Fatalf("min %d: SLO %+v, condition %+v; want the load aggregated and a condition", min, res.SLO, cnd)
		}
		if got := res.Roles["prefill"].Desired; got != min {
			t.Fatalf("min %d: prefill desired %d", min, got)
		}
		if agg, held := strings.Contains(cnd.Message, "aggregated on decode"), strings.Contains(cnd.Message, "held at 1"); agg != (min == 0) || held != (min == 1) {
			t.Errorf("min %d: message %q", min, cnd.Message)
		}
	}
}

// TestAggregateBelowRefusedForSGLang: an SGLang decode server cannot serve
// whole requests, so a policy with aggregateBelow on an sglang
// ModelDeployment is invalid (and says why); vLLM, or aggregateBelow 0, is
// fine.
func TestAggregateBelowRefusedForSGLang(t *testing.T) {
	for _, c := range []struct {
		engine  v1alpha1.EngineKind
		agg     float64
		refused bool
	}{{v1alpha1.EngineSGLang, 0.8, true}, {v1alpha1.EngineSGLang, 0, false}, {v1alpha1.EngineVLLM, 0.8, false}} {
		ap := sloPolicy()
		ap.Spec.SLO.AggregateBelow = c.agg
		md := &v1alpha1.ModelDeployment{}
		md.Name = "m"
		md.Spec.Engine = c.engine
		err := aggregateEngine(ap, md)
		if (err != nil) != c.refused {
			t.Errorf("%s, aggregateBelow %v: %v, want refused %v", c.engine, c.agg, err, c.refused)
		}
		if err != nil && (err.reason != reasonInvalidPolicy || !strings.Contains(err.msg, "sglang")) {
			t.Errorf("%s: reason %q message %q", c.engine, err.reason, err.msg)
		}
	}
}
