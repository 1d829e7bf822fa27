package ingress

import (
	"sync"
	"time"
)

// servedWindow is how long a model some engine served keeps answering 503
// (retry) rather than 404 (no such model) once no live engine serves it:
// its sidecars gone or restarting is an outage of the mesh, and clients do
// not retry a 404.
const servedWindow = 5 * time.Minute

// servedModels remembers when each model was last routed to a live
// engine. Its keys are the engines' own model names (bounded by the
// deployment, never a client's string).
type servedModels struct {
	mu   sync.RWMutex
	last map[string]time.Time
}

// seen records that model has a live engine at now; at most one write a
// second per model, so the request path mostly takes the read lock.
func (m *servedModels) seen(model string, now time.Time) {
	m.mu.RLock()
	t, ok := m.last[model]
	m.mu.RUnlock()
	if ok && now.Sub(t) < time.Second {
		return
	}
	m.mu.Lock()
	if m.last == nil {
		m.last = map[string]time.Time{}
	}
	m.last[model] = now
	m.mu.Unlock()
}

// recently reports whether model had a live engine within servedWindow
// of now.
func (m *servedModels) recently(model string, now time.Time) bool {
	m.mu.RLock()
	t, ok := m.last[model]
	m.mu.RUnlock()
	return ok && now.Sub(t) < servedWindow
}
