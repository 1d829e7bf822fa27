package orchestrator

import (
	"math"
	"strconv"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/learn/learntest"
)

func sloPolicy() *v1alpha1.AutoscalingPolicy {
	return &v1alpha1.AutoscalingPolicy{Spec: v1alpha1.AutoscalingPolicySpec{
		Roles: []v1alpha1.RoleAutoscaling{{Name: "prefill", MinReplicas: 1, MaxReplicas: 8}, {Name: "decode", MinReplicas: 1, MaxReplicas: 8}},
		SLO: &v1alpha1.SLOTarget{PrefillRole: "prefill", DecodeRole: "decode", TTFTMilliseconds: 500, TPOTMilliseconds: 50,
			PrefillTokensPerSecond: 1000, DecodeStreamsPerReplica: 8},
	}}
}

// TestSLOInputsFromTwoIngresses: two ingress-like gossip members on
// loopback memberlist record requests with the ingress's own recorder and
// publish its summary; the orchestrator, a third member, merges them per
// role weighted by count, sums the prompt tokens/s, takes the running
// streams from the decode engines' gossip, and the SLO mode sizes both roles.
func TestSLOInputsFromTwoIngresses(t *testing.T) {
	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	in1 := gossipNode(t, "ingress-1", gossip.RoleIngress, orch.Addr())
	in2 := gossipNode(t, "ingress-2", gossip.RoleIngress, orch.Addr())
	side := gossipNode(t, "sidecar", gossip.RoleSidecar, orch.Addr())
	side.SetEngine(gossip.EngineState{ID: "dec-0", Model: "m", EngineRole: "decode", Running: 30})
	side.SetEngine(gossip.EngineState{ID: "dec-1", Model: "m", EngineRole: "decode", Running: 10})

	cfg := ingress.SLOConfig{Interval: time.Second, Windows: 10} // the summary covers 1 s: counts become rates
	r1, r2 := ingress.NewSLORecorder(cfg), ingress.NewSLORecorder(cfg)
	for range 30 { // ingress 1: 30 P/D requests, TTFT 200 ms, TPOT 20 ms
		r1.Observe("pre-0", "dec-0", 200*time.Millisecond, 20*time.Millisecond, 1000)
	}
	for range 10 { // ingress 2: 10 slow ones, TTFT 1 s, TPOT 100 ms
		r2.Observe("pre-0", "dec-1", time.Second, 100*time.Millisecond, 2000)
	}
	r2.Observe("other-engine", "other-engine", time.Minute, time.Second, 1) // not in any role
	now := time.Now()
	if err := r1.Tick(now, in1); err != nil {
		t.Fatal(err)
	}
	if err := r2.Tick(now, in2); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to hold both summaries and both engines", func() bool {
		return len(orch.AppStates(SLOStateName)) == 2 && len(orch.Engines()) == 2
	})

	c := &Controller{cfg: Config{SLO: orch}}
	targets := map[string]roleTarget{"prefill": {current: 1, engines: []string{"pre-0"}}, "decode": {current: 1, engines: []string{"dec-0", "dec-1"}}}
	engines := map[string]gossip.EngineView{}
	for _, v := range orch.Engines() {
		engines[v.ID] = v
	}
	obs := observe(targets, engines)
	pc := &policyConds{}
	ap := sloPolicy()
	in := c.observeSLO(ap, targets, engines, obs, pc)
	if in == nil {
		t.Fatal("no SLO observation")
	}
	// Weighted by count: (30 × ~0.2 + 10 × ~1.0) / 40 ≈ 0.4 s; bucket error ≤ 25 %.
	near := func(got, want float64) bool { return math.Abs(got-want) <= 0.25*want }
	if !near(in.MeasuredTTFT, 0.4) || !near(in.MeasuredTPOT, 0.04) {
		t.Errorf("measured TTFT %v, TPOT %v; want ≈ 0.4 and 0.04", in.MeasuredTTFT, in.MeasuredTPOT)
	}
	if in.PromptTokensPerSecond != 50000 || in.RunningStreams != 40 {
		t.Errorf("prompt tokens/s %v (want 50000), running streams %v (want 40)", in.PromptTokensPerSecond, in.RunningStreams)
	}
	if v := obs["prefill"].Metrics[autoscale.TTFTP90]; !near(v, 0.4) {
		t.Errorf("prefill ttftP90Seconds metric %v", v)
	}
	a, err := autoscale.New(PolicyFromSpec(&ap.Spec))
	if err != nil {
		t.Fatal(err)
	}
	res := a.Step(now, obs, in)
	sloCondition(pc, ap.Spec.SLO, in, res)
	// 50000 tok/s ÷ 1000 per replica × TTFT correction (≈ 0.4/0.5) and
	// 40 streams ÷ 8 × TPOT correction (≈ 0.04/0.05).
	if res.SLO == nil || res.SLO.Prefill < 35 || res.SLO.Prefill > 50 || res.SLO.Decode < 4 || res.SLO.Decode > 5 {
		t.Errorf("SLO sizing %+v: want prefill ≈ 40, decode 4-5", res.SLO)
	}
	if cnd := meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionSLOAtRisk); cnd == nil || cnd.Status != metav1.ConditionFalse {
		t.Errorf("SLOAtRisk %+v, want False (0.4 s < 0.5 s, 40 ms < 50 ms)", cnd)
	}

	// An ingress leaves: its summary goes with it.
	_ = in2.Close()
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to drop the leaver's summary", func() bool {
		return len(orch.AppStates(SLOStateName)) == 1
	})
	in = c.observeSLO(ap, targets, engines, observe(targets, engines), pc)
	if in == nil || !near(in.MeasuredTTFT, 0.2) || in.PromptTokensPerSecond != 30000 {
		t.Errorf("after the leave: %+v", in)
	}
}

// TestSLOLearnedPrefillThroughput: a policy without prefillTokensPerSecond
// sizes prefill from the prefill throughput the ingresses learned. Two
// ingress-like members on loopback memberlist each publish their TTFT
// summary and their learner's own sums (as ingress/learn_gossip.go does),
// each having measured one of the two prefill engines at 8,000 tokens/s;
// the orchestrator fits both shares, and the SLO mode plans each replica
// for 0.8 × 8,000. A share that does not decode is counted and skipped;
// with no share at all there is no SLO observation, and the condition says
// why.
func TestSLOLearnedPrefillThroughput(t *testing.T) {
	const rate = 8000.0
	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	members := []*gossip.Node{gossipNode(t, "ingress-1", gossip.RoleIngress, orch.Addr()), gossipNode(t, "ingress-2", gossip.RoleIngress, orch.Addr())}
	for i, m := range members {
		r := ingress.NewSLORecorder(ingress.SLOConfig{Interval: time.Second, Windows: 10})
		r.Observe("pre-"+strconv.Itoa(i), "dec-0", 200*time.Millisecond, 20*time.Millisecond, 11000) // 11,000 tokens/s each
		if err := r.Tick(time.Now(), m); err != nil {
			t.Fatal(err)
		}
		share, err := learntest.Share("pre-"+strconv.Itoa(i), rate)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetAppState(learn.StateName, share); err != nil {
			t.Fatal(err)
		}
	}
	junk := gossipNode(t, "ingress-3", gossip.RoleIngress, orch.Addr())
	if err := junk.SetAppState(learn.StateName, []byte("not a share")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to hold both summaries and three shares", func() bool {
		return len(orch.AppStates(SLOStateName)) == 2 && len(orch.AppStates(learn.StateName)) == 3
	})

	c := &Controller{cfg: Config{SLO: orch}}
	targets := map[string]roleTarget{"prefill": {current: 2, engines: []string{"pre-0", "pre-1"}}, "decode": {current: 1, engines: []string{"dec-0"}}}
	ap := sloPolicy()
	ap.Spec.SLO.PrefillTokensPerSecond = 0 // learned
	ap.Spec.SLO.RaiseOnly = true           // the 0.2 s TTFT, under target, does not shrink the sizing
	errsBefore := promtest.ToFloat64(learnShareErrors)
	pc := &policyConds{}
	obs := observe(targets, nil)
	in := c.observeSLO(ap, targets, nil, obs, pc)
	if in == nil {
		t.Fatal("no SLO observation")
	}
	if math.Abs(in.PrefillTokensPerReplica/rate-1) > 0.05 {
		t.Fatalf("learned prefill throughput %.0f tokens/s, want within 5 %% of %.0f", in.PrefillTokensPerReplica, rate)
	}
	if got := promtest.ToFloat64(learnShareErrors) - errsBefore; got != 1 {
		t.Errorf("%v share errors counted, want 1 (the junk)", got)
	}
	a, err := autoscale.New(PolicyFromSpec(&ap.Spec))
	if err != nil {
		t.Fatal(err)
	}
	res := a.Step(time.Now(), obs, in)
	// 22,000 prompt tokens/s ÷ (0.8 × ≈ 8,000) = 3.4 → 4 (3.3–3.6 for a
	// rate within 5 %).
	if res.SLO == nil || res.SLO.Prefill != 4 {
		t.Fatalf("SLO sizing %+v: want prefill 4 from the learned throughput", res.SLO)
	}
	ap.Spec.SLO.PrefillUtilizationPercent = 100
	if a, err = autoscale.New(PolicyFromSpec(&ap.Spec)); err != nil {
		t.Fatal(err)
	}
	if res = a.Step(time.Now(), obs, in); res.SLO == nil || res.SLO.Prefill != 3 { // 22,000 ÷ 8,000 = 2.75
		t.Fatalf("utilization 100 %%: SLO sizing %+v, want prefill 3", res.SLO)
	}

	// Without any share, no observation: the metric targets decide.
	c.cfg.SLO = onlyApp{name: SLOStateName, states: orch.AppStates(SLOStateName)}
	pc = &policyConds{}
	if in := c.observeSLO(ap, targets, nil, observe(targets, nil), pc); in != nil {
		t.Errorf("observation %+v without a learned throughput", in)
	}
	if cnd := meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionSLOAtRisk); cnd == nil || cnd.Reason != "NoThroughputSignal" {
		t.Errorf("condition %+v, want reason NoThroughputSignal", cnd)
	}
}

// onlyApp serves one app-state name's blobs (the others are absent).
type onlyApp struct {
	name   string
	states map[string][]byte
}

func (o onlyApp) AppStates(name string) map[string][]byte {
	if name == o.name {
		return o.states
	}
	return nil
}

// TestSLOWithoutSummariesHolds: no ingress gossips: no SLO observation (the
// metric targets decide), the condition says why.
func TestSLOWithoutSummariesHolds(t *testing.T) {
	c := &Controller{cfg: Config{SLO: staticSLO{"x": []byte(`{"v":2}`)}}}
	pc := &policyConds{}
	targets := map[string]roleTarget{"prefill": {current: 2}, "decode": {current: 2}}
	if in := c.observeSLO(sloPolicy(), targets, nil, observe(targets, nil), pc); in != nil {
		t.Errorf("observation %+v from no valid summary", in)
	}
	if cnd := meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionSLOAtRisk); cnd == nil || cnd.Reason != "NoLatencySignal" {
		t.Errorf("condition %+v", cnd)
	}
}

type staticSLO map[string][]byte

func (s staticSLO) AppStates(string) map[string][]byte { return s }

// FuzzSLOSummary: any gossiped blob decodes to a bounded summary or an
// error, and merging a decoded one yields finite values.
func FuzzSLOSummary(f *testing.F) {
	r := ingress.NewSLORecorder(ingress.SLOConfig{Interval: time.Second})
	r.Observe("p", "d", 100*time.Millisecond, 10*time.Millisecond, 64)
	f.Add(append([]byte(nil), r.Summary()...))
	for _, s := range []string{
		`{"v":1,"w":30,"e":[]}`, `{"v":1,"w":0,"e":[]}`, `{"v":1,"w":30,"e":[{"id":"","t":1}]}`,
		`{"v":1,"w":30,"e":[{"id":"a","t":-1}]}`, `{"v":1,"w":1e308,"e":null}`, `{"v":1,"w":30,"e":[{"id":"a","tn":18446744073709551615,"t":3600}]}`,
		`{"v":2}`, `null`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSLOSummary(b)
		if err != nil {
			return
		}
		ids := make([]string, 0, len(s.Engines))
		for _, e := range s.Engines {
			ids = append(ids, e.ID)
		}
		l := sloView{summaries: []sloSummary{s}}.merge(ids)
		for _, v := range []float64{l.ttft, l.tpot, l.promptTokensPerSec} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("merged %+v from %q", l, b)
			}
		}
	})
}

// TestPolicyFromSpecSLOAdapt: the AutoscalingPolicy's SLO refinements reach
// the autoscaler the controller steps (zero: off).
func TestPolicyFromSpecSLOAdapt(t *testing.T) {
	spec := sloPolicy().Spec
	spec.SLO.TTFTBaselineWindowSeconds, spec.SLO.LeadSeconds, spec.SLO.CorrectionWindowSeconds = 900, 90, 360
	p := PolicyFromSpec(&spec)
	if p.SLO == nil || p.SLO.Adapt.BaselineWindow != 15*time.Minute || p.SLO.Adapt.Lead != 90*time.Second || p.SLO.Adapt.CorrectionWindow != 6*time.Minute {
		t.Fatalf("SLO adapt %+v, want baseline 15m, lead 90s and correction window 6m", p.SLO)
	}
	spec.SLO.TTFTBaselineWindowSeconds, spec.SLO.LeadSeconds, spec.SLO.CorrectionWindowSeconds = 0, 0, 0
	if p := PolicyFromSpec(&spec); p.SLO.Adapt != (autoscale.SLOAdapt{}) || p.SLO.TTFTAim != 0 || p.SLO.MinCorrection != 0 {
		t.Fatalf("zero fields gave %+v, want the refinements off", p.SLO)
	}
	spec.SLO.TTFTAimPercent, spec.SLO.TPOTAimPercent, spec.SLO.RaiseOnly = 40, 60, true
	if p := PolicyFromSpec(&spec); p.SLO.TTFTAim != 0.4 || p.SLO.TPOTAim != 0.6 || p.SLO.MinCorrection != 1 {
		t.Fatalf("aims 40 / 60 %%, raise-only gave aims %v / %v, min correction %v; want 0.4, 0.6 and 1", p.SLO.TTFTAim, p.SLO.TPOTAim, p.SLO.MinCorrection)
	}
}

// TestPolicyFromSpecSLODefaults: an slo block without its targets gets the
// CRD's defaults (500 ms TTFT, 50 ms TPOT) however the spec was read. The
// local backend's reader has no API server to default it, and took 1 ms.
func TestPolicyFromSpecSLODefaults(t *testing.T) {
	spec := v1alpha1.AutoscalingPolicySpec{SLO: &v1alpha1.SLOTarget{PrefillRole: "p", DecodeRole: "d", DecodeStreamsPerReplica: 8}}
	p := PolicyFromSpec(&spec)
	if p.SLO == nil || p.SLO.TTFTSeconds != 0.5 || p.SLO.TPOTSeconds != 0.05 {
		t.Fatalf("SLO %+v, want the CRD's 0.5 s and 0.05 s", p.SLO)
	}
	spec.SLO.TTFTMilliseconds, spec.SLO.TPOTMilliseconds = 800, 40
	if p := PolicyFromSpec(&spec); p.SLO.TTFTSeconds != 0.8 || p.SLO.TPOTSeconds != 0.04 {
		t.Fatalf("SLO %+v, want the spec's 0.8 s and 0.04 s", p.SLO)
	}
}
