package ingress

import (
	"net/http"
	"strings"
	"testing"
)

// X-Kvmesh-Engine names the engine that answered (the load tools count
// requests per engine from it), and CORS lets browsers read it. With
// Config.EngineHeader off no answer carries it, neither a 200 (buffered or
// streamed) nor an error naming a failed engine, and CORS no longer
// exposes it: an engine id defaults to its address (docs/SECURITY.md).
func TestEngineHeaderOff(t *testing.T) {
	ok, bad := startFaultEngine(t, faultOK), startFaultEngine(t, fault500)
	const app = "https://app.example"
	start := func(on bool) *Server {
		cfg := testConfig(StaticEngine{ID: "good", Model: "m", URL: ok.url()}, StaticEngine{ID: "bad", Model: "bad", URL: bad.url()})
		cfg.CORSOrigins = []string{app}
		cfg.EngineHeader = on
		return startIngress(t, cfg, Deps{})
	}
	for _, on := range []bool{true, false} {
		s := start(on)
		url := "http://" + s.Addr() + "/v1/completions"
		for _, c := range []struct {
			body, engine string
			status       int
		}{
			{`{"model":"m","prompt":[1],"max_tokens":1}`, "good", 200},
			{`{"model":"m","prompt":[1],"max_tokens":1,"stream":true}`, "good", 200},
			{`{"model":"bad","prompt":[1],"max_tokens":1}`, "bad", 503},
		} {
			st, hdr, b := post(t, http.DefaultClient, url, c.body, "Origin", app)
			if st != c.status {
				t.Fatalf("header on %v: %s: %d %s, want %d", on, c.body, st, b, c.status)
			}
			want, expose := "", "X-Request-Id, Retry-After"
			if on {
				want, expose = c.engine, "X-Kvmesh-Engine, X-Request-Id, Retry-After"
			}
			if got := hdr.Values("X-Kvmesh-Engine"); strings.Join(got, ",") != want {
				t.Errorf("header on %v: %s: X-Kvmesh-Engine %q, want %q", on, c.body, got, want)
			}
			if got := hdr.Get("Access-Control-Expose-Headers"); got != expose {
				t.Errorf("header on %v: %s: Access-Control-Expose-Headers %q, want %q", on, c.body, got, expose)
			}
		}
	}
}
