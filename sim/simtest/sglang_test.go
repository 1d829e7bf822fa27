package simtest

import (
	"encoding/json"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestSGLangBothLegsAtOnce: the same body with the prefill engine's
// bootstrap fields and one room, sent to both engines at once, as
// sgl-router does: the decode engine reads the room's KV (its usage
// reports the prompt as cached) and the prefill engine frees it.
func TestSGLangBothLegsAtOnce(t *testing.T) {
	pd := StartSGLangForTest(t, PDOptions{Base: base(t)})
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = i + 7
	}
	body := map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4, "bootstrap_room": rand.Uint64() & (1<<63 - 1)}
	for k, v := range pd.BootstrapFields(0) {
		body[k] = v
	}
	var wg sync.WaitGroup
	var decode map[string]json.RawMessage
	wg.Add(1)
	go func() {
		defer wg.Done()
		postJSON(t, pd.Prefill[0].URL()+"/v1/completions", body)
	}()
	decode = postJSON(t, pd.Decode[0].URL()+"/v1/completions", body)
	wg.Wait()
	var usage struct {
		Completion int `json:"completion_tokens"`
		Details    struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if err := json.Unmarshal(decode["usage"], &usage); err != nil || usage.Details.Cached < 288 || usage.Completion != 4 {
		t.Fatalf("decode usage %s: want the prompt's full blocks read over the bootstrap connection", decode["usage"])
	}
	testutil.WaitFor(t, 20*time.Second, "prefill blocks freed", func() bool { return pd.Prefill[0].Load(0).HeldBlocks == 0 })
}
