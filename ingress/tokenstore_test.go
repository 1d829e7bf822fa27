package ingress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestTokenizerFromSidecar: an ingress with no local tokenizer serves chat
// requests for a model whose sidecars published its tokenizer files to NATS,
// and tokenizes them exactly as the engine does: a conversation warmed on one
// engine, behind the ingress's back, pulls the same conversation there (its
// block keys, computed by the ingress from the fetched tokenizer and chat
// template, match the keys the engine reported).
func TestTokenizerFromSidecar(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nt, tpl := llama(t)
	_, tplJSON := llamaFiles(t)
	modelDir := t.TempDir()
	for dst, src := range map[string]string{"tokenizer.json": filepath.Join(llamaDir, "bert-base-uncased.json"), "tokenizer_config.json": tplJSON} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(modelDir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ns := testutil.NATS(t)

	cfg := DefaultConfig()
	cfg.ID = "ingress-tokstore"
	cfg.Scheduler.Policy = "kvmesh"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Logger: quiet})
	s := startIngress(t, cfg, Deps{Tokenizers: store})
	seed := s.GossipAddr()

	const model = "meta-llama/Llama-3.1-8B-Instruct"
	sims := map[string]*sim.Server{}
	for i, id := range []string{"eng-a", "eng-b"} {
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			Engine: engine.Config{BlockSize: 16, GPUBlocks: 2048, Profile: mustProfile(t, "tiny")}, TimeScale: 500, Seed: uint64(i + 1),
			Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		sims[id] = sm
		startSidecar(t, sidecar.EngineConfig{ID: id, Model: model, URL: sm.URL(), DPSize: 1,
			RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints(), TokenizerDir: modelDir}, ns.URL(), seed, quiet)
	}
	base := "http://" + s.Addr()
	testutil.WaitFor(t, 20*time.Second, "ingress ready with both engines known by gossip and healthy (their sidecars report ready)", func() bool {
		st, _, _ := get(base + "/ready")
		return st == 200 && healthyEngines(s) == 2
	})
	testutil.WaitFor(t, 20*time.Second, "the published tokenizer loaded by the ingress", func() bool {
		_, ok := store.For(model)
		return ok
	})

	system := strings.Repeat("You are a careful assistant who answers in full sentences and cites sources. ", 40)
	chat := `{"model":"` + model + `","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"What is a KV cache?"}],"max_tokens":2}`
	if st, _, b := post(t, http.DefaultClient, sims["eng-a"].URL()+"/v1/chat/completions", chat); st != 200 {
		t.Fatalf("warm eng-a: %d %s", st, b)
	}
	testutil.WaitFor(t, 10*time.Second, "eng-a's warmed conversation in the ingress index", func() bool {
		return s.deps.Index.KeyCount("eng-a", kvevents.TierGPU) >= 20
	})
	for i := 0; i < 6; i++ {
		st, hdr, b := post(t, http.DefaultClient, base+"/v1/chat/completions", chat)
		if st != 200 {
			t.Fatalf("chat %d via the ingress: %d %s", i, st, b)
		}
		if e := hdr.Get("X-Kvmesh-Engine"); e != "eng-a" {
			t.Fatalf("chat %d went to %q: the ingress's keys for the conversation do not match the engine's", i, e)
		}
	}
	if _, ok := store.For("no/such-model"); ok {
		t.Fatal("a model nobody published has a tokenizer")
	}
}

func mustProfile(t *testing.T, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
