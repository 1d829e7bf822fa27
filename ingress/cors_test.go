package ingress

import (
	"net/http"
	"strings"
	"testing"
)

// CORS: off by default; with allowed origins a preflight is answered with
// 204 and the answers (streamed too) carry the origin; other origins get no
// CORS headers.
func TestCORS(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	do := func(s *Server, method, origin, body string, hdr ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+s.Addr()+"/v1/completions", strings.NewReader(body))
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	preflight := []string{"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type"}
	const app = "https://app.example"

	off := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	if r := do(off, "OPTIONS", app, "", preflight...); r.StatusCode != 405 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS off: preflight %d %v", r.StatusCode, r.Header)
	}
	if r := do(off, "POST", app, `{"model":"m","prompt":[1]}`); r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS off: POST %d %v", r.StatusCode, r.Header)
	}

	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.CORSOrigins = []string{app}
	on := startIngress(t, cfg, Deps{})
	r := do(on, "OPTIONS", app, "", preflight...)
	if r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != app || r.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "POST") || r.Header.Get("Vary") != "Origin" {
		t.Fatalf("preflight %d %v", r.StatusCode, r.Header)
	}
	for _, body := range []string{`{"model":"m","prompt":[1]}`, `{"model":"m","prompt":[1],"stream":true}`} {
		if r := do(on, "POST", app, body); r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != app ||
			!strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), "X-Kvmesh-Engine") {
			t.Fatalf("POST %s: %d %v", body, r.StatusCode, r.Header)
		}
	}
	if r := do(on, "OPTIONS", "https://evil.example", "", preflight...); r.StatusCode == 204 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin: %d %v", r.StatusCode, r.Header)
	}

	cfg.CORSOrigins = []string{"*"}
	any := startIngress(t, cfg, Deps{})
	if r := do(any, "OPTIONS", "https://evil.example", "", preflight...); r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("any origin: %d %v", r.StatusCode, r.Header)
	}
}
