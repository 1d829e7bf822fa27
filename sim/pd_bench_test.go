package sim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// BenchmarkPDRoundTrip measures the simulator's own cost of one
// disaggregated request (prefill leg with kv_transfer_params, decode leg
// reading 64 blocks over the loopback side channel, 4 output tokens) at a
// time scale so large that modelled time is negligible: the overhead a P/D
// test or demo pays per request on top of the aggregated path.
func BenchmarkPDRoundTrip(b *testing.B) {
	mk := func() *Server {
		cfg := Config{Model: "test-model", TimeScale: 1e6, Logger: quietLogger()}
		cfg.Engine.Profile = mustProfileB(b, "tiny")
		nixlConfig(&cfg)
		s, err := Start(b.Context(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		return s
	}
	p, d := mk(), mk()
	do := func(url string, body map[string]any) map[string]json.RawMessage {
		raw, _ := json.Marshal(body)
		resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		out := map[string]json.RawMessage{}
		rb, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(rb, &out) != nil {
			b.Fatalf("%d %s", resp.StatusCode, rb)
		}
		return out
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		prompt := tokens(1+i*7, 1024) // a new prompt each time: no local hits on the decode
		pr := do(p.URL()+"/v1/completions", prefillLeg(prompt))
		do(d.URL()+"/v1/completions", decodeLeg(prompt, pr["kv_transfer_params"], 4))
	}
}
