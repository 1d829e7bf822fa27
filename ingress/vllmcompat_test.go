package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
)

func startSim(t *testing.T, cfg sim.Config) *sim.Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 500
	}
	sm, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	return sm
}

// The engine's X-Request-Id answer header (vLLM with
// --enable-request-id-headers; the simulator always) reaches the client,
// streamed or not:
// the client's own id echoed, or the one the engine made, which its answer's
// id carries.
func TestEngineRequestIDPassesThrough(t *testing.T) {
	sm := startSim(t, sim.Config{Model: "m"})
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: sm.URL()}), Deps{})
	for _, stream := range []bool{false, true} {
		for _, id := range []string{"", "req-42"} {
			body := `{"model":"m","prompt":"hello there","max_tokens":2}`
			if stream {
				body = `{"model":"m","prompt":"hello there","max_tokens":2,"stream":true}`
			}
			var hdr []string
			if id != "" {
				hdr = []string{"X-Request-Id", id}
			}
			st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body, hdr...)
			if st != 200 {
				t.Fatalf("stream %v: %d %s", stream, st, b)
			}
			var ans struct{ ID string }
			first := b
			if stream {
				first = []byte(sseEvents(b)[0])
			}
			if err := json.Unmarshal(first, &ans); err != nil {
				t.Fatalf("stream %v: %v: %s", stream, err, b)
			}
			got := h.Get("X-Request-Id")
			if got == "" || (id != "" && got != id) || ans.ID != "cmpl-"+got {
				t.Fatalf("stream %v, client's id %q: X-Request-Id %q, answer id %q", stream, id, got, ans.ID)
			}
		}
	}
}

// vLLM's /ping (SageMaker's health check, GET or POST) and /version are
// served: ping is 200 while the ingress is ready and a 503 with the OpenAI
// error body when it is not (draining here); version is kvmesh's.
func TestPingAndVersion(t *testing.T) {
	sm := startSim(t, sim.Config{Model: "m"})
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: sm.URL()}), Deps{})
	base := "http://" + s.Addr()
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, base+"/ping", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s /ping: %d, want 200 from a ready ingress", method, resp.StatusCode)
		}
	}
	resp, err := http.Get(base + "/version")
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ Version string }
	err = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil || v.Version == "" {
		t.Fatalf("/version: %d %v %+v", resp.StatusCode, err, v)
	}

	s.draining.Store(true) // what Close does first
	resp, err = http.Get(base + "/ping")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct {
		Error struct{ Message, Type string } `json:"error"`
	}
	if resp.StatusCode != 503 || json.Unmarshal(b, &e) != nil || e.Error.Type == "" || !strings.Contains(e.Error.Message, "draining") {
		t.Fatalf("/ping while draining: %d %s, want a 503 with the OpenAI error body", resp.StatusCode, b)
	}
}

// n > 1 through the ingress to a simulator that samples it (vLLM's
// shapes): the client gets every choice, streamed or not; the ingress
// learns one sequence's output length from the usage (completion tokens
// over n) and leaves nothing charged on the engine (TestLearnParallelSampling
// covers the decode sample itself: whether a stream's steps arrive in
// separate reads depends on the machine).
func TestParallelSamplingThroughIngress(t *testing.T) {
	sm := startSim(t, sim.Config{Model: "m", TimeScale: 50})
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: sm.URL()})
	cfg.Scheduler.Policy = "kvmesh"
	s := startIngress(t, cfg, Deps{})
	const n = 3
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"sample this","max_tokens":12,"n":3,"ignore_eos":true}`)
	var full struct {
		Choices []struct {
			Index int
			Text  string
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal(b, &full); st != 200 || err != nil || len(full.Choices) != n || full.Usage.CompletionTokens != n*12 {
		t.Fatalf("status %d (%v): %s", st, err, b)
	}
	if got := s.outLens.estimate("m", 1000); got != 12 {
		t.Errorf("output length learned from n=%d answers of 12 tokens each: %d, want 12", n, got)
	}
	st, _, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"sample this","max_tokens":12,"n":3,"ignore_eos":true,"stream":true}`)
	if st != 200 {
		t.Fatalf("stream: status %d %s", st, b)
	}
	texts := make([]string, n)
	for _, ev := range sseEvents(b) {
		if ev == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Index int
				Text  string
			}
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Index >= n {
			t.Fatalf("event %s (%v)", ev, err)
		}
		texts[c.Choices[0].Index] += c.Choices[0].Text
	}
	for i := range texts {
		if texts[i] != full.Choices[i].Text {
			t.Errorf("streamed choice %d %q, not streamed %q", i, texts[i], full.Choices[i].Text)
		}
	}
	up, _ := s.ups.get("e", sm.URL())
	if up.lw.seqs.Load() != 0 || up.lw.ctx.Load() != 0 || up.inflight.Load() != 0 {
		t.Errorf("%d sequences, %d context tokens and %d requests still counted", up.lw.seqs.Load(), up.lw.ctx.Load(), up.inflight.Load())
	}
}

// stream is read as vLLM's pydantic reads a bool: "yes", "TRUE" and 1 ask
// for a stream, "off" and 0 for one answer, both through the ingress and
// the engine, on the four generation APIs; 2 and "maybe" are refused (400)
// before any engine sees them.
// Before, any stream but true, false or null was a 400 the engine would
// not have given.
func TestStreamReadAsPydanticBool(t *testing.T) {
	sm := startSim(t, sim.Config{Model: "m"})
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: sm.URL()}), Deps{})
	for _, tc := range []struct {
		val    string
		status int
		stream bool
	}{
		{`"yes"`, 200, true}, {`"TRUE"`, 200, true}, {`1`, 200, true}, {`1.0`, 200, true},
		{`"off"`, 200, false}, {`0`, 200, false}, {`"F"`, 200, false},
		{`2`, 400, false}, {`"maybe"`, 400, false}, {`[]`, 400, false},
	} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses"} {
			body := map[string]string{
				"/v1/completions":      `{"model":"m","prompt":"hello there","max_tokens":2,"stream":`,
				"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":`,
				"/v1/messages":         `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":`,
				"/v1/responses":        `{"model":"m","input":"hello","max_output_tokens":2,"stream":`,
			}[path] + tc.val + `}`
			st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+path, body)
			if st != tc.status {
				t.Fatalf("%s stream %s: %d %s, want %d", path, tc.val, st, b, tc.status)
			}
			if st != 200 {
				if !strings.Contains(string(b), "stream must be a boolean") {
					t.Errorf("%s stream %s: %s, want an error naming stream", path, tc.val, b)
				}
				continue
			}
			sse := strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
			end := map[string]string{"/v1/messages": "event: message_stop", "/v1/responses": "event: response.completed"}[path]
			if end == "" {
				end = "data: [DONE]"
			}
			if sse != tc.stream || tc.stream && !strings.Contains(string(b), end) {
				t.Errorf("%s stream %s: Content-Type %q, %.120s; want a stream: %v", path, tc.val, h.Get("Content-Type"), b, tc.stream)
			}
		}
	}
}
