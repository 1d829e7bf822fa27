package ingress

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// An engine that answers 404 "the model does not exist" for a model its
// sidecar gossips it serves is not the engine gossip says it is: its
// model was swapped in place (the sidecar kept running), or its address
// went to another engine before gossip found the old one dead. For a LoRA
// adapter it means the engine lost the adapter (a restart, an unload)
// before its sidecar's next /v1/models poll. Either way the request did
// nothing wrong and another engine may serve it, so, before a byte reaches
// the client, the answer is an attempt failure (result wrong_model) and the
// next engine is tried. A base model ejects the engine, and its probe
// readmits it only once /v1/models lists the model again (health.go); an
// adapter only keeps the engine out of that adapter's requests for
// wrongAdapterTTL, as the engine still serves its base model and any other
// adapter, or until its sidecar's gossip lists the adapter in a listing
// newer than the denial (wrongAdapters.has).

// wrongAdapterTTL is how long an engine that denied an adapter gets no
// requests for it: the sidecar's default /v1/models interval, by which its
// next update has dropped the adapter from the engine's list (or the
// engine has loaded it again).
const wrongAdapterTTL = 10 * time.Second

// maxNoSuchModelBody bounds the 404 bodies read for the model's name: an
// engine's is one short JSON object.
const maxNoSuchModelBody = 16 << 10

// sentModel is the model the engine was asked for (the "model" of the
// body upstreamBody sends) and whether it is a LoRA adapter.
func (c *call) sentModel() (model string, adapter bool) {
	_, a := c.adapterOf()
	if c.rt.upModel != "" {
		return c.rt.upModel, true
	}
	return c.model, a != ""
}

// noSuchModel reports whether body, an engine's 404 answer, says the
// engine does not serve the model it was asked for. vLLM writes
// {"error":{"message":"The model `M` does not exist.","type":"NotFoundError","code":404}}
// (older releases the inner object alone, with "object":"error"); the
// simulator writes the same. The message is matched loosely (it names the
// model and says it does not exist or is not found), not as vLLM's exact
// text: a 404 that does not name the model (an unknown path, say) is the
// engine's verdict on the request and is relayed.
func (c *call) noSuchModel(body []byte) bool {
	model, _ := c.sentModel()
	return deniesModel(body, model)
}

// deniesModel is noSuchModel for a body and the model it was sent: the P/D
// legs' prefill goroutine (pd_sglang.go) has no call to read it from.
func deniesModel(body []byte, model string) bool {
	if model == "" || len(body) > maxNoSuchModelBody {
		return false
	}
	return noSuchModelText(errorMessage(body), model)
}

// errorMessage is the message of an error body in the shapes engines use:
// OpenAI's {"error":{"message"}}, vLLM's older {"message"}, FastAPI's
// {"detail"}; else the body itself.
func errorMessage(body []byte) string {
	if d, ok := openai.DecodeError(body); ok {
		return d.Message
	}
	var flat struct {
		Message string `json:"message"`
		Detail  any    `json:"detail"`
	}
	if json.Unmarshal(body, &flat) == nil {
		if flat.Message != "" {
			return flat.Message
		}
		if d, ok := flat.Detail.(string); ok {
			return d
		}
	}
	return string(body)
}

func noSuchModelText(msg, model string) bool {
	lower := strings.ToLower(msg)
	if !namesModel(lower, strings.ToLower(model)) {
		return false
	}
	for _, s := range [...]string{"not exist", "not found", "not loaded", "not served"} {
		if strings.Contains(lower, s) {
			return true
		}
	}
	return false
}

// namesModel reports whether msg holds model as a word of its own (quoted,
// or between spaces): a short name such as "m" is in most texts as a part
// of another word.
func namesModel(msg, model string) bool {
	for i := 0; model != ""; {
		j := strings.Index(msg[i:], model)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(model)
		if (start == 0 || !nameByte(msg[start-1])) && (end == len(msg) || !nameByte(msg[end])) {
			return true
		}
		i = start + 1
	}
	return false
}

// nameByte: a byte that continues a model name (org/name-7b.v1:tag).
func nameByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("-_./:", b) >= 0
}

// wrongModel ends an attempt whose engine answered that it does not serve
// the model: a base model ejects the engine (its probe checks the model
// is listed again before it returns), an adapter keeps the engine out of
// that adapter's requests for wrongAdapterTTL. The error, if it is the
// last attempt's, is the 503 of a model with no live engine
// (servedmodels.go): gossip says the model is served, so this is an
// outage to retry, and it names the engine by id only.
func (c *call) wrongModel(up *upstream, resp *fasthttp.Response) error {
	model, adapter := c.sentModel()
	cause := fmt.Errorf("engine %s answered 404: it does not serve the model %q", up.id, clip(model))
	_ = c.attemptFailed(up, resp, "wrong_model", cause) // the answer's connection goes back to the pool
	c.s.deniedModel(up, model, adapter)
	err := fmt.Errorf("%w: no live engine serves the model %q right now (engine %s answered that it does not serve it)", ErrNoEngine, clip(model), up.id)
	msg := err.Error()
	if adapter {
		err = fmt.Errorf("%w (%w)", err, errAdapterDenied)
	}
	return &upstreamError{msg: msg, err: err}
}

// errAdapterDenied marks an attempt an engine answered that it does not
// serve the LoRA adapter it was sent: when every candidate engine of the
// base model answers so, the adapter does not exist for the client (404
// model_not_found, as vLLM answers), not a passing outage (503).
var errAdapterDenied = errors.New("the engine does not serve the adapter")

// adapterNotFound is the 404 of an adapter that every engine it could go
// to (its base model's, or a route pool's) answered, lately, that it does
// not serve. A route's adapter may be asked of a pool of another model,
// so the message does not call them its base model's.
func adapterNotFound(model string, engines int) error {
	return fmt.Errorf("%w: the model %q does not exist: every engine it was sent to (%d) answered that it does not serve it",
		ErrModelNotFound, clip(model), engines)
}

// deniedModel takes up out of model's requests once it answered that it
// does not serve it (its answer's connection already released): a base
// model ejects the engine and closes its pooled connections, which lead to
// whatever holds the address now (a readmitted engine is dialled afresh);
// an adapter keeps the engine out of that adapter's requests for
// wrongAdapterTTL. The P/D legs (pd.go, pd_sglang.go) call it too.
func (s *Server) deniedModel(up *upstream, model string, adapter bool) {
	if adapter {
		up.wrong.add(model, time.Now().Add(wrongAdapterTTL), s.engineLists(up, model))
		return
	}
	s.health.wrongModel(up, model)
	up.hc.CloseIdleConnections()
}

// engineLists reports whether up's engine lists adapter as gossip has it
// now (its sidecar's last read of the engine's /v1/models).
func (s *Server) engineLists(up *upstream, adapter string) bool {
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.ID == up.id && e.URL == up.url {
			return slices.Contains(e.LoRAs, adapter)
		}
	}
	return false
}

// wrongAdapters are the adapters one engine (one upstream: a new URL is a
// new record) answered that it does not serve, each until its entry
// expires or a newer listing clears it. Its names are adapters that a
// flag, a route or the engines' gossip name (candidates admits no other),
// and at most maxWrongAdapters are kept.
//
// Gossip carries no time of the sidecar's read, so a listing is known to be
// newer than the denial when the engine's gossip did not list the adapter at
// some point since it: at the denial, or at a later check (has). Such a
// listing says the engine has the adapter again (it was loaded after the
// denial), and clears the entry: the engine is tried for it at once. A
// listing seen at the denial and at every check since may be the one the
// sidecar read before the engine lost the adapter (what wrongAdapterTTL
// bridges), so it clears nothing.
type wrongAdapters struct {
	n     atomic.Int32 // entries: the request path checks it alone when 0
	mu    sync.Mutex
	marks map[string]wrongAdapter
}

// wrongAdapter is one adapter's entry: when it expires, and whether every
// listing of the engine seen since the denial listed the adapter (a
// listing then may predate the denial).
type wrongAdapter struct {
	until  time.Time
	listed bool
}

const maxWrongAdapters = 64

// add records that the engine denied adapter name, keeping it from the
// adapter until then; listed is whether its gossip listed the adapter when
// it did.
func (w *wrongAdapters) add(name string, until time.Time, listed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.marks == nil {
		w.marks = map[string]wrongAdapter{}
	}
	if len(w.marks) >= maxWrongAdapters {
		now := time.Now()
		for k, m := range w.marks {
			if !now.Before(m.until) {
				delete(w.marks, k)
			}
		}
		if len(w.marks) >= maxWrongAdapters {
			return // the engine still answers 404 for it, and is retried past
		}
	}
	w.marks[name] = wrongAdapter{until: until, listed: listed}
	w.n.Store(int32(len(w.marks)))
}

// has reports whether the engine denied adapter name less than
// wrongAdapterTTL before now and no listing newer than the denial lists it
// since; listing is the engine's adapters as its gossip has them now. An
// expired or cleared entry goes.
func (w *wrongAdapters) has(name string, now time.Time, listing []string) bool {
	if w.n.Load() == 0 {
		return false
	}
	lists := slices.Contains(listing, name)
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.marks[name]
	switch {
	case !ok:
		return false
	case !now.Before(m.until) || lists && !m.listed:
		delete(w.marks, name)
		w.n.Store(int32(len(w.marks)))
		return false
	case m.listed && !lists:
		// The sidecar's read after the engine lost the adapter: a listing
		// from now on is newer than the denial.
		m.listed = false
		w.marks[name] = m
	}
	return true
}

// engineIdentity is what an ejected engine's probe checks it against
// (ejector.identity): the model its sidecar gossips ("" when membership
// no longer lists it) and the engines' API key.
func (s *Server) engineIdentity(id string) (model string, auth []byte) {
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.ID == id {
			return e.Model, s.engineAuth
		}
	}
	return "", s.engineAuth
}
