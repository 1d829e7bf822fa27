package openai

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
)

// openaiVersion pins the client the test installs.
const openaiVersion = "7.55.0"

const testKey = "sk-kvmesh-e2e-0123456789"

// TestOpenAINodeClient drives ingress + two simulated engines with the
// official openai npm package: completions and chat, streaming and not, the
// usage chunk, the model list and error mapping.
func TestOpenAINodeClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, dir := installClient(t)
	const model = "e2e-model"
	cfg := ingress.DefaultConfig()
	cfg.Engines = startEngines(t, ctx, 2, model, nil)
	srv := startIngress(t, ctx, cfg, ingress.Deps{Auth: keyStore(t, dir)})
	checkClient(t, ctx, node, dir, srv.Addr(), model)
}

// installClient installs the pinned openai npm package (cached) and
// returns a working directory with the openai client's scripts (skipping
// without node/npm outside CI).
func installClient(t *testing.T) (node, dir string) {
	t.Helper()
	dir = nodeWork(t, "openai-"+openaiVersion, "the test drives the ingress with the openai npm client (Node.js 20+)",
		[]string{"openai@" + openaiVersion}, "client.mjs", "responses.mjs", "security.mjs")
	return "node", dir
}

// checkClient runs client.mjs against an ingress at addr and checks every
// answer's shape.
func checkClient(t *testing.T, ctx context.Context, node, dir, addr, model string) {
	t.Helper()
	var res results
	runScript(t, ctx, node, dir, "client.mjs", &res, "KVMESH_BASE_URL=http://"+addr+"/v1", "KVMESH_API_KEY="+testKey, "KVMESH_MODEL="+model)
	for name, r := range res {
		t.Logf("%s: %v", name, r)
	}

	if ids, _ := res.ok(t, "models")["ids"].([]any); len(ids) != 1 || ids[0] != model {
		t.Errorf("models: %v", ids)
	}
	if m := res.ok(t, "model_retrieve"); m["id"] != model || m["object"] != "model" {
		t.Errorf("models.retrieve(%q): %v", model, m)
	}
	c := res.ok(t, "completion")
	if c["object"] != "text_completion" || c["text"] == "" || num(usage(c)["completion_tokens"]) != 8 || c["finish"] != "length" {
		t.Errorf("completion: %v", c)
	}
	if u := usage(res.ok(t, "completion_ids")); num(u["prompt_tokens"]) != 17 || num(u["completion_tokens"]) != 4 {
		t.Errorf("completion with token ids: usage %v (the engine must see exactly the ids sent)", u)
	}
	cs := res.ok(t, "completion_stream")
	if num(cs["chunks"]) < 2 || cs["text"] == "" || num(usage(cs)["completion_tokens"]) != 6 || cs["finish"] != "length" {
		t.Errorf("completion stream: %v", cs)
	}
	cb := res.ok(t, "completion_batch")
	if idx, _ := cb["indexes"].([]any); len(idx) != 2 || num(idx[0]) != 0 || num(idx[1]) != 1 ||
		num(usage(cb)["prompt_tokens"]) != 8 || num(usage(cb)["completion_tokens"]) != 6 {
		t.Errorf("batched completion: %v (one choice per prompt, usage summed)", cb)
	}
	cbs := res.ok(t, "completion_batch_stream")
	if fin, _ := cbs["finished"].([]any); len(fin) != 2 || fin[0] != "0" || fin[1] != "1" || num(usage(cbs)["completion_tokens"]) != 8 {
		t.Errorf("batched completion stream: %v", cbs)
	}
	ch := res.ok(t, "chat")
	if ch["object"] != "chat.completion" || ch["role"] != "assistant" || ch["content"] == "" || num(usage(ch)["completion_tokens"]) != 7 {
		t.Errorf("chat: %v", ch)
	}
	chs := res.ok(t, "chat_stream")
	if chs["role"] != "assistant" || chs["content"] == "" || num(usage(chs)["completion_tokens"]) != 5 || chs["finish"] != "length" {
		t.Errorf("chat stream: %v", chs)
	}
	chn := res.ok(t, "chat_n_stream") // n = 2: two choices, streamed and not, the prompt counted once
	content, _ := chn["content"].(map[string]any)
	finish, _ := chn["finish"].(map[string]any)
	full, _ := chn["full"].([]any)
	fullIdx, _ := chn["fullIndexes"].([]any)
	if len(content) != 2 || len(finish) != 2 || len(full) != 2 || len(fullIdx) != 2 || num(fullIdx[1]) != 1 ||
		content["0"] != full[0] || content["1"] != full[1] || content["0"] == "" ||
		num(usage(chn)["completion_tokens"]) != 8 || num(usage(chn)["prompt_tokens"]) != num(usage(ch)["prompt_tokens"]) {
		t.Errorf("chat with n 2: %v", chn)
	}
	cst := res.ok(t, "chat_stop") // a stop string: the text cut before it, streamed and not, finish_reason stop
	whole, _ := cst["whole"].(string)
	stop, _ := cst["stop"].(string)
	if at := strings.Index(whole, stop); stop == "" || at < 0 || cst["text"] != whole[:at] || cst["streamed"] != cst["text"] ||
		cst["finish"] != "stop" || cst["streamFinish"] != "stop" || cst["stopReason"] != stop {
		t.Errorf("chat with a stop string: %v", cst)
	}
	sid := res.ok(t, "completion_stop_ids") // a stop token id: the output ends on it, stop_reason the id
	if ids, _ := sid["ids"].([]any); len(ids) > 4 {
		k := int(num(sid["k"]))
		got, _ := sid["got"].([]any)
		if k >= len(ids) || len(got) != k+1 || sid["finish"] != "stop" || num(sid["stopReason"]) != num(ids[k]) || num(usage(sid)["completion_tokens"]) != k+1 {
			t.Errorf("completion with stop_token_ids: %v", sid)
		}
	} else {
		t.Errorf("completion_stop_ids: no token ids: %v", sid)
	}
	cu := res.ok(t, "chat_usage_continuous") // continuous_usage_stats: every chunk's usage passed through
	per, _ := cu["perChoice"].(map[string]any)
	last, _ := cu["last"].(map[string]any)
	if num(cu["withUsage"]) != num(cu["chunks"]) || len(per) != 2 || num(last["completion_tokens"]) != num(per["0"])+num(per["1"]) || num(per["0"]) < 1 {
		t.Errorf("chat with continuous_usage_stats: %v", cu)
	}
	wantErr := func(name string, status int, typ string) {
		r := res[name]
		if r == nil || r["error"] != true || num(r["status"]) != status || (typ != "" && r["type"] != typ) {
			t.Errorf("%s: want HTTP %d %s, got %v", name, status, typ, r)
		}
	}
	wantErr("unknown_model", 404, "invalid_request_error")
	wantErr("bad_request", 400, "invalid_request_error")
	wantErr("wrong_key", 401, "invalid_request_error")
}
