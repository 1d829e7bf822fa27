package epp

import (
	"fmt"
	"hash/fnv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
)

// The picker authenticates every request it routes as `kvmesh ingress`
// does (docs/SECURITY.md), not only the four inference paths: a stored
// response's GET and cancel, the embeddings family, the model list,
// prefixed and trailing-slash paths, bodyless requests. The stand-in plays
// Envoy's messages one at a time.

const goodKey = "sk-epp-test-key"

func authRig(t *testing.T, mut func(*ingress.Config)) *staticRig {
	return newStaticRigWith(t, twoEngines, Config{}, Deps{}, mut, func(d *ingress.Deps) {
		d.Auth = auth.NewStore([]auth.Entry{{Name: "tenant-a", Key: goodKey}})
	})
}

// authCase is one request: a body (nil: bodyless, end_of_stream on the
// headers) on a path.
type authCase struct {
	name, path string
	body       []byte
}

func authCases() []authCase {
	chat := []byte(chatBody("sys", "hi", false))
	emb := []byte(`{"model":"` + model + `","input":"hello"}`)
	return []authCase{
		{"chat", "/v1/chat/completions", chat},
		{"embeddings", "/v1/embeddings", emb},
		{"rerank", "/v1/rerank", []byte(`{"model":"` + model + `","query":"q","documents":["a"]}`)},
		{"prefixed chat", "/llama3/v1/chat/completions", chat},
		{"trailing slash", "/v1/chat/completions/", chat},
		{"unknown path with a body", "/custom/endpoint", emb},
		{"model list", "/v1/models", nil},
		{"a model's card", "/v1/models/" + model, nil},
		{"stored response", "/v1/responses/" + respIDFor("e1"), nil},
		{"stored response cancel", "/v1/responses/" + respIDFor("e1") + "/cancel", []byte(`{}`)},
		{"bodyless other path", "/anything", nil},
	}
}

// respIDFor is a response id as the ingress makes it for engine
// (ingress/responses.go): "resp_kvm", the engine's FNV-1a tag, 32 digits.
func respIDFor(engine string) string {
	h := fnv.New64a()
	h.Write([]byte(engine))
	return fmt.Sprintf("resp_kvm%016x%032d", h.Sum64(), 7)
}

// A stored response's GET or cancel whose id no known engine holds (not
// made by a kvmesh ingress, or its engine gone) is the ingress's 404, not
// routed by load to an engine that does not have it.
func TestUnknownStoredResponseNotFound(t *testing.T) {
	r := authRig(t, nil)
	key := [2]string{"authorization", "Bearer " + goodKey}
	for _, p := range []string{"/v1/responses/resp_x", "/v1/responses/" + respIDFor("gone"), "/v1/responses/" + respIDFor("gone") + "/cancel?x=1"} {
		s := r.open(t, fd).headers(p, true, key)
		ir := s.refused(404, "not_found")
		if !strings.Contains(string(ir.GetBody()), "not found") {
			t.Fatalf("%s: %s", p, ir.GetBody())
		}
		s.closed()
	}
	s, m := r.play(t, authCase{"known", "/v1/responses/" + respIDFor("e2"), nil}, key)
	routed(t, m)
	if d := m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders(); len(d) == 0 || !strings.Contains(string(d[0].GetHeader().GetRawValue()), "10.0.0.2") {
		t.Fatalf("known id routed to %v, want e2 (10.0.0.2) first", d)
	}
	s.end()
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "not_found"); got != 3 {
		t.Fatalf("not_found counted %v, want 3", got)
	}
}

// play sends c with the headers kv and returns the routing answer (or the
// refusal).
func (r *staticRig) play(t *testing.T, c authCase, kv ...[2]string) (*stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	if strings.Contains(c.path, "/v1/models") {
		kv = append(kv, [2]string{":method", "GET"})
	}
	s := r.open(t, fd).headers(c.path, c.body == nil, kv...)
	if c.body != nil {
		// Not s.body: a request refused at its headers (no credential) may
		// have its stream ended before the body is sent, which Send then
		// reports; the answer read next says what happened.
		_ = s.st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: c.body, EndOfStream: true}}})
	}
	return s, s.recv()
}

func TestEveryPathAuthenticated(t *testing.T) {
	r := authRig(t, nil)
	for _, c := range authCases() {
		s, m := r.play(t, c)
		ir := m.GetImmediateResponse()
		if ir == nil || ir.GetStatus().GetCode() != 401 || !strings.Contains(string(ir.GetBody()), "invalid_api_key") {
			t.Fatalf("%s without a credential: %v, want 401 invalid_api_key", c.name, m)
		}
		s.closed()

		s, m = r.play(t, c, [2]string{"authorization", "Bearer wrong"})
		if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 401 {
			t.Fatalf("%s with a wrong key: %v, want 401", c.name, m)
		}
		s.closed()

		s, m = r.play(t, c, [2]string{"authorization", "Bearer " + goodKey}, [2]string{"authorization", "Bearer " + goodKey})
		if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 400 {
			t.Fatalf("%s with two Authorization headers: %v, want 400", c.name, m)
		}
		s.closed()

		s, m = r.play(t, c, [2]string{"authorization", "Bearer " + goodKey})
		if strings.Contains(c.path, "/v1/models") { // the picker's own answer (TestModelsAnswered)
			if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 200 {
				t.Fatalf("%s with the key: %v, want the picker's 200", c.name, m)
			}
			s.closed()
			continue
		}
		routed(t, m)
		if c.body != nil {
			s.recv() // the body passed back
		}
		s.end()
	}
	if n := counter(t, r.reg, "kvmesh_epp_immediate_responses_total", "status", "401"); n != float64(2*len(authCases())) {
		t.Fatalf("kvmesh_epp_immediate_responses_total{status=401} %v, want %d", n, 2*len(authCases()))
	}

	// X-Api-Key counts where the ingress reads it (Anthropic's paths, the
	// model list), prefixed too, and nowhere else.
	msgs := []byte(`{"model":"` + model + `","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	for _, c := range []authCase{{"messages", "/v1/messages", msgs}, {"prefixed messages", "/anthropic/v1/messages", msgs}, {"models", "/v1/models", nil}} {
		s, m := r.play(t, c, [2]string{"x-api-key", goodKey})
		if c.body == nil { // the model list: the picker's own answer
			if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 200 {
				t.Fatalf("%s with X-Api-Key: %v, want the picker's 200", c.name, m)
			}
			s.closed()
			continue
		}
		routed(t, m)
		s.recv()
		s.end()
	}
	s, m := r.play(t, authCase{"chat", "/v1/chat/completions", []byte(chatBody("sys", "hi", false))}, [2]string{"x-api-key", goodKey})
	if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 401 {
		t.Fatalf("chat with X-Api-Key: %v, want 401 (the ingress reads it on Anthropic's paths only)", m)
	}
	s.closed()
}

// The credential is read at the request headers, as the ingress reads it
// before the body: a caller without one is refused before its body comes,
// and nothing of it is charged to the body budget.
func TestAuthBeforeBody(t *testing.T) {
	r := authRig(t, nil)
	s := r.open(t, fd).headers("/v1/chat/completions", false, [2]string{"content-length", "1000000"})
	if ir := s.recv().GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 401 {
		t.Fatalf("headers without a credential: %v, want 401 before the body", ir)
	}
	s.closed()
	if got := counter(t, r.reg, "kvmesh_ingress_body_bytes_in_flight"); got != 0 {
		t.Fatalf("body bytes in flight %v after the refusal, want 0", got)
	}
}

// TestPassthroughLimits: the ingress's limits apply to the embeddings
// family as to generation (--max-concurrent here): a second embeddings
// request while one is in flight is refused with 429.
func TestPassthroughLimits(t *testing.T) {
	r := authRig(t, func(c *ingress.Config) { c.MaxConcurrent = 1 })
	emb := authCase{"embeddings", "/v1/embeddings", []byte(`{"model":"` + model + `","input":"hello"}`)}
	key := [2]string{"authorization", "Bearer " + goodKey}
	s1, m := r.play(t, emb, key)
	routed(t, m)
	s1.recv()
	s2, m := r.play(t, emb, key)
	if ir := m.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 429 {
		t.Fatalf("second embeddings request past --max-concurrent 1: %v, want 429", m)
	}
	s2.closed()
	s1.end()
}

// A method an endpoint does not take is the ingress's 405 with Allow,
// before authentication, as the ingress answers it: a browser's CORS
// preflight (OPTIONS, no credential) too, which the picker does not answer
// as a preflight any more than the ingress without --cors-origins does
// (the gateway's CORS filter does). Paths the engines serve as they come
// are authenticated and routed whatever the method.
func TestMethodNotAllowedBeforeAuth(t *testing.T) {
	r := authRig(t, nil)
	preflight := [][2]string{{":method", "OPTIONS"}, {"origin", "https://app.example"}, {"access-control-request-method", "POST"}}
	for _, c := range []struct{ method, path, allow string }{
		{"OPTIONS", "/v1/chat/completions", "POST"},
		{"OPTIONS", "/team/v1/messages", "POST"},
		{"GET", "/v1/embeddings", "POST"},
		{"OPTIONS", "/v1/models", "GET, HEAD"},
		{"DELETE", "/v1/models/" + model, "GET, HEAD"},
	} {
		kv := append([][2]string(nil), preflight...)
		kv[0][1] = c.method
		s := r.open(t, fd).headers(c.path, true, kv...)
		ir := s.refused(405, "method_not_allowed")
		if got := immediateHeader(ir, "allow"); got != c.allow {
			t.Fatalf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		s.closed()
	}
	s := r.open(t, fd).headers("/custom/thing", true, preflight...)
	s.refused(401, "invalid_api_key")
	s.closed()
}
