package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/gossip"
)

// vLLM's model card of the base model: max_model_len and root, of the
// entry named as the sidecar's model when the engine serves several names.
func TestParseModelsBaseCard(t *testing.T) {
	const vllm = `{"object":"list","data":[{"id":"other","parent":null,"root":"/models/other","max_model_len":2048},
		{"id":"llama","object":"model","parent":null,"root":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072},
		{"id":"sql-lora","parent":"llama","root":"/a/sql","max_model_len":null}]}`
	for _, tc := range []struct {
		model, root string
		maxLen      int
		listed      bool
	}{{"llama", "meta-llama/Llama-3.1-8B-Instruct", 131072, true}, {"other", "/models/other", 2048, true},
		{"unlisted", "", 0, false}} { // another model's card is not this one's
		got, err := parseModels(strings.NewReader(vllm), tc.model)
		if err != nil || got.listed != tc.listed || got.root != tc.root || got.maxModelLen != tc.maxLen ||
			!slices.Equal(got.adapters, []string{"sql-lora"}) || !slices.Equal(got.served, []string{"other", "llama"}) {
			t.Fatalf("model %s: %+v, %v", tc.model, got, err)
		}
	}
	long := `{"data":[{"id":"m","parent":null,"root":"` + strings.Repeat("r", gossip.MaxRoot+1) + `","max_model_len":-3}]}`
	if got, err := parseModels(strings.NewReader(long), "m"); err != nil || got.root != "" || got.maxModelLen != 0 {
		t.Fatalf("a root over gossip.MaxRoot, a negative length: %+v, %v", got, err)
	}
}

// Whether the engine serves the sidecar's model, as vLLM (one entry per
// --served-model-name alias, adapters with their parent) and SGLang (one
// entry, id and root its served_model_name, no parent field; newer
// versions add adapters with a parent) list it.
func TestParseModelsListed(t *testing.T) {
	const (
		vllmAliases = `{"object":"list","data":[{"id":"llama","object":"model","owned_by":"vllm","root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192},
			{"id":"llama-8b","object":"model","owned_by":"vllm","root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192},
			{"id":"sql","object":"model","owned_by":"vllm","root":"/a/sql","parent":"llama"}]}`
		sglang = `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1733000000,"owned_by":"sglang",
			"root":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072}]}`
		sglangLoRA = `{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"sglang","root":"qwen","max_model_len":32768,"parent":null},
			{"id":"qwen-sql","object":"model","owned_by":"sglang","root":"/a/sql","parent":"qwen"}]}`
	)
	for _, tc := range []struct {
		list, model string
		listed      bool
		maxLen      int
		served      []string
	}{
		{vllmAliases, "llama", true, 8192, []string{"llama", "llama-8b"}},
		{vllmAliases, "llama-8b", true, 8192, []string{"llama", "llama-8b"}},           // an alias
		{vllmAliases, "/models/llama-3.1-8b", false, 0, []string{"llama", "llama-8b"}}, // the root is no served name
		{vllmAliases, "mistral", false, 0, []string{"llama", "llama-8b"}},
		{sglang, "meta-llama/Llama-3.1-8B-Instruct", true, 131072, []string{"meta-llama/Llama-3.1-8B-Instruct"}},
		{sglang, "llama", false, 0, []string{"meta-llama/Llama-3.1-8B-Instruct"}},
		{sglangLoRA, "qwen", true, 32768, []string{"qwen"}},
		{`{"object":"list","data":[]}`, "m", false, 0, nil},
	} {
		got, err := parseModels(strings.NewReader(tc.list), tc.model)
		if err != nil || got.listed != tc.listed || got.maxModelLen != tc.maxLen || !slices.Equal(got.served, tc.served) {
			t.Errorf("%s in %.60s...: %+v, %v; want listed %v, max_model_len %d, served %q", tc.model, tc.list, got, err, tc.listed, tc.maxLen, tc.served)
		}
	}
}

func TestParseAdapters(t *testing.T) {
	// vLLM's /v1/models with --lora-modules: the base model has parent null,
	// each adapter its base model.
	const vllm = `{"object":"list","data":[{"id":"llama","object":"model","parent":null,"root":"meta/llama"},
		{"id":"sql-lora","object":"model","parent":"llama","root":"/a/sql"},{"id":"chat-lora","parent":"llama"},
		{"id":"","parent":"llama"},{"id":"self","parent":"self"},{"id":"empty-parent","parent":""}]}`
	got, err := parseModels(strings.NewReader(vllm), "llama")
	if err != nil || !slices.Equal(got.adapters, []string{"sql-lora", "chat-lora"}) {
		t.Fatalf("adapters %q, %v", got.adapters, err)
	}
	for _, bad := range []string{"", "[]", `{"data":{}}`, "<html>"} {
		if _, err := parseModels(strings.NewReader(bad), "llama"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzParseAdapters: an engine's /v1/models answer (any bytes) parses or
// fails, never panics, and every adapter named is non-empty.
func FuzzParseAdapters(f *testing.F) {
	f.Add(`{"data":[{"id":"a","parent":"b"},{"id":"b","parent":null}]}`)
	f.Add(`{"data":[{"id":"a","parent":7}]}`)
	f.Add(`{"data":null}`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parseModels(strings.NewReader(s), "b")
		if err != nil {
			return
		}
		if m.maxModelLen < 0 || len(m.root) > gossip.MaxRoot {
			t.Fatalf("%q: max_model_len %d, root of %d bytes", s, m.maxModelLen, len(m.root))
		}
		for _, n := range m.adapters {
			if n == "" {
				t.Fatalf("%q: an empty adapter name", s)
			}
		}
	})
}

// An engine started with vLLM's --api-key answers /v1/models only with the
// key: the sidecar sends EngineAPIKey.
func TestFetchAdaptersWithKey(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sk-engine" {
			http.Error(w, `{"error":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"data":[{"id":"m","parent":null},{"id":"a","parent":"m"}]}`))
	}))
	defer srv.Close()
	if _, err := fetchModels(context.Background(), srv.Client(), srv.URL, "", "m"); err == nil {
		t.Fatal("no key: no error")
	}
	got, err := fetchModels(context.Background(), srv.Client(), srv.URL, "sk-engine", "m")
	if err != nil || !slices.Equal(got.adapters, []string{"a"}) {
		t.Fatalf("with the key: %q, %v", got.adapters, err)
	}
}
