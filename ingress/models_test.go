package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// getModels reads the ingress's /v1/models as raw cards.
func getModels(t *testing.T, s *Server) map[string]map[string]json.RawMessage {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ml struct {
		Object string                       `json:"object"`
		Data   []map[string]json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil || resp.StatusCode != 200 || ml.Object != "list" {
		t.Fatalf("/v1/models: %d %v", resp.StatusCode, err)
	}
	out := map[string]map[string]json.RawMessage{}
	for _, c := range ml.Data {
		var id string
		_ = json.Unmarshal(c["id"], &id)
		out[id] = c
	}
	return out
}

// checkCard compares a card's members with want (raw JSON) and checks
// vLLM's other members are there.
func checkCard(t *testing.T, id string, card map[string]json.RawMessage, want map[string]string) {
	t.Helper()
	if card == nil {
		t.Fatalf("%s is not listed", id)
	}
	for k, v := range want {
		if string(card[k]) != v {
			t.Errorf("%s: %s is %s, want %s", id, k, card[k], v)
		}
	}
	var perm []struct {
		ID, Object    string
		AllowSampling bool `json:"allow_sampling"`
	}
	if err := json.Unmarshal(card["permission"], &perm); err != nil || len(perm) != 1 || perm[0].Object != "model_permission" || !perm[0].AllowSampling {
		t.Errorf("%s: permission %s", id, card["permission"])
	}
	for _, k := range []string{"object", "created", "owned_by"} {
		if card[k] == nil {
			t.Errorf("%s: no %s", id, k)
		}
	}
}

// /v1/models has vLLM's model card: a base model's root and max_model_len
// as its engines report them in their own /v1/models (read by the sidecars,
// gossiped; the smallest max_model_len of the model's engines), a LoRA
// adapter's parent with a null max_model_len, as vLLM lists them. Without
// sidecars (static engines) they are null: not known.
func TestModelCards(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	cfg := DefaultConfig()
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	s := startIngress(t, cfg, Deps{Logger: quiet})
	for i, maxLen := range []int{4096, 2048} {
		sc := sim.Config{Model: "llama", TimeScale: 500, Logger: quiet, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			Engine: engine.Config{BlockSize: 16, GPUBlocks: 1024, MaxModelLen: maxLen}}
		if i == 0 {
			sc.LoRA = sim.LoRAConfig{Enable: true, Modules: map[string]string{"sql-lora": "/adapters/sql"}, MaxLoRAs: 2}
		}
		sm, err := sim.Start(context.Background(), sc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		startSidecar(t, sidecar.EngineConfig{ID: []string{"a", "b"}[i], Model: "llama", URL: sm.URL(), DPSize: 1,
			RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}, ns.URL(), s.GossipAddr(), quiet)
	}
	testutil.WaitFor(t, 20*time.Second, "both engines healthy, their model cards gossiped", func() bool {
		n, lora := 0, false
		for _, e := range s.deps.Membership.Engines(nil) {
			if e.Healthy && e.MaxModelLen > 0 {
				n++
			}
			lora = lora || len(e.LoRAs) > 0
		}
		return n == 2 && lora
	})
	cards := getModels(t, s)
	if len(cards) != 2 {
		t.Fatalf("%d models listed, want llama and sql-lora", len(cards))
	}
	checkCard(t, "llama", cards["llama"], map[string]string{"root": `"llama"`, "parent": "null", "max_model_len": "2048", "owned_by": `"kvmesh"`})
	checkCard(t, "sql-lora", cards["sql-lora"], map[string]string{"parent": `"llama"`, "max_model_len": "null"})

	// Static engines: nothing reported, so null.
	st := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}), Deps{Logger: quiet})
	checkCard(t, "m", getModels(t, st)["m"], map[string]string{"root": "null", "parent": "null", "max_model_len": "null"})
}

// GET /v1/models/{id} (the OpenAI API's retrieve model, the SDKs'
// models.retrieve) answers the card /v1/models lists for id, a slashed id
// and an adapter's included, and 404 model_not_found for a model no engine
// serves. Before, every such path was a 404.
func TestRetrieveModel(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e", Model: "org/base-model", URL: "http://127.0.0.1:1"})
	cfg.LoRAAdapters = map[string]string{"sql-lora": "org/base-model"}
	s := startIngress(t, cfg, Deps{})
	list := getModels(t, s)
	for _, tc := range []struct{ path, id string }{
		{"/v1/models/org/base-model", "org/base-model"},
		{"/v1/models/org%2Fbase-model", "org/base-model"},
		{"/v1/models/sql-lora", "sql-lora"},
	} {
		resp, err := http.Get("http://" + s.Addr() + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		var card map[string]json.RawMessage
		err = json.NewDecoder(resp.Body).Decode(&card)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil {
			t.Fatalf("GET %s: %d %v", tc.path, resp.StatusCode, err)
		}
		want := list[tc.id]
		if len(want) == 0 || len(card) != len(want) {
			t.Fatalf("GET %s: %d members, /v1/models lists %d for %s", tc.path, len(card), len(want), tc.id)
		}
		for k, v := range want {
			var a, b bytes.Buffer
			if json.Compact(&a, card[k]) != nil || json.Compact(&b, v) != nil || a.String() != b.String() {
				t.Errorf("GET %s: %s is %s, /v1/models lists %s", tc.path, k, card[k], v)
			}
		}
	}
	resp, err := http.Get("http://" + s.Addr() + "/v1/models/nope")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if d, ok := openai.DecodeError(body); resp.StatusCode != 404 || !ok || string(d.Code) != `"model_not_found"` || !strings.Contains(d.Message, "nope") {
		t.Errorf("GET /v1/models/nope: %d %s, want 404 model_not_found naming it", resp.StatusCode, body)
	}
}

// The read-only paths take GET and HEAD; another method is a 405 naming
// them, as vLLM's (FastAPI's) routes answer, not an answer as if it had
// done something (DELETE /v1/models/m returned the model as if deleted).
func TestReadOnlyPathsRefuseOtherMethods(t *testing.T) {
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}), Deps{})
	for _, path := range []string{"/v1/models", "/v1/models/m", "/health", "/ready", "/version", "/metrics"} {
		for _, method := range []string{http.MethodPost, http.MethodDelete, http.MethodPut} {
			req, _ := http.NewRequest(method, "http://"+s.Addr()+path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if d, ok := openai.DecodeError(body); resp.StatusCode != 405 || !ok || resp.Header.Get("Allow") != "GET, HEAD" || !strings.Contains(d.Message, "use GET, HEAD") {
				t.Errorf("%s %s: %d Allow %q %s, want 405 naming GET and HEAD", method, path, resp.StatusCode, resp.Header.Get("Allow"), body)
			}
		}
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			req, _ := http.NewRequest(method, "http://"+s.Addr()+path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == 405 {
				t.Errorf("%s %s: 405", method, path)
			}
		}
	}
}
