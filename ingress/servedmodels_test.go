package ingress

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
)

// droppableMembership is a FAKE membership from which the test removes a
// model's engines, as gossip does when their sidecars die (the engines
// themselves stay up).
type droppableMembership struct {
	mu      sync.Mutex
	engines []EngineInfo
}

func (m *droppableMembership) Engines(dst []EngineInfo) []EngineInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(dst, m.engines...)
}

func (m *droppableMembership) drop(model string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.engines[:0]
	for _, e := range m.engines {
		if e.Model != model {
			kept = append(kept, e)
		}
	}
	m.engines = kept
}

// A model that lost every live engine after serving is a 503 to retry,
// not a 404: before, a model whose sidecars died was "model_not_found"
// seconds after serving, which clients do not retry. A model never
// served stays a 404.
func TestServedModelGoneIs503(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	mem := &droppableMembership{engines: []EngineInfo{
		{Engine: scheduler.Engine{ID: "a", Model: "m", Healthy: true}, URL: fe.url()},
		{Engine: scheduler.Engine{ID: "b", Model: "m2", Healthy: true}, URL: fe.url()},
	}}
	s := startIngress(t, DefaultConfig(), Deps{Membership: mem})
	url := "http://" + s.Addr() + "/v1/completions"
	if st, _, b := post(t, http.DefaultClient, url, `{"model":"m2","prompt":[1,2],"max_tokens":1}`); st != 200 {
		t.Fatalf("m2 while served: %d %s", st, b)
	}
	mem.drop("m2")
	st, hdr, b := post(t, http.DefaultClient, url, `{"model":"m2","prompt":[1,2],"max_tokens":1}`)
	if st != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(b), `no live engine serves the model \"m2\" right now`) {
		t.Fatalf("m2 after its engines left: %d Retry-After %q %s", st, hdr.Get("Retry-After"), b)
	}
	if st, _, b := post(t, http.DefaultClient, url, `{"model":"never","prompt":[1,2],"max_tokens":1}`); st != 404 || !strings.Contains(string(b), "model_not_found") {
		t.Fatalf("a model never served: %d %s", st, b)
	}
}
