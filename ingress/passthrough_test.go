package ingress

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The engine's other endpoints pass through the request path: /tokenize to
// the simulator answers as the simulator does directly, a dead engine is
// retried before the first byte, an endpoint the engine lacks is its own
// 404, and the ingress's own checks (model, auth path) apply.
func TestPassthroughEndpoints(t *testing.T) {
	sims := startSims(t, 1, "m")
	dead := startFaultEngine(t, faultOK)
	dead.close() // connection refused
	cfg := testConfig(StaticEngine{ID: "dead", Model: "m", URL: dead.url()}, StaticEngine{ID: "sim", Model: "m", URL: sims[0].URL()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.MaxAttempts = 2
	s := startIngress(t, cfg, Deps{})
	body := `{"model":"m","prompt":"hello passthrough","stream":true}`
	_, _, direct := post(t, http.DefaultClient, sims[0].URL()+"/tokenize", body)
	for i := 0; i < 4; i++ { // round-robin: two of them try the dead engine first
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/tokenize", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "sim" || string(b) != string(direct) {
			t.Fatalf("request %d: %d via %q: %s (direct: %s)", i, st, hdr.Get("X-Kvmesh-Engine"), b, direct)
		}
		var tk struct{ Tokens []int }
		if err := json.Unmarshal(b, &tk); err != nil || len(tk.Tokens) == 0 {
			t.Fatalf("tokenize answer %s: %v", b, err)
		}
	}
	for _, tc := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/v1/embeddings", `{"model":"m","input":"x"}`, 404, "no route POST /v1/embeddings"}, // the simulator has none: its answer
		{"/v1/embeddings", `{"input":"x"}`, 404, "no route POST /v1/embeddings"},             // the one model served, as vLLM
		{"/v1/rerank", `{"model":"nope","query":"q","documents":["a"]}`, 404, "does not exist"},
		{"/score", `not json`, 400, "JSON"},
	} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, tc.body)
		if st != tc.status || !strings.Contains(string(b), tc.msg) || !json.Valid(b) {
			t.Errorf("%s %s: %d %s, want %d with %q", tc.path, tc.body, st, b, tc.status, tc.msg)
		}
	}
	waitSettled(t, s)
	if val(s.m.attempts.WithLabelValues("connect_error")) == 0 {
		t.Error("no attempt on the dead engine: round-robin should have tried it (and retried the request)")
	}
	if val(s.m.requests.WithLabelValues("other", "200")) != 4 {
		t.Errorf("%v passthrough requests counted 200, want 4", val(s.m.requests.WithLabelValues("other", "200")))
	}
}
