package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// LoRAConfig is vLLM's LoRA serving: --enable-lora, --lora-modules
// name=path, --max-loras, and the runtime /v1/load_lora_adapter and
// /v1/unload_lora_adapter endpoints (vLLM needs
// VLLM_ALLOW_RUNTIME_LORA_UPDATING; the simulator allows them whenever LoRA
// is enabled). A request naming an adapter runs on the base model with the
// adapter's name in its cache keys and KV events (lora_name), so its blocks
// are shared only with requests for the same adapter.
type LoRAConfig struct {
	Enable bool
	// Modules are the adapters served from the start: name → path (the
	// path is only reported; the simulator has no weights).
	Modules map[string]string
	// MaxLoRAs is how many adapters may be loaded at once. Default 1 (vLLM's).
	MaxLoRAs int
}

// loras is the set of loaded adapters. Safe for concurrent use.
type loras struct {
	mu    sync.Mutex
	max   int
	paths map[string]string // name → path
}

func newLoRAs(c LoRAConfig) *loras {
	l := &loras{max: max(c.MaxLoRAs, 1), paths: map[string]string{}}
	for n, p := range c.Modules {
		l.paths[n] = p
	}
	l.max = max(l.max, len(l.paths))
	return l
}

// has reports whether name is a loaded adapter.
func (l *loras) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.paths[name]
	return ok
}

func (l *loras) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.paths))
	for n := range l.paths {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// resolveModel maps a request's model to the LoRA adapter it names ("" for
// the base model), naming the base model when it is empty; unknown names
// are vLLM's 404.
func (s *Server) resolveModel(name *string) (string, error) {
	if *name == "" {
		*name = s.cfg.Model // vLLM serves a request without a model with its own
	}
	model := *name
	if model == s.cfg.Model {
		return "", nil
	}
	if s.loras != nil && s.loras.has(model) {
		return model, nil
	}
	return "", &httpError{http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model)}
}

// loraModels lists the loaded adapters as vLLM's /v1/models does: root is
// the adapter's path, parent the base model, no max_model_len.
func (s *Server) loraModels() []openai.Model {
	if s.loras == nil {
		return nil
	}
	var out []openai.Model
	for _, n := range s.loras.names() {
		s.loras.mu.Lock()
		path := s.loras.paths[n]
		s.loras.mu.Unlock()
		parent := s.cfg.Model
		// No max_model_len: vLLM's adapter cards leave it null (the
		// base model's card has it).
		out = append(out, openai.Model{ID: n, Object: "model", Created: s.created, OwnedBy: "vllm", Root: path, Parent: &parent})
	}
	return out
}

type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

func (s *Server) readLoRARequest(w http.ResponseWriter, r *http.Request, needPath bool) (loraRequest, bool) {
	var req loraRequest
	if s.loras == nil {
		s.fail(w, badRequest("LoRA is not enabled (start the engine with --enable-lora)"))
		return req, false
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil || req.Name == "" || needPath && req.Path == "" {
		s.fail(w, badRequest("both 'lora_name' and 'lora_path' must be provided."))
		return req, false
	}
	return req, true
}

// handleLoadLoRA is POST /v1/load_lora_adapter {"lora_name", "lora_path"}.
func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readLoRARequest(w, r, true)
	if !ok {
		return
	}
	l := s.loras
	l.mu.Lock()
	_, dup := l.paths[req.Name]
	full := !dup && len(l.paths) >= l.max
	if !dup && !full {
		l.paths[req.Name] = req.Path
	}
	l.mu.Unlock()
	switch {
	case dup:
		s.fail(w, badRequest("The lora adapter '%s' has already been loaded.", req.Name))
	case full:
		s.fail(w, badRequest("No free LoRA slot: %d adapters loaded (--max-loras %d); unload one first.", l.max, l.max))
	default:
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
	}
}

// handleUnloadLoRA is POST /v1/unload_lora_adapter {"lora_name"}.
func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readLoRARequest(w, r, false)
	if !ok {
		return
	}
	s.loras.mu.Lock()
	_, found := s.loras.paths[req.Name]
	delete(s.loras.paths, req.Name)
	s.loras.mu.Unlock()
	if !found {
		s.fail(w, &httpError{http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name)})
		return
	}
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

// enabledLoRAs is the adapter set when LoRA is enabled, else nil.
func enabledLoRAs(c LoRAConfig) *loras {
	if !c.Enable {
		return nil
	}
	return newLoRAs(c)
}
