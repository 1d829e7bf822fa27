package simtest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

func base(t *testing.T) sim.Config {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return sim.Config{Model: "m", Engine: engine.Config{BlockSize: 16, GPUBlocks: 512, Profile: p}, TimeScale: 50,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func postJSON(t *testing.T, url string, body any) map[string]json.RawMessage {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]json.RawMessage{}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(raw, &out) != nil {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, raw)
	}
	return out
}

// The helper's NIXL cluster carries a request through both legs: the
// prefill answers kv_transfer_params, the decode reads them and the
// prefill's blocks are freed.
func TestStartPDNixl(t *testing.T) {
	pd := StartPDForTest(t, PDOptions{Base: base(t), Prefill: 2, Decode: 2})
	if len(pd.Prefill) != 2 || len(pd.Decode) != 2 || pd.Prefill[1].SideChannelAddr(0) == "" {
		t.Fatalf("cluster %+v", pd)
	}
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = i + 1
	}
	p := postJSON(t, pd.Prefill[1].URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	var kv map[string]any
	if err := json.Unmarshal(p["kv_transfer_params"], &kv); err != nil || kv["do_remote_prefill"] != true {
		t.Fatalf("prefill answer %s", p["kv_transfer_params"])
	}
	d := postJSON(t, pd.Decode[0].URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4,
		"kv_transfer_params": kv})
	var usage struct {
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if err := json.Unmarshal(d["usage"], &usage); err != nil || usage.Details.Cached != 299 {
		t.Fatalf("decode usage %s", d["usage"])
	}
	testutil.WaitFor(t, 20*time.Second, "prefill blocks freed", func() bool { return pd.Prefill[1].Load(0).HeldBlocks == 0 })
}

func TestStartPDSGLang(t *testing.T) {
	pd := StartPDForTest(t, PDOptions{Base: base(t), Protocol: SGLang})
	f := pd.BootstrapFields(0)
	if f == nil || pd.Decode[0].BootstrapAddr() != "" {
		t.Fatalf("bootstrap fields %v", f)
	}
}
