package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
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
//
// It also checks that the engine serves the configured model: an engine
// restarted in place with another model, or another engine now at this
// address, would get this model's requests and answer 404 (vLLM) or answer
// them with the wrong model (SGLang does not check the name). Until it lists
// the model again the engine is gossiped as not ready (readyLocked), logged
// at error once per change and exported as kvmesh_sidecar_engine_model_mismatch.
func (e *engine) modelsLoop(ctx context.Context, client *http.Client, url string) {
	t := time.NewTicker(e.s.cfg.ModelsInterval)
	defer t.Stop()
	for {
		m, err := fetchModels(ctx, client, url, e.s.cfg.EngineAPIKey, e.cfg.Model)
		if err != nil {
			e.log.Debug("engine /v1/models poll failed", "url", natsutil.RedactURL(url), "err", err)
		} else {
			e.checkModel(m)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkModel keeps one /v1/models answer: the adapters and base model card
// when the engine serves the configured model, the mismatch otherwise.
func (e *engine) checkModel(m engineModels) {
	served := strings.Join(m.served, ", ")
	e.mu.Lock()
	was, wasServed := e.modelMismatch != "", e.modelMismatch
	if !m.listed {
		// The other model's adapters and card are not this model's: keep
		// the last ones (the engine is not routed to meanwhile).
		now := "engine serves " + served
		if served == "" {
			now = "engine lists no model"
		}
		e.modelMismatch = now
		e.mu.Unlock()
		if !was || wasServed != now {
			e.log.Error("engine does not serve the configured model: gossiped as not ready, the ingresses stop routing to it; a different engine at this URL, or the engine restarted with another model (its --served-model-name must be --model)",
				"configured", e.cfg.Model, "served", served)
		}
		return
	}
	loras := gossip.JoinLoRAs(m.adapters)
	left := gossip.LoRAsLeftOut(m.adapters)
	e.loras, e.maxModelLen, e.root = loras, m.maxModelLen, m.root
	e.modelMismatch = ""
	warn := left != e.lorasLeftOut // once per change
	e.lorasLeftOut = left
	e.mu.Unlock()
	if was {
		e.log.Info("engine serves the configured model again: gossiped as ready", "model", e.cfg.Model)
	}
	if warn && left > 0 {
		e.log.Warn("engine lists LoRA adapters the mesh does not gossip: requests naming them get 404 from the ingresses unless mapped there (--lora-adapter NAME=BASE or a model route)",
			"gossiped", gossip.MaxLoRAs, "left_out", left, "rule", "at most 64 names, each 1–256 bytes without a comma")
	}
}

// engineModels is what the sidecar keeps of an engine's /v1/models.
type engineModels struct {
	// listed: an entry's id is the configured model (vLLM lists each
	// --served-model-name, SGLang its served_model_name).
	listed bool
	// served names the base models listed (at most maxServedNames), for
	// the log when the configured one is not.
	served      []string
	adapters    []string // LoRA adapters' ids
	maxModelLen int      // the base model's max_model_len (0: not listed)
	root        string   // the base model's root ("": not listed, or over gossip.MaxRoot bytes)
}

// statusError is a /v1/models answer other than 200.
type statusError int

func (e statusError) Error() string { return fmt.Sprintf("models: status %d", int(e)) }

// errModelsDecode wraps a /v1/models body that is no model list.
var errModelsDecode = errors.New("models: decode")

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
		return engineModels{}, statusError(resp.StatusCode)
	}
	return parseModels(io.LimitReader(resp.Body, maxModelsBytes), model)
}

// maxServedNames bounds the base model names kept for the mismatch log.
const maxServedNames = 8

// parseModels reads an OpenAI model list: whether an entry's id is model,
// the ids of the entries vLLM marks as LoRA adapters (those with a parent,
// their base model; a base model's entry has "parent": null, and SGLang's
// has none), and the max_model_len and root of the base model entry named
// model. vLLM lists one entry per served name (aliases share the root);
// SGLang one, whose id and root are its served_model_name.
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
		return engineModels{}, fmt.Errorf("%w: %w", errModelsDecode, err)
	}
	var out engineModels
	base := -1
	for i, m := range list.Data {
		if m.ID == model {
			out.listed = true
		}
		if m.Parent != nil && *m.Parent != "" && m.ID != "" && m.ID != *m.Parent {
			out.adapters = append(out.adapters, m.ID)
			continue
		}
		if m.ID == model && base < 0 {
			base = i
		}
		if m.ID != "" && len(out.served) < maxServedNames {
			out.served = append(out.served, m.ID)
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
