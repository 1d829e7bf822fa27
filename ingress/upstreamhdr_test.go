package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
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
	// The engine's 401 is about the ingress's key, not the client's: never
	// relayed as the client's 401 (its SDK would call the client's key wrong).
	checkRefused := func(what, addr, wantMsg string) {
		t.Helper()
		st, _, b := post(t, http.DefaultClient, "http://"+addr+"/v1/completions", body, hdr...)
		var e struct {
			Error struct{ Message, Code string }
		}
		if st != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e.Error.Code != "ingress_engine_credential_refused" ||
			!strings.Contains(e.Error.Message, wantMsg) {
			t.Fatalf("%s: %d %s, want 503 ingress_engine_credential_refused saying %q", what, st, b, wantMsg)
		}
	}
	checkRefused("no engine key", without.Addr(), "this ingress sends none (set engineAPIKey")
	wrong := testConfig(StaticEngine{ID: "e", Model: "m", URL: front})
	wrong.EngineAPIKey = "another-key"
	checkRefused("another engine key", startIngress(t, wrong, Deps{Logger: quiet}).Addr(), "does not take this ingress's engine key")
	if n := val(without.m.attempts.WithLabelValues("credential_refused")); n != 1 {
		t.Fatalf("credential_refused attempts = %v, want 1", n)
	}
	// One engine that wants another key beside one that takes the
	// ingress's: every request is served, the refusing engine's 401 moving
	// it on to the next (least-request alternates, so it is met).
	other, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, APIKey: "other-key", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	mixed := testConfig(StaticEngine{ID: "refuses", Model: "m", URL: other.URL()}, StaticEngine{ID: "e", Model: "m", URL: front})
	mixed.EngineAPIKey = "engine-key"
	both := startIngress(t, mixed, Deps{Logger: quiet})
	for i := 0; i < 50 && val(both.m.attempts.WithLabelValues("credential_refused")) == 0; i++ {
		if st, _, b := post(t, http.DefaultClient, "http://"+both.Addr()+"/v1/completions", body, hdr...); st != http.StatusOK {
			t.Fatalf("request %d beside a refusing engine: %d %s", i, st, b)
		}
	}
	if val(both.m.attempts.WithLabelValues("credential_refused")) == 0 {
		t.Fatal("50 requests and the refusing engine never tried")
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
