package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// words returns n deterministic filler words seeded by tag.
func words(tag string, n int) string {
	vocab := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")
	var b strings.Builder
	b.WriteString(tag)
	for i := range n {
		b.WriteByte(' ')
		b.WriteString(vocab[(i*7+len(tag)*3+i/5)%len(vocab)])
	}
	return b.String()
}

func jsonStr(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func completionsBody(prompt string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":3,"stream":%v}`, model, jsonStr(prompt), stream)
}

func chatBody(system, user string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%s},{"role":"user","content":%s}],"max_tokens":3,"stream":%v}`,
		model, jsonStr(system), jsonStr(user), stream)
}

// warm sends a request straight to one engine (behind the picker's back)
// and waits until the replica's index holds the prompt's blocks there.
func (m *mesh) warm(r *replica, engineID, path, body string, tokens []uint32) {
	t := m.t
	resp, err := httpPost(m.sims[engineID].URL()+path, body)
	if err != nil || resp != 200 {
		t.Fatalf("warm %s: %d %v", engineID, resp, err)
	}
	keys := kvevents.AppendKeys(nil, kvevents.Root(model, "", ""), tokens, 16)
	testutil.WaitFor(t, 15*time.Second, "the warmed prompt's blocks in the index", func() bool {
		return r.idx.KeyCount(engineID, kvevents.TierGPU) >= len(keys)
	})
}

// routingCommon returns the answer that carries the routing and checks the
// fields every routed answer must have.
func checkRouting(t *testing.T, res *exchangeResult, wantFirst string, n int) []string {
	t.Helper()
	if res.immediate != nil {
		t.Fatalf("immediate response %d: %s", res.immediate.GetStatus().GetCode(), res.immediate.GetBody())
	}
	eps := strings.Split(res.dest, ",")
	// n is every eligible engine; the scheduler's filters (health, queue)
	// may drop one whose gossiped state says so, never the first.
	if eps[0] != wantFirst || len(eps) > n {
		t.Fatalf("destination %q, want at most %d endpoints starting with %s", res.dest, n, wantFirst)
	}
	seen := map[string]bool{}
	for _, ep := range eps {
		if seen[ep] {
			t.Fatalf("endpoint %s listed twice in %q", ep, res.dest)
		}
		seen[ep] = true
	}
	if res.metaDest != res.dest {
		t.Fatalf("envoy.lb metadata %q differs from the header %q", res.metaDest, res.dest)
	}
	if !res.clearRoute || len(res.removed) != 1 || res.removed[0] != PrefillerHeader || res.prefiller != "" {
		t.Fatalf("clear_route_cache %v, removed %v, prefiller %q", res.clearRoute, res.removed, res.prefiller)
	}
	return eps
}

func setHeaderOf(t *testing.T, c *extprocv3.CommonResponse) *corev3.HeaderValueOption {
	t.Helper()
	hs := c.GetHeaderMutation().GetSetHeaders()
	if len(hs) != 1 || hs[0].GetHeader().GetKey() != DestinationKey ||
		hs[0].GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || hs[0].GetHeader().GetValue() != "" {
		t.Fatalf("set headers %v", hs)
	}
	return hs[0]
}

type pickerRig struct {
	m     *mesh
	s     *Server
	r     *replica
	ing   *replica // a plain ingress replica in the same mesh
	textA string   // cached on eng-a
	sysB  string   // chat system prompt cached on eng-b
}

// newPickerRig: two engines, a picker and a plain ingress; a text prefix
// warmed on eng-a, a chat prefix on eng-b.
func newPickerRig(t *testing.T) *pickerRig {
	m := newMesh(t)
	s, r := m.startEPP("epp-test", DefaultConfig(), Deps{}, nil)
	m.addEngine("eng-a", "", 1)
	m.addEngine("eng-b", "", 2)
	ing := m.newReplica("ingress-test", nil)
	m.start(ing)
	m.waitEngines(r, 2)
	m.waitEngines(ing, 2)
	rig := &pickerRig{m: m, s: s, r: r, ing: ing, textA: words("cached-on-a", 400), sysB: words("system-on-b", 400)}

	toks, err := m.tok.Encode(nil, []byte(rig.textA))
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range []*replica{r, ing} {
		m.warm(rep, "eng-a", "/v1/completions", completionsBody(rig.textA, false), toks)
	}
	chatToks, err := m.tok.RenderChat(nil, chatMsgs(rig.sysB, "warm"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rep := range []*replica{r, ing} {
		m.warm(rep, "eng-b", "/v1/chat/completions", chatBody(rig.sysB, "warm", false), chatToks[:len(chatToks)*3/4])
	}
	return rig
}

func TestEnvoySequences(t *testing.T) {
	rig := newPickerRig(t)
	m := rig.m
	type kind struct {
		name, path, body, want string
		stream                 bool
	}
	kinds := []kind{
		{"completions", "/v1/completions", completionsBody(rig.textA+" first question", false), "eng-a", false},
		{"completions-stream", "/v1/completions", completionsBody(rig.textA+" second question", true), "eng-a", true},
		{"chat", "/v1/chat/completions", chatBody(rig.sysB, "a new turn", false), "eng-b", false},
		{"chat-stream", "/v1/chat/completions", chatBody(rig.sysB, "another turn", true), "eng-b", true},
	}
	modes := []struct {
		name      string
		req, resp extprocfilter.ProcessingMode_BodySendMode
		trailers  bool
	}{
		{"full-duplex", extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, false},
		{"full-duplex-trailers", extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, true},
		{"buffered", extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_STREAMED, false},
		{"streamed", extprocfilter.ProcessingMode_STREAMED, extprocfilter.ProcessingMode_STREAMED, false},
	}
	for _, md := range modes {
		env := newEnvoy(t, rig.s.Addr(), md.req, md.resp)
		for _, k := range kinds {
			t.Run(md.name+"/"+k.name, func(t *testing.T) {
				res, err := env.do(context.Background(), httpRequest{method: "POST", path: k.path, body: []byte(k.body), trailers: md.trailers}, true)
				if err != nil {
					t.Fatal(err)
				}
				checkRouting(t, res, m.ep[k.want], 2)
				checkModeAnswers(t, md.req, res, []byte(k.body), md.trailers, env.chunk)
				// The response phase: headers answered empty, the body passed
				// back unchanged (full duplex) and the engine's real answer.
				if res.status != 200 || res.respAnswer[0].GetResponseHeaders() == nil || res.respAnswer[0].GetResponseHeaders().GetResponse() != nil {
					t.Fatalf("response status %d, first answer %v", res.status, res.respAnswer[0])
				}
				if k.stream {
					if !strings.Contains(string(res.respBody), "data: [DONE]") {
						t.Fatalf("stream body %s", res.respBody)
					}
				} else if !json.Valid(res.respBody) || !strings.Contains(string(res.respBody), `"choices"`) {
					t.Fatalf("body %s", res.respBody)
				}
				testutil.WaitFor(t, 10*time.Second, "the picker's charge released and the engines idle", func() bool { return settled(rig.r) })
			})
		}
	}
}

// checkModeAnswers checks the request-side answers field by field for the mode.
func checkModeAnswers(t *testing.T, mode extprocfilter.ProcessingMode_BodySendMode, res *exchangeResult, body []byte, trailers bool, chunk int) {
	t.Helper()
	rh := res.reqHeaders.GetRequestHeaders()
	if rh == nil {
		t.Fatalf("first answer is not for the request headers: %v", res.reqHeaders)
	}
	switch mode {
	case extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
		c := rh.GetResponse()
		if v := setHeaderOf(t, c).GetHeader().GetRawValue(); string(v) != res.dest || c.GetStatus() != extprocv3.CommonResponse_CONTINUE || c.GetBodyMutation() != nil {
			t.Fatalf("headers answer %v", c)
		}
		if len(res.reqBodies) != 1 {
			t.Fatalf("%d body answers, want 1", len(res.reqBodies))
		}
		sb := res.reqBodies[0].GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if string(sb.GetBody()) != string(body) || sb.GetEndOfStream() == trailers {
			t.Fatalf("streamed body eos=%v %q", sb.GetEndOfStream(), sb.GetBody())
		}
		if trailers != (res.reqTrailers.GetRequestTrailers() != nil) {
			t.Fatalf("trailers answer %v", res.reqTrailers)
		}
	case extprocfilter.ProcessingMode_BUFFERED:
		if rh.GetResponse().GetHeaderMutation() != nil || res.reqHeaders.GetDynamicMetadata() != nil {
			t.Fatalf("buffered: the headers answer must be empty, got %v", res.reqHeaders)
		}
		if len(res.reqBodies) != 1 {
			t.Fatalf("%d body answers, want 1", len(res.reqBodies))
		}
		c := res.reqBodies[0].GetRequestBody().GetResponse()
		if string(setHeaderOf(t, c).GetHeader().GetRawValue()) != res.dest || c.GetBodyMutation() != nil {
			t.Fatalf("body answer %v", c)
		}
	case extprocfilter.ProcessingMode_STREAMED:
		if string(setHeaderOf(t, rh.GetResponse()).GetHeader().GetRawValue()) != res.dest {
			t.Fatalf("headers answer %v", rh)
		}
		want := (len(body) + chunk - 1) / chunk
		if len(res.reqBodies) != want {
			t.Fatalf("%d body answers, want one per chunk (%d)", len(res.reqBodies), want)
		}
		for _, b := range res.reqBodies {
			if c := b.GetRequestBody().GetResponse(); c.GetBodyMutation() != nil || c.GetHeaderMutation() != nil {
				t.Fatalf("chunk answer must pass the chunk: %v", c)
			}
		}
	}
	if string(res.forwarded) != string(body) {
		t.Fatalf("the data plane would forward %q, not the client's body", res.forwarded)
	}
}

func chatMsgs(system, user string) []ingress.Message {
	return []ingress.Message{{Role: "system", Content: system}, {Role: "user", Content: user}}
}

func httpPost(url, body string) (int, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
