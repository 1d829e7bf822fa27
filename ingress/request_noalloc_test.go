//go:build !race

package ingress

import (
	"log/slog"
	"strconv"
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

// The request path up to the proxy (parse, tokens, keys, limits,
// schedule) allocates nothing for a model of a realistic name once it has
// been routed (modelname.go interns it); before, the name's copy was one
// allocation per request (a one-byte name, as the benchmarks used, costs
// none).
func TestPreparedRequestNoAlloc(t *testing.T) {
	const model = "Qwen/Qwen2.5-7B-Instruct"
	cfg := DefaultConfig()
	cfg.AccessLog = false
	for i := range 4 {
		cfg.Engines = append(cfg.Engines, StaticEngine{ID: "e" + strconv.Itoa(i), Model: model, URL: "http://127.0.0.1:1"})
	}
	s, err := New(cfg, Deps{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetBody([]byte(`{"model":"` + model + `","max_tokens":64,"stream":true,"prompt":[` + strings.Repeat("1000,", 511) + `1000]}`))
	c := &call{}
	prepare := func() {
		c.reset()
		c.s, c.ep = s, epCompletions
		if err := c.prepare(&ctx); err != nil {
			t.Fatal(err)
		}
	}
	prepare() // the first routes the name and interns it; the buffers grow
	if n := testing.AllocsPerRun(100, prepare); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}
