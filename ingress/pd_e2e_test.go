package ingress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// startPDCluster starts a NIXL P/D cluster of real simulators (side
// channel on loopback) and an ingress disaggregating every request.
func startPDCluster(t *testing.T, base sim.Config, prefill, decode int) (*simtest.PD, *Server) {
	t.Helper()
	base.Model, base.Logger = "m", slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: base, Prefill: prefill, Decode: decode})
	var m roleMembership
	for i, s := range cl.Prefill {
		m = append(m, pdEngine("p"+string(rune('0'+i)), scheduler.RolePrefill, s.URL()))
	}
	for i, s := range cl.Decode {
		m = append(m, pdEngine("d"+string(rune('0'+i)), scheduler.RoleDecode, s.URL()))
	}
	for i := range m {
		m[i].MaxModelLen = base.Engine.MaxModelLen // as the sidecars gossip it (0: not reported)
	}
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	return cl, startIngress(t, c, Deps{Membership: m})
}

// TestPDBlocksFreedAfterEachRead: after every disaggregated request the
// prefill engine holds no blocks: the decode engine's read over the side
// channel released them (not the 480 s abort timeout).
func TestPDBlocksFreedAfterEachRead(t *testing.T) {
	cl, s := startPDCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 1, 1)
	p := cl.Prefill[0]
	for i := 0; i < 6; i++ {
		stream := i%2 == 1
		body := `{"model":"m","prompt":"request ` + strings.Repeat("word ", 40+i) + `","max_tokens":4,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		// The decode engine sends DONE off the request path once the KV has
		// arrived (sim: pdState.ack, as vLLM's NIXL notification), so the
		// answer can reach the client before the prefill engine frees the
		// blocks; freed within seconds, not at the 480 s abort timeout.
		testutil.WaitFor(t, 30*time.Second, "the prefill engine to free the leg's blocks", func() bool {
			return p.Load(0).HeldBlocks == 0 && p.HeldRequests(0) == 0
		})
		if l := p.Load(0); l.Finished != uint64(i+1) {
			t.Fatalf("after request %d the prefill engine ran %d legs", i, l.Finished)
		}
	}
	if ok := val(s.pdInit().legs.WithLabelValues("prefill", "ok")); ok != 6 {
		t.Fatalf("%v prefill legs ok, want 6 (every request disaggregated)", ok)
	}
}

// TestPDPrefillKilledMidRun: a prefill engine killed while requests queue
// on it costs no request that had not started streaming: every one falls
// back to the decode engine (local prefill) and succeeds.
func TestPDPrefillKilledMidRun(t *testing.T) {
	// One sequence at a time, 20× slower than the model, so prefill legs queue.
	cl, s := startPDCluster(t, sim.Config{TimeScale: 0.05, Seed: 1, Engine: engine.Config{MaxRunning: 1}}, 1, 1)
	const n = 12
	type result struct {
		status int
		body   string
		done   bool
		stream bool
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := i%2 == 0
			body := `{"model":"m","prompt":"kill ` + strings.Repeat("token ", 200+i) + `","max_tokens":3,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
			st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
			r := result{status: st, body: string(b), stream: stream}
			if stream {
				evs := sseEvents(b)
				r.done = len(evs) > 0 && evs[len(evs)-1] == "[DONE]"
			}
			results[i] = r
		}(i)
	}
	p := cl.Prefill[0]
	okLegs := s.pdInit().legs.WithLabelValues("prefill", "ok")
	testutil.WaitFor(t, 30*time.Second, "a prefill leg done and others queued on the victim", func() bool {
		l := p.Load(0)
		return l.Running+l.Waiting > 0 && val(okLegs) > 0
	})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	legs := s.pdInit().legs
	ok, fallback := val(legs.WithLabelValues("prefill", "ok")), val(legs.WithLabelValues("prefill", "fallback_connect_error"))+val(legs.WithLabelValues("prefill", "fallback_status_5xx"))
	if ok == 0 || fallback == 0 {
		t.Errorf("prefill legs: %v ok, %v fell back; want both (the kill must land mid-run)", ok, fallback)
	}
	for i, r := range results {
		if r.status != 200 || (r.stream && !r.done) {
			t.Errorf("request %d (stream %v): status %d body %.200s", i, r.stream, r.status, r.body)
		}
	}
}

// TestPDRefusedLimitsServedAggregated: a request the engine refuses for a
// member the prefill leg rewrites (max_tokens 0, min_tokens over
// max_tokens, stream_options without stream) runs no prefill leg: it is
// served aggregated, so the client gets the engine's own 400, the same
// answer as on the aggregated path, and no prefill engine holds blocks for
// a decode leg that would be refused.
func TestPDRefusedLimitsServedAggregated(t *testing.T) {
	cl, s := startPDCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 1, 1)
	agg := startIngress(t, testConfig(StaticEngine{ID: "d0", Model: "m", URL: cl.Decode[0].URL()}), Deps{})
	prompt := `"prompt":"` + strings.Repeat("refused ", 60) + `"`
	servedAggregated(t, s, agg, cl.Prefill[0], []string{
		`{"model":"m",` + prompt + `,"max_tokens":0}`,
		`{"model":"m",` + prompt + `,"max_tokens":5,"min_tokens":9}`,
		`{"model":"m",` + prompt + `,"max_tokens":5,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`,
	})
	legs := s.pdInit().legs
	if n := val(legs.WithLabelValues("prefill", "fallback_invalid")); n != 4 {
		t.Fatalf("%v requests served aggregated for refused values, want 4", n)
	}
	// Values the engine takes still split: min_tokens within max_tokens.
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m",`+prompt+`,"max_tokens":5,"min_tokens":3}`)
	if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "d0" || val(legs.WithLabelValues("prefill", "ok")) != 1 {
		t.Fatalf("status %d engine %q, %v legs ok: %s", st, hdr.Get("X-Kvmesh-Engine"), val(legs.WithLabelValues("prefill", "ok")), b)
	}
}

// TestPDOverContextServedAggregated: a request whose prompt plus max_tokens
// is over the decode engine's max_model_len (gossiped) runs no prefill leg:
// vLLM's API server refuses it before the engine schedules it, so the
// decode leg would never read the leg's KV and the prefill engine would
// hold the blocks until its abort timeout (480 s). It is served aggregated
// and the client gets the engine's own 400, as on the aggregated path; the
// leg used to run for every such request.
func TestPDOverContextServedAggregated(t *testing.T) {
	cl, s := startPDCluster(t, sim.Config{TimeScale: 100, Seed: 1, Engine: engine.Config{MaxModelLen: 512}}, 1, 1)
	agg := startIngress(t, testConfig(StaticEngine{ID: "d0", Model: "m", URL: cl.Decode[0].URL()}), Deps{})
	prompt := `"prompt":"` + strings.Repeat("refused ", 20) + `"`
	servedAggregated(t, s, agg, cl.Prefill[0], []string{
		`{"model":"m",` + prompt + `,"max_tokens":500}`,
		`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("refused ", 20) + `"}],"max_completion_tokens":500}`,
	})
	legs := s.pdInit().legs
	if n := val(legs.WithLabelValues("prefill", "fallback_invalid")); n != 2 {
		t.Fatalf("%v requests served aggregated for their context length, want 2", n)
	}
	// Within the context, the request still splits.
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m",`+prompt+`,"max_tokens":5}`)
	if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "d0" || val(legs.WithLabelValues("prefill", "ok")) != 1 {
		t.Fatalf("status %d engine %q, %v legs ok: %s", st, hdr.Get("X-Kvmesh-Engine"), val(legs.WithLabelValues("prefill", "ok")), b)
	}
}

// TestPDPrefillWithoutKVConnectorLeftOut: a prefill engine started without
// --kv-transfer-config answers its legs by length without
// kv_transfer_params (every such request was prefilled twice, once there
// and once on the decode engine, with nothing logged): its first such leg
// leaves it out of prefill legs for a backoff, warned once and counted
// (kvmesh_ingress_pd_prefill_no_kv_marks_total), and the legs go to the
// prefill engine that has a connector.
func TestPDPrefillWithoutKVConnectorLeftOut(t *testing.T) {
	var logs testutil.SyncBuffer
	base := sim.Config{Model: "m", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TimeScale: 100, Seed: 1}
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: base})
	plain, err := sim.Start(context.Background(), base) // no KV connector
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })
	good := pdEngine("p0", scheduler.RolePrefill, cl.Prefill[0].URL())
	good.Waiting = 2 // the cost model ranks the engine without a connector first while it is not marked
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Membership: roleMembership{
		pdEngine("p1", scheduler.RolePrefill, plain.URL()), good, pdEngine("d0", scheduler.RoleDecode, cl.Decode[0].URL())}})
	for i := range 4 {
		body := `{"model":"m","prompt":"connector ` + strings.Repeat("word ", 40+i) + `","max_tokens":4}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	p := s.pdInit()
	if n, ok, none := plain.Load(0).Finished, val(p.legs.WithLabelValues("prefill", "ok")), val(p.legs.WithLabelValues("prefill", "fallback_no_params")); n != 1 || ok != 3 || none != 1 {
		t.Fatalf("the engine without a connector ran %d legs; %v legs ok, %v without params; want 1, 3, 1", n, ok, none)
	}
	if n := val(p.noKVMarks.WithLabelValues("p1")); n != 1 {
		t.Fatalf("%v marks counted, want 1", n)
	}
	if n := strings.Count(logs.String(), "without kv_transfer_params"); n != 1 || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
}

// TestKVTransferParamsFinish: the prefill answer's finish_reason comes with
// its params: only a leg that ran to its length without params says the
// engine has no connector (one that stopped early on EOS has none either).
func TestKVTransferParamsFinish(t *testing.T) {
	for _, tc := range []struct {
		body, finish string
		ok           bool
	}{
		{`{"choices":[{"text":"x","finish_reason":"length"}],"kv_transfer_params":{"remote_block_ids":[1]}}`, "length", true},
		{`{"choices":[{"text":"x","finish_reason":"length"}],"kv_transfer_params":null}`, "length", false},
		{`{"choices":[{"message":{"content":""},"finish_reason":"stop"}]}`, "stop", false},
		{`{"choices":[]}`, "", false},
	} {
		if _, finish, ok := kvTransferParams([]byte(tc.body)); finish != tc.finish || ok != tc.ok {
			t.Errorf("%s: finish %q ok %v, want %q %v", tc.body, finish, ok, tc.finish, tc.ok)
		}
	}
}

// servedAggregated posts each of bodies to the P/D ingress s and to agg
// (an ingress over the decode engine d0 alone) and checks the P/D one gave
// the aggregated path's 400 from d0, and that the prefill engine p ran no
// leg and holds no block.
func servedAggregated(t *testing.T, s, agg *Server, p *sim.Server, bodies []string) {
	t.Helper()
	for _, tc := range bodies {
		path := "/v1/completions"
		if strings.Contains(tc, `"messages"`) {
			path = "/v1/chat/completions"
		}
		wst, _, want := post(t, http.DefaultClient, "http://"+agg.Addr()+path, tc)
		st, hdr, got := post(t, http.DefaultClient, "http://"+s.Addr()+path, tc)
		if wst != http.StatusBadRequest || st != wst || string(got) != string(want) || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Errorf("%s: P/D status %d engine %q %s; aggregated %d %s", tc, st, hdr.Get("X-Kvmesh-Engine"), got, wst, want)
		}
	}
	if l := p.Load(0); l.Finished != 0 || l.HeldBlocks != 0 || p.HeldRequests(0) != 0 {
		t.Fatalf("the prefill engine ran %d legs and holds %d blocks", l.Finished, l.HeldBlocks)
	}
}
