package openai

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/sim"
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
	node, dir := installClient(t, ctx)
	const model = "e2e-model"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := ingress.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	for i := 0; i < 2; i++ {
		s, err := sim.Start(ctx, sim.Config{Model: model, TimeScale: 200, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		cfg.Engines = append(cfg.Engines, ingress.StaticEngine{ID: "sim" + string(rune('a'+i)), Model: model, URL: s.URL()})
	}
	keys := filepath.Join(dir, "keys.txt")
	if err := os.WriteFile(keys, []byte("e2e "+testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(auth.Config{KeysFile: keys, EnvVar: "-"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ingress.New(cfg, ingress.Deps{Logger: quiet, AccessLog: quiet, Auth: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	checkClient(t, ctx, node, dir, srv.Addr(), model)
}

// installClient installs the pinned openai npm package and client.mjs into
// a temporary directory (skipping without node/npm outside CI).
func installClient(t *testing.T, ctx context.Context) (node, dir string) {
	t.Helper()
	node = testutil.RequireTool(t, "node", "the test drives the ingress with the openai npm client (Node.js 20+)")
	npm := testutil.RequireTool(t, "npm", "it installs the openai npm client")
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"kvmesh-e2e","private":true,"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	inst := exec.CommandContext(ctx, npm, "install", "openai@"+openaiVersion, "--no-audit", "--no-fund", "--loglevel=error")
	inst.Dir = dir
	if out, err := inst.CombinedOutput(); err != nil {
		t.Fatalf("npm install openai@%s: %v\n%s", openaiVersion, err, out)
	}
	script, err := os.ReadFile("client.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "client.mjs"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	return node, dir
}

// checkClient runs client.mjs against an ingress at addr and checks every
// answer's shape.
func checkClient(t *testing.T, ctx context.Context, node, dir, addr, model string) {
	t.Helper()
	run := exec.CommandContext(ctx, node, "client.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "KVMESH_BASE_URL=http://"+addr+"/v1", "KVMESH_API_KEY="+testKey, "KVMESH_MODEL="+model)
	var stderr strings.Builder
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), out)
	}
	var res map[string]map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	for name, r := range res {
		t.Logf("%s: %v", name, r)
	}
	ok := func(name string) map[string]any {
		r := res[name]
		if r == nil || r["error"] == true {
			t.Fatalf("%s failed: %v", name, r)
		}
		return r
	}
	num := func(v any) int { f, _ := v.(float64); return int(f) }
	usage := func(r map[string]any) map[string]any { u, _ := r["usage"].(map[string]any); return u }

	if ids, _ := ok("models")["ids"].([]any); len(ids) != 1 || ids[0] != model {
		t.Errorf("models: %v", ids)
	}
	c := ok("completion")
	if c["object"] != "text_completion" || c["text"] == "" || num(usage(c)["completion_tokens"]) != 8 || c["finish"] != "length" {
		t.Errorf("completion: %v", c)
	}
	if u := usage(ok("completion_ids")); num(u["prompt_tokens"]) != 17 || num(u["completion_tokens"]) != 4 {
		t.Errorf("completion with token ids: usage %v (the engine must see exactly the ids sent)", u)
	}
	cs := ok("completion_stream")
	if num(cs["chunks"]) < 2 || cs["text"] == "" || num(usage(cs)["completion_tokens"]) != 6 || cs["finish"] != "length" {
		t.Errorf("completion stream: %v", cs)
	}
	cb := ok("completion_batch")
	if idx, _ := cb["indexes"].([]any); len(idx) != 2 || num(idx[0]) != 0 || num(idx[1]) != 1 ||
		num(usage(cb)["prompt_tokens"]) != 8 || num(usage(cb)["completion_tokens"]) != 6 {
		t.Errorf("batched completion: %v (one choice per prompt, usage summed)", cb)
	}
	cbs := ok("completion_batch_stream")
	if fin, _ := cbs["finished"].([]any); len(fin) != 2 || fin[0] != "0" || fin[1] != "1" || num(usage(cbs)["completion_tokens"]) != 8 {
		t.Errorf("batched completion stream: %v", cbs)
	}
	ch := ok("chat")
	if ch["object"] != "chat.completion" || ch["role"] != "assistant" || ch["content"] == "" || num(usage(ch)["completion_tokens"]) != 7 {
		t.Errorf("chat: %v", ch)
	}
	chs := ok("chat_stream")
	if chs["role"] != "assistant" || chs["content"] == "" || num(usage(chs)["completion_tokens"]) != 5 || chs["finish"] != "length" {
		t.Errorf("chat stream: %v", chs)
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
