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

// A request without a model (or with "model": null) goes to the model every
// live engine serves, as vLLM serves its one model then; when the engines
// serve several, it is a 400 naming the parameter.
func TestRequestWithoutModel(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := func(model string) string {
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, TimeScale: 500, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		return sm.URL()
	}
	a1, a2 := start("a"), start("a")
	one := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "a", URL: a1}, StaticEngine{ID: "e2", Model: "a", URL: a2}), Deps{Logger: quiet})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"hello there","max_tokens":2}`},
		{"/v1/completions", `{"model":null,"prompt":"hello there","max_tokens":2}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`},
	} {
		st, hdr, b := post(t, http.DefaultClient, "http://"+one.Addr()+c.path, c.body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") == "" {
			t.Fatalf("%s %s: %d via %q: %s", c.path, c.body, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		if !strings.Contains(c.body, `"stream":true`) {
			var r struct{ Model string }
			if err := json.Unmarshal(b, &r); err != nil || r.Model != "a" {
				t.Fatalf("%s: model %q (%v): %s", c.path, r.Model, err, b)
			}
		}
	}
	two := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "a", URL: a1}, StaticEngine{ID: "e3", Model: "b", URL: start("b")}), Deps{Logger: quiet})
	st, _, b := post(t, http.DefaultClient, "http://"+two.Addr()+"/v1/completions", `{"prompt":"x","max_tokens":1}`)
	var e struct {
		Error struct{ Message, Param string }
	}
	if err := json.Unmarshal(b, &e); err != nil || st != http.StatusBadRequest || e.Error.Param != "model" ||
		!strings.Contains(e.Error.Message, "model is required") {
		t.Fatalf("two models served, no model: %d %s", st, b)
	}
	if st, _, b := post(t, http.DefaultClient, "http://"+two.Addr()+"/v1/completions", `{"model":"b","prompt":"x","max_tokens":1}`); st != http.StatusOK {
		t.Fatalf("model b named: %d %s", st, b)
	}
}
