package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/sim"
)

// startSims starts n simulated engines serving model, fast enough for tests.
func startSims(t testing.TB, n int, model string) []*sim.Server {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var out []*sim.Server
	for i := 0; i < n; i++ {
		s, err := sim.Start(context.Background(), sim.Config{Model: model, TimeScale: 200, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

func simEngines(sims []*sim.Server, model string) []StaticEngine {
	var es []StaticEngine
	for i, s := range sims {
		es = append(es, StaticEngine{ID: "sim" + strconv.Itoa(i), Model: model, URL: s.URL()})
	}
	return es
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	} `json:"error"`
}

// TestBadInput sends every kind of bad request; each must get the right
// status and an OpenAI error body, and the server must keep serving.
func TestBadInput(t *testing.T) {
	const key = "sk-test-key-0123456789"
	const probeKey = "sk-probe-key-0123456789" // no rate limit: checks the server still serves
	store := keyFileStore(t, "tester "+key+"\nprobe "+probeKey+"\n")
	rc := ratelimit.DefaultConfig()
	rc.Keys = map[string]ratelimit.Limits{"tester": {InputTokens: 1000}}
	lim, err := ratelimit.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(simEngines(startSims(t, 2, "m"), "m")...)
	cfg.MaxBodyBytes = 64 << 10
	cfg.MaxPromptTokens = 2000
	s := startIngress(t, cfg, Deps{Auth: store, Limiter: lim})
	url := "http://" + s.Addr()
	bearer := "Bearer " + key
	ids := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"model":"m","max_tokens":1,"prompt":[`)
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(i%1000 + 1))
		}
		b.WriteString("]}")
		return b.String()
	}
	tests := []struct {
		name, path, body, auth string
		status                 int
		typ, code              string
	}{
		{"malformed json", "/v1/completions", `{"model":"m","prompt":`, bearer, 400, "invalid_request_error", ""},
		{"not an object", "/v1/completions", `"hi"`, bearer, 400, "invalid_request_error", ""},
		{"model wrong type", "/v1/completions", `{"model":1,"prompt":"x"}`, bearer, 400, "invalid_request_error", ""},
		{"stream wrong type", "/v1/completions", `{"model":"m","prompt":"x","stream":2}`, bearer, 400, "invalid_request_error", ""},
		{"messages wrong type", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, bearer, 400, "invalid_request_error", ""},
		{"empty prompt", "/v1/completions", `{"model":"m","prompt":""}`, bearer, 400, "invalid_request_error", ""},
		{"empty ids", "/v1/completions", `{"model":"m","prompt":[]}`, bearer, 400, "invalid_request_error", ""},
		{"huge prompt", "/v1/completions", ids(2500), bearer, 400, "invalid_request_error", "context_length_exceeded"},
		{"invalid token id", "/v1/completions", `{"model":"m","prompt":[1,-5]}`, bearer, 400, "invalid_request_error", ""},
		{"float token id", "/v1/completions", `{"model":"m","prompt":[1.5]}`, bearer, 400, "invalid_request_error", ""},
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"x"}`, bearer, 404, "invalid_request_error", "model_not_found"},
		{"missing api key", "/v1/completions", `{"model":"m","prompt":"x"}`, "", 401, "invalid_request_error", "invalid_api_key"},
		{"wrong api key", "/v1/completions", `{"model":"m","prompt":"x"}`, "Bearer sk-wrong-key-000000", 401, "invalid_request_error", "invalid_api_key"},
		{"oversized body", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("a", 70<<10) + `"}`, bearer, 413, "invalid_request_error", "request_too_large"},
		{"unknown path", "/v1/nothing", `{}`, bearer, 404, "invalid_request_error", "not_found"},
		// 1000 input tokens per minute: 900 pass, the next 900 do not.
		{"within rate limit", "/v1/completions", ids(900), bearer, 200, "", ""},
		{"rate limit exceeded", "/v1/completions", ids(900), bearer, 429, "rate_limit_error", "rate_limit_exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st int
			var hdr http.Header
			var body []byte
			if tc.status == 413 {
				// The server answers before reading the whole body and closes:
				// write from one goroutine, read the answer from another.
				st, hdr, body = rawPost(t, s.Addr(), tc.path, tc.body, tc.auth)
			} else {
				st, hdr, body = post(t, http.DefaultClient, url+tc.path, tc.body, "Authorization", tc.auth)
			}
			if st != tc.status {
				t.Fatalf("status %d, want %d: %.300s", st, tc.status, body)
			}
			if tc.status == 200 {
				return
			}
			var e openAIError
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
				t.Fatalf("not an OpenAI error body: %.300s (%v)", body, err)
			}
			if e.Error.Type != tc.typ || (tc.code != "" && e.Error.Code != tc.code) {
				t.Fatalf("type %q code %v, want %q %q", e.Error.Type, e.Error.Code, tc.typ, tc.code)
			}
			if st == 429 {
				if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 1 {
					t.Fatalf("Retry-After %q", hdr.Get("Retry-After"))
				}
			}
			// The server keeps serving real requests.
			st, _, body = post(t, http.DefaultClient, url+"/v1/completions", `{"model":"m","prompt":"ok","max_tokens":2}`, "Authorization", "Bearer "+probeKey)
			if st != 200 || !strings.Contains(string(body), `"text_completion"`) {
				t.Fatalf("server stopped serving: %d %s", st, body)
			}
		})
	}
	if got := val(s.m.requests.WithLabelValues("completions", "429")); got != 1 {
		t.Fatalf("requests_total{status=429} = %v", got)
	}
}

// rawPost sends a request over a raw connection and reads the response even
// if the server stops reading the body (413), which net/http's client reports
// as a write error instead.
func rawPost(t *testing.T, addr, path, body, authz string) (int, http.Header, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go func() {
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n%s", path, addr, authz, len(body), body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}
