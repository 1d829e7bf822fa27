package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// scriptedServer is an OpenAI-compatible server on loopback whose behaviour each test
// scripts: it exists to produce what a real engine will not on demand (429s,
// malformed streams, error events, stalls). It decodes requests with internal/openai
// like the simulator does, and reports the prompt length it actually received, so
// token counts in the report are earned, not echoed.
type scriptedServer struct {
	*httptest.Server
	mode        func(n int64) string // per request number: "ok", "429", "badsse", "errevent", "stall"
	n           atomic.Int64
	cur, peak   atomic.Int64
	mu          sync.Mutex
	chatBodies  int
	tokensSeen  int
	sessionSeen map[string]int
}

func newScriptedServer(t *testing.T, mode func(n int64) string) *scriptedServer {
	s := &scriptedServer{mode: mode, sessionSeen: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.Close)
	return s
}

func (s *scriptedServer) handle(w http.ResponseWriter, r *http.Request) {
	c := s.cur.Add(1)
	defer s.cur.Add(-1)
	for p := s.peak.Load(); c > p && !s.peak.CompareAndSwap(p, c); p = s.peak.Load() {
	}
	n := s.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	prompt, maxTok, stream := 0, 0, false
	switch r.URL.Path {
	case "/v1/completions":
		req, err := openai.DecodeCompletionRequest(body)
		if err != nil {
			w.WriteHeader(400)
			w.Write(openai.AppendError(nil, err.Error(), openai.TypeInvalidRequest, "", ""))
			return
		}
		prompt, maxTok, stream = req.Prompt.Len(), req.MaxOutput(), bool(req.Stream) && req.IncludeUsage()
		if len(req.Prompt.Tokens) == 1 {
			prompt = len(req.Prompt.Tokens[0])
		}
	case "/v1/chat/completions":
		req, err := openai.DecodeChatRequest(body)
		if err != nil {
			w.WriteHeader(400)
			return
		}
		prompt, maxTok, stream = len(strings.Fields(req.Messages[0].Content.Text)), req.MaxOutput(), bool(req.Stream)
		s.mu.Lock()
		s.chatBodies++
		s.mu.Unlock()
	default:
		w.WriteHeader(404)
		return
	}
	s.mu.Lock()
	s.tokensSeen += prompt
	if sid := r.Header.Get("X-Session-ID"); sid != "" {
		s.sessionSeen[sid]++
	}
	s.mu.Unlock()
	engine := fmt.Sprintf("engine-%d", n%2)
	w.Header().Set(EngineHeader, engine)
	switch s.mode(n) {
	case "429":
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(429)
		w.Write(openai.AppendError(nil, "slow down", "rate_limit_exceeded", "", ""))
		return
	case "stall":
		<-r.Context().Done()
		return
	}
	usage := &openai.Usage{PromptTokens: prompt, CompletionTokens: maxTok, TotalTokens: prompt + maxTok,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: prompt / 2}}
	if !stream {
		json.NewEncoder(w).Encode(map[string]any{"choices": []map[string]any{{"text": strings.Repeat("x", maxTok)}}, "usage": usage})
		return
	}
	openai.SetHeaders(w.Header())
	sw := openai.NewSSEWriter(w)
	f := &openai.ChunkFields{ID: "cmpl-1", Model: "m"}
	for i := 0; i < maxTok; i++ {
		if s.mode(n) == "errevent" && i == 1 {
			sw.Data(openai.AppendError(nil, "engine died", "server_error", "", ""))
			return
		}
		if r.URL.Path == "/v1/chat/completions" {
			sw.Data(openai.AppendChatChunk(nil, f, "", openai.StringPtr("x"), ""))
		} else {
			sw.Data(openai.AppendCompletionChunk(nil, f, "x", ""))
		}
	}
	if s.mode(n) == "badsse" {
		w.Write([]byte("event: nope\n\n"))
		return
	}
	sw.Data(openai.AppendUsageChunk(nil, f, openai.ObjectCompletion, usage))
	sw.Done()
}

func sharedPrefix(t *testing.T, groups, prompts int) []workload.Request {
	t.Helper()
	reqs, err := workload.SharedPrefix{Groups: groups, Prompts: prompts, Shared: 64, Question: 16, Output: 4, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestRunStreamingCompletions(t *testing.T) {
	srv := newScriptedServer(t, func(int64) string { return "ok" })
	reqs := sharedPrefix(t, 4, 8)
	var progress []Progress
	var mu sync.Mutex
	rep, err := Run(context.Background(), Config{URL: srv.URL + "/v1", Model: "m", Concurrency: 4, Rate: -1,
		SessionHeader: "X-Session-ID", ProgressInterval: 5 * time.Millisecond,
		Progress: func(p Progress) { mu.Lock(); progress = append(progress, p); mu.Unlock() }}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 32 || rep.Failed != 0 {
		t.Fatalf("completed %d failed %d: %v", rep.Completed, rep.Failed, rep.Errors)
	}
	if rep.PromptTokens != int64(srv.tokensSeen) || rep.PromptTokens != 32*80 {
		t.Fatalf("prompt tokens %d, server saw %d, want %d", rep.PromptTokens, srv.tokensSeen, 32*80)
	}
	if rep.CachedTokens != rep.PromptTokens/2 || rep.PrefixHitRate != 0.5 {
		t.Fatalf("cached %d hit rate %v", rep.CachedTokens, rep.PrefixHitRate)
	}
	if rep.OutputTokens != 32*4 {
		t.Fatalf("output tokens %d", rep.OutputTokens)
	}
	if rep.PerEngine["engine-0"]+rep.PerEngine["engine-1"] != 32 || rep.LoadImbalance != 1 {
		t.Fatalf("per engine %v imbalance %v", rep.PerEngine, rep.LoadImbalance)
	}
	for _, r := range rep.Results {
		if r.TTFT <= 0 || r.TTFT > r.E2E {
			t.Fatalf("request %d: ttft %v e2e %v", r.ID, r.TTFT, r.E2E)
		}
	}
	if rep.TTFT.P50 > rep.TTFT.P99 || rep.TTFT.P99 > rep.TTFT.Max || rep.ThroughputRPS <= 0 {
		t.Fatalf("summary inconsistent: %+v", rep)
	}
	if p := srv.peak.Load(); p > 4 {
		t.Fatalf("peak concurrency %d > 4", p)
	}
	if len(srv.sessionSeen) != 32 || srv.sessionSeen[reqs[5].Session] != 1 {
		t.Fatalf("sessions seen %v, want each request's session once", srv.sessionSeen)
	}
	mu.Lock()
	last := progress[len(progress)-1]
	mu.Unlock()
	if !last.Final || last.Completed != 32 || last.InFlight != 0 {
		t.Fatalf("final progress %+v", last)
	}
	pr := rep.PolicyResult()
	if pr.TTFTP99 != rep.TTFT.P99 || pr.PrefixHitRate != rep.PrefixHitRate || pr.Completed != 32 {
		t.Fatalf("policy result %+v", pr)
	}
	// The E2E p99 and TPOT are the client's own, measured; the engines'
	// queue it cannot see: null, not a measured 0 (kvmesh demo --json).
	if pr.E2EP99 != rep.E2E.P99 || pr.TPOTCount != 32 || !(pr.TPOTMean > 0) {
		t.Fatalf("policy result E2E p99 %v (want %v), TPOT %v over %d", pr.E2EP99, rep.E2E.P99, pr.TPOTMean, pr.TPOTCount)
	}
	if b, err := json.Marshal(pr); err != nil || !strings.Contains(string(b), `"queue_mean_s":null`) || strings.Contains(string(b), `"e2e_p99_s":0,`) {
		t.Fatalf("policy result JSON %s, %v", b, err)
	}
	var sb strings.Builder
	if err := rep.WriteText(&sb); err != nil || !strings.Contains(sb.String(), "hit rate 50.0%") {
		t.Fatalf("text report: %v\n%s", err, sb.String())
	}
}

func TestRunChatAndNonStreaming(t *testing.T) {
	srv := newScriptedServer(t, func(int64) string { return "ok" })
	reqs := sharedPrefix(t, 2, 2)
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Endpoint: Chat, Rate: -1}, reqs)
	if err != nil || rep.Completed != 4 || srv.chatBodies != 4 {
		t.Fatalf("chat: %v, completed %d, chat bodies %d, errors %v", err, rep.Completed, srv.chatBodies, rep.Errors)
	}
	if rep.PromptTokens != 4*80 {
		t.Fatalf("chat words/tokens %d, want %d", rep.PromptTokens, 4*80)
	}
	rep, err = Run(context.Background(), Config{URL: srv.URL, Model: "m", NoStream: true, Rate: -1}, reqs)
	if err != nil || rep.Completed != 4 || rep.OutputTokens != 16 {
		t.Fatalf("non-streaming: %v %+v", err, rep)
	}
}

func TestRunErrorKinds(t *testing.T) {
	modes := []string{"ok", "429", "badsse", "errevent"}
	srv := newScriptedServer(t, func(n int64) string { return modes[(n-1)%4] })
	reqs := sharedPrefix(t, 2, 8)
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Concurrency: 1, Rate: -1}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"http_429": 4, KindStream: 4, KindInStream: 4}
	if rep.Completed != 4 || rep.Failed != 12 || fmt.Sprint(rep.Errors) != fmt.Sprint(want) {
		t.Fatalf("completed %d failed %d errors %v, want 4/12 %v", rep.Completed, rep.Failed, rep.Errors, want)
	}
	for _, r := range rep.Results {
		if r.ErrKind == "http_429" && r.ErrMsg != "slow down" {
			t.Fatalf("429 message %q not decoded from the OpenAI error body", r.ErrMsg)
		}
	}

	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	rep, err = Run(context.Background(), Config{URL: url, Model: "m", Rate: -1}, reqs[:2])
	if err != nil || rep.Errors[KindConnect] != 2 {
		t.Fatalf("connect errors: %v %v", err, rep.Errors)
	}
}

func TestRunTimeoutAndCancel(t *testing.T) {
	srv := newScriptedServer(t, func(int64) string { return "stall" })
	reqs := sharedPrefix(t, 1, 2)
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Timeout: 50 * time.Millisecond, Rate: -1}, reqs)
	if err != nil || rep.Errors[KindTimeout] != 2 {
		t.Fatalf("timeouts: %v %v", err, rep.Errors)
	}

	ctx, cancel := context.WithCancel(context.Background())
	many := sharedPrefix(t, 4, 16)
	done := make(chan struct{})
	var rep2 *Report
	go func() {
		rep2, err = Run(ctx, Config{URL: srv.URL, Model: "m", Concurrency: 2, Rate: -1}, many)
		close(done)
	}()
	testutil.WaitFor(t, 5*time.Second, "two requests in flight at the server", func() bool { return srv.cur.Load() == 2 })
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) || rep2 == nil || rep2.Sent >= len(many) || rep2.Errors[KindCanceled] != rep2.Sent {
		t.Fatalf("cancel: err %v, report %+v", err, rep2)
	}
}

func TestScheduleOpenLoop(t *testing.T) {
	reqs := sharedPrefix(t, 2, 50)
	arr, _ := schedule(Config{Rate: 100, Seed: 7}, reqs)
	if arr[0] <= 0 || arr[99] < arr[0] {
		t.Fatal("arrivals not increasing")
	}
	mean := arr[99].Seconds() / 100
	if mean < 0.005 || mean > 0.02 {
		t.Fatalf("mean inter-arrival %.4fs at rate 100/s", mean)
	}
	again, _ := schedule(Config{Rate: 100, Seed: 7}, reqs)
	if fmt.Sprint(arr) != fmt.Sprint(again) {
		t.Fatal("seeded arrivals differ")
	}

	srv := newScriptedServer(t, func(int64) string { return "ok" })
	start := time.Now()
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: 200, Seed: 3}, reqs[:40])
	if err != nil || rep.Completed != 40 {
		t.Fatal(err, rep.Errors)
	}
	arr, _ = schedule(Config{Rate: 200, Seed: 3}, reqs[:40])
	last := arr[39]
	if el := time.Since(start); el < last {
		t.Fatalf("run took %v, shorter than the last arrival %v: not open-loop paced", el, last)
	}
	for i, r := range rep.Results {
		if r.Sent+time.Millisecond < arr[i] {
			t.Fatalf("request %d sent at %v before its arrival", i, r.Sent)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	_, err := Run(context.Background(), Config{URL: "ftp://x", Endpoint: "embeddings", Concurrency: -1, Timeout: -1}, nil)
	for _, want := range []string{"url", "endpoint", "model", "concurrency", "timeout"} {
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestEndpointURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:1":      "http://h:1/v1/completions",
		"http://h:1/":     "http://h:1/v1/completions",
		"http://h:1/v1":   "http://h:1/v1/completions",
		"http://h:1/v1/":  "http://h:1/v1/completions",
		"https://h/x/v1/": "https://h/x/v1/completions",
	} {
		if got := endpointURL(in, Completions); got != want {
			t.Errorf("%s → %s, want %s", in, got, want)
		}
	}
}

func BenchmarkAppendBody(b *testing.B) {
	reqs, _ := workload.SharedPrefix{Groups: 1, Prompts: 1, Shared: 2048, Question: 128, Output: 64, Seed: 1}.Generate()
	cfg := Config{Model: "llama"}
	var buf []byte
	var scratch []uint32
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf, scratch = appendBody(buf[:0], &cfg, &reqs[0], scratch)
	}
}

func TestRunSpreadsOverURLs(t *testing.T) {
	a := newScriptedServer(t, func(int64) string { return "ok" })
	b := newScriptedServer(t, func(int64) string { return "ok" })
	rep, err := Run(context.Background(), Config{URLs: []string{a.URL, b.URL + "/v1/"}, Model: "m", Rate: -1}, sharedPrefix(t, 2, 5))
	if err != nil || rep.Completed != 10 {
		t.Fatal(err, rep.Errors)
	}
	if a.n.Load() != 5 || b.n.Load() != 5 {
		t.Fatalf("split %d/%d, want 5/5", a.n.Load(), b.n.Load())
	}
}

func FuzzReadBody(f *testing.F) {
	fields := &openai.ChunkFields{ID: "c", Model: "m"}
	var good []byte
	good = openai.AppendEvent(good, openai.AppendCompletionChunk(nil, fields, "x", ""))
	good = openai.AppendEvent(good, openai.AppendUsageChunk(nil, fields, openai.ObjectCompletion,
		&openai.Usage{PromptTokens: 5, CompletionTokens: 1, PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: 3}}))
	good = openai.AppendDone(good)
	f.Add(good, true, false)
	f.Add(good[:len(good)-3], true, false)
	f.Add([]byte(`{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}`), false, false)
	f.Add(openai.AppendEvent(nil, openai.AppendError(nil, "boom", "server_error", "", "")), true, false)
	f.Add([]byte("data: {\"choices\":null}\r\n\r\ndata: [DONE]\r\n\r\n"), true, false)
	f.Add([]byte(respStream), true, true)
	f.Add([]byte(`{"output":[{"content":[{"text":"a"}]}],"usage":{"input_tokens":3,"output_tokens":1}}`), false, true)
	f.Add([]byte(msgStream), true, true)
	f.Add([]byte("id: 1\r\ndata:{\"choices\":[{\"text\":\"a\"}]}\r\rdata:\n\ndata: [DONE]"), true, false)
	f.Add([]byte("event: message_start\ndata:{\"type\":\"message_start\",\n\n"), true, true)
	f.Fuzz(func(t *testing.T, body []byte, stream, named bool) {
		for _, ep := range []Endpoint{Completions, Responses, Messages} {
			if named == (ep == Completions) {
				continue
			}
			for _, strict := range []bool{false, true} {
				var res Result
				readBody(context.Background(), strings.NewReader(string(body)), stream, ep, strict, time.Now(), &res)
				if res.ErrKind == "" {
					if res.TTFT > res.E2E || (strict && res.NonCanonicalSSE) {
						t.Fatalf("accepted body gave %+v", res)
					}
				} else if res.ErrKind != KindStream && res.ErrKind != KindInStream && res.ErrKind != KindUsage {
					t.Fatalf("unexpected kind %q", res.ErrKind)
				}
			}
		}
	})
}

func TestReadBody(t *testing.T) {
	fields := &openai.ChunkFields{ID: "c", Model: "m"}
	var b []byte
	b = openai.AppendEvent(b, openai.AppendChatChunk(nil, fields, "assistant", openai.StringPtr(""), ""))
	b = openai.AppendEvent(b, openai.AppendChatChunk(nil, fields, "", openai.StringPtr("hi"), ""))
	b = openai.AppendEvent(b, openai.AppendUsageChunk(nil, fields, openai.ObjectChatChunk,
		&openai.Usage{PromptTokens: 40, CompletionTokens: 1, PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: 32}}))
	good := openai.AppendDone(b)
	for _, tc := range []struct {
		name string
		body []byte
		kind string
	}{
		{"good", good, ""},
		{"no [DONE]", b, KindStream},
		{"error event", openai.AppendEvent(append([]byte{}, b...), openai.AppendError(nil, "boom", "server_error", "", "")), KindInStream},
		{"not json", []byte("data: hello\n\ndata: [DONE]\n\n"), KindStream},
	} {
		var res Result
		readBody(context.Background(), strings.NewReader(string(tc.body)), true, Completions, false, time.Now(), &res)
		if res.ErrKind != tc.kind {
			t.Errorf("%s: kind %q, want %q (%s)", tc.name, res.ErrKind, tc.kind, res.ErrMsg)
		}
		if tc.kind == "" && (res.PromptTokens != 40 || res.CachedTokens != 32 || res.OutputTokens != 1 || res.TTFT <= 0) {
			t.Errorf("%s: %+v", tc.name, res)
		}
	}
}

// respStream is a Responses API stream as vLLM writes it (abridged).
const respStream = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n" +
	"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
	"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":1}}}\n\n"

func TestReadBodyResponses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		stream bool
		kind   string
	}{
		{"stream", respStream, true, ""},
		{"answer", `{"output":[{"content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":32},"output_tokens":1}}`, false, ""},
		{"error event", respStream[:strings.Index(respStream, "event: response.completed")] + "event: error\ndata: {\"type\":\"error\",\"message\":\"boom\"}\n\n", true, KindInStream},
		{"cut inside an event", respStream[:len(respStream)-5], true, KindStream},
		{"named form is not a chat stream", respStream, true, "chat"},
	} {
		var res Result
		ep := Responses
		if tc.kind == "chat" {
			ep = Chat
		}
		readBody(context.Background(), strings.NewReader(tc.body), tc.stream, ep, false, time.Now(), &res)
		want := tc.kind
		if want == "chat" {
			want = KindStream // a chat stream ends with [DONE]
		}
		if res.ErrKind != want {
			t.Errorf("%s: kind %q, want %q (%s)", tc.name, res.ErrKind, want, res.ErrMsg)
		}
		if want == "" && (res.PromptTokens != 40 || res.CachedTokens != 32 || res.OutputTokens != 1 || res.TTFT <= 0) {
			t.Errorf("%s: %+v", tc.name, res)
		}
	}
}

func TestOpenLoopFlag(t *testing.T) {
	srv := newScriptedServer(t, func(int64) string { return "ok" })
	reqs := sharedPrefix(t, 1, 3)
	closed, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1}, reqs)
	if err != nil || closed.OpenLoop {
		t.Fatalf("closed loop: %v, open=%v", err, closed.OpenLoop)
	}
	open, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: 500, Seed: 1}, reqs)
	if err != nil || !open.OpenLoop {
		t.Fatalf("open loop: %v, open=%v", err, open.OpenLoop)
	}
}

// TestRunFollowUps: a session's next turn (workload.Request.After) is sent
// Think after the previous turn's answer, once, in every arrival mode, and
// after a failed answer too.
func TestRunFollowUps(t *testing.T) {
	const trace = `{"timestamp": 0, "session_id": "s", "input_length": 40, "output_length": 3, "hash_ids": [1]}
{"session_id": "s", "delay": 150, "input_length": 60, "output_length": 3, "hash_ids": [1]}
{"session_id": "s", "delay": 50, "input_length": 80, "output_length": 3, "hash_ids": [1]}
{"timestamp": 10, "input_length": 20, "output_length": 3, "hash_ids": [9]}
`
	reqs, err := workload.Mooncake{}.Read(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct {
		rate float64
		mode string
	}{{0, "ok"}, {-1, "ok"}, {1000, "ok"}, {0, "429"}} {
		rate, mode := run.rate, run.mode // "429": every turn fails, and a failed answer is an answer too
		srv := newScriptedServer(t, func(int64) string { return mode })
		rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: rate, Seed: 1}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Sent != 4 || srv.n.Load() != 4 || (mode == "429") != (rep.Failed == 4) {
			t.Fatalf("rate %v, %s: sent %d, failed %d, server saw %d, want 4", rate, mode, rep.Sent, rep.Failed, srv.n.Load())
		}
		byID := map[int]Result{}
		for _, r := range rep.Results {
			byID[r.ID] = r
		}
		for _, j := range []int{2, 3} { // the follow-ups (sorted after the untagged request)
			i := reqs[j].After - 1
			p, f := byID[i], byID[j]
			if f.Sent < p.Sent+p.E2E+reqs[j].Think {
				t.Errorf("rate %v: request %d sent at %v, before request %d's answer (%v + %v) + %v", rate, j, f.Sent, i, p.Sent, p.E2E, reqs[j].Think)
			}
		}
	}
}

// msgStream is a Messages API stream as vLLM writes it.
const msgStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":40,\"output_tokens\":0}}}\n\n" +
	"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"},\"index\":0}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"},\"index\":0}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":8,\"output_tokens\":1,\"cache_read_input_tokens\":32}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

func TestReadBodyMessages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		stream bool
		kind   string
	}{
		{"stream", msgStream, true, ""},
		{"answer", `{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":8,"cache_read_input_tokens":32,"output_tokens":1}}`, false, ""},
		{"error event", msgStream[:strings.Index(msgStream, "event: content_block_stop")] + "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n", true, KindInStream},
		{"cut inside an event", msgStream[:len(msgStream)-5], true, KindStream},
	} {
		var res Result
		readBody(context.Background(), strings.NewReader(tc.body), tc.stream, Messages, false, time.Now(), &res)
		if res.ErrKind != tc.kind {
			t.Fatalf("%s: kind %q (%s), want %q", tc.name, res.ErrKind, res.ErrMsg, tc.kind)
		}
		if tc.kind == "" && (res.PromptTokens != 40 || res.CachedTokens != 32 || res.OutputTokens != 1 || res.TTFT <= 0) {
			t.Fatalf("%s: %+v", tc.name, res)
		}
	}
}

// A rate so low that an arrival is past what a time.Duration holds is
// refused before anything is sent, naming the rate (before: the arrival
// times wrapped negative and every request was sent at once, reported as
// an open-loop run).
func TestRunRateOverflowRefused(t *testing.T) {
	srv := newScriptedServer(t, func(int64) string { return "ok" })
	for _, rate := range []float64{1e-12, 1e-300, 5e-324} {
		rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: rate, Seed: 1}, sharedPrefix(t, 2, 4))
		if !errors.Is(err, ErrConfig) || rep != nil || !strings.Contains(err.Error(), fmt.Sprintf("rate %g req/s", rate)) ||
			!strings.Contains(err.Error(), "past the 292 years") {
			t.Errorf("rate %g: report %v, err %v; want a config error naming the rate", rate, rep, err)
		}
	}
	if n := srv.n.Load(); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
	// The lowest rate that fits is accepted (its arrivals are scheduled, not sent here).
	if _, err := schedule(Config{Rate: 1e-6, Seed: 1}, sharedPrefix(t, 2, 4)); err != nil {
		t.Fatalf("rate 1e-6: %v", err)
	}
}
