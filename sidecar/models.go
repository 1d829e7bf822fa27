package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// maxModelsBytes bounds one /v1/models body.
const maxModelsBytes = 1 << 20

// modelsLoop polls the engine's /v1/models every ModelsInterval for the LoRA
// adapters it serves (loaded at start with --lora-modules or at run time with
// /v1/load_lora_adapter) and its base model's max_model_len and root, and
// keeps them for gossip, so the ingresses route a request naming an adapter
// without being told of it and list the model as the engine does. A failed
// poll keeps the last answer: an engine that is briefly busy does not lose
// its adapters.
func (e *engine) modelsLoop(ctx context.Context, client *http.Client, url string) {
	t := time.NewTicker(e.s.cfg.ModelsInterval)
	defer t.Stop()
	for {
		m, err := fetchModels(ctx, client, url, e.s.cfg.EngineAPIKey, e.cfg.Model)
		if err != nil {
			e.log.Debug("engine /v1/models poll failed", "url", natsutil.RedactURL(url), "err", err)
		} else {
			loras := gossip.JoinLoRAs(m.adapters)
			left := gossip.LoRAsLeftOut(m.adapters)
			e.mu.Lock()
			e.loras, e.maxModelLen, e.root = loras, m.maxModelLen, m.root
			warn := left != e.lorasLeftOut // once per change
			e.lorasLeftOut = left
			e.mu.Unlock()
			if warn && left > 0 {
				e.log.Warn("engine lists LoRA adapters the mesh does not gossip: requests naming them get 404 from the ingresses unless mapped there (--lora-adapter NAME=BASE or a model route)",
					"gossiped", gossip.MaxLoRAs, "left_out", left, "rule", "at most 64 names, each 1–256 bytes without a comma")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// engineModels is what the sidecar keeps of an engine's /v1/models.
type engineModels struct {
	adapters    []string // LoRA adapters' ids
	maxModelLen int      // the base model's max_model_len (0: not listed)
	root        string   // the base model's root ("": not listed, or over gossip.MaxRoot bytes)
}

func fetchModels(ctx context.Context, client *http.Client, url, key, model string) (engineModels, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return engineModels{}, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return engineModels{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engineModels{}, fmt.Errorf("models: status %d", resp.StatusCode)
	}
	return parseModels(io.LimitReader(resp.Body, maxModelsBytes), model)
}

// parseModels reads an OpenAI model list: the ids of the entries vLLM
// marks as LoRA adapters (those with a parent, their base model; a base
// model's entry has "parent": null), and the max_model_len and root of the
// base model entry named model (or else the first base model entry).
func parseModels(r io.Reader, model string) (engineModels, error) {
	var list struct {
		Data []struct {
			ID          string  `json:"id"`
			Parent      *string `json:"parent"`
			Root        string  `json:"root"`
			MaxModelLen int     `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return engineModels{}, fmt.Errorf("models: %w", err)
	}
	var out engineModels
	base := -1
	for i, m := range list.Data {
		if m.Parent != nil && *m.Parent != "" && m.ID != "" && m.ID != *m.Parent {
			out.adapters = append(out.adapters, m.ID)
		} else if base < 0 || m.ID == model && list.Data[base].ID != model {
			base = i
		}
	}
	if base >= 0 {
		b := list.Data[base]
		out.maxModelLen = max(b.MaxModelLen, 0)
		if len(b.Root) <= gossip.MaxRoot {
			out.root = b.Root
		}
	}
	return out, nil
}
