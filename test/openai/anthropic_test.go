package openai

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
)

// anthropicSDKVersion pins Anthropic's TypeScript SDK.
const anthropicSDKVersion = "1.16.0"

// TestAnthropicNodeClient drives the ingress's /v1/messages with
// Anthropic's official TypeScript SDK (this version sends its key as
// Authorization: Bearer): a message, a stream read through the SDK's event
// helpers, a tool round trip, models.list() (also with the key as
// x-api-key, as earlier SDKs send it), and the errors the SDK maps to its
// types.
func TestAnthropicNodeClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work := nodeWork(t, "anthropic-"+anthropicSDKVersion, "the test drives the ingress with Anthropic's SDK",
		[]string{"@anthropic-ai/sdk@" + anthropicSDKVersion}, "anthropic.mjs")
	const model = "e2e-model"
	cfg := ingress.DefaultConfig()
	cfg.Engines = startEngines(t, ctx, 2, model, nil)
	srv := startIngress(t, ctx, cfg, ingress.Deps{Auth: keyStore(t, work)})
	var res results
	runScript(t, ctx, "node", work, "anthropic.mjs", &res, "KVMESH_BASE_URL=http://"+srv.Addr(), "KVMESH_API_KEY="+testKey, "KVMESH_MODEL="+model)
	for name, r := range res {
		t.Logf("%s: %v", name, r)
	}
	m := res.ok(t, "create")
	u := usage(m)
	if m["type"] != "message" || m["role"] != "assistant" || m["text"] == "" || m["stop"] != "max_tokens" ||
		num(u["output_tokens"]) != 7 || num(u["input_tokens"]) <= 0 {
		t.Errorf("create: %v", m)
	}
	s := res.ok(t, "stream")
	var events []string
	for _, e := range s["events"].([]any) {
		events = append(events, e.(string))
	}
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if len(events) < len(want) || events[0] != want[0] || events[1] != want[1] || events[len(events)-3] != want[3] ||
		events[len(events)-2] != want[4] || events[len(events)-1] != want[5] ||
		slices.ContainsFunc(events[2:len(events)-3], func(e string) bool { return e != "content_block_delta" }) {
		t.Errorf("stream events %v, want %v with deltas between", events, want)
	}
	prompt := func(u map[string]any) int { return num(u["input_tokens"]) + num(u["cache_read_input_tokens"]) } // vLLM: input_tokens is the uncached part
	if su := usage(s); s["text"] == "" || s["stop"] != "max_tokens" || num(su["output_tokens"]) != 5 || prompt(su) != prompt(u) {
		t.Errorf("stream: %v (create's usage %v)", s, u)
	}
	tu := usage(res.ok(t, "tools"))
	if num(tu["output_tokens"]) != 4 || prompt(tu) <= prompt(u) {
		t.Errorf("tools: usage %v (the tool turn's prompt is longer than %v)", tu, u["input_tokens"])
	}
	for _, name := range []string{"models", "models_x_api_key"} {
		if ids, _ := res.ok(t, name)["ids"].([]any); !slices.Contains(ids, any(model)) {
			t.Errorf("%s: models.list(): %v", name, res[name])
		}
	}
	for name, want := range map[string][2]any{"no_max_tokens": {400.0, "invalid_request_error"}, "wrong_key": {401.0, "authentication_error"}} {
		r := res[name]
		if r == nil || r["error"] != true || r["status"] != want[0] || r["type"] != want[1] {
			t.Errorf("%s: %v, want HTTP %v %v", name, r, want[0], want[1])
		}
	}
}
