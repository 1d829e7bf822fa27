package ingress

import (
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkRequestPath measures everything the ingress does before it
// proxies (auth off, parse, candidates, keys for 2,048 token ids, index
// lookup, scheduling, speculative insert): the hot path must not allocate
// per block.
func BenchmarkRequestPath(b *testing.B) {
	for _, policy := range []string{"random", "kvmesh"} {
		b.Run(policy, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Scheduler.Policy = policy
			cfg.AccessLog = false
			for i := 0; i < 8; i++ {
				cfg.Engines = append(cfg.Engines, StaticEngine{ID: "e" + strconv.Itoa(i), Model: "m", URL: "http://127.0.0.1:1"})
			}
			s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			c := benchPrepare(b, s, "m", func(c *call) {
				// What proxy does before dialing: the speculative entry.
				s.deps.Index.AddSpeculative(c.dec.Ranked[0].Engine, c.keys, c.sreq.Now)
			})
			if len(c.keys) != 128 {
				b.Fatalf("%d keys", len(c.keys))
			}
		})
	}
}

// benchPrepare times the request path up to the proxy (parse, tokens, keys,
// limits, schedule) for a streamed 2,048-token-id completion of model,
// calling after on each prepared call; it returns the last call.
func benchPrepare(b *testing.B, s *Server, model string, after func(c *call)) *call {
	b.Helper()
	var sb strings.Builder
	sb.WriteString(`{"model":"` + model + `","max_tokens":64,"stream":true,"prompt":[`)
	for i := 0; i < 2048; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(1000 + i))
	}
	sb.WriteString("]}")
	body := []byte(sb.String())
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetBody(body)
	c := &call{}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.reset()
		c.s, c.ep = s, epCompletions
		if err := c.prepare(&ctx); err != nil {
			b.Fatal(err)
		}
		after(c)
	}
	b.StopTimer()
	return c
}
