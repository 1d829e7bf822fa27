package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim"
)

// A request naming a LoRA adapter reaches the engine serving its base model,
// is keyed like the sidecar keys the adapter's blocks (root with the
// adapter's name), and a second identical request reuses the first's blocks.
func TestLoRARequestsReuseAdapterBlocks(t *testing.T) {
	// The adapter's base comes from the tokenizer set (a Go embedding) or
	// from the ingress's config (--lora-adapter, YAML loraAdapters).
	for _, viaConfig := range []bool{false, true} {
		t.Run(map[bool]string{false: "deps", true: "config"}[viaConfig], func(t *testing.T) { testLoRAReuse(t, viaConfig) })
	}
}

func testLoRAReuse(t *testing.T, viaConfig bool) {
	nt, tpl := llama(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Logger: quiet,
		LoRA: sim.LoRAConfig{Enable: true, Modules: map[string]string{"sql-lora": "/adapters/sql"}, MaxLoRAs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg := testConfig(StaticEngine{ID: "s", Model: "llama", URL: sm.URL()})
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	deps := Deps{Tokenizers: ModelTokenizers{Models: TokenizerMap{"llama": tk}, Adapters: map[string]string{"sql-lora": "llama"}}, Logger: quiet}
	if viaConfig {
		cfg.LoRAAdapters = map[string]string{"sql-lora": "llama"}
		deps.Tokenizers = TokenizerMap{"llama": tk}
	}
	s, spy := spiedIngress(t, cfg, deps)

	prompt := strings.Repeat("select the name and the total of every order placed this year ", 6)
	body := `{"model":"sql-lora","max_tokens":2,"prompt":` + string(mustJSON(t, prompt)) + `}`
	var usage [2]openai.Usage
	for i := range usage {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "s" {
			t.Fatalf("request %d: status %d engine %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		var r struct{ Usage openai.Usage }
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		usage[i] = r.Usage
	}
	if usage[1].CachedTokens() == 0 {
		t.Fatalf("second adapter request reused no blocks: usage %+v", usage[1])
	}
	keys := spy.last()
	want := kvevents.AppendKeys(nil, kvevents.Root("llama", "sql-lora", ""), nt.Encode(prompt, true), cfg.BlockSize)
	if len(keys) == 0 || !slices.Equal(keys, want) {
		t.Fatalf("ingress keys %x, want the adapter chain %x", keys, want)
	}
	engineCachedAll(t, sm, keys)

	// /v1/models on the engine lists the adapter with its parent.
	resp, err := http.Get(sm.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ml openai.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ml.Data, func(m openai.Model) bool { return m.ID == "sql-lora" })
	if i < 0 || ml.Data[i].Parent == nil || *ml.Data[i].Parent != "llama" || ml.Data[i].Root != "/adapters/sql" {
		t.Fatalf("models %+v: want sql-lora with parent llama", ml.Data)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
