package ingress

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// NIXL simulators of block sizes 16 and 32 under kvmesh-always: a prefill
// engine is paired only with a decode engine of its own size, whose KV
// read then succeeds (the prompt is cached on the decode engine), and
// with none of that size the request is served aggregated on the decode
// engine. The block-16 prefill engine was paired with the block-32 decode
// engine, every KV read failed ("remote block size 16, local 32"), the
// decode engine prefilled again and the prefill engine's KV filled with
// blocks nobody read (tester h-reg8 F1).
func TestPDPairsOneBlockSize(t *testing.T) {
	cluster := func(bs int) *simtest.PD {
		return simtest.StartPDForTest(t, simtest.PDOptions{Base: sim.Config{Model: "m", TimeScale: 100, Seed: 1,
			Engine: engine.Config{BlockSize: bs, GPUBlocks: 4096}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	}
	c16, c32 := cluster(16), cluster(32)
	p16 := pdEngine("p16", scheduler.RolePrefill, c16.Prefill[0].URL())
	p32 := pdEngine("p32", scheduler.RolePrefill, c32.Prefill[0].URL())
	d32 := pdEngine("d32", scheduler.RoleDecode, c32.Decode[0].URL())
	p16.BlockSize, p32.BlockSize, d32.BlockSize = 16, 32, 32
	p32.QueuedPrefillTokens = 100000 // the block-16 engine looks the cheaper prefill engine
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(1 + i*37%30000)
	}
	body := tokenIDsBody(toks, 2)
	for _, tc := range []struct {
		name    string
		engines []EngineInfo
		prefill string // "" aggregated
	}{
		{"a prefill engine of each size", []EngineInfo{p16, p32, d32}, "p32"},
		{"only another size", []EngineInfo{p16, d32}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before16, before32 := c16.Prefill[0].Load(0).Finished, c32.Prefill[0].Load(0).Finished
			s := startPDIngress(t, "kvmesh-always", PDConfig{}, tc.engines...)
			st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", body)
			if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d32" {
				t.Fatalf("status %d engine %q: %.300s", st, hdr.Get("X-Kvmesh-Engine"), b)
			}
			var r struct {
				Usage struct {
					Details struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			legs, dec := s.pdInit().legs, s.pdInit().decisions
			if n := c16.Prefill[0].Load(0).Finished - before16; n != 0 {
				t.Errorf("the block-16 prefill engine served %d legs for the block-32 decode engine", n)
			}
			if tc.prefill == "" {
				if ok, agg := val(legs.WithLabelValues("prefill", "ok")), val(dec.WithLabelValues("aggregated", "aggregated-no-pair")); ok != 0 || agg != 1 {
					t.Errorf("%v prefill legs, %v aggregated-no-pair decisions; want 0 and 1", ok, agg)
				}
				return
			}
			if n := c32.Prefill[0].Load(0).Finished - before32; n != 1 || r.Usage.Details.Cached < len(toks)/2 {
				t.Errorf("the block-32 prefill engine served %d legs, the decode engine had %d of %d prompt tokens cached; want 1 leg and the prompt read",
					n, r.Usage.Details.Cached, len(toks))
			}
		})
	}
}
