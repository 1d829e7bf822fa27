package sim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/sim/engine"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// BenchmarkCompletionStream measures the simulator's own overhead per
// streamed request (16 output tokens, 256-token prompt) at a time scale so
// large that modelled time is negligible.
func BenchmarkCompletionStream(b *testing.B) {
	s := startSimB(b)
	body, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": tokens(1, 256), "max_tokens": 16,
		"ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		if err := openai.ReadAll(resp.Body, func([]byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func startSimB(b *testing.B) *Server {
	cfg := Config{Model: "test-model", TimeScale: 1e6, Logger: quietLogger()}
	cfg.Engine.Profile = mustProfileB(b, "tiny")
	s, err := Start(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

func mustProfileB(b *testing.B, name string) engine.Profile {
	p, err := engine.LookupProfile(name)
	if err != nil {
		b.Fatal(err)
	}
	return p
}
