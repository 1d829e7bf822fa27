package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The runtime adapter endpoints behave as vLLM's: load, duplicate load,
// a slot limit, requests naming the adapter, unload, unknown unload.
func TestLoRAAdapterLifecycle(t *testing.T) {
	s := startSim(t, func(c *Config) { c.LoRA = LoRAConfig{Enable: true, MaxLoRAs: 1} })
	gen := func(model string) int {
		code, _, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": model, "prompt": []int{1, 2, 3, 4, 5}, "max_tokens": 1})
		return code
	}
	steps := []struct {
		path string
		body map[string]string
		code int
		msg  string
	}{
		{"/v1/load_lora_adapter", map[string]string{"lora_name": "a", "lora_path": "/p/a"}, 200, "added successfully"},
		{"/v1/load_lora_adapter", map[string]string{"lora_name": "a", "lora_path": "/p/a"}, 400, "already been loaded"},
		{"/v1/load_lora_adapter", map[string]string{"lora_name": "b", "lora_path": "/p/b"}, 400, "No free LoRA slot"},
		{"/v1/load_lora_adapter", map[string]string{"lora_name": "b"}, 400, "must be provided"},
	}
	for _, st := range steps {
		code, body, _ := post(t, s.URL()+st.path, st.body)
		if code != st.code || !strings.Contains(string(body), st.msg) {
			t.Fatalf("%s %v: %d %s, want %d %q", st.path, st.body, code, body, st.code, st.msg)
		}
	}
	if c := gen("a"); c != http.StatusOK {
		t.Fatalf("request to loaded adapter: %d", c)
	}
	// Its /v1/models card is vLLM's: root the path, parent the base
	// model, no max_model_len (the base model's card has it).
	resp, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []map[string]any `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) != 2 {
		t.Fatalf("/v1/models: %v %v", models.Data, err)
	}
	for _, m := range models.Data {
		_, hasLen := m["max_model_len"]
		if adapter := m["id"] == "a"; hasLen == adapter || adapter && (m["root"] != "/p/a" || m["parent"] == nil) {
			t.Fatalf("card %v: an adapter's has root and parent and no max_model_len, the base model's has max_model_len", m)
		}
	}
	if code, body, _ := post(t, s.URL()+"/v1/unload_lora_adapter", map[string]string{"lora_name": "a"}); code != 200 || !strings.Contains(string(body), "removed") {
		t.Fatalf("unload: %d %s", code, body)
	}
	if code, _, _ := post(t, s.URL()+"/v1/unload_lora_adapter", map[string]string{"lora_name": "a"}); code != http.StatusNotFound {
		t.Fatalf("second unload: %d, want 404", code)
	}
	if c := gen("a"); c != http.StatusNotFound {
		t.Fatalf("request to unloaded adapter: %d, want 404", c)
	}
	off := startSim(t, nil)
	if code, _, _ := post(t, off.URL()+"/v1/load_lora_adapter", map[string]string{"lora_name": "a", "lora_path": "/p"}); code != http.StatusBadRequest {
		t.Fatalf("load without --enable-lora: %d, want 400", code)
	}
}

// An answer to a request naming an adapter names the adapter, as vLLM's
// does (model_name(lora_request)): completions, chat, and every streamed
// chunk; the base model's answers name the base model.
func TestAnswerNamesTheAdapter(t *testing.T) {
	s := startSim(t, func(c *Config) {
		c.LoRA = LoRAConfig{Enable: true, Modules: map[string]string{"ad": "/p/ad"}, MaxLoRAs: 1}
	})
	for _, model := range []string{"ad", s.cfg.Model} {
		for _, c := range []struct {
			path string
			body map[string]any
		}{
			{"/v1/completions", map[string]any{"model": model, "prompt": []int{1, 2, 3}, "max_tokens": 2}},
			{"/v1/chat/completions", map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 2}},
			{"/v1/completions", map[string]any{"model": model, "prompt": []int{1, 2, 3}, "max_tokens": 2, "stream": true}},
		} {
			code, body, _ := post(t, s.URL()+c.path, c.body)
			if code != http.StatusOK {
				t.Fatalf("%s %v: %d %s", c.path, c.body, code, body)
			}
			want := `"model":"` + model + `"`
			n := strings.Count(string(body), `"model":`)
			if n == 0 || strings.Count(string(body), want) != n {
				t.Fatalf("%s %v: answer %s: want every %s", c.path, c.body, body, want)
			}
		}
	}
}
