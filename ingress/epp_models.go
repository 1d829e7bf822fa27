package ingress

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Models answers a model list (path "/v1/models") or a model's card
// ("/v1/models/{id}", an id may hold slashes) as the ingress answers them
// (models.go): every model the live engines serve, not one engine's. It
// returns the status, the JSON body and, for a method other than GET or
// HEAD (405), the Allow header's value. A calling proxy (the endpoint
// picker) authenticates the request first (Authenticate).
func (s *Server) Models(method, path string) (status int, body []byte, allow string) {
	if method != "GET" && method != "HEAD" {
		ae := methodNotAllowed("GET, HEAD", []byte(method), []byte(path))
		return ae.status, appendErrorBody(nil, ae), ae.allow
	}
	var v any = map[string]any{"object": "list", "data": s.modelCards()}
	if id, ok := strings.CutPrefix(path, "/v1/models/"); ok {
		v = nil
		for _, c := range s.modelCards() {
			if c.ID == id {
				v = c
				break
			}
		}
		if v == nil {
			ae := toAPIError(fmt.Errorf("%w: the model %q does not exist", ErrModelNotFound, clip(id)))
			return ae.status, appendErrorBody(nil, ae), ""
		}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		ae := toAPIError(err)
		return ae.status, appendErrorBody(nil, ae), ""
	}
	return 200, b, ""
}
