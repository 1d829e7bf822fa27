package epp

import (
	"slices"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/auth"
)

// The client's credentials stay at the gateway when the picker
// authenticates, as they stay at the ingress (docs/SECURITY.md): the
// routing answer removes Authorization and X-Api-Key, and sets the engines'
// own key when one is configured (engineAPIKey, $KVMESH_ENGINE_API_KEY),
// with authentication on or off. With neither, the headers go on.

// mutationOf is the header mutation of a routing answer.
func mutationOf(m *extprocv3.ProcessingResponse) *extprocv3.HeaderMutation {
	if rh := m.GetRequestHeaders(); rh != nil && rh.GetResponse().GetHeaderMutation() != nil {
		return rh.GetResponse().GetHeaderMutation()
	}
	return m.GetRequestBody().GetResponse().GetHeaderMutation()
}

func TestClientCredentialsStayAtTheGateway(t *testing.T) {
	chat := []byte(chatBody("sys", "hi", false))
	msgs := []byte(`{"model":"` + model + `","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	for _, c := range []struct {
		name      string
		authOn    bool
		engineKey string
		// want: the Authorization the engine gets set ("": none set), and
		// whether Authorization and X-Api-Key are removed.
		set           string
		rmAuth, rmKey bool
	}{
		{"auth on, no engine key", true, "", "", true, true},
		{"auth on, an engine key", true, "ek-1", "Bearer ek-1", false, true},
		{"auth off, an engine key", false, "ek-1", "Bearer ek-1", false, false},
		{"auth off, no engine key", false, "", "", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newStaticRigWith(t, twoEngines, Config{}, Deps{}, func(ic *ingress.Config) { ic.EngineAPIKey = c.engineKey }, func(d *ingress.Deps) {
				if c.authOn {
					d.Auth = auth.NewStore([]auth.Entry{{Name: "tenant-a", Key: goodKey}})
				}
			})
			check := func(what string, m *extprocv3.ProcessingResponse) {
				t.Helper()
				routed(t, m)
				hm := mutationOf(m)
				set := ""
				for _, h := range hm.GetSetHeaders() {
					if h.GetHeader().GetKey() == "authorization" {
						set = string(h.GetHeader().GetRawValue())
					}
				}
				rm := hm.GetRemoveHeaders()
				if set != c.set || slices.Contains(rm, "authorization") != c.rmAuth || slices.Contains(rm, "x-api-key") != c.rmKey {
					t.Fatalf("%s: authorization set %q, removed %v; want set %q, authorization removed %v, x-api-key removed %v",
						what, set, rm, c.set, c.rmAuth, c.rmKey)
				}
			}
			bearer := [2]string{"authorization", "Bearer " + goodKey}
			for _, ac := range []authCase{{"chat", "/v1/chat/completions", chat}, {"stored response", "/v1/responses/" + respIDFor("e1"), nil}, {"bodyless", "/anything", nil}} {
				s, m := r.play(t, ac, bearer)
				check(ac.name, m)
				if ac.body != nil {
					s.recv()
				}
				s.end()
			}
			s, m := r.play(t, authCase{"messages", "/v1/messages", msgs}, [2]string{"x-api-key", goodKey})
			check("messages with X-Api-Key", m)
			s.recv()
			s.end()
			// BUFFERED: the route is in the body's answer.
			s = r.open(t, buffered).headers("/v1/chat/completions", false, bearer)
			s.recv() // the headers' empty answer
			check("buffered chat", s.body(chat, true).recv())
			s.end()
		})
	}
}
