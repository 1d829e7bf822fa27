package des

import (
	"context"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// scripted asks for fixed sizes from given times and records what it saw.
type scripted struct {
	steps []scriptStep
	seen  []seenSync
}

type scriptStep struct {
	at   time.Duration
	p, d int
}

type seenSync struct {
	at                  time.Duration
	pReady, dReady, dRe int
}

func (*scripted) Name() string    { return "scripted" }
func (*scripted) Setting() string { return "" }
func (s *scripted) Decide(now time.Duration, sig *Signals) (int, int) {
	s.seen = append(s.seen, seenSync{now, sig.Prefill.Ready, sig.Decode.Ready, sig.Decode.Replicas})
	p, d := sig.Prefill.Replicas, sig.Decode.Replicas
	for i := range s.steps {
		if now >= s.steps[i].at {
			p, d = s.steps[i].p, s.steps[i].d
		}
	}
	return p, d
}

func smallTrace(t *testing.T, seed uint64) []workload.Request {
	t.Helper()
	reqs, err := workload.Diurnal{Duration: 4 * time.Minute, PeakRate: 3, TroughRate: 1, Seed: seed,
		Mix: workload.LongPromptMix{Prefixes: 8, PrefixTokens: 256, OwnTokens: 512, OutputTokens: 32}}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func smallScaleConfig(p, d int) ScaleConfig {
	return ScaleConfig{PDConfig: PDConfig{Config: Config{Engine: engine.Config{Profile: mustProfile("7b-l40s"), GPUBlocks: 8000}},
		Roles: Roles{Prefill: p, Decode: d}}, StartupDelay: 60 * time.Second, SyncPeriod: 15 * time.Second}
}

func mustProfile(name string) engine.Profile {
	p, err := engine.LookupProfile(name)
	if err != nil {
		panic(err)
	}
	return p
}

// runScripted runs a scaleSim directly so the test can read its instances
// and flights afterwards.
func runScripted(t *testing.T, cfg ScaleConfig, reqs []workload.Request, as Autoscaler) (*scaleSim, ScaleResult) {
	t.Helper()
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := newScaleSim(&cfg, reqs, as)
	if err != nil {
		t.Fatal(err)
	}
	res := s.run(context.Background())
	if res.Completed+res.Failed != len(reqs) || res.Failed != 0 {
		t.Fatalf("completed %d failed %d of %d", res.Completed, res.Failed, len(reqs))
	}
	return s, res
}

func TestScaleUpWaitsForStartupAndCountsGPUTime(t *testing.T) {
	reqs := smallTrace(t, 1)
	as := &scripted{steps: []scriptStep{{at: 30 * time.Second, p: 2, d: 2}}}
	s, res := runScripted(t, smallScaleConfig(1, 1), reqs, as)
	if len(s.insts) != 4 {
		t.Fatalf("%d instances, want 4", len(s.insts))
	}
	for _, in := range s.insts[2:] {
		if in.requested != 30*time.Second {
			t.Fatalf("added engine requested at %v", in.requested)
		}
		// No request is sent to an engine before its start-up delay ends.
		for i, f := range s.flights {
			if (f.decode == in.slot || f.prefill == in.slot) && f.sent < in.requested+60*time.Second {
				t.Fatalf("request %d sent to %s at %v, before it was ready", i, s.view[in.slot].ID, f.sent)
			}
		}
	}
	for _, x := range as.seen {
		wantReady := 1
		if x.at >= 90*time.Second {
			wantReady = 2
		}
		if x.dReady != wantReady || x.pReady != wantReady {
			t.Fatalf("at %v: ready P/D %d/%d, want %d", x.at, x.pReady, x.dReady, wantReady)
		}
		if x.at > 30*time.Second && x.dRe != 2 {
			t.Fatalf("at %v: %d decode replicas requested, want 2 (starting ones count)", x.at, x.dRe)
		}
	}
	end := res.Span
	want := (2*end + 2*(end-30)) / 3600
	if math.Abs(res.GPUHours-want) > 1e-9 {
		t.Fatalf("GPU-hours %v, want %v (span %vs)", res.GPUHours, want, end)
	}
}

func TestScaleDownDrains(t *testing.T) {
	reqs := smallTrace(t, 2)
	const at = 120 * time.Second
	as := &scripted{steps: []scriptStep{{at: at, p: 1, d: 1}}}
	s, res := runScripted(t, smallScaleConfig(2, 3), reqs, as)
	var drained []instance
	for _, in := range s.insts {
		if in.state == stStopped {
			drained = append(drained, in)
		}
	}
	if len(drained) != 3 {
		t.Fatalf("%d engines stopped, want 3 (1 prefill + 2 decode)", len(drained))
	}
	busy := 0
	for _, in := range drained {
		if in.stopped < at {
			t.Fatalf("stopped at %v, before the drain at %v", in.stopped, at)
		}
		if in.stopped > at {
			busy++ // it finished its running requests first
		}
		for i, f := range s.flights {
			if (f.decode == in.slot || f.prefill == in.slot) && f.sent > at {
				t.Fatalf("request %d sent at %v to an engine draining since %v", i, f.sent, at)
			}
		}
	}
	if busy == 0 {
		t.Fatal("every drained engine stopped at once: the test's load did not exercise draining")
	}
	p, d := s.gpuSeconds(time.Duration(res.Span * float64(time.Second)))
	wantP, wantD := res.Span, 1*res.Span
	for _, in := range drained {
		if in.role == scheduler.RolePrefill {
			wantP += in.stopped.Seconds()
		} else {
			wantD += in.stopped.Seconds()
		}
	}
	if math.Abs(p-wantP) > 1e-6 || math.Abs(d-wantD) > 1e-6 {
		t.Fatalf("GPU seconds P/D %v/%v, want %v/%v", p, d, wantP, wantD)
	}
}

func TestScaleCancelStartingStopsCounting(t *testing.T) {
	reqs := smallTrace(t, 3)
	as := &scripted{steps: []scriptStep{{at: 15 * time.Second, p: 1, d: 3}, {at: 45 * time.Second, p: 1, d: 1}}}
	s, res := runScripted(t, smallScaleConfig(1, 1), reqs, as)
	for _, in := range s.insts[2:] {
		if in.state != stStopped || in.stopped != 45*time.Second {
			t.Fatalf("starting engine not cancelled at 45s: %+v", in)
		}
	}
	want := (2*res.Span + 2*30) / 3600
	if math.Abs(res.GPUHours-want) > 1e-9 {
		t.Fatalf("GPU-hours %v, want %v", res.GPUHours, want)
	}
}

func TestScaleSlotReuse(t *testing.T) {
	reqs := smallTrace(t, 4)
	as := &scripted{steps: []scriptStep{{at: 15 * time.Second, p: 1, d: 3}, {at: 100 * time.Second, p: 1, d: 1}, {at: 180 * time.Second, p: 1, d: 2}}}
	s, _ := runScripted(t, smallScaleConfig(1, 1), reqs, as)
	if len(s.insts) != 5 || len(s.engines) != 4 {
		t.Fatalf("%d instances in %d slots, want 5 in 4 (a stopped slot reused)", len(s.insts), len(s.engines))
	}
	seen := map[string]bool{}
	for _, v := range s.view {
		if seen[v.ID] {
			t.Fatalf("engine id %s twice", v.ID)
		}
		seen[v.ID] = true
	}
}

func sloScaler(t *testing.T, cfg ScaleConfig, util float64) *SLOScaler {
	t.Helper()
	prof, err := ProfileEngine(cfg.Engine, 800, 32)
	if err != nil {
		t.Fatal(err)
	}
	p := autoscale.DefaultPolicy()
	p.Roles = map[string]autoscale.RolePolicy{"prefill": {Bounds: autoscale.Bounds{Min: 1, Max: 8}}, "decode": {Bounds: autoscale.Bounds{Min: 1, Max: 8}}}
	p.Ratio = &autoscale.Ratio{Numerator: "prefill", Denominator: "decode", Min: 0.25, Max: 2}
	s, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: util, SLOTTFT: 2, SLOTP: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScaleDeterministic(t *testing.T) {
	reqs := smallTrace(t, 5)
	cfg := smallScaleConfig(1, 1)
	var results []ScaleResult
	for range 2 {
		k, err := NewKthena(KthenaConfig{Behavior: DefaultKthenaBehavior(),
			Prefill: KthenaRole{Min: 1, Max: 8, Targets: map[string]float64{KthenaWaiting: 1}},
			Decode:  KthenaRole{Min: 1, Max: 8, Targets: map[string]float64{KthenaRunning: 8}}, Ratio: &KthenaRatio{Min: 0.25, Max: 2}})
		if err != nil {
			t.Fatal(err)
		}
		for _, as := range []Autoscaler{sloScaler(t, cfg, 0.5), k} {
			res, err := RunScale(context.Background(), cfg, reqs, as)
			if err != nil {
				t.Fatal(err)
			}
			res.Wall = 0
			results = append(results, res)
		}
	}
	for i := range 2 {
		if !reflect.DeepEqual(results[i], results[i+2]) {
			t.Fatalf("%s: two runs differ:\n%+v\n%+v", results[i].Autoscaler, results[i], results[i+2])
		}
		if len(results[i].Windows) < 4 {
			t.Fatalf("%s: %d report windows", results[i].Autoscaler, len(results[i].Windows))
		}
	}
}

func TestProfileEngine(t *testing.T) {
	p, err := ProfileEngine(engine.Config{Profile: mustProfile("7b-l40s"), GPUBlocks: 30000}, 2048, 64)
	if err != nil {
		t.Fatal(err)
	}
	if p.PrefillTokensPerSecond <= 0 || len(p.Streams) < 4 {
		t.Fatalf("profile %+v", p)
	}
	for i := 1; i < len(p.TPOT); i++ {
		if p.TPOT[i] < p.TPOT[i-1] {
			t.Fatalf("TPOT falls with more streams: %v", p.TPOT)
		}
	}
	n := p.StreamsWithin(p.TPOT[2])
	if n != float64(p.Streams[2]) || p.TPOTAt(n) != p.TPOT[2] {
		t.Fatalf("StreamsWithin/TPOTAt not inverse: %v, %v", n, p.TPOTAt(n))
	}
}

func TestScaleConfigValidate(t *testing.T) {
	bad := []ScaleConfig{
		{PDConfig: PDConfig{Roles: Roles{Prefill: 1, Decode: 1, Mixed: 1}}},
		{PDConfig: PDConfig{Roles: Roles{Prefill: 1, Decode: 1}}, SyncPeriod: 300 * time.Millisecond},
		{PDConfig: PDConfig{Roles: Roles{Prefill: 1, Decode: 1}}, Policy: "aggregated"},
	}
	for i, c := range bad {
		c.Defaults()
		if err := c.Validate(); err == nil {
			t.Errorf("config %d accepted", i)
		}
	}
}

// TestSLOScalerSizesFromSignals: the SLO mode sizes prefill from the
// ingress's uncached prompt tokens/s and decode from the gossiped streams
// (running + waiting) over the planned per-replica capacities.
func TestSLOScalerSizesFromSignals(t *testing.T) {
	prof := EngineProfile{PrefillTokensPerSecond: 10000, Streams: []int{1, 64, 128}, TPOT: []float64{0.02, 0.04, 0.08}}
	p := autoscale.DefaultPolicy()
	p.Roles = map[string]autoscale.RolePolicy{"prefill": {Bounds: autoscale.Bounds{Min: 1, Max: 20}}, "decode": {Bounds: autoscale.Bounds{Min: 1, Max: 20}}}
	s, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: 0.5, DecodeUtilization: 0.5, SLOTTFT: 2, SLOTP: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	// Capacities: 5,000 tok/s per prefill replica; 0.5 × 80 streams (TPOT
	// 50 ms interpolated between 64 and 128) = 40 per decode replica.
	sig := Signals{Prefill: RoleSignals{Replicas: 3, Ready: 3, Loads: make([]EngineLoad, 3)},
		Decode:                RoleSignals{Replicas: 3, Ready: 3, Loads: []EngineLoad{{Running: 40, Waiting: 10}, {Running: 40}, {Running: 30}}},
		PromptTokensPerSecond: 40000, CachedFraction: 0.5}
	pr, de := s.Decide(0, &sig)
	if pr != 4 || de != 3 {
		t.Fatalf("got P/D %d/%d, want 4 (20,000 uncached tok/s ÷ 5,000) / 3 (120 streams ÷ 40)", pr, de)
	}
	if !strings.Contains(s.Setting(), "util P 0.50 D 0.50") {
		t.Fatalf("setting %q", s.Setting())
	}
}

// rateRecorder is scripted that also keeps the last learned prefill rate
// it was shown.
type rateRecorder struct {
	scripted
	last float64
}

func (r *rateRecorder) Decide(now time.Duration, sig *Signals) (int, int) {
	r.last = sig.PrefillTokensPerReplica
	return r.scripted.Decide(now, sig)
}

// TestLearnedPrefillReachesTheAutoscaler: the router's learned prefill rate
// of the ready prefill engines reaches the autoscaler (what the ingresses
// gossip and the controller reads for a policy without
// prefillTokensPerSecond), within 15 % of what profiling the engine as
// Dynamo's profiler does measures; with it the SLO mode sizes prefill.
func TestLearnedPrefillReachesTheAutoscaler(t *testing.T) {
	cfg := smallScaleConfig(1, 1)
	cfg.Engine.GPUBlocks = 30000
	// The benchmark's mix: prompts of a 1,024-token shared document and a
	// log-normal own part (mean 2,048), wide enough to fit a slope on.
	reqs, err := workload.Diurnal{Duration: 6 * time.Minute, PeakRate: 2, TroughRate: 1, Seed: 1,
		Mix: workload.LongPromptMix{Prefixes: 64, PrefixTokens: 1024, OwnTokens: 2048, OutputTokens: 64}}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := ProfileEngine(cfg.Engine, 3072, 64)
	if err != nil {
		t.Fatal(err)
	}
	r := &rateRecorder{}
	runScripted(t, cfg, reqs, r)
	t.Logf("learned %.0f tokens/s, profiled %.0f", r.last, prof.PrefillTokensPerSecond)
	if math.Abs(r.last/prof.PrefillTokensPerSecond-1) > 0.15 {
		t.Fatalf("learned prefill rate %.0f tokens/s, profiled %.0f: want within 15 %%", r.last, prof.PrefillTokensPerSecond)
	}

	p := autoscale.DefaultPolicy()
	p.Roles = map[string]autoscale.RolePolicy{"prefill": {Bounds: autoscale.Bounds{Min: 1, Max: 8}}, "decode": {Bounds: autoscale.Bounds{Min: 1, Max: 8}}}
	s, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: 0.8, DecodeUtilization: 0.6, SLOTTFT: 2, SLOTP: 0.05, LearnedPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Setting(), "of the learned prefill rate") {
		t.Errorf("setting %q", s.Setting())
	}
	sig := &Signals{Prefill: RoleSignals{Replicas: 1, Ready: 1}, Decode: RoleSignals{Replicas: 1, Ready: 1},
		PromptTokensPerSecond: 4 * 0.8 * r.last, PrefillTokensPerReplica: r.last}
	if pre, _ := s.Decide(time.Hour, sig); pre < 2 {
		t.Errorf("4 replicas' worth of prompt tokens at the learned rate: prefill %d, want it raised", pre)
	}
	fresh, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: 0.8, DecodeUtilization: 0.6, SLOTTFT: 2, SLOTP: 0.05, LearnedPrefill: true})
	if err != nil {
		t.Fatal(err)
	}
	sig.PrefillTokensPerReplica = 0
	if pre, _ := fresh.Decide(time.Hour, sig); pre > 1 {
		t.Errorf("no learned rate: prefill %d, want no prefill sizing (stays at its min)", pre)
	}
}
