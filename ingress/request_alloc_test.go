//go:build !race

package ingress

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/scheduler"
)

// fasthttpStreamBodyAllocs is what fasthttp's client allocates per upstream
// answer read with StreamResponseBody (upstream.go), which every answer is,
// buffered or streamed: fasthttp v1.79.0 client.go makes the releaseConn
// closure, the clientStreamBody and its interrupt and release closures for
// each one. The rest of the ingress's request handling allocates nothing
// (docs/BENCHMARKS.md, "Allocations per request").
const fasthttpStreamBodyAllocs = 4

const (
	allocAnswer = `{"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":32,"completion_tokens":1,"total_tokens":33}}`
	allocEvents = `data: {"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"cmpl-a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":32,"completion_tokens":2,"total_tokens":34}}` + "\n\n" +
		"data: [DONE]\n\n"
)

// startAllocEngine is an engine on loopback that answers every request with
// a fixed completion (a stream of events when the body asks for one), from
// fasthttp's server, which allocates nothing per request.
func startAllocEngine(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answer, events := []byte(allocAnswer), []byte(allocEvents)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if jsonBool(ctx.PostBody(), "stream") {
			ctx.SetContentType("text/event-stream")
			ctx.SetBody(events)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(answer)
	}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }() // owner: the test; Shutdown ends it
	t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return ln.Addr().String()
}

// jsonBool reports whether body has "key":true, for the fake engine.
func jsonBool(body []byte, key string) bool {
	for i := 0; i+len(key)+7 <= len(body); i++ {
		if body[i] == '"' && string(body[i+1:i+1+len(key)]) == key && string(body[i+1+len(key):i+len(key)+7]) == `":true` {
			return true
		}
	}
	return false
}

// minAllocs is the fewest allocations per call of f over several rounds:
// testing.AllocsPerRun counts the whole process's, and a background
// goroutine (a timer, a probe) may allocate during one round, never during
// all of them.
func minAllocs(rounds, runs int, f func()) float64 {
	best := -1.0
	for range rounds {
		if n := testing.AllocsPerRun(runs, f); best < 0 || n < best {
			best = n
		}
	}
	return best
}

// A request's whole handling in the ingress (reading it from its client,
// parsing, routing, the upstream exchange with a loopback engine over a
// pooled connection, relaying the answer, the metrics) allocates nothing of
// its own, non-streamed and streamed: what is left is fasthttp's client
// reading each answer as a stream (fasthttpStreamBodyAllocs). The client and
// the engine, fasthttp's too, are measured alone first: they allocate
// nothing, so the count through the ingress is the ingress's.
func TestRequestHandlingAllocs(t *testing.T) {
	engine := startAllocEngine(t)
	cfg := DefaultConfig()
	cfg.AccessLog = false
	cfg.Engines = []StaticEngine{{ID: "e0", Model: "m", URL: "http://" + engine}}
	s := startIngress(t, cfg, Deps{})
	for _, mode := range []struct{ name, body string }{{"nonstream", benchBody}, {"stream", benchStreamBody}} {
		t.Run(mode.name, func(t *testing.T) {
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			count := func(addr string) float64 {
				hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
				req := newReq(addr, mode.body)
				defer fasthttp.ReleaseRequest(req)
				do := func() {
					if err := doOnce(hc, req, resp); err != nil {
						t.Fatal(err)
					}
				}
				for range 50 { // connections dialed, pools and buffers grown
					do()
				}
				return minAllocs(5, 100, do)
			}
			if n := count(engine); n != 0 {
				t.Fatalf("the client and the engine alone allocate %v per request: the rig measures more than the ingress", n)
			}
			n := count(s.Addr())
			t.Logf("%v allocations per request through the ingress", n)
			if n > fasthttpStreamBodyAllocs {
				t.Fatalf("%v allocations per request through the ingress, want at most fasthttp's %d", n, fasthttpStreamBodyAllocs)
			}
		})
	}
}

// TestRequestHandlingAllocsMixedBlockSizes: a model whose engines report
// two block sizes keys each prompt twice (handler.go, blockSizes), in the
// call's own buffers: no allocation per request beyond the single-size
// path's.
func TestRequestHandlingAllocsMixedBlockSizes(t *testing.T) {
	engine := startAllocEngine(t)
	cfg := DefaultConfig()
	cfg.AccessLog = false
	cfg.Engines = []StaticEngine{{ID: "e0", Model: "m", URL: "http://" + engine}}
	mem := engineList{
		{Engine: scheduler.Engine{ID: "e0", Model: "m", Healthy: true}, URL: "http://" + engine, BlockSize: 16},
		{Engine: scheduler.Engine{ID: "e1", Model: "m", Healthy: true}, URL: "http://" + engine, BlockSize: 32},
	}
	s := startIngress(t, cfg, Deps{Membership: mem, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	hc := &fasthttp.HostClient{Addr: s.Addr(), MaxConns: 1, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	req := newReq(s.Addr(), benchBody)
	defer fasthttp.ReleaseRequest(req)
	do := func() {
		if err := doOnce(hc, req, resp); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		do()
	}
	if s.check.mixedBlocks == nil || seriesSum(s.check.mixedBlocks) == 0 {
		t.Fatal("the requests were not keyed at two block sizes")
	}
	if n := minAllocs(5, 100, do); n > fasthttpStreamBodyAllocs {
		t.Fatalf("%v allocations per request through the ingress with two block sizes, want at most fasthttp's %d", n, fasthttpStreamBodyAllocs)
	}
}
