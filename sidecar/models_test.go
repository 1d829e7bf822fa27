package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestParseAdapters(t *testing.T) {
	// vLLM's /v1/models with --lora-modules: the base model has parent null,
	// each adapter its base model.
	const vllm = `{"object":"list","data":[{"id":"llama","object":"model","parent":null,"root":"meta/llama"},
		{"id":"sql-lora","object":"model","parent":"llama","root":"/a/sql"},{"id":"chat-lora","parent":"llama"},
		{"id":"","parent":"llama"},{"id":"self","parent":"self"},{"id":"empty-parent","parent":""}]}`
	got, err := parseAdapters(strings.NewReader(vllm))
	if err != nil || !slices.Equal(got, []string{"sql-lora", "chat-lora"}) {
		t.Fatalf("adapters %q, %v", got, err)
	}
	for _, bad := range []string{"", "[]", `{"data":{}}`, "<html>"} {
		if _, err := parseAdapters(strings.NewReader(bad)); err == nil {
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
		names, err := parseAdapters(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, n := range names {
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
	if _, err := fetchAdapters(context.Background(), srv.Client(), srv.URL, ""); err == nil {
		t.Fatal("no key: no error")
	}
	got, err := fetchAdapters(context.Background(), srv.Client(), srv.URL, "sk-engine")
	if err != nil || !slices.Equal(got, []string{"a"}) {
		t.Fatalf("with the key: %q, %v", got, err)
	}
}
