package epp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// TestRunListenerServesNoAPI runs the picker as the command does (Run, a
// static engine) and checks its HTTP listener over real HTTP: /metrics,
// /health and /ready answer; the client API and the rest are 404 with the
// OpenAI error body, so the listener is no proxy around the gateway.
func TestRunListenerServesNoAPI(t *testing.T) {
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	o := DefaultOptions()
	o.Ingress.Config.Listen = "127.0.0.1:0"
	o.Ingress.Config.Engines = []ingress.StaticEngine{{ID: "e1", Model: "m", URL: sm.URL()}}
	o.Ingress.Config.AccessLog = false
	o.Picker.Listen = "127.0.0.1:0"
	o.Picker.TLS = TLSOff
	o.Picker.DrainDelay = 0 // stop at once (TestDrainDelay covers the delay)
	var out, errOut testutil.SyncBuffer
	run := testutil.Run(t, "epp.Run", func(ctx context.Context) error { return Run(ctx, o, &out, &errOut) }, errOut.String)
	addrRE := regexp.MustCompile(`metrics on http://([^\s",]+)`) // text, or the msg of the JSON banner
	var base string
	testutil.WaitFor(t, 10*time.Second, "the listening line", func() bool {
		select {
		case <-run.Done():
			t.Fatalf("Run returned early: %v: %s", run.Err(), errOut.String())
		default:
		}
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			base = "http://" + m[1]
			return true
		}
		return false
	})
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := do("GET", "/health", ""); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Fatalf("/health: %d %s", code, body)
	}
	if code, body := do("GET", "/metrics", ""); code != 200 || !strings.Contains(body, "kvmesh_epp_") {
		t.Fatalf("/metrics: %d, no kvmesh_epp_ series", code)
	}
	testutil.WaitFor(t, 10*time.Second, "/ready", func() bool {
		code, _ := do("GET", "/ready", "")
		return code == 200
	})
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`},
		{"POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"GET", "/v1/models", ""},
		{"POST", "/tokenize", `{"model":"m","prompt":"hi"}`},
		{"GET", "/version", ""},
		{"OPTIONS", "/v1/completions", ""},
		{"GET", "/debug/config", ""},
	} {
		code, body := do(r.method, r.path, r.body)
		var e struct {
			Error struct {
				Message, Type string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); code != 404 || err != nil || e.Error.Type == "" {
			t.Errorf("%s %s: %d %s, want 404 with an OpenAI error", r.method, r.path, code, body)
		}
	}
}
