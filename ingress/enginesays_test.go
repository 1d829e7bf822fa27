package ingress

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The client's 503 after an engine's 5xx says what the engine said when
// its answer is a JSON error ("engine broke"), and nothing of an answer that
// is not (an HTML page of a proxy in front of it). Before, only "engine e
// answered 500". The engine is named once: "engine e: answered 500", not
// "engine e: engine e answered 500".
func TestEngineErrorMessageReachesTheClient(t *testing.T) {
	fe := startFaultEngine(t, fault500)
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(502)
		io.WriteString(w, "<html><body>Bad Gateway from nginx</body></html>")
	}))
	t.Cleanup(html.Close)
	for _, tc := range []struct {
		url, want, not string
	}{
		{fe.url(), "engine e: answered 500: engine broke", "html"},
		{html.URL, "engine e: answered 502", "nginx"},
	} {
		cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: tc.url})
		cfg.MaxAttempts = 1
		s := startIngress(t, cfg, Deps{})
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1}`)
		body := string(b)
		if st != 503 || !strings.Contains(body, tc.want) || strings.Contains(body, tc.not) || !strings.Contains(body, `"error":{`) ||
			strings.Count(body, "engine e") != 1 {
			t.Errorf("status %d: %s (want 503 saying %q, nothing of %q)", st, body, tc.want, tc.not)
		}
	}
}
