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
// /v1/load_lora_adapter) and keeps them for gossip, so the ingresses route a
// request naming an adapter without being told of it. A failed poll keeps the
// last list: an engine that is briefly busy does not lose its adapters.
func (e *engine) modelsLoop(ctx context.Context, client *http.Client, url string) {
	t := time.NewTicker(e.s.cfg.ModelsInterval)
	defer t.Stop()
	for {
		names, err := fetchAdapters(ctx, client, url, e.s.cfg.EngineAPIKey)
		if err != nil {
			e.log.Debug("engine /v1/models poll failed", "url", natsutil.RedactURL(url), "err", err)
		} else {
			loras := gossip.JoinLoRAs(names)
			e.mu.Lock()
			e.loras = loras
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func fetchAdapters(ctx context.Context, client *http.Client, url, key string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("models: status %d", resp.StatusCode)
	}
	return parseAdapters(io.LimitReader(resp.Body, maxModelsBytes))
}

// parseAdapters reads an OpenAI model list and returns the ids of the
// entries vLLM marks as LoRA adapters: those with a parent (their base
// model). A base model's entry has "parent": null.
func parseAdapters(r io.Reader) ([]string, error) {
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	var out []string
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent != "" && m.ID != "" && m.ID != *m.Parent {
			out = append(out, m.ID)
		}
	}
	return out, nil
}
