package epp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// The Responses API through the picker, with the Envoy stand-in forwarding
// to real simulated engines that store responses: the picker writes a
// request_id naming the engine into the body it hands back (with its
// content-length), so a follow-up naming the response, and a GET of it
// through the ingress, reach the engine that holds it; in every body mode
// (STREAMED replaces it in the first chunk's answer and clears the others:
// each chunk waits there for its answer).
func TestPickerResponses(t *testing.T) {
	rig := newPickerRig(t)
	ctx := context.Background()
	for _, mode := range []extprocfilter.ProcessingMode_BodySendMode{extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_BUFFERED,
		extprocfilter.ProcessingMode_STREAMED} {
		t.Run(mode.String(), func(t *testing.T) {
			env := newEnvoy(t, rig.s.Addr(), mode, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
			for i := 0; i < 4; i++ {
				first := map[string]any{"model": model, "input": rig.textA + " question " + strconv.Itoa(i), "max_output_tokens": 3}
				if i%2 == 1 {
					first["input"] = "a short unrelated prompt " + strconv.Itoa(i) // lands wherever load says
				}
				b, _ := json.Marshal(first)
				res, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/responses", body: b}, true)
				if err != nil {
					t.Fatal(err)
				}
				var fwd map[string]any
				if err := json.Unmarshal(res.forwarded, &fwd); err != nil || fwd["input"] != first["input"] {
					t.Fatalf("forwarded body %s: %v", res.forwarded, err)
				}
				if cl := headerSet(res, "content-length"); cl != strconv.Itoa(len(res.forwarded)) {
					t.Fatalf("content-length %q for a %d-byte body", cl, len(res.forwarded))
				}
				var r1 struct {
					ID    string `json:"id"`
					Usage struct {
						Output int `json:"output_tokens"`
					} `json:"usage"`
				}
				if res.status != 200 || json.Unmarshal(res.respBody, &r1) != nil || !strings.HasPrefix(r1.ID, "resp_kvm") || r1.ID != fwd["request_id"] {
					t.Fatalf("first turn: %d %s (forwarded request_id %v)", res.status, res.respBody, fwd["request_id"])
				}
				follow, _ := json.Marshal(map[string]any{"model": model, "input": "and then?", "previous_response_id": r1.ID, "max_output_tokens": 2})
				res2, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/responses", body: follow}, true)
				if err != nil {
					t.Fatal(err)
				}
				if res2.served != res.served || res2.status != 200 {
					t.Fatalf("follow-up of %s served by %s (first turn %s): %d %s", r1.ID, res2.served, res.served, res2.status, res2.respBody)
				}
				// A GET of it through the gateway (bodyless: routed without
				// the ingress's Pick) reaches its engine too.
				res3, err := env.do(ctx, httpRequest{method: "GET", path: "/v1/responses/" + r1.ID}, true)
				if err != nil {
					t.Fatal(err)
				}
				if res3.served != res.served || res3.status != 200 || !strings.Contains(string(res3.respBody), r1.ID) {
					t.Fatalf("GET %s served by %s (first turn %s): %d %s", r1.ID, res3.served, res.served, res3.status, res3.respBody)
				}
				// Any ingress replica reads the engine back from the id.
				resp, err := http.Get("http://" + rig.ing.ing.Addr() + "/v1/responses/" + r1.ID)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(got), r1.ID) {
					t.Fatalf("GET through the ingress: %d %s", resp.StatusCode, got)
				}
			}
		})
	}
}

// headerSet returns the value the route's header mutation sets for key.
func headerSet(res *exchangeResult, key string) string {
	for _, r := range append(res.reqBodies, res.reqHeaders) {
		c := r.GetRequestHeaders().GetResponse()
		if c == nil {
			c = r.GetRequestBody().GetResponse()
		}
		for _, h := range c.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == key {
				return string(h.GetHeader().GetRawValue())
			}
		}
	}
	return ""
}
