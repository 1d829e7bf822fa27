package sidecar

import (
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
