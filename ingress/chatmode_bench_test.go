package ingress

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sim"
)

// BenchmarkChatMode answers "does sending rendered tokens to /v1/completions
// and re-wrapping pay?": the same ~1,000-token conversation through an
// ingress in each chat mode, against a simulator that tokenizes with the same
// Llama 3 tokenizer (so in chat mode the engine renders and tokenizes again,
// as vLLM does). Interleaved, sequential; reports p50/p99 per mode.
func BenchmarkChatMode(b *testing.B) {
	nt, tpl := llama3(b)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 1e6, Tokenizer: nt, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sm.Close() })
	body := `{"model":"llama","max_tokens":1,"messages":` + benchConversation() + `}`
	modes := []string{ChatModeChat, ChatModeCompletions}
	var hcs []*fasthttp.HostClient
	var reqs []*fasthttp.Request
	for _, mode := range modes {
		cfg := DefaultConfig()
		cfg.Listen, cfg.AccessLog, cfg.ChatMode = "127.0.0.1:0", false, mode
		cfg.Engines = []StaticEngine{{ID: "s", Model: "llama", URL: sm.URL()}}
		tk, err := NewTokenizer(nt, tpl)
		if err != nil {
			b.Fatal(err)
		}
		_, hc, req := benchChatIngress(b, cfg, Deps{Logger: quiet, Tokenizers: TokenizerMap{"llama": tk}}, body)
		hcs, reqs = append(hcs, hc), append(reqs, req)
	}
	interleave(b, modes, hcs, reqs)
}

// llama3 loads the real Llama 3 tokenizer and chat template.
func llama3(b testing.TB) (*tokenizer.Native, *tokenizer.ChatTemplate) {
	tokJSON, tplJSON := llamaFiles(b)
	nt, err := tokenizer.LoadFile(tokJSON)
	if err != nil {
		b.Fatal(err)
	}
	tpl, err := tokenizer.LoadChatTemplateFile(tplJSON)
	if err != nil {
		b.Fatal(err)
	}
	return nt, tpl
}

// benchChatIngress starts an ingress and returns a client for it and a
// chat request carrying body.
func benchChatIngress(b *testing.B, cfg Config, deps Deps, body string) (*Server, *fasthttp.HostClient, *fasthttp.Request) {
	s, err := New(cfg, deps)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + s.Addr() + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	return s, &fasthttp.HostClient{Addr: s.Addr()}, req
}

// interleave warms each of the ingresses up, then sends req[i] to hcs[i]
// in turn, b.N rounds, and reports each one's p50 and p99 latency.
func interleave(b *testing.B, names []string, hcs []*fasthttp.HostClient, reqs []*fasthttp.Request) {
	resp := fasthttp.AcquireResponse()
	lat := make([][]time.Duration, len(names))
	for i := range names {
		for j := 0; j < 20; j++ {
			if err := doOnce(hcs[i], reqs[i], resp); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for k := range names {
			i := (n + k) % len(names)
			t0 := time.Now()
			if err := doOnce(hcs[i], reqs[i], resp); err != nil {
				b.Fatal(err)
			}
			lat[i] = append(lat[i], time.Since(t0))
		}
	}
	b.StopTimer()
	for i, name := range names {
		slices.Sort(lat[i])
		b.ReportMetric(float64(lat[i][len(lat[i])/2].Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(lat[i][len(lat[i])*99/100].Microseconds()), name+"-p99-µs")
	}
}

// BenchmarkEngineTokenize is what keying a model the ingress has no
// tokenizer for costs (enginetok.go): the same ~1,000-token conversation
// through an ingress that tokenizes it itself and one that asks the
// engine's /tokenize, against a simulator rendering with the same Llama 3
// template and tokenizer. Interleaved, sequential.
func BenchmarkEngineTokenize(b *testing.B) {
	nt, tpl := llama3(b)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 1e6, Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sm.Close() })
	body := `{"model":"llama","max_tokens":1,"messages":` + benchConversation() + `}`
	names := []string{"local", "engine"}
	var hcs []*fasthttp.HostClient
	var reqs []*fasthttp.Request
	for _, name := range names {
		cfg := DefaultConfig()
		cfg.Listen, cfg.AccessLog = "127.0.0.1:0", false
		cfg.Engines = []StaticEngine{{ID: "s", Model: "llama", URL: sm.URL()}}
		deps := Deps{Logger: quiet}
		if name == "local" {
			tk, err := NewTokenizer(nt, tpl)
			if err != nil {
				b.Fatal(err)
			}
			deps.Tokenizers = TokenizerMap{"llama": tk}
		}
		s, hc, req := benchChatIngress(b, cfg, deps, body)
		hcs, reqs = append(hcs, hc), append(reqs, req)
		if name == "engine" {
			b.Cleanup(func() {
				if n := val(s.etok.ok); n == 0 {
					b.Errorf("the engine-tokenizing ingress never keyed on the engine's tokens")
				}
			})
		}
	}
	interleave(b, names, hcs, reqs)
}

// benchConversation is an 8-message, ~1,000-token conversation.
func benchConversation() string {
	var msgs strings.Builder
	msgs.WriteString(`[{"role":"system","content":"You are a helpful assistant that answers questions about distributed systems."}`)
	long := strings.Repeat("The key-value cache of a transformer stores attention keys and values for every token of the prompt. ", 40)
	for i := 0; i < 3; i++ {
		msgs.WriteString(`,{"role":"user","content":"` + long + `"},{"role":"assistant","content":"Understood."}`)
	}
	msgs.WriteString(`,{"role":"user","content":"Summarize."}]`)
	return msgs.String()
}

// BenchmarkRewrapChunk is the ingress's cost per streamed chunk in
// completions chat mode.
func BenchmarkRewrapChunk(b *testing.B) {
	ev := []byte(`data: {"id":"cmpl-42","object":"text_completion","created":1795986758,"model":"llama","choices":[{"index":0,"text":" token","logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n")
	p := &proxyStream{c: &call{}}
	var out []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for i := 0; i < b.N; i++ {
		out = p.rewrap(out[:0], ev)
	}
	if !strings.Contains(string(out), "chat.completion.chunk") {
		b.Fatalf("%s", out)
	}
}
