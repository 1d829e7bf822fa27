package openai

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/sim"
)

// TestOpenAINodeClientResponses drives the Responses API (POST /v1/responses,
// GET /v1/responses/{id}) with the official openai npm client through two
// ingress replicas in front of two simulated engines that store responses
// (vLLM's VLLM_ENABLE_RESPONSES_API_STORE): a conversation started on one
// replica and continued on the other (previous_response_id) must reach the
// engine that holds it, as must a retrieve; streams carry vLLM's events.
func TestOpenAINodeClientResponses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, dir := installClient(t)
	const model = "e2e-model"
	engines := startEngines(t, ctx, 2, model, func(c *sim.Config) { c.ResponsesStore = true })
	store := keyStore(t, dir)
	var urls []string
	for i := 0; i < 2; i++ {
		cfg := ingress.DefaultConfig()
		cfg.Engines = engines
		// Round-robin alternates the first turns between the engines and
		// would send half the follow-ups to the wrong one: only the
		// response id's engine tag keeps them where their state is.
		cfg.Scheduler.Policy = "round-robin"
		urls = append(urls, "http://"+startIngress(t, ctx, cfg, ingress.Deps{Auth: store}).Addr()+"/v1")
	}
	var res results
	runScript(t, ctx, node, dir, "responses.mjs", &res, "KVMESH_BASE_URLS="+strings.Join(urls, ","), "KVMESH_API_KEY="+testKey, "KVMESH_MODEL="+model)
	for name, r := range res {
		t.Logf("%s: %v", name, r)
	}

	c := res.ok(t, "create")
	if id, _ := c["id"].(string); !strings.HasPrefix(id, "resp_") || c["object"] != "response" || c["text"] == "" ||
		num(usage(c)["output_tokens"]) != 8 || c["engine"] == nil {
		t.Errorf("create: %v", c)
	}
	chains, _ := res.ok(t, "chains")["chains"].([]any)
	used := map[any]bool{}
	for i, ch := range chains {
		m, _ := ch.(map[string]any)
		used[m["first"]] = true
		if m["first"] != m["second"] || m["retrieved"] != true || m["prev"] != true ||
			num(m["in2"]) <= num(m["in1"])+num(m["out1"]) || num(m["cached2"]) == 0 {
			t.Errorf("chain %d: %v (the follow-up must reach the engine holding the first response, and see its turn)", i, m)
		}
	}
	if len(chains) != 6 || len(used) != 2 {
		t.Errorf("%d chains on engines %v: want 6 over both", len(chains), used)
	}
	// A stored conversation continued with no new message (input []) goes
	// where the first response is and sees it (the ingress refused it).
	if ce := res.ok(t, "continue_empty"); ce["first"] != ce["second"] || ce["prev"] != true || num(ce["in2"]) <= num(ce["in1"]) {
		t.Errorf("continue_empty: %v", ce)
	}
	st := res.ok(t, "stream")
	types, _ := st["types"].([]any)
	if len(types) < 4 || types[0] != "response.created" || (types[len(types)-1] != "response.completed" && types[len(types)-1] != "response.incomplete") ||
		st["text"] == "" || st["text"] != st["done"] || num(usage(st)["output_tokens"]) != 6 {
		t.Errorf("stream: %v", st)
	}
	wantErr := func(name string, status int) {
		r := res[name]
		if r == nil || r["error"] != true || num(r["status"]) != status {
			t.Errorf("%s: want HTTP %d, got %v", name, status, r)
		}
	}
	wantErr("unknown_previous", 404)
	wantErr("retrieve_unknown", 404)
	wantErr("bad_input", 400)
}
