package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// A request naming a LoRA adapter reaches the engine serving its base model,
// is keyed like the sidecar keys the adapter's blocks (root with the
// adapter's name), and a second identical request reuses the first's blocks.
// The adapter's base comes from the ingress's config (--lora-adapter, YAML
// loraAdapters).
func TestLoRARequestsReuseAdapterBlocks(t *testing.T) {
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
	cfg.LoRAAdapters = map[string]string{"sql-lora": "llama"}
	deps := Deps{Tokenizers: TokenizerMap{"llama": tk}, Logger: quiet}
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

// TestLoRADiscovered: an adapter the engine serves (vLLM's --lora-modules)
// and nobody named to the ingress is found by the sidecar in the engine's
// /v1/models, gossiped, listed by the ingress's /v1/models with its base
// model, and routed to the one engine that serves it (its sibling serves the
// base model only, and would answer 404), keyed as the adapter's blocks.
func TestLoRADiscovered(t *testing.T) {
	nt, tpl := llama(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	s, spy := spiedIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"llama": tk}, Logger: quiet})
	var withLoRA *sim.Server
	for _, id := range []string{"base-only", "with-lora"} {
		sc := sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Logger: quiet,
			KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0", Engine: engine.Config{BlockSize: 16, GPUBlocks: 2048}}
		if id == "with-lora" {
			sc.LoRA = sim.LoRAConfig{Enable: true, Modules: map[string]string{"sql-lora": "/adapters/sql"}, MaxLoRAs: 2}
		}
		sm, err := sim.Start(context.Background(), sc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		if id == "with-lora" {
			withLoRA = sm
		}
		startSidecar(t, sidecar.EngineConfig{ID: id, Model: "llama", URL: sm.URL(), DPSize: 1,
			RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, ns.URL(), s.GossipAddr(), quiet)
	}
	base := "http://" + s.Addr()
	testutil.WaitFor(t, 20*time.Second, "both engines healthy, the adapter gossiped", func() bool {
		if healthyEngines(s) != 2 {
			return false
		}
		for _, e := range s.deps.Membership.Engines(nil) {
			if slices.Contains(e.LoRAs, "sql-lora") {
				return true
			}
		}
		return false
	})
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml struct {
		Data []struct{ ID, Parent string } `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ml)
	resp.Body.Close()
	if err != nil || len(ml.Data) != 2 || ml.Data[0].ID != "llama" || ml.Data[0].Parent != "" ||
		ml.Data[1].ID != "sql-lora" || ml.Data[1].Parent != "llama" {
		t.Fatalf("/v1/models %+v (%v): want llama and sql-lora with parent llama", ml.Data, err)
	}

	prompt := strings.Repeat("list every customer who placed an order in the last month ", 6)
	body := `{"model":"sql-lora","max_tokens":2,"prompt":` + string(mustJSON(t, prompt)) + `}`
	for i := range 6 {
		st, hdr, b := post(t, http.DefaultClient, base+"/v1/completions", body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "with-lora" {
			t.Fatalf("request %d: status %d engine %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	keys := spy.last()
	want := kvevents.AppendKeys(nil, kvevents.Root("llama", "sql-lora", ""), nt.Encode(prompt, true), cfg.BlockSize)
	if len(keys) == 0 || !slices.Equal(keys, want) {
		t.Fatalf("ingress keys %x, want the adapter chain %x", keys, want)
	}
	engineCachedAll(t, withLoRA, keys)
	if st, _, b := post(t, http.DefaultClient, base+"/v1/completions", `{"model":"no-such-lora","prompt":"x"}`); st != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", st, b)
	}
}

// TestNamedAdapterGoesToEnginesListingIt: an adapter named to the ingress
// (--lora-adapter) goes only to the engines of its base model that list it
// loaded, with no attempt wasted on the others (which answer 404); when no
// healthy engine lists it, every engine of the base model is a candidate
// again (one may load it on demand), and the request still finds it.
func TestNamedAdapterGoesToEnginesListingIt(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var urls []string
	for i := range 2 {
		sc := sim.Config{Model: "m", TimeScale: 500, Seed: uint64(i + 1), Logger: quiet}
		if i == 0 {
			sc.LoRA = sim.LoRAConfig{Enable: true, Modules: map[string]string{"ad": "/adapters/ad"}, MaxLoRAs: 1}
		}
		sm, err := sim.Start(context.Background(), sc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		urls = append(urls, sm.URL())
	}
	with, without := pdEngine("with", 0, urls[0]), pdEngine("without", 0, urls[1])
	with.LoRAs = []string{"ad"}
	with.InFlight = 50 // other replicas' requests there: least-request would pick "without" first
	m := &swapMembership{}
	list := []EngineInfo{with, without}
	m.list.Store(&list)
	cfg := testConfig()
	cfg.Scheduler.Policy = "least-request"
	cfg.LoRAAdapters = map[string]string{"ad": "m"}
	reg := prometheus.NewRegistry()
	s := startIngress(t, cfg, Deps{Membership: m, Registry: reg})
	base := "http://" + s.Addr()
	wasted := func() float64 {
		return metricValue(t, reg, "kvmesh_ingress_upstream_attempts_total", "result", "wrong_model")
	}
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"ad","max_tokens":1,"prompt":"request %d"}`, i)
		st, hdr, b := post(t, http.DefaultClient, base+"/v1/completions", body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "with" {
			t.Fatalf("request %d: status %d engine %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if n := wasted(); n != 0 {
		t.Fatalf("%v attempts sent to an engine without the adapter, want none", n)
	}

	// The listing engine turns unhealthy: the other engine of the base
	// model is a candidate again (it answers 404 here, a sim that cannot
	// load adapters on demand; the request fails over, no 503 up front).
	with.LoRAs = []string{"ad"}
	with.Healthy = false
	list2 := []EngineInfo{with, without}
	m.list.Store(&list2)
	st, _, b := post(t, http.DefaultClient, base+"/v1/completions", `{"model":"ad","max_tokens":1,"prompt":"x"}`)
	if wasted() == 0 {
		t.Fatalf("status %d (%s) and no attempt on the engine without the adapter: with no healthy engine listing it, every engine of the base model should be a candidate", st, b)
	}
}
