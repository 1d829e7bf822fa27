package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// A model's chat template is found where transformers puts it
// (chat_template.jinja beside a tokenizer_config.json without one); a
// template this interpreter cannot parse, or fails to render, does not stop
// the model: its chat requests are routed by load, unkeyed, and the engine
// renders them.
func TestChatTemplateFallbacks(t *testing.T) {
	llama(t) // locates the tokenizer files
	tok, err := os.ReadFile(filepath.Join(llamaDir, "bert-base-uncased.json"))
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{
		"jinja":        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>",
		"unparsable":   "{% include 'x.jinja' %}",
		"unrenderable": "{{ messages[0].content | wordwrap(10) }}",
	}
	cfg := testConfig()
	cfg.Tokenizers = map[string]string{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for model, tpl := range dirs {
		d := t.TempDir()
		for name, b := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": []byte(`{"bos_token":"[CLS]"}`), "chat_template.jinja": []byte(tpl)} {
			if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cfg.Tokenizers[model] = d
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, TimeScale: 500, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		cfg.Engines = append(cfg.Engines, StaticEngine{ID: model, Model: model, URL: sm.URL()})
	}
	// A tokenizer.json with a normalizer Native lacks: that model is served
	// unkeyed, the others keep theirs.
	var tj map[string]any
	if err := json.Unmarshal(tok, &tj); err != nil {
		t.Fatal(err)
	}
	tj["normalizer"] = map[string]any{"type": "Precompiled", "precompiled_charsmap": "AAAA"}
	d := t.TempDir()
	if err := os.WriteFile(filepath.Join(d, "tokenizer.json"), mustJSON(t, tj), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Tokenizers["precompiled"] = d
	sm, err := sim.Start(context.Background(), sim.Config{Model: "precompiled", TimeScale: 500, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg.Engines = append(cfg.Engines, StaticEngine{ID: "precompiled", Model: "precompiled", URL: sm.URL()})

	warned := &testutil.SyncBuffer{}
	deps := Deps{Logger: slog.New(slog.NewTextHandler(warned, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if err := LoadTokenizers(&cfg, &deps); err != nil {
		t.Fatalf("a model's template or tokenizer stopped the ingress: %v", err)
	}
	if _, ok := deps.Tokenizers.For("precompiled"); ok || !strings.Contains(warned.String(), "tokenizer not supported here") {
		t.Fatalf("unsupported tokenizer: loaded %v, log:\n%s", ok, warned)
	}
	for model, wantTpl := range map[string]bool{"jinja": true, "unparsable": false, "unrenderable": true} {
		tk, _ := deps.Tokenizers.For(model)
		if h := tk.(*hfTokenizer); (h.tpl != nil) != wantTpl {
			t.Errorf("%s: template loaded %v, want %v", model, h.tpl != nil, wantTpl)
		}
	}
	s, spy := spiedIngress(t, cfg, deps)
	long := `{"role":"system","content":"You answer questions about the weather in every European capital, briefly and in celsius."}`
	for model, wantKeys := range map[string]bool{"jinja": true, "unparsable": false, "unrenderable": false, "precompiled": false} {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions",
			`{"model":"`+model+`","max_tokens":2,"messages":[`+long+`,{"role":"user","content":"Rome?"}]}`)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != model {
			t.Fatalf("%s: %d via %q: %s", model, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		if keys := spy.last(); (len(keys) > 0) != wantKeys {
			t.Errorf("%s: %d keys, want keys %v", model, len(keys), wantKeys)
		}
	}
	if n := val(s.m.renderFallbacks); n != 1 {
		t.Errorf("%v render fallbacks counted, want 1 (the unrenderable template)", n)
	}
}
