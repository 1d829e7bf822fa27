package openai

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// pythonWithClients is a Python 3 interpreter that imports httpx and
// aiohttp (make deps installs Debian's python3-httpx and python3-aiohttp
// for /usr/bin/python3 when no python3 on PATH has them).
func pythonWithClients(t *testing.T) string {
	t.Helper()
	return testutil.Python(t, "import httpx, aiohttp",
		"python3 with httpx and aiohttp is needed: the test drives the ingress with Python's HTTP clients")
}

// TestPythonHTTPClients drives the ingress with Python's HTTP stacks,
// httpx (over h11, what the official openai Python client uses) and aiohttp,
// each with its own strict HTTP/1.1 parser: a chat stream with usage, a
// chat and a completion, an error body, keep-alive reuse and concurrent
// streams must all parse and carry the engine's token counts.
func TestPythonHTTPClients(t *testing.T) {
	py := pythonWithClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const model = "e2e-model"
	cfg := ingress.DefaultConfig()
	cfg.Engines = startEngines(t, ctx, 2, model, nil)
	srv := startIngress(t, ctx, cfg, ingress.Deps{})
	var res results
	runScript(t, ctx, py, ".", "python_clients.py", &res, "KVMESH_BASE_URL=http://"+srv.Addr()+"/v1", "KVMESH_MODEL="+model)

	s := res.ok(t, "httpx_stream")
	if s["done"] != true || s["text"] == "" || num(s["events"]) < 2 || num(s["usage_events"]) != 1 ||
		num(usage(s)["completion_tokens"]) != 9 || num(usage(s)["prompt_tokens"]) <= 0 || s["content_type"] != "text/event-stream" {
		t.Errorf("httpx stream: %v (want events ending in [DONE], text, one usage event with 9 output tokens)", s)
	}
	for name, want := range map[string]int{"httpx_chat": 7, "httpx_completions": 5} {
		r := res.ok(t, name)
		if r["text"] == "" || num(usage(r)["completion_tokens"]) != want || num(usage(r)["prompt_tokens"]) <= 0 {
			t.Errorf("%s: %v (want text and %d output tokens)", name, r, want)
		}
	}
	e := res.ok(t, "httpx_error")
	body, _ := e["body"].(map[string]any)
	eo, _ := body["error"].(map[string]any)
	if num(e["status"]) != 400 || eo["type"] != "invalid_request_error" || eo["message"] == "" || eo["param"] != "messages" {
		t.Errorf("httpx error: %v (want 400 with the OpenAI error body naming messages)", e)
	}
	for _, name := range []string{"httpx_keepalive", "aiohttp_streams"} {
		if r := res.ok(t, name); num(r["ok"]) != num(r["sent"]) || num(r["sent"]) == 0 {
			t.Errorf("%s: %v", name, r)
		}
	}
}
