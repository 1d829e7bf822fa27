package epp

import (
	"encoding/json"
	"testing"

	"github.com/kvmesh/kvmesh/ingress"
)

// /v1/models and /v1/models/{id} are the picker's own answers, as they are
// the ingress's (ingress/models.go): every model the pool's live engines
// serve, whichever endpoint a pick would have named; a card of any of
// them; 404 model_not_found for another id; 405 for a method other than
// GET or HEAD. Routed to one engine, the list was that engine's models and
// a card of another model was its 404.
func TestModelsAnswered(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, func(ic *ingress.Config) {
		ic.Engines = append(ic.Engines, ingress.StaticEngine{ID: "e3", Model: "other", URL: "http://10.0.0.3:8000"})
	})
	get := [2]string{":method", "GET"}
	for _, path := range []string{"/v1/models", "/team/v1/models?x=1", "/v1/models/"} {
		s := r.open(t, fd).headers(path, true, get)
		ir := s.recv().GetImmediateResponse()
		var list struct {
			Object string
			Data   []struct{ ID string }
		}
		if ir.GetStatus().GetCode() != 200 || json.Unmarshal(ir.GetBody(), &list) != nil || list.Object != "list" ||
			len(list.Data) != 2 || list.Data[0].ID != model || list.Data[1].ID != "other" {
			t.Fatalf("GET %s: %v", path, ir)
		}
		if ct := immediateHeader(ir, "content-type"); ct != "application/json" {
			t.Fatalf("GET %s: content-type %q", path, ct)
		}
		s.closed()
	}
	for _, id := range []string{model, "other"} {
		s := r.open(t, fd).headers("/v1/models/"+id, true, get)
		ir := s.recv().GetImmediateResponse()
		var card struct{ ID, Object string }
		if ir.GetStatus().GetCode() != 200 || json.Unmarshal(ir.GetBody(), &card) != nil || card.ID != id || card.Object != "model" {
			t.Fatalf("GET /v1/models/%s: %v", id, ir)
		}
		s.closed()
	}
	s := r.open(t, fd).headers("/v1/models/nope", true, get)
	s.refused(404, "model_not_found")
	s.closed()
	s = r.open(t, fd).headers("/v1/models", true) // POST
	if ir := s.refused(405, "method_not_allowed"); immediateHeader(ir, "allow") != "GET, HEAD" {
		t.Fatalf("POST /v1/models: allow %q", immediateHeader(ir, "allow"))
	}
	s.closed()
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "models"); got != 6 { // the 405 is refusedMethod's
		t.Fatalf("kvmesh_epp_requests_total{result=models} %v, want 6", got)
	}
}
