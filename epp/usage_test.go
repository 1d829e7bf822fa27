package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The picker reads the engine's answer as it passes through the response
// phase (FULL_DUPLEX_STREAMED, as GAIE gateways run it) for its output
// tokens, as the ingress reads its proxied answers: the usage of a JSON
// answer, the usage chunk of a stream, else one token per streamed event;
// the Responses and Messages APIs' output_tokens. The request's token
// budgets settle on them (--key-output-tpm), and the token metrics count
// them. The stand-in cuts every answer into small chunks that split lines,
// keys and numbers.

// openFD opens a stream whose response body runs FULL_DUPLEX_STREAMED.
func (r *staticRig) openFD(t *testing.T) *stream {
	t.Helper()
	env := newEnvoy(t, r.s.Addr(), fd, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a guard, not a timing
	t.Cleanup(cancel)
	st, err := env.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &stream{t: t, env: env, st: st, cancel: cancel}
}

// answer plays the response phase: the status, then answer in chunks of
// size bytes, each echoed back; then the stream's end.
func (s *stream) answer(status string, answer string, size int) {
	s.t.Helper()
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: s.env.headerMap([][2]string{{":status", status}})}}})
	s.recv()
	var echoed []byte
	for b := []byte(answer); len(b) > 0; {
		n := min(size, len(b))
		s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: b[:n], EndOfStream: n == len(b)}}})
		echoed = append(echoed, s.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		b = b[n:]
	}
	if string(echoed) != answer {
		s.t.Fatalf("answer echoed as %q, want %q", echoed, answer)
	}
	s.closed()
}

// exchangeFD sends one request and plays its answer cut in chunks of size.
func (r *staticRig) exchangeFD(t *testing.T, path, body, answer string, size int) {
	t.Helper()
	s := r.openFD(t).headers(path, false).body([]byte(body), true)
	routed(t, s.recv())
	s.recv() // the body passed back
	s.answer("200", answer, size)
}

func sseEvents(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}

func TestOutputTokensFromTheAnswer(t *testing.T) {
	chatDelta := `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok,"}}]}`
	messages := `{"model":"` + model + `","max_tokens":40,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, path, body, answer string
		want                     int
	}{
		{"chat JSON", "/v1/chat/completions", chatBody("sys", "hi", false),
			`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a, b"}}],"usage":{"prompt_tokens":12,"total_tokens":52,"completion_tokens":40}}`, 40},
		{"chat stream with its usage chunk", "/v1/chat/completions", chatBody("sys", "hi", true),
			sseEvents(chatDelta, chatDelta, `{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":49,"completion_tokens":37}}`, "[DONE]"), 37},
		{"chat stream without usage: one token per event", "/v1/chat/completions", chatBody("sys", "hi", true),
			sseEvents(chatDelta, chatDelta, chatDelta, chatDelta, chatDelta, "[DONE]"), 5},
		{"completions JSON, pretty-printed", "/v1/completions", completionsBody("hello there", false),
			"{\n  \"choices\": [{\"text\": \"x\"}],\n  \"usage\": {\n    \"prompt_tokens\": 3,\n    \"completion_tokens\": 1234\n  }\n}\n", 1234},
		{"responses JSON", "/v1/responses", `{"model":"` + model + `","input":"hi","max_output_tokens":40}`,
			`{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":5,"output_tokens":21,"total_tokens":26},"user":null}`, 21},
		{"messages stream", "/v1/messages", messages,
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":33}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 33},
		{"a JSON answer longer than the line the picker holds", "/v1/chat/completions", chatBody("sys", "hi", false),
			`{"id":"c","choices":[{"index":0,"message":{"content":"` + strings.Repeat("w, ", 3*maxAnswerLine/3) + `"}}],"usage":{"completion_tokens":77}}`, 77},
	}
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	want := 0.0
	for _, c := range cases {
		for _, size := range []int{3, 7, 64, 1000, 1 << 20} {
			if len(c.answer) > 10000 && size < 1000 {
				continue // 64 k messages
			}
			before := counter(t, r.reg, "kvmesh_ingress_tokens_total", "direction", "out")
			r.exchangeFD(t, c.path, c.body, c.answer, size)
			want += float64(c.want)
			// Settled before the last chunk's echo went out: at the stream's end.
			if got := counter(t, r.reg, "kvmesh_ingress_tokens_total", "direction", "out"); got != want {
				t.Fatalf("%s in chunks of %d: output tokens counted %v, want %v", c.name, size, got-before, c.want)
			}
		}
	}
}

// Output budgets are enforced through the picker: under --key-output-tpm
// 100, requests of max_tokens 40 whose answers produce 40 tokens each get
// through twice, and the third is refused with 429 (it was admitted every
// time while the picker settled each answer at 0 tokens).
func TestOutputBudgetThroughPicker(t *testing.T) {
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	lim, err := ratelimit.New(ratelimit.Config{PerKey: ratelimit.Limits{OutputTokens: 100}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	r := newStaticRigWith(t, twoEngines, Config{}, Deps{}, nil, func(d *ingress.Deps) { d.Limiter = lim })
	body := `{"model":"` + model + `","prompt":"hello there","max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`
	answer := sseEvents(`{"choices":[{"text":"a"}]}`, `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":40,"total_tokens":43}}`, "[DONE]")
	for range 2 {
		r.exchangeFD(t, "/v1/completions", body, answer, 11)
	}
	if got := counter(t, r.reg, "kvmesh_ingress_tokens_total", "direction", "out"); got != 80 {
		t.Fatalf("output tokens counted %v, want 80", got)
	}
	s := r.openFD(t).headers("/v1/completions", false).body([]byte(body), true)
	s.refused(429, "")
	s.closed()
}

// An answer's end decides its status as the ingress's proxy decides it: an
// engine's error event inside a 200 stream gives the request the event's
// code, and a stream that ends before the answer did (the client left, the
// data plane cut it) is 499, its partial output settling the budgets but
// teaching nothing of answer lengths (the output counter is for whole
// answers).
func TestAnswerEndStatus(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	body := `{"model":"` + model + `","prompt":"hello there","max_tokens":40,"stream":true}`
	status := func(code string) float64 {
		return counter(t, r.reg, "kvmesh_ingress_requests_total", "endpoint", "completions", "status", code)
	}
	r.exchangeFD(t, "/v1/completions", body, sseEvents(`{"choices":[{"text":"a"}]}`, `{"error":{"message":"engine fault","type":"InternalServerError","code":503}}`, "[DONE]"), 16)
	testutil.WaitFor(t, 10*time.Second, "the request counted with the error event's code", func() bool { return status("503") == 1 })

	s := r.openFD(t).headers("/v1/completions", false).body([]byte(body), true)
	routed(t, s.recv())
	s.recv() // the body passed back
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: s.env.headerMap([][2]string{{":status", "200"}})}}})
	s.recv()
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte(sseEvents(`{"choices":[{"text":"a"}]}`, `{"choices":[{"text":"b"}]}`))}}})
	s.recv()
	s.cancel() // the client goes before the answer's end
	testutil.WaitFor(t, 10*time.Second, "the cut answer counted 499", func() bool { return status("499") == 1 })
	if got := status("200"); got != 0 {
		t.Fatalf("%v requests counted 200, want none", got)
	}
	if got := counter(t, r.reg, "kvmesh_ingress_tokens_total", "direction", "out"); got != 0 {
		t.Fatalf("output tokens of whole answers %v, want 0 (a cut answer and a failed one)", got)
	}
}
