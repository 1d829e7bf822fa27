package des

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/sim/engine"
)

func TestParseRoles(t *testing.T) {
	good := map[string]Roles{
		"prefill=2,decode=6":         {Prefill: 2, Decode: 6},
		"decode=1":                   {Decode: 1},
		"mixed=3, prefill=1":         {Prefill: 1, Mixed: 3},
		"prefill=0,decode=2,mixed=0": {Decode: 2},
	}
	for s, want := range good {
		if got, err := ParseRoles(s); err != nil || got != want {
			t.Errorf("ParseRoles(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "prefill=2", "decode=x", "decode=-1", "gpu=2,decode=1", "decode=1,decode=2", "decode"} {
		if _, err := ParseRoles(s); !errors.Is(err, ErrConfig) {
			t.Errorf("ParseRoles(%q): err %v, want ErrConfig", s, err)
		}
	}
}

// TestRunPD: long prompts on 2 prefill + 2 decode engines. Every request
// completes under every policy; aggregated never disaggregates and the
// always-P/D policies always do; disaggregation takes prefill off the
// decode engines, so their streams' TPOT tail is lower than aggregated
// routing's, and kvmesh's per-request choice keeps a goodput at least
// that of the emulated P/D routers (SLO attainment: goodput over makespans that differ by a few ms is noise at this size).
func TestRunPD(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 8, Prompts: 8, Shared: 2048, Question: 2048, Output: 64, Rate: 9, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 8000, Profile: prof}}, Roles: Roles{Prefill: 2, Decode: 2}}
	rep, err := RunPD(context.Background(), cfg, reqs, PDPolicies)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	for _, p := range PDPolicies {
		r := rep.Policies[p]
		if r.Completed != len(reqs) || r.Failed != 0 {
			t.Fatalf("%s: %d of %d completed, %d failed", p, r.Completed, len(reqs), r.Failed)
		}
		checkPDRecords(t, p, rep, cfg.Roles)
	}
	agg, k := rep.Policies["aggregated"], rep.Policies["kvmesh"]
	if agg.Disaggregated != 0 || agg.TransferGB != 0 {
		t.Errorf("aggregated disaggregated %.2f, moved %.2f GB", agg.Disaggregated, agg.TransferGB)
	}
	for _, p := range []string{"kvmesh-always", "kthena", "sglang", "aibrix"} {
		if d := rep.Policies[p].Disaggregated; d != 1 {
			t.Errorf("%s disaggregated %.2f of requests, want all", p, d)
		}
	}
	if a := rep.Policies["kvmesh-always"]; a.TPOTP99 >= agg.TPOTP99 {
		t.Errorf("TPOT p99: always-P/D %.4fs not below aggregated %.4fs", a.TPOTP99, agg.TPOTP99)
	}
	for _, p := range []string{"kthena", "llmd", "dynamo", "sglang", "aibrix"} {
		if e := rep.Policies[p]; k.SLOAttainment < e.SLOAttainment {
			t.Errorf("kvmesh met the SLOs for %.3f of requests, below %s's %.3f", k.SLOAttainment, p, e.SLOAttainment)
		}
	}
}

// checkPDRecords: the HTML report's records of policy p are its finished
// requests, each decoded by an engine that may decode, with the table's
// TTFT mean; the report's summary carries the policy's numbers.
func checkPDRecords(t *testing.T, p string, rep PDReport, roles Roles) {
	t.Helper()
	r, run := rep.Policies[p], rep.Runs[p]
	if len(run.Records) != r.Completed || len(run.EngineIDs) != roles.Total() {
		t.Fatalf("%s: %d records of %d completed, %d engine names for %d engines", p, len(run.Records), r.Completed,
			len(run.EngineIDs), roles.Total())
	}
	var ttft float64
	for _, rec := range run.Records {
		if rec.TTFT <= 0 || rec.E2E < rec.TTFT || rec.Start < 0 || rec.CachedTokens > rec.PromptTokens {
			t.Fatalf("%s: record %+v", p, rec)
		}
		if id := run.EngineIDs[rec.Engine]; strings.HasPrefix(id, "prefill") || (p == "aggregated") != strings.HasPrefix(id, "mixed") {
			t.Fatalf("%s: a request decoded on %s", p, id)
		}
		ttft += rec.TTFT
	}
	if m := ttft / float64(len(run.Records)); math.Abs(m-r.TTFTMean) > 1e-9*max(1, m) {
		t.Errorf("%s: records' TTFT mean %v, table's %v", p, m, r.TTFTMean)
	}
	h, notes := rep.AsReport()
	if hp := h.Policies[p]; hp.ThroughputRPS != r.ThroughputRPS || hp.Completed != r.Completed || hp.LoadImbalance < 1 {
		t.Errorf("%s: HTML summary %+v for %+v", p, hp, r)
	}
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, p+": goodput ") }) {
		t.Errorf("%s: no goodput note in %q", p, notes)
	}
}

func TestRunPDRejectsBadConfig(t *testing.T) {
	_, err := RunPD(context.Background(), PDConfig{Roles: Roles{Prefill: 1}}, nil, []string{"nope"})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v, want ErrConfig", err)
	}
}

// TestPDEqualInformation: kvmesh (and aggregated) price with an online
// learner that has left its prior after a run, the emulations have none;
// no router is given queued prefill tokens (vLLM exports none) nor a
// request's true output length.
func TestPDEqualInformation(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 4, Prompts: 4, Shared: 1024, Question: 1024, Output: 32, Rate: 8, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 8000, Profile: prof}}, Roles: Roles{Prefill: 1, Decode: 1}}
	cfg.Defaults()
	for _, p := range []string{"kvmesh", "aggregated", "llmd"} {
		s, err := newPDSim(&cfg, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		if (s.learner != nil) != (p != "llmd") {
			t.Fatalf("%s: learner %v", p, s.learner)
		}
		before := cfg.Learn.Prior
		if res := s.run(context.Background()); res.Completed != len(reqs) {
			t.Fatalf("%s: %d of %d completed", p, res.Completed, len(reqs))
		}
		for _, v := range s.view {
			if v.QueuedPrefillTokens != 0 {
				t.Fatalf("%s: engine %s reported %d queued prefill tokens", p, v.ID, v.QueuedPrefillTokens)
			}
		}
		if s.learner != nil && s.learner.Pooled() == before {
			t.Fatalf("%s: the learner never left its prior", p)
		}
		if got := s.outPred.Predict(); got != 32 {
			t.Fatalf("%s: predicted output %d after every request finished with 32", p, got)
		}
	}
}

// TestRunPDMixedPrefill: on mixed engines only, aggregated never splits a
// request; kvmesh splits none without MixedPrefill and, with it, some of a
// long-prompt overload (every local prefill would break streams), and
// every request completes.
func TestRunPDMixedPrefill(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 16, Prompts: 8, Shared: 4096, Question: 4096, Output: 128, Rate: 4, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	for _, mixed := range []bool{false, true} {
		cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 30000, Profile: prof}}, Roles: Roles{Mixed: 4}, MixedPrefill: mixed}
		rep, err := RunPD(context.Background(), cfg, reqs, []string{"aggregated", "kvmesh"})
		if err != nil {
			t.Fatal(err)
		}
		for p, r := range rep.Policies {
			if r.Completed != len(reqs) || r.Failed != 0 {
				t.Fatalf("mixed prefill %v, %s: %d of %d completed, %d failed", mixed, p, r.Completed, len(reqs), r.Failed)
			}
		}
		agg, k := rep.Policies["aggregated"], rep.Policies["kvmesh"]
		t.Logf("mixed prefill %v: aggregated goodput %.2f, kvmesh %.2f (%.0f %% split)", mixed, agg.GoodputRPS, k.GoodputRPS, 100*k.Disaggregated)
		if agg.Disaggregated != 0 {
			t.Errorf("mixed prefill %v: aggregated split %.2f of requests", mixed, agg.Disaggregated)
		}
		if split := k.Disaggregated > 0; split != mixed {
			t.Errorf("mixed prefill %v: kvmesh split %.2f of requests", mixed, k.Disaggregated)
		}
	}
}

// TestPDOutputDist: with OutputDist kvmesh's runs keep the distribution of
// the output lengths they observe (fed by finished requests); the other
// policies get none.
func TestPDOutputDist(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 2, Prompts: 4, Shared: 512, Question: 512, Output: 16, Rate: 8, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 8000, Profile: prof}}, Roles: Roles{Prefill: 1, Decode: 1}, OutputDist: true}
	cfg.Defaults()
	for _, p := range []string{"kvmesh", "kvmesh-always", "aggregated", "llmd"} {
		s, err := newPDSim(&cfg, reqs, p)
		if err != nil {
			t.Fatal(err)
		}
		if want := p == "kvmesh" || p == "kvmesh-always"; (s.outs != nil) != want {
			t.Fatalf("%s: distribution %v, want one: %v", p, s.outs, want)
		}
		if res := s.run(context.Background()); res.Completed != len(reqs) {
			t.Fatalf("%s: %d of %d completed", p, res.Completed, len(reqs))
		}
		if s.outs != nil && s.outs.Weight(cfg.Model) <= 0 {
			t.Fatalf("%s: no finished request observed", p)
		}
	}
}

// TestRunPDAggregatedHolds: the P/D benchmark's aggregated routing runs the
// router-side hold as an ingress without P/D does (hold.go): under
// overload it delays requests in the router and counts the wait in their
// TTFT; a P/D router never holds, nor aggregated with holdSeconds 0.
func TestRunPDAggregatedHolds(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 8, Prompts: 8, Shared: 4096, Question: 4096, Output: 32, Rate: 8, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 30000, Profile: prof}}, Roles: Roles{Prefill: 1, Decode: 1}}
	rep, err := RunPD(context.Background(), cfg, reqs, []string{"aggregated", "kvmesh"})
	if err != nil {
		t.Fatal(err)
	}
	holdOff(t, &cfg.Scheduler)
	free, err := RunPD(context.Background(), cfg, reqs, []string{"aggregated"})
	if err != nil {
		t.Fatal(err)
	}
	agg, k, f := rep.Policies["aggregated"], rep.Policies["kvmesh"], free.Policies["aggregated"]
	t.Logf("aggregated: %.0f %% held for %.2f s on average, TTFT mean %.2f s; without the hold %.2f s", 100*agg.Held, agg.HeldMean, agg.TTFTMean, f.TTFTMean)
	for name, r := range map[string]PDResult{"aggregated": agg, "kvmesh": k, "aggregated without the hold": f} {
		if r.Completed != len(reqs) {
			t.Fatalf("%s: %d of %d completed", name, r.Completed, len(reqs))
		}
	}
	if agg.Held < 0.1 || agg.HeldMean <= 0 {
		t.Fatalf("aggregated held %.2f of requests (mean %.3f s): the overload must engage the hold", agg.Held, agg.HeldMean)
	}
	if k.Held != 0 || f.Held != 0 {
		t.Fatalf("held: kvmesh P/D %.2f, aggregated with holdSeconds 0 %.2f; want none", k.Held, f.Held)
	}
	// Each request's TTFT counts its wait in the router.
	if agg.TTFTMean < agg.Held*agg.HeldMean {
		t.Fatalf("TTFT mean %.3f s below the mean time held %.3f s", agg.TTFTMean, agg.Held*agg.HeldMean)
	}
}

// TestPDPickRoom: a request the hold releases goes to the best-ranked
// aggregated option whose engine has room, or whose engine holds
// holdAffinity of its prompt.
func TestPDPickRoom(t *testing.T) {
	prof, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 1000, Profile: prof}}, Roles: Roles{Prefill: 1, Decode: 1}}
	cfg.Defaults()
	s, err := newPDSim(&cfg, make([]workload.Request, 1), "aggregated")
	if err != nil || !s.hold.on() {
		t.Fatalf("aggregated: hold on %v, err %v", s != nil && s.hold.on(), err)
	}
	full, free := s.view[0].ID, s.view[1].ID
	s.view[0].LocalPrefillTokens = 1 << 30 // no room at any rate
	bs := cfg.Engine.BlockSize
	for _, c := range []struct {
		matched int // blocks the full engine holds of the 1,024-token prompt
		want    string
	}{{0, free}, {1024 / bs / 4, free}, {1024 / bs / 2, full}} {
		s.plan.Decode = full
		s.plan.Options = append(s.plan.Options[:0], pd.Choice{Decode: full, DecodeMatch: index.Match{Spec: c.matched}}, pd.Choice{Decode: free})
		s.pickRoom(1024)
		if s.plan.Decode != c.want {
			t.Errorf("full engine holding %d blocks: picked %s, want %s", c.matched, s.plan.Decode, c.want)
		}
	}
}

// TestPDUniformPromptsSpreadDecode: every request with one prompt length
// (1,024 shared + 1,024 own tokens, 512 output) on 2 prefill + 6 decode
// engines, past the point where the decode engines' TPOT nears the
// objective. The learner cannot tell a decode step's per-token cost from
// its per-sequence cost on such traffic (context = sequences × one
// length); when it put the cost on the sequences, which the policy does
// not price, kvmesh saw no TPOT growth on a busy decode engine and sent
// one of six 263 of 512 requests (half missed the TPOT objective, goodput
// 4.70 against the emulations' 12.25–12.77 req/s). kvmesh must spread its
// decode legs (no decode engine over 1.5× the mean) and keep at least 0.9×
// the best emulation's goodput.
func TestPDUniformPromptsSpreadDecode(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 64, Prompts: 8, Shared: 1024, Question: 1024, Output: 512, Rate: 20, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 30000, Profile: mustProfile("7b-l40s")}}, Roles: Roles{Prefill: 2, Decode: 6}}
	emulations := []string{"kthena", "sglang", "aibrix"}
	rep, err := RunPD(context.Background(), cfg, reqs, append([]string{"kvmesh"}, emulations...))
	if err != nil {
		t.Fatal(err)
	}
	k, run := rep.Policies["kvmesh"], rep.Runs["kvmesh"]
	if k.Completed != len(reqs) {
		t.Fatalf("kvmesh completed %d of %d", k.Completed, len(reqs))
	}
	legs := make([]int, len(run.EngineIDs))
	for _, rec := range run.Records {
		legs[rec.Engine]++
	}
	mean := float64(len(run.Records)) / float64(cfg.Roles.Decode)
	if m := slices.Max(legs); float64(m) > 1.5*mean {
		t.Errorf("decode legs per engine %v (%v): one engine has %d, over 1.5× the mean %.0f", legs, run.EngineIDs, m, mean)
	}
	for _, p := range emulations {
		if e := rep.Policies[p]; k.GoodputRPS < 0.9*e.GoodputRPS {
			t.Errorf("kvmesh goodput %.2f req/s, below 0.9× %s's %.2f", k.GoodputRPS, p, e.GoodputRPS)
		}
	}
}

// TestPDPrefillEnginesServeWhenDecodeSaturated: on 5 prefill + 3 decode
// engines the mix's decode work is more than three engines keep within the
// TPOT objective at rate 32; kvmesh then serves whole requests on prefill
// engines (vLLM's kv_both) and keeps at least twice the goodput of the
// routers that only disaggregate. At rate 8 the decode engines keep TPOT
// and no prefill engine serves a whole request.
func TestPDPrefillEnginesServeWhenDecodeSaturated(t *testing.T) {
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 30000, Profile: mustProfile("7b-l40s")}}, Roles: Roles{Prefill: 5, Decode: 3}}
	whole := func(run report.Run) int {
		n := 0
		for i, rec := range run.Records {
			if run.Prefill[i] < 0 && strings.HasPrefix(run.EngineIDs[rec.Engine], "prefill") {
				n++
			}
		}
		return n
	}
	for _, rate := range []float64{8, 32} {
		reqs, err := workload.SharedPrefix{Groups: 64, Prompts: 8, Shared: 1024, Question: 1024, Output: 512, Rate: rate, Seed: 1}.Generate()
		if err != nil {
			t.Fatal(err)
		}
		others := []string{"kvmesh-always", "llmd", "sglang"}
		rep, err := RunPD(context.Background(), cfg, reqs, append([]string{"kvmesh"}, others...))
		if err != nil {
			t.Fatal(err)
		}
		k, n := rep.Policies["kvmesh"], whole(rep.Runs["kvmesh"])
		if k.Completed != len(reqs) {
			t.Fatalf("rate %v: kvmesh completed %d of %d", rate, k.Completed, len(reqs))
		}
		for _, p := range others {
			if m := whole(rep.Runs[p]); m != 0 {
				t.Errorf("rate %v: %s served %d whole requests on prefill engines", rate, p, m)
			}
		}
		if rate == 8 {
			if n != 0 {
				t.Errorf("rate 8: %d whole requests on prefill engines while the decode engines keep TPOT", n)
			}
			continue
		}
		if n == 0 {
			t.Errorf("rate 32: no whole request on a prefill engine")
		}
		for _, p := range others {
			if e := rep.Policies[p]; k.GoodputRPS < 2*e.GoodputRPS {
				t.Errorf("rate 32: kvmesh goodput %.2f req/s, below 2× %s's %.2f", k.GoodputRPS, p, e.GoodputRPS)
			}
		}
	}
}

// TestTransferBounded: a transfer time past ~292 years overflowed its
// time.Duration to MinInt64, so `--transfer-gbps 1e-10` printed TTFTs of
// −9.2e9 s that met the SLO. RunPD refuses a bandwidth whose transfer of
// the largest prompt takes over MaxTransfer ("a unit mistake?"); below it
// the run is correct, hours of transfer included; a sim run without the
// check takes MaxTransfer rather than a negative time.
func TestTransferBounded(t *testing.T) {
	reqs, err := workload.SharedPrefix{Groups: 1, Prompts: 2, Shared: 512, Question: 64, Output: 4, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	prof, _ := engine.LookupProfile("7b-l40s") // 57,344 bytes of KV per token
	cfg := PDConfig{Config: Config{Engine: engine.Config{GPUBlocks: 2000, Profile: prof}}, Roles: Roles{Prefill: 1, Decode: 1}}
	for _, gbps := range []float64{1e-10, 1e-6} { // 33 MB of KV: 84 years, 3.1 days
		c := cfg
		c.TransferGbps = gbps
		_, err := RunPD(context.Background(), c, reqs, []string{"kvmesh-always"})
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "576 tokens") || !strings.Contains(err.Error(), "a unit mistake?") {
			t.Fatalf("%g Gbit/s: %v", gbps, err)
		}
	}
	// 1e-5 Gbit/s: the 576-token prompt's 33 MB take 7.3 h.
	c := cfg
	c.TransferGbps = 1e-5
	rep, err := RunPD(context.Background(), c, reqs, []string{"kvmesh-always"})
	if err != nil {
		t.Fatal(err)
	}
	xfer := 576 * prof.KVBytesPerToken * 8 / 1e4
	r := rep.Policies["kvmesh-always"]
	if r.Completed != 2 || r.TTFTP50 < xfer || r.TTFTP99 > 2*xfer+60 || r.GoodputRPS != 0 || r.SLOAttainment != 0 {
		t.Fatalf("transfers of %.0f s: %+v", xfer, r)
	}

	// Past the check (a sim built directly), 8,400 years of transfer: a
	// day, not a negative time.
	c.TransferGbps = 1e-12
	c.Defaults()
	s, err := newPDSim(&c, reqs, "kvmesh-always")
	if err != nil {
		t.Fatal(err)
	}
	res := s.run(context.Background())
	if res.Completed != 2 || res.TTFTP50 < MaxTransfer.Seconds() || res.SLOAttainment != 0 {
		t.Fatalf("unchecked 1e-12 Gbit/s: %+v", res)
	}
}

// TestNegativeLatencyMissesSLO: a negative TTFT or TPOT is a broken
// measurement, never a request within the SLOs.
func TestNegativeLatencyMissesSLO(t *testing.T) {
	var st pdStats
	st.init(3)
	st.ttft = []float64{-9.2e9, 0.5, 0.1}
	st.e2e = []float64{1, 1, 1}
	st.goodCandidates = [][2]float64{{-9.2e9, 0.01}, {0.5, 0.02}, {0.1, -1}}
	cfg := PDConfig{SLOTTFT: 2 * time.Second, SLOTPOT: 50 * time.Millisecond}
	if p := st.result(&cfg); p.SLOAttainment != 1.0/3 {
		t.Fatalf("SLO attainment %v, want 1/3 (only the request with no negative latency)", p.SLOAttainment)
	}
}
