package local

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/learn/learntest"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// stubBackend maps role → engine id → URL: the SLO scraper's view of a
// Backend, in front of real simulators.
type stubBackend map[string]map[string]string

func (b stubBackend) Replicas(_, role string) []string {
	var out []string
	for id := range b[role] {
		out = append(out, id)
	}
	return out
}
func (b stubBackend) Scale(context.Context, string, string, int) error { return nil }
func (b stubBackend) EngineURL(id string) string {
	for _, m := range b {
		if u, ok := m[id]; ok {
			return u
		}
	}
	return ""
}

type stubLoad []gossip.EngineView

func (l stubLoad) Engines() []gossip.EngineView { return l }

// TestSLOScraperReadsEngines: between two steps, requests served by a real
// simulator show up as prompt tokens/s and TTFT/TPOT p90 for the SLO mode;
// running streams come from the mesh's view of the decode role.
func TestSLOScraperReadsEngines(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := startSLOSim(t, ctx)
	b := stubBackend{"prefill": {"p0": s.URL()}, "decode": {"d0": s.URL()}}
	load := stubLoad{{EngineState: gossip.EngineState{ID: "d0", Running: 5}}}
	md := &v1alpha1.ModelDeployment{}
	md.Name = "x"
	ap := &v1alpha1.AutoscalingPolicy{Spec: v1alpha1.AutoscalingPolicySpec{SLO: &v1alpha1.SLOTarget{PrefillRole: "prefill", DecodeRole: "decode"}}}
	sc := newSLOScraper()
	t0 := time.Now()
	if o := sc.observe(ctx, t0, md, ap, b, load); o != nil {
		t.Fatalf("first step has no interval, got %+v", o)
	}
	complete(t, s.URL(), 4, 100, 8)
	o := sc.observe(ctx, t0.Add(2*time.Second), md, ap, b, load)
	if o == nil {
		t.Fatal("no observation after an interval")
	}
	if o.PromptTokensPerSecond != 4*256/2.0 {
		t.Errorf("prompt tokens/s %v, want %v", o.PromptTokensPerSecond, 4*256/2.0)
	}
	if o.MeasuredTTFT <= 0 || o.MeasuredTPOT <= 0 || o.RunningStreams != 5 {
		t.Errorf("observation %+v: want TTFT and TPOT p90 > 0 and 5 running streams", o)
	}
	if o.PrefillTokensPerReplica != 0 {
		t.Errorf("no ingress shares learned costs, yet a prefill throughput %v", o.PrefillTokensPerReplica)
	}

	// An ingress shares what it learned of p0 (8,000 tokens/s); the policy
	// gives no prefillTokensPerSecond, so the observation carries it.
	share, err := learntest.Share("p0", 8000)
	if err != nil {
		t.Fatal(err)
	}
	withShares := sharingLoad{stubLoad: load, states: map[string][]byte{"ingress-1": share}}
	o = sc.observe(ctx, t0.Add(4*time.Second), md, ap, b, withShares)
	if o == nil || math.Abs(o.PrefillTokensPerReplica/8000-1) > 0.05 {
		t.Fatalf("observation %+v: want a learned prefill throughput within 5 %% of 8000", o)
	}
}

// sharingLoad is stubLoad whose gossip also carries app states (the
// ingresses' learned costs).
type sharingLoad struct {
	stubLoad
	states map[string][]byte
}

func (l sharingLoad) AppStates(name string) map[string][]byte {
	if name == learn.StateName {
		return l.states
	}
	return nil
}

// With aggregateBelow, the requests served whole on a decode engine are
// prefill load (tester h-orchagg F1: the local backend read none, and a
// prefill role the load needed stayed at zero), whether or not a prefill
// engine is listed: one that has yet to answer a scrape, just scaled from
// zero, must not turn the load to none, nor one that runs hide the
// requests served whole beside it (tester h-reg7 F5). Without
// aggregateBelow they are not added.
func TestSLOScraperAggregatedReadsDecodeEngines(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := startSLOSim(t, ctx)
	md := &v1alpha1.ModelDeployment{}
	md.Name = "x"
	for _, tc := range []struct {
		name      string
		aggregate float64
		b         stubBackend
		want      float64
	}{
		{"aggregated, no prefill engine", 0.8, stubBackend{"decode": {"d0": s.URL()}}, 2 * 256 / 2.0},
		{"no aggregateBelow", 0, stubBackend{"decode": {"d0": s.URL()}}, 0},
		{"a prefill engine not yet scraped", 0.8, stubBackend{"prefill": {"p0": "http://127.0.0.1:1"}, "decode": {"d0": s.URL()}}, 2 * 256 / 2.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := &v1alpha1.AutoscalingPolicy{Spec: v1alpha1.AutoscalingPolicySpec{SLO: &v1alpha1.SLOTarget{
				PrefillRole: "prefill", DecodeRole: "decode", AggregateBelow: tc.aggregate}}}
			sc := newSLOScraper()
			t0 := time.Now()
			sc.observe(ctx, t0, md, ap, tc.b, stubLoad{})
			complete(t, s.URL(), 2, 200, 4)
			o := sc.observe(ctx, t0.Add(2*time.Second), md, ap, tc.b, stubLoad{})
			if o == nil {
				t.Fatal("no observation after an interval")
			}
			if o.PromptTokensPerSecond != tc.want {
				t.Errorf("prompt tokens/s %v, want %v", o.PromptTokensPerSecond, tc.want)
			}
			if wantTTFT := tc.aggregate > 0; (o.MeasuredTTFT > 0) != wantTTFT {
				t.Errorf("TTFT p90 %v: want one read off the decode engine %v", o.MeasuredTTFT, wantTTFT)
			}
		})
	}
}

// TestSLOScraperAggregatedCountsDisaggregatedOnce: with a prefill engine
// running and aggregateBelow, a request served whole on the decode engine
// counts there, and a disaggregated one counts on the prefill engine only:
// the decode engine's prompt counter holds its prompt too (the KV it read
// from the prefill engine), and those tokens are left out (tester h-reg7
// F5). The TTFT is the prefill engine's while it records some.
func TestSLOScraperAggregatedCountsDisaggregatedOnce(t *testing.T) {
	pd := simtest.StartPDForTest(t, simtest.PDOptions{Base: sim.Config{Model: "m", TimeScale: 1, Seed: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, Prefill: 1, Decode: 1})
	pre, dec := pd.Prefill[0].URL(), pd.Decode[0].URL()
	b := stubBackend{"prefill": {"p0": pre}, "decode": {"d0": dec}}
	md := &v1alpha1.ModelDeployment{}
	md.Name = "x"
	ap := &v1alpha1.AutoscalingPolicy{Spec: v1alpha1.AutoscalingPolicySpec{SLO: &v1alpha1.SLOTarget{
		PrefillRole: "prefill", DecodeRole: "decode", AggregateBelow: 0.8}}}
	ctx := context.Background()
	sc := newSLOScraper()
	t0 := time.Now()
	sc.observe(ctx, t0, md, ap, b, stubLoad{})
	complete(t, dec, 2, 200, 4) // served whole on decode: 512 prompt tokens
	disaggregate(t, pre, dec, 300)
	o := sc.observe(ctx, t0.Add(2*time.Second), md, ap, b, stubLoad{})
	if o == nil {
		t.Fatal("no observation after an interval")
	}
	// 512 + 256 prompt tokens over 2 s; the decode leg's own last token
	// (it computes one: the KV of the rest is read) is within a token/s.
	if want := (2*256 + 256) / 2.0; math.Abs(o.PromptTokensPerSecond-want) > 1 {
		t.Errorf("prompt tokens/s %v, want %v (the disaggregated prompt once)", o.PromptTokensPerSecond, want)
	}
	if o.MeasuredTTFT <= 0 {
		t.Errorf("TTFT p90 %v, want the prefill engine's", o.MeasuredTTFT)
	}
}

// disaggregate sends one request of 256 prompt tokens (token first
// repeated) through both legs: the prefill engine at pre, then the decode
// engine at dec, which reads its KV.
func disaggregate(t *testing.T, pre, dec string, first int) {
	t.Helper()
	prompt := strings.Repeat(fmt.Sprintf("%d,", first), 255) + "7"
	post := func(url, body string) map[string]json.RawMessage {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out := map[string]json.RawMessage{}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
			t.Fatalf("%s: %s %s", url, resp.Status, raw)
		}
		return out
	}
	p := post(pre, fmt.Sprintf(`{"model":"m","max_tokens":1,"prompt":[%s],"kv_transfer_params":{"do_remote_decode":true}}`, prompt))
	if len(p["kv_transfer_params"]) == 0 {
		t.Fatal("the prefill engine answered no kv_transfer_params")
	}
	d := post(dec, fmt.Sprintf(`{"model":"m","max_tokens":4,"prompt":[%s],"kv_transfer_params":%s}`, prompt, p["kv_transfer_params"]))
	var usage struct {
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if err := json.Unmarshal(d["usage"], &usage); err != nil || usage.Details.Cached != 255 {
		t.Fatalf("decode leg usage %s: want 255 tokens read from the prefill engine", d["usage"])
	}
}

// startSLOSim starts a real simulator (model m) until the test ends.
func startSLOSim(t *testing.T, ctx context.Context) *sim.Server {
	t.Helper()
	s, err := sim.Start(ctx, sim.Config{Model: "m", HTTPAddr: "127.0.0.1:0", TimeScale: 1, Seed: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// complete sends n completions of 256 prompt tokens each (token first+i
// repeated, then 7) and max_tokens out to url.
func complete(t *testing.T, url string, n, first, out int) {
	t.Helper()
	for i := range n {
		prompt := strings.Repeat(fmt.Sprintf("%d,", first+i), 255) + "7"
		resp, err := http.Post(url+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"m","max_tokens":%d,"prompt":[%s]}`, out, prompt)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %s", resp.Status)
		}
	}
}
