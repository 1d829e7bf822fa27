package policies

import (
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// TestKthenaGPUUsageScore replays Kthena's own table test of the gpu-usage
// plugin (plugins/gpu_test.go TestGPUCacheUsageScore): score =
// int((1 − GPU cache usage)·100).
func TestKthenaGPUUsageScore(t *testing.T) {
	for _, tc := range []struct {
		usage float64
		want  float64
	}{{0, 100}, {0.5, 50}, {1, 0}, {0.999, 0}, {0.01, 99}} {
		if got := kthenaGPUUsage(tc.usage); got != tc.want {
			t.Errorf("usage %v: score %v, want %v", tc.usage, got, tc.want)
		}
	}
}

// TestKthenaHelmGPUUsage: the Helm chart's plugin set (the kthena default)
// adds gpu-usage with weight 1, which can outweigh least-latency; the
// router without a configuration file (gpuUsageWeight 0) does not have it.
func TestKthenaHelmGPUUsage(t *testing.T) {
	a, b := eng("a"), eng("b")
	// least-latency: TPOT equal (100 each), a's TTFT faster: a 100, b 50.
	a.TTFT, a.TPOT = time.Second, 20*time.Millisecond
	b.TTFT, b.TPOT = 2*time.Second, 20*time.Millisecond
	a.KVUsage, b.KVUsage = 0.9, 0.1 // gpu-usage: a 10, b 90
	es := []scheduler.Engine{a, b}
	none := []index.Match{{}, {}}
	helm := NewKthena()
	if helm.GPUUsageWeight != 1 {
		t.Fatalf("kthena's gpu-usage weight %v, want 1 (Helm chart)", helm.GPUUsageWeight)
	}
	mustPick(t, helm, reqKeys(keys(1, 10)), es, none, "b", "weighted-score",
		"Helm: a = 100 + 10 + 100, b = 100 + 90 + 50")
	c := DefaultKthenaConfig()
	c.GPUUsageWeight = 0
	mustPick(t, KthenaFrom("kthena", c), reqKeys(keys(1, 10)), es, none, "a", "weighted-score",
		"no config file: a = 100 + 100, b = 100 + 50")
}

// TestDynamoHostCacheHit pins selector/default.rs's overlap credit:
// overlap_score_credit·device_overlap + host_cache_hit_weight·host_overlap,
// the host blocks being those that continue the GPU prefix in the CPU tier
// (Match.CPU − Match.GPU). Without the active-sequence tracker decode =
// request blocks on both.
func TestDynamoHostCacheHit(t *testing.T) {
	es := []scheduler.Engine{eng("a"), eng("b")}
	// a: 2 blocks on GPU, the next 8 on CPU; b: 6 on GPU.
	ms := []index.Match{{GPU: 2, CPU: 10, Other: 10, Spec: 10}, full(6)}
	mustPick(t, Dynamo{OverlapWeight: 1, HostWeight: 0.75}, req(10), es, ms, "a", "lowest-cost",
		"a = (10 − 2 − 0.75·8) + 10 = 12, b = (10 − 6) + 10 = 14")
	mustPick(t, Dynamo{OverlapWeight: 1}, req(10), es, ms, "b", "lowest-cost",
		"CPU tier ignored: a = 8 + 10 = 18, b = 14")
	if d := NewDynamo(); d.HostWeight != 0.75 || d.Active == nil {
		t.Fatalf("NewDynamo = %+v: want host weight 0.75 and the active-sequence tracker", d)
	}
}

// TestLLMDAutoTune follows llm-d's TestApproxPrefixCacheAutoTune and
// makeServer: with autoTune the server's LRU holds the blocks the server
// reports (CacheNumGPUBlocks), whatever lruCapacityPerServer says; without
// it (or while the server reports none) the configured capacity.
func TestLLMDAutoTune(t *testing.T) {
	for _, tc := range []struct {
		auto      bool
		gpuBlocks int
		want      int
	}{
		{true, 1000, 10}, // pod metrics (1000) win over lruCapacityPerServer 1
		{false, 1000, 1}, // configured 1
		{true, 0, 1},     // nothing reported: configured 1
		{true, 4, 4},     // a small reported cache bounds the record
	} {
		p, err := NewLLMDApproximate(DefaultLLMDWeights())
		if err != nil {
			t.Fatal(err)
		}
		p.AutoTune = tc.auto
		p.History.Capacity = 1
		s := eng("s")
		s.GPUBlocks = tc.gpuBlocks
		pick(t, p, reqKeys(keys(1, 10)), []scheduler.Engine{s}, []index.Match{{}})
		if got := p.History.Size("s"); got != tc.want {
			t.Errorf("autoTune %v, %d reported blocks: holds %d, want %d", tc.auto, tc.gpuBlocks, got, tc.want)
		}
	}
	if p, _ := NewLLMDApproximate(DefaultLLMDWeights()); !p.AutoTune {
		t.Error("autoTune is off by default; upstream's default is on")
	}
}

// TestSGLangTimestampSampling: a match refreshes the best-matching
// worker's matched path only on sampled epochs (one tick per match and per
// insert; sampled when the epoch is a multiple of TimestampSampling). The
// refreshed path then survives an eviction that would otherwise take it.
func TestSGLangTimestampSampling(t *testing.T) {
	run := func(sampling, priorRequests int) int {
		c := DefaultSGLangConfig()
		c.MaxTreeSize = 8 * charsPerBlock // 8 blocks per worker
		c.TimestampSampling = &sampling
		p := SGLangFrom(c)
		es := []scheduler.Engine{eng("w1"), eng("w2")}
		none := []index.Match{{}, {}}
		for i := 0; i < priorRequests; i++ { // one match + one insert each, on w2
			pick(t, p, reqKeys(keys(10_000+100*i, 1)), []scheduler.Engine{eng("w2")}, []index.Match{{}})
		}
		p.History.Insert("w1", keys(1, 4))   // A
		p.History.Insert("w1", keys(100, 4)) // B, more recent: w1 is full
		// Shares A's first block only: 1/10 ≤ 0.3, so w2 (the smaller
		// tree) gets it; the match may refresh A's first block on w1.
		r := reqKeys(append(keys(1, 1), keys(500, 9)...))
		if got, why := pick(t, p, r, es, none); got != "w2" || why != "smallest-cache" {
			t.Fatalf("%s (%s), want w2 by smallest-cache", got, why)
		}
		p.History.Insert("w1", keys(200, 4)) // C evicts w1's 4 oldest blocks
		return p.History.Prefix("w1", keys(1, 4))
	}
	if got := run(1, 0); got != 1 {
		t.Errorf("every match refreshes: A's first block kept %d, want 1", got)
	}
	if got := run(0, 0); got != 0 {
		t.Errorf("no refresh: A kept %d blocks, want 0 (evicted)", got)
	}
	if got := run(8, 0); got != 1 {
		t.Errorf("sampled, epoch 0: A kept %d, want 1", got)
	}
	if got := run(8, 1); got != 0 {
		t.Errorf("sampled, epoch 2 (not a multiple of 8): A kept %d, want 0", got)
	}
	if got := run(8, 4); got != 1 {
		t.Errorf("sampled, epoch 8 (every 4th match): A kept %d, want 1", got)
	}
}

// TestLLMDPreciseMinMax pins llm-d's normalisation of the precise scorer's
// per-pod longest-prefix counts (utils.go indexedScoresToNormalizedScoredPods):
// min-max over the pods with a hit, 1 when they tie or one pod has a hit, 0
// for pods without one; "fraction" is matched / request blocks.
func TestLLMDPreciseMinMax(t *testing.T) {
	for _, tc := range []struct {
		name    string
		matched []int
		want    []float64
	}{
		{"no hits", []int{0, 0, 0}, []float64{0, 0, 0}},
		{"one pod hits", []int{0, 2, 0}, []float64{0, 1, 0}},
		{"the fewest hits score like none", []int{3, 7, 0}, []float64{0, 1, 0}},
		{"linear between", []int{2, 4, 6}, []float64{0, 0.5, 1}},
		{"tie", []int{5, 5, 0}, []float64{1, 1, 0}},
	} {
		cs := make([]scheduler.Candidate, len(tc.matched))
		for i, m := range tc.matched {
			e := eng(string(rune('a' + i)))
			cs[i] = scheduler.Candidate{Engine: &e, Match: full(m)}
		}
		out := make([]float64, len(cs))
		confirmedPrefix{MinMax: true}.Score(req(10), cs, out)
		for i := range out {
			if out[i] != tc.want[i] {
				t.Errorf("%s: scores %v, want %v", tc.name, out, tc.want)
				break
			}
		}
	}
	// The sample config's weights (prefix 2, KV 1, queue 1): a holds 3 of
	// 10 blocks and b 7, b has more waiting. Min-max gives a 0 and b 1,
	// so b's cache wins; as fractions (0.3 vs 0.7) the queue decides.
	a, b := eng("a"), eng("b")
	b.Waiting = 4
	es, ms := []scheduler.Engine{a, b}, []index.Match{full(3), full(7)}
	pol := func(score string) scheduler.Policy {
		cfg := DefaultLLMDPreciseConfig()
		cfg.PreciseScore = score
		p, err := LLMDPreciseFactory("llmd-precise", nodeOf(t, cfg))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mustPick(t, pol(""), req(10), es, ms, "b", "", "min-max: a = queue 1 + KV 1 + 2·0, b = 0 + 1 + 2·1 (over 4)")
	mustPick(t, pol("fraction"), req(10), es, ms, "a", "", "fraction: a = 1 + 1 + 2·0.3, b = 0 + 1 + 2·0.7 (over 4)")
}

// nodeOf is v as a YAML node (a policy block).
func nodeOf(t *testing.T, v any) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		t.Fatal(err)
	}
	return &n
}
