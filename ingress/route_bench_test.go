package ingress

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
)

// BenchmarkRequestPathRouted is BenchmarkRequestPath with a model route in
// front: match, weighted pick across two pools, candidates of the picked
// pool, and the upstream body with "model" rewritten. Compare its allocs/op
// with BenchmarkRequestPath/random: the route adds none. The client's model
// is one byte, like BenchmarkRequestPath's (a longer name allocates nothing
// either: the ingress interns the names it serves).
func BenchmarkRequestPathRouted(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Scheduler.Policy = "random"
	cfg.AccessLog = false
	for i := 0; i < 8; i++ {
		cfg.Engines = append(cfg.Engines,
			StaticEngine{ID: "a" + strconv.Itoa(i), Model: "a", URL: "http://127.0.0.1:1"},
			StaticEngine{ID: "b" + strconv.Itoa(i), Model: "b", URL: "http://127.0.0.1:1"})
	}
	rt := routeTable(b, `routes:
  - name: other
    match: {model: x, headers: {X-Tenant: t}}
    backends: [{model: a}]
  - name: split
    match: {model: "c", pathPrefix: /v1/}
    backends: [{model: a, weight: 80}, {model: b, weight: 20}]
    fallback: [a]
`)
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Routes: rt})
	if err != nil {
		b.Fatal(err)
	}
	c := benchPrepare(b, s, "c", func(c *call) {
		if up := c.upstreamBody(); len(up) < 2048*4 {
			b.Fatal("short body")
		}
	})
	if c.rt.route == nil || (c.model != "a" && c.model != "b") {
		b.Fatalf("not routed: %q", c.model)
	}
}
