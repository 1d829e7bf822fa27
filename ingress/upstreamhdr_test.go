package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
)

// An engine started with an API key (vLLM's --api-key) serves the ingress's
// requests only when the ingress sends the key (engineAPIKey); the client's
// request id and trace context reach the engine, its credentials do not.
func TestUpstreamHeaders(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, APIKey: "engine-key", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	// What reaches the engine, recorded by a pass-through in front of it.
	var mu sync.Mutex
	var seen []http.Header
	front := recordingFront(t, sm.URL(), func(h http.Header) {
		mu.Lock()
		seen = append(seen, h)
		mu.Unlock()
	})

	if resp, err := http.Get(sm.URL() + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the engine's /health needs no key (as vLLM's): %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	body := `{"model":"m","prompt":"hello there","max_tokens":2}`
	hdr := []string{"Authorization", "Bearer client-key", "X-Request-Id", "req-42", "Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	without := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: front}), Deps{Logger: quiet})
	if st, _, b := post(t, http.DefaultClient, "http://"+without.Addr()+"/v1/completions", body, hdr...); st != http.StatusUnauthorized {
		t.Fatalf("no engine key: %d %s, want the engine's 401", st, b)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: front})
	cfg.EngineAPIKey = "engine-key"
	with := startIngress(t, cfg, Deps{Logger: quiet})
	st, _, b := post(t, http.DefaultClient, "http://"+with.Addr()+"/v1/completions", body, hdr...)
	var r struct{ ID string }
	if st != http.StatusOK || json.Unmarshal(b, &r) != nil || r.ID != "cmpl-req-42" {
		t.Fatalf("with the engine key: %d %s (want vLLM's id from X-Request-Id)", st, b)
	}
	mu.Lock()
	last := seen[len(seen)-1]
	mu.Unlock()
	if last.Get("Authorization") != "Bearer engine-key" || last.Get("X-Request-Id") != "req-42" ||
		last.Get("Traceparent") != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("engine saw %v", last)
	}
}
