package epp

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/ingress"
)

func TestClassifyPath(t *testing.T) {
	for _, c := range []struct {
		path string
		kind pathKind
		ep   string
	}{
		{"/v1/chat/completions", pathInference, "/v1/chat/completions"},
		{"/v1/chat/completions?x=1", pathInference, "/v1/chat/completions"},
		{"/v1/chat/completions/", pathInference, "/v1/chat/completions"},
		{"/llama3/v1/chat/completions", pathInference, "/v1/chat/completions"},
		{"/openai/v1/completions", pathInference, "/v1/completions"},
		{"/a/b/v1/responses", pathInference, "/v1/responses"},
		{"/anthropic/v1/messages", pathInference, "/v1/messages"},
		{"/v1/messages/count_tokens", pathPassthrough, "/v1/messages/count_tokens"},
		{"/m/v1/embeddings", pathPassthrough, "/v1/embeddings"},
		{"/v1/score", pathPassthrough, "/v1/score"},
		{"/score", pathPassthrough, "/score"},
		{"/detokenize", pathPassthrough, "/detokenize"},
		{"/x/v1/responses/resp_1/cancel", pathResponseByID, "/v1/responses/resp_1/cancel"},
		{"/v1/models", pathModels, "/v1/models"},
		{"/x/v1/models/org/name", pathModels, "/v1/models/org/name"},
		{"/v1/chat/completionsX", pathOther, "/v1/chat/completionsX"},
		{"/xv1/embeddings2", pathOther, "/xv1/embeddings2"},
		{"", pathOther, ""},
		{"/", pathOther, "/"},
	} {
		kind, ep, _ := classifyPath(c.path)
		if kind != c.kind || ep != c.ep {
			t.Errorf("classifyPath(%q) = %v %q, want %v %q", c.path, kind, ep, c.kind, c.ep)
		}
	}
}

// TestPathsByModel: every request with a body is routed among the engines
// of its model, as the ingress routes it (GAIE's reference EPP reads the
// model of any body too): an unknown model is a 404 whatever the path, an
// embeddings request goes to its model's engines only, and a prefixed
// inference path (an HTTPRoute rewrite Envoy applies after ext_proc) gets
// the ingress's decision, not load routing.
func TestPathsByModel(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, func(c *ingress.Config) {
		c.Engines = append(c.Engines, ingress.StaticEngine{ID: "o1", Model: "other", URL: "http://10.0.0.3:8000"})
	})
	nope := []byte(`{"model":"nope","messages":[{"role":"user","content":"hi"}],"prompt":"hi","input":"hi"}`)
	for _, p := range []string{"/llama3/v1/chat/completions", "/v1/chat/completions/", "/openai/v1/completions",
		"/v1/chat/completions?x=1", "/v1/embeddings", "/custom/endpoint"} {
		r.open(t, fd).headers(p, false).body(nope, true).refused(404, "model_not_found")
	}
	for _, c := range []struct{ model, want string }{{model, "10.0.0.1:8000,10.0.0.2:8000"}, {"other", "10.0.0.3:8000"}} {
		for _, p := range []string{"/v1/embeddings", "/m/v1/embeddings"} {
			s := r.open(t, fd).headers(p, false).body([]byte(`{"model":"`+c.model+`","input":"hello"}`), true)
			got := routed(t, s.recv())
			if eps := strings.Split(got, ","); len(eps) != len(strings.Split(c.want, ",")) || strings.Contains(got, "10.0.0.3") != (c.model == "other") {
				t.Fatalf("%s model %s: destination %q, want %s", p, c.model, got, c.want)
			}
			s.recv()
			s.end()
		}
	}
	before := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "routed")
	s := r.open(t, fd).headers("/llama3/v1/chat/completions", false).body([]byte(chatBody("sys", "hi", false)), true)
	if got := routed(t, s.recv()); strings.Contains(got, "10.0.0.3") {
		t.Fatalf("prefixed chat for %s: destination %q", model, got)
	}
	s.recv()
	s.end()
	if n := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "routed"); n != before+1 {
		t.Fatalf("prefixed chat: routed %v → %v, want the ingress's decision", before, n)
	}
}
