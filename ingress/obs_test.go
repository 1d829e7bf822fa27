package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The observability tester's findings (metrics and logs that must match
// what happened): one test each.

// obsEngine is a FAKE engine answering the passthrough endpoints and
// refusing completions with a huge max_tokens (400), as vLLM does.
func obsEngine(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/tokenize":
			io.WriteString(w, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
		case r.URL.Path == "/v1/embeddings":
			io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":5,"total_tokens":5}}`)
		case r.URL.Path == "/detokenize":
			w.WriteHeader(404)
			io.WriteString(w, `{"detail":"Not Found"}`)
		case strings.Contains(string(body), `"max_tokens":99999`):
			w.WriteHeader(400)
			io.WriteString(w, `{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}`)
		default:
			io.WriteString(w, `{"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"t0t1t2","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// waitLines waits for n access lines and returns them.
func waitLines(t *testing.T, alog *testutil.SyncBuffer, n int) []map[string]any {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "the access lines", func() bool {
		return strings.Count(alog.String(), `"msg":"request"`) >= n
	})
	return accessLines(t, alog)
}

// TestTokensCountTakenRequests (F1, F8): kvmesh_ingress_tokens_total counts
// both directions on one rule, the requests an engine took: not a prompt
// the engine refused (400), not a passthrough's size estimate (/tokenize,
// a 404), an embeddings answer by its usage; and the output the client was
// sent, of a stream the engine broke (502) or the client cut (499) too, as
// the access log's output_tokens says. The access log gives a passthrough
// no prompt_tokens unless its engine counted them.
func TestTokensCountTakenRequests(t *testing.T) {
	in := func(s *Server) float64 { return val(s.m.tokensIn) }
	out := func(s *Server) float64 { return val(s.m.tokensOut) }

	t.Run("refused and passthrough", func(t *testing.T) {
		var alog testutil.SyncBuffer
		eng := obsEngine(t)
		s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: eng.URL}),
			Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
		base := "http://" + s.Addr()
		for _, r := range []struct {
			path, body string
			status     int
		}{
			{"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":99999}`, 400},
			{"/tokenize", `{"model":"m","prompt":"hello world, a longer prompt than two tokens"}`, 200},
			{"/detokenize", `{"model":"m","tokens":[1,2,3,4,5,6,7,8]}`, 404},
			{"/v1/embeddings", `{"model":"m","input":"hello world, a longer prompt than five tokens"}`, 200},
			{"/v1/completions", `{"model":"m","prompt":[1,2,3,4]}`, 200},
		} {
			if st, _, b := post(t, http.DefaultClient, base+r.path, r.body); st != r.status {
				t.Fatalf("%s: %d %s, want %d", r.path, st, b, r.status)
			}
		}
		lines := waitLines(t, &alog, 5)
		waitSettled(t, s)
		// 5 (the embeddings' usage) + 4 (the completion's prompt).
		if got := in(s); got != 9 {
			t.Errorf(`tokens_total{direction="in"} = %v, want 9: the refused prompt and the passthrough estimates counted`, got)
		}
		if got := out(s); got != 3 {
			t.Errorf(`tokens_total{direction="out"} = %v, want 3`, got)
		}
		// The passthrough lines: /tokenize (200) and /detokenize (404)
		// without prompt_tokens, the embeddings with the 5 it reported.
		var without200, without404, with5 int
		for _, l := range lines {
			p, ok := l["prompt_tokens"]
			switch {
			case l["endpoint"] != "other":
				if !ok {
					t.Errorf("a generation request's access line has no prompt_tokens: %v", l)
				}
			case !ok && l["status"] == 200.0:
				without200++
			case !ok && l["status"] == 404.0:
				without404++
			case ok && p == 5.0 && l["status"] == 200.0:
				with5++
			default:
				t.Errorf("passthrough access line with prompt_tokens %v (an estimate): %v", p, l)
			}
		}
		if without200 != 1 || without404 != 1 || with5 != 1 {
			t.Errorf("passthrough lines: %d 200s and %d 404s without prompt_tokens, %d with the engine's 5; want one each", without200, without404, with5)
		}
	})

	t.Run("stream broken by the engine", func(t *testing.T) {
		var alog testutil.SyncBuffer
		fe := startFaultEngine(t, faultBreakStream)
		s := startIngress(t, testConfig(StaticEngine{ID: "broken", Model: "m", URL: fe.url()}),
			Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
		post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
		l := waitLines(t, &alog, 1)[0]
		waitSettled(t, s)
		if l["status"] != 502.0 || l["output_tokens"] != 2.0 {
			t.Fatalf("access line %v, want status 502 with 2 output tokens", l)
		}
		if got := out(s); got != 2 {
			t.Errorf(`tokens_total{direction="out"} = %v, want the access log's 2`, got)
		}
		if got := in(s); got != 2 {
			t.Errorf(`tokens_total{direction="in"} = %v, want 2: the engine took the prompt`, got)
		}
	})

	t.Run("stream cut by the client", func(t *testing.T) {
		var alog testutil.SyncBuffer
		fe := startFaultEngine(t, faultSlowStream)
		s := startIngress(t, testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()}),
			Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
		req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1,2,3],"stream":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for n := 0; n < 3; {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "data: ") {
				n++
			}
		}
		resp.Body.Close()
		l := waitLines(t, &alog, 1)[0]
		waitSettled(t, s)
		sent, _ := l["output_tokens"].(float64)
		if l["status"] != 499.0 || sent < 3 {
			t.Fatalf("access line %v, want status 499 with at least 3 output tokens", l)
		}
		if got := out(s); got != sent {
			t.Errorf(`tokens_total{direction="out"} = %v, want the access log's %v`, got, sent)
		}
		if got := in(s); got != 3 {
			t.Errorf(`tokens_total{direction="in"} = %v, want 3`, got)
		}
	})
}

// TestStreamAttemptCountedOnce (F2): a stream counts one result in
// kvmesh_ingress_upstream_attempts_total, when it ends: stream_error alone
// when the engine broke it (before, ok at its commit as well), ok when it
// ran to its end or its client cut it.
func TestStreamAttemptCountedOnce(t *testing.T) {
	results := func(s *Server) (ok, broke float64) {
		return val(s.m.attemptOK), val(s.m.attempts.WithLabelValues("stream_error"))
	}
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultBreakStream)
	s := startIngress(t, testConfig(StaticEngine{ID: "broken", Model: "m", URL: fe.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	waitLines(t, &alog, 1)
	waitSettled(t, s)
	if ok, broke := results(s); ok != 0 || broke != 1 {
		t.Errorf("a broken stream counted ok %v and stream_error %v, want 0 and 1", ok, broke)
	}
	if total := seriesSum(s.m.attempts); total != 1 {
		t.Errorf("attempts counted %v for one attempt", total)
	}

	var alog2 testutil.SyncBuffer
	good := startFaultEngine(t, faultOK)
	s2 := startIngress(t, testConfig(StaticEngine{ID: "good", Model: "m", URL: good.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog2, nil))})
	post(t, http.DefaultClient, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	waitLines(t, &alog2, 1)
	waitSettled(t, s2)
	if ok, broke := results(s2); ok != 1 || broke != 0 {
		t.Errorf("a whole stream counted ok %v and stream_error %v, want 1 and 0", ok, broke)
	}
}

// histCount is a histogram observer's sample count.
func histCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var d dto.Metric
	if err := o.(prometheus.Metric).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// TestTTFTStreamedOnly (F3): kvmesh_ingress_ttft_seconds holds streamed
// answers only: a non-streamed answer's first byte comes with its whole
// answer, and observing it there read as a TTFT of its whole time.
func TestTTFTStreamedOnly(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
	waitLines(t, &alog, 1)
	if n, d := histCount(t, s.m.ttftBy[epCompletions]), histCount(t, s.m.durationBy[epCompletions]); n != 0 || d != 1 {
		t.Errorf("after a non-streamed answer: %d TTFT and %d duration samples, want 0 and 1", n, d)
	}
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	waitLines(t, &alog, 2)
	if n := histCount(t, s.m.ttftBy[epCompletions]); n != 1 {
		t.Errorf("after a streamed answer: %d TTFT samples, want 1", n)
	}
}

// TestLatencyBucketsBetweenOneAndFive (F4): TTFT and duration have buckets
// inside (1 s, 2.5 s) and (2.5 s, 5 s), where TTFT objectives sit: with
// none, every answer of 1.1–2.4 s fell into one bucket and a p99 of 1.7 s
// read 2.49 s.
func TestLatencyBucketsBetweenOneAndFive(t *testing.T) {
	inside := func(lo, hi float64) bool {
		for _, b := range latencyBuckets {
			if b > lo && b < hi {
				return true
			}
		}
		return false
	}
	if !inside(1, 2.5) || !inside(2.5, 5) {
		t.Errorf("latency buckets %v: none between 1 s and 2.5 s, or between 2.5 s and 5 s", latencyBuckets)
	}
}

// TestPrefixMatchRatioSkipsBlocklessPrompts (F12): a prompt with no full
// block has nothing to match and is not observed in
// kvmesh_ingress_prefix_match_ratio (it read as a 0, a miss).
func TestPrefixMatchRatioSkipsBlocklessPrompts(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	count := func() uint64 {
		var d dto.Metric
		if err := s.m.matchRatio.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetHistogram().GetSampleCount()
	}
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3]}`)
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`)
	waitLines(t, &alog, 2)
	if n := count(); n != 0 {
		t.Errorf("%d match ratios observed for prompts with no full block, want 0", n)
	}
	ids := make([]string, s.cfg.BlockSize)
	for i := range ids {
		ids[i] = "7"
	}
	post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[`+strings.Join(ids, ",")+`]}`)
	waitLines(t, &alog, 3)
	if n := count(); n != 1 {
		t.Errorf("%d match ratios observed after a prompt of one full block, want 1", n)
	}
}

// TestDebugEnginesShowsLocalLoad (F7): /debug/engines shows an engine's
// scheduler-side load as the scheduler sees it, this replica's requests
// included (InFlight, LocalPrefillTokens, LocalActiveTokens), not the
// membership copy's zeros.
func TestDebugEnginesShowsLocalLoad(t *testing.T) {
	fe := startFaultEngine(t, faultHangAlive)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminToken = "admin-secret"
	s := startIngress(t, cfg, Deps{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":20}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testutil.WaitFor(t, 10*time.Second, "the request at the engine", func() bool { return fe.hits.Load() == 1 })
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/engines", "admin-secret")
	cancel()
	<-done
	if st != http.StatusOK {
		t.Fatalf("/debug/engines: %d %s", st, body)
	}
	var got []struct {
		ID                                              string
		InFlight, LocalPrefillTokens, LocalActiveTokens int
		LocalInFlight                                   int `json:"local_inflight"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || len(got) != 1 {
		t.Fatalf("%v: %s", err, body)
	}
	e := got[0]
	if e.LocalInFlight != 1 || e.InFlight != 1 || e.LocalPrefillTokens != 10 || e.LocalActiveTokens != 30 {
		t.Errorf("engine shown %+v, want InFlight 1 (as local_inflight), LocalPrefillTokens 10, LocalActiveTokens 30", e)
	}
}

// TestMetricHelpNamesItsValues (F5, F11): the attempts metric's HELP names
// every result it exports, client_gone (a request whose client left before
// its answer) and credential_refused included; the index-keys gauge says it
// counts (key, engine) entries, not distinct keys.
func TestMetricHelpNamesItsValues(t *testing.T) {
	fe := startFaultEngine(t, faultHangAlive)
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Registry: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1]}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testutil.WaitFor(t, 10*time.Second, "the request at the engine", func() bool { return fe.hits.Load() == 1 })
	cancel()
	<-done
	testutil.WaitFor(t, 10*time.Second, "the attempt counted client_gone", func() bool {
		return val(s.m.attempts.WithLabelValues("client_gone")) == 1
	})
	s.m.attempts.WithLabelValues("credential_refused")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvmesh_ingress_upstream_attempts_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && !strings.Contains(mf.GetHelp(), lp.GetValue()) {
					t.Errorf("result %q is not named in the HELP %q", lp.GetValue(), mf.GetHelp())
				}
			}
		}
	}
	reg2 := prometheus.NewRegistry()
	newMetrics(reg2, "x", func() float64 { return 0 }, nil, nil)
	mfs, err = reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_ingress_index_keys" && !strings.Contains(mf.GetHelp(), "(key, engine)") {
			t.Errorf("kvmesh_ingress_index_keys HELP %q does not say it counts (key, engine) entries", mf.GetHelp())
		}
	}
}
