package ingress

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// startBlockSim is a simulated engine of model "m" with KV blocks of bs
// tokens.
func startBlockSim(t *testing.T, bs, maxModelLen int) *sim.Server {
	t.Helper()
	e, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Seed: 1,
		Engine: engine.Config{BlockSize: bs, GPUBlocks: 1024, MaxModelLen: maxModelLen},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// tokenIDsBody is a completions request of the token ids toks.
func tokenIDsBody(toks []uint32, maxTokens int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"prompt":[`)
	for i, t := range toks {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(t)))
	}
	b.WriteString(`]}`)
	return b.String()
}

// Engines of one model with different KV block sizes (16 and 32: vLLM's
// --block-size per GPU type, SGLang's page size beside vLLM's 16): each
// engine's cache holds the chain keys of its own size, so the ingress keys
// the prompt once per size and looks each engine up with its own. A
// prompt the block-32 engine holds goes there, though the block-16 one,
// listed first, is idle; the tokens the router expected it to hold are
// counted in its blocks; the mixed sizes are counted and warned about
// once. Before, every prompt was keyed at the first listed engine's size,
// the block-32 engine never matched, and the prompt went to the idle
// engine with nothing cached (tester h-hetero F1).
func TestMixedBlockSizesKeyedPerEngine(t *testing.T) {
	_, e32, idx, mem, cfg := mixedBlockRig(t)
	reg := prometheus.NewRegistry()
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Membership: mem, Index: idx, Registry: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	toks := make([]uint32, 1024)
	for i := range toks {
		toks[i] = uint32(1 + i*37%30000)
	}
	body := tokenIDsBody(toks, 2)
	// The block-32 engine computes the prompt (another ingress sent it),
	// and its KV events publish its blocks: chain keys of 32 tokens.
	if st, _, b := post(t, http.DefaultClient, e32.URL()+"/v1/completions", body); st != 200 {
		t.Fatalf("warm-up: %d %.300s", st, b)
	}
	idx.Store("e32", kvevents.TierGPU, kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks, 32))

	for i := range 2 {
		st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || h.Get("X-Kvmesh-Engine") != "e32" || !strings.Contains(string(b), `"cached_tokens":992`) {
			t.Fatalf("send %d of a prompt the block-32 engine holds: %d from %q, %.400s; want 200 from e32 with 992 tokens cached",
				i, st, h.Get("X-Kvmesh-Engine"), b)
		}
	}
	// 31 of its 32 blocks each time: the engine computes the last token.
	if p, e := metricValue(t, reg, "kvmesh_ingress_cached_prompt_tokens_total", "source", "predicted"),
		metricValue(t, reg, "kvmesh_ingress_cached_prompt_tokens_total", "source", "engine"); p != 2*992 || e != 2*992 {
		t.Errorf("cached prompt tokens predicted %v, engine %v; want %d both", p, e, 2*992)
	}
	if n := seriesSum(mixedCounter(t, reg)); n != 2 {
		t.Errorf("kvmesh_ingress_mixed_block_size_decisions_total %v, want 2", n)
	}
	if n := strings.Count(logs.String(), "different KV block sizes"); n != 1 || !strings.Contains(logs.String(), "16 (1 engines), 32 (1 engines)") {
		t.Errorf("%d warnings about the mixed block sizes, want 1 naming both: %s", n, logs.String())
	}
}

// mixedCounter is the registry's mixed-block-size counter.
func mixedCounter(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_ingress_mixed_block_size_decisions_total" {
			for _, m := range mf.GetMetric() {
				c.Add(m.GetCounter().GetValue())
			}
		}
	}
	return c
}

// While the only engine whose context holds a long prompt is out of
// routing (its sidecar gossips it not ready: crashed, restarting), the
// prompt is not sent to the short-context engines, whose 400 ("maximum
// context length is 128") would read as permanent and misstate the model's
// context: it is a 503 with Retry-After naming the model and the tokens
// (docs/REQUESTS.md). A prompt the short engine holds still goes there;
// one no engine holds, live or not, is still the 400 (tester h-hetero F2).
func TestLongPromptWhileLongEngineDown(t *testing.T) {
	short := startBlockSim(t, 16, 128)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // the long engine's process is gone
	mem := engineList{
		{Engine: scheduler.Engine{ID: "short", Model: "m", Healthy: true}, URL: short.URL(), MaxModelLen: 128},
		{Engine: scheduler.Engine{ID: "long", Model: "m", Healthy: false}, URL: down, MaxModelLen: 1000},
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "short", Model: "m", URL: short.URL()}), Deps{Membership: mem})
	for _, tc := range []struct {
		prompt, maxTokens, status int
		says                      string
	}{
		{100, 4, 200, ""},
		{500, 4, 503, `no live engine of the model \"m\" takes 504 tokens (a prompt of 500 and its max_tokens 4) right now`},
		{100, 200, 503, `takes 300 tokens (a prompt of 100 and its max_tokens 200)`},
		{990, 100, 503, `takes 990 tokens right now`}, // no engine holds both; the long one holds the prompt
		{2000, 4, 400, "context_length_exceeded"},     // no engine holds it
	} {
		body := strings.Replace(idsPrompt(tc.prompt), `"max_tokens":1,`, `"max_tokens":`+strconv.Itoa(tc.maxTokens)+`,`, 1)
		st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != tc.status || !strings.Contains(string(b), tc.says) {
			t.Errorf("a prompt of %d tokens, max_tokens %d, the 1000-token engine down: %d %.300s; want %d with %s",
				tc.prompt, tc.maxTokens, st, b, tc.status, tc.says)
		}
		if st == 503 && (h.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"server_error"`)) {
			t.Errorf("a prompt of %d: the 503 has Retry-After %q, body %.300s; want one, with an OpenAI server_error", tc.prompt, h.Get("Retry-After"), b)
		}
		if st == 503 && h.Get("X-Kvmesh-Engine") != "" {
			t.Errorf("a prompt of %d: the 503 names engine %q; no engine was tried", tc.prompt, h.Get("X-Kvmesh-Engine"))
		}
	}
}

// mixedBlockRig is two real sims of one model, block sizes 16 and 32 (the
// block-32 one with a request in flight, so an idle-first choice is the
// block-16 one), their gossip view, an index and a kvmesh-policy config.
func mixedBlockRig(t *testing.T) (e16, e32 *sim.Server, idx *index.Index, mem engineList, cfg Config) {
	t.Helper()
	e16, e32 = startBlockSim(t, 16, 0), startBlockSim(t, 32, 0)
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mem = engineList{
		{Engine: scheduler.Engine{ID: "e16", Model: "m", Healthy: true}, URL: e16.URL(), BlockSize: 16},
		{Engine: scheduler.Engine{ID: "e32", Model: "m", Healthy: true, InFlight: 1}, URL: e32.URL(), BlockSize: 32},
	}
	cfg = testConfig(StaticEngine{ID: "e16", Model: "m", URL: e16.URL()})
	cfg.Scheduler.Policy = "kvmesh"
	return e16, e32, idx, mem, cfg
}
