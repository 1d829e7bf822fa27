//go:build !race

package ingress

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// Reading the int members as pydantic does allocates nothing, numeric
// strings with escapes and duplicates included.
func TestIntMembersNoAlloc(t *testing.T) {
	body := []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":"\u0036\u0034","n":" 4 ","n":"4.0","truncate_prompt_tokens":"1_0","max_tokens":null,"max_tokens":1e2}`)
	var r request
	if err := parseRequest(&r, epCompletions, body); err != nil || r.maxTokens != 100 || r.n != 4 || r.truncate != 10 {
		t.Fatalf("max tokens %d, n %d, truncate %d: %v", r.maxTokens, r.n, r.truncate, err)
	}
	if n := testing.AllocsPerRun(100, func() {
		r.reset()
		if err := parseRequest(&r, epCompletions, body); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}

// Keeping the forwarded headers, a client request id replaced by one the
// ingress makes included, allocates nothing once the call's buffers grew.
func TestForwardHeadersNoAlloc(t *testing.T) {
	var h fasthttp.RequestHeader
	h.Set("X-Request-Id", strings.Repeat("a", 4000))
	h.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	var c call
	c.keepForwardHeaders(&h)
	if n := testing.AllocsPerRun(100, func() { c.keepForwardHeaders(&h) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
	if len(c.fwd[fwdRequestID]) != 32 {
		t.Fatalf("request id %.40q", c.fwd[fwdRequestID])
	}
}
