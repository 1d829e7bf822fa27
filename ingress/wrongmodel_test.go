package ingress

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// simServing starts a simulator serving model (with adapters loaded, if
// any) on addr ("" a free port); it is closed at cleanup.
func simServing(t *testing.T, model, addr string, adapters ...string) *sim.Server {
	t.Helper()
	sc := sim.Config{Model: model, TimeScale: 200, HTTPAddr: addr}
	if len(adapters) > 0 {
		sc.LoRA = sim.LoRAConfig{Enable: true, Modules: map[string]string{}, MaxLoRAs: len(adapters)}
		for _, a := range adapters {
			sc.LoRA.Modules[a] = "/adapters/" + a
		}
	}
	return startSim(t, sc) // vllmcompat_test.go
}

// probesFailed is how many times engine id was ejected or failed a probe
// since its last success (1: ejected, not yet probed).
func probesFailed(s *Server, id string) int {
	s.health.mu.RLock()
	h := s.health.m[id]
	s.health.mu.RUnlock()
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ejections
}

// An engine that answers 404 "The model `m` does not exist" for the model
// its listing says it serves (its model swapped in place, or its address
// taken by another engine) is failed over, counted as wrong_model and
// ejected: no client sees its 404. Its probe does not readmit it while
// /health answers but /v1/models lacks the model (F1, F3a); once an engine
// serving the model is back at the address, the probe readmits it. Before,
// the 404 was relayed as the engine's verdict, and a readmission needed
// only /health.
func TestWrongModelEngineFailsOverIsEjectedAndProbedForIdentity(t *testing.T) {
	good := simServing(t, "m", "")
	wrong := simServing(t, "other", "")
	addr := wrong.HTTPAddr()
	cfg := testConfig(StaticEngine{ID: "good", Model: "m", URL: good.URL()}, StaticEngine{ID: "wrong", Model: "m", URL: wrong.URL()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 20*time.Millisecond, 40*time.Millisecond
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 0 {
		t.Fatalf("wrong_model attempts %v at start, want 0", got)
	}
	url := "http://" + s.Addr() + "/v1/completions"
	body := func(i int) string { return `{"model":"m","prompt":[` + strconv.Itoa(i+1) + `,2,3,4],"max_tokens":2}` }
	for i := range 6 {
		if st, hdr, b := post(t, http.DefaultClient, url, body(i)); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 1 {
		t.Fatalf("wrong_model attempts %v, want 1 (then ejected)", got)
	}
	if got := val(s.m.attempts.WithLabelValues("status_4xx")); got != 0 {
		t.Fatalf("status_4xx attempts %v: the engine's 404 was relayed", got)
	}
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"wrong"}) {
		t.Fatalf("ejected %v, want [wrong]", ej)
	}

	// The probes find /health answered and /v1/models without "m": out.
	testutil.WaitFor(t, 20*time.Second, "two probes of the wrong engine to fail", func() bool { return probesFailed(s, "wrong") >= 3 })
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"wrong"}) {
		t.Fatalf("ejected %v after its probes, want [wrong]: /health alone readmitted it", ej)
	}
	if out := logs.String(); strings.Count(out, "engine kept out of routing") != 1 || !strings.Contains(out, "serves=[other]") {
		t.Fatalf("want one warning naming what the URL serves:\n%s", out)
	}

	// An engine serving "m" at the address: the probe readmits it.
	if err := wrong.Close(); err != nil {
		t.Fatal(err)
	}
	back := simServing(t, "m", addr)
	testutil.WaitFor(t, 20*time.Second, "the probe to readmit the engine at the address", func() bool { return len(s.health.ejected()) == 0 })
	for i := range 4 {
		if st, _, b := post(t, http.DefaultClient, url, body(100+i)); st != 200 {
			t.Fatalf("request %d after the readmission: %d %s", i, st, b)
		}
	}
	if back.Load(0).Finished == 0 || len(s.health.ejected()) != 0 {
		t.Fatalf("the readmitted engine got no requests, or was ejected again (%v)", s.health.ejected())
	}
}

// When every engine answers that it does not serve the model, the client
// gets the 503 of a model with no live engine (servedmodels.go), naming
// the engines by id and never by address, and both engines are ejected:
// the next request is answered at once, with no attempt.
func TestWrongModelEverywhereIs503(t *testing.T) {
	a, b := simServing(t, "other", ""), simServing(t, "other", "")
	cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: a.URL()}, StaticEngine{ID: "b", Model: "m", URL: b.URL()})
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 2 {
		st, hdr, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		var e openAIError
		if err := json.Unmarshal(body, &e); err != nil || st != http.StatusServiceUnavailable || e.Error.Code != "service_unavailable" ||
			hdr.Get("Retry-After") == "" {
			t.Fatalf("request %d: %d %s, want 503 service_unavailable with Retry-After", i, st, body)
		}
		if strings.Contains(string(body), "127.0.0.1") {
			t.Fatalf("request %d: the client's message names an engine address: %s", i, body)
		}
		if i == 0 && !strings.Contains(e.Error.Message, `no live engine serves the model "m" right now`) {
			t.Fatalf("first request's message %q, want the no-live-engine 503", e.Error.Message)
		}
		// Both ejected: the next request is told so, without an attempt.
		if i == 1 && !strings.Contains(e.Error.Message, `no live engine serves the model "m" right now: all 2 of its engines are out of routing: a ejected after failing (probed until it answers again), b ejected`) {
			t.Fatalf("second request's message %q, want the no-live-engine 503 naming both ejected engines", e.Error.Message)
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 2 {
		t.Fatalf("wrong_model attempts %v, want 2 (one per engine, then both ejected)", got)
	}
	if ej := s.health.ejected(); len(ej) != 2 {
		t.Fatalf("ejected %v, want both", ej)
	}
}

// An engine that lost a LoRA adapter (404 for it) is failed over but not
// ejected: it still serves its base model. It gets no more requests for
// the adapter for wrongAdapterTTL (F7), and its base-model requests go on.
func TestWrongAdapterAvoidsEngineForTheAdapterOnly(t *testing.T) {
	with := simServing(t, "m", "", "ad")
	without := simServing(t, "m", "")
	cfg := testConfig(StaticEngine{ID: "with", Model: "m", URL: with.URL()}, StaticEngine{ID: "without", Model: "m", URL: without.URL()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.LoRAAdapters = map[string]string{"ad": "m"}
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 6 {
		st, hdr, b := post(t, http.DefaultClient, url, `{"model":"ad","prompt":[`+strconv.Itoa(i+1)+`,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "with" {
			t.Fatalf("adapter request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 1 {
		t.Fatalf("wrong_model attempts %v, want 1 (then the engine is kept from the adapter)", got)
	}
	if ej := s.health.ejected(); len(ej) != 0 {
		t.Fatalf("ejected %v for a missing adapter, want none", ej)
	}
	before := without.Load(0).Finished
	for i := range 4 {
		if st, _, b := post(t, http.DefaultClient, url, `{"model":"m","prompt":[`+strconv.Itoa(50+i)+`,2,3],"max_tokens":2}`); st != 200 {
			t.Fatalf("base request %d: %d %s", i, st, b)
		}
	}
	if without.Load(0).Finished == before {
		t.Fatal("the engine without the adapter got no base-model request")
	}
}

// wrongAdapters keeps an adapter from an engine until its entry expires.
func TestWrongAdaptersExpire(t *testing.T) {
	var w wrongAdapters
	now := time.Now()
	if w.has("ad", now, nil) {
		t.Fatal("empty set has ad")
	}
	w.add("ad", now.Add(wrongAdapterTTL), false)
	if !w.has("ad", now.Add(wrongAdapterTTL-time.Millisecond), nil) || w.has("other", now, nil) {
		t.Fatal("ad not kept, or another adapter kept")
	}
	if w.has("ad", now.Add(wrongAdapterTTL), nil) || w.n.Load() != 0 {
		t.Fatalf("ad kept past its TTL (%d entries)", w.n.Load())
	}
}

// wrongAdapters: a listing newer than the denial (the engine's gossip did
// not list the adapter at the denial, or at a check since) clears it; a
// listing seen at the denial and at every check since does not.
func TestWrongAdaptersClearedByNewerListing(t *testing.T) {
	now := time.Now()
	until := now.Add(wrongAdapterTTL)
	listing := []string{"other", "ad"}

	var w wrongAdapters
	w.add("ad", until, false) // denied while not listed
	if !w.has("ad", now, []string{"other"}) {
		t.Fatal("not kept while unlisted")
	}
	if w.has("ad", now, listing) || w.n.Load() != 0 {
		t.Fatalf("kept once listed after the denial (%d entries)", w.n.Load())
	}

	w.add("ad", until, true) // denied under a listing that may be stale
	w.add("b", until, false)
	for i := range 2 {
		if !w.has("ad", now, listing) {
			t.Fatalf("check %d: the listing seen at the denial cleared it", i+1)
		}
	}
	if !w.has("ad", now, nil) {
		t.Fatal("not kept once the listing dropped")
	}
	if w.has("ad", now, listing) || !w.has("b", now, nil) || w.n.Load() != 1 {
		t.Fatalf("kept when listed after its listing dropped, or another adapter cleared (%d entries)", w.n.Load())
	}
}

// The 404 bodies that say the engine does not serve the model, in the
// shapes engines write, and 404s that do not (relayed as the engine's
// verdict).
func TestNoSuchModelText(t *testing.T) {
	for _, tc := range []struct {
		body, model string
		want        bool
	}{
		{`{"error":{"message":"The model ` + "`A`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`, "A", true},
		{`{"object":"error","message":"The model ` + "`org/A-7b`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`, "org/A-7b", true},
		{`{"error":{"message":"LoRA adapter sql-lora not found","type":"NotFoundError","code":404}}`, "sql-lora", true},
		{`{"detail":"Model 'A' not found"}`, "A", true},
		{`{"detail":"Not Found"}`, "A", false},
		{`{"detail":"Not Found"}`, "o", false},
		{`{"error":{"message":"The model ` + "`m`" + ` does not exist.","code":404}}`, "m", true},
		{`{"error":{"message":"The model ` + "`m-2`" + ` does not exist.","code":404}}`, "m", false},
		{`{"error":{"message":"no route POST /v1/v1/completions","code":404}}`, "A", false},
		{`{"error":{"message":"The model ` + "`B`" + ` does not exist.","code":404}}`, "A-long-name", false},
		{`not json: model A does not exist`, "A", true},
	} {
		if got := noSuchModelText(errorMessage([]byte(tc.body)), tc.model); got != tc.want {
			t.Errorf("%s for %q: %v, want %v", tc.body, tc.model, got, tc.want)
		}
	}
}

// An engine ejected for an ordinary failure (here a connect error) is
// readmitted by its health probe alone, even when another engine took its
// address (the IP reuse of a rescheduled pod): the first request routed
// there gets the wrong-model 404, fails over (the client sees no error)
// and ejects it for a wrong model, and from then on its probes check
// /v1/models and keep it out. Before (H1), every readmission checked
// /v1/models, which kept out for good any engine that does not list the
// routed name (TestProbeReadmitsEngineNotListingTheRoutedName).
func TestAnotherEngineAtTheAddressIsReadmittedThenEjectedForAWrongModel(t *testing.T) {
	good, victim := simServing(t, "m", ""), simServing(t, "m", "")
	addr := victim.HTTPAddr()
	cfg := testConfig(StaticEngine{ID: "good", Model: "m", URL: good.URL()}, StaticEngine{ID: "victim", Model: "m", URL: victim.URL()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 20*time.Millisecond, 40*time.Millisecond
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	url := "http://" + s.Addr() + "/v1/completions"
	body := func(i int) string { return `{"model":"m","prompt":[` + strconv.Itoa(i+1) + `,2,3],"max_tokens":2}` }
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if st, hdr, b := post(t, http.DefaultClient, url, body(i)); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"victim"}) || val(s.m.attempts.WithLabelValues("connect_error")) != 1 {
		t.Fatalf("ejected %v after %v connect errors, want [victim] after 1", ej, val(s.m.attempts.WithLabelValues("connect_error")))
	}
	other := simServing(t, "other", addr) // another engine takes the address
	testutil.WaitFor(t, 20*time.Second, "the health probe to readmit the address", func() bool { return len(s.health.ejected()) == 0 })

	// Its first request fails over to the good engine and ejects it.
	for i := range 4 {
		if st, hdr, b := post(t, http.DefaultClient, url, body(10+i)); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d after the readmission: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 1 {
		t.Fatalf("wrong_model attempts %v, want 1 (then ejected)", got)
	}
	if got := val(s.m.attempts.WithLabelValues("status_4xx")); got != 0 {
		t.Fatalf("status_4xx attempts %v: the other engine's 404 was relayed", got)
	}
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"victim"}) {
		t.Fatalf("ejected %v, want [victim]", ej)
	}

	// Ejected for a wrong model, its probes check /v1/models: it stays out.
	n := probesFailed(s, "victim")
	testutil.WaitFor(t, 20*time.Second, "two probes of the address to fail", func() bool { return probesFailed(s, "victim") >= n+2 })
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"victim"}) {
		t.Fatalf("ejected %v after its probes, want [victim]: /health alone readmitted another engine", ej)
	}
	if out := logs.String(); strings.Count(out, "engine kept out of routing") != 1 || !strings.Contains(out, "serves=[other]") {
		t.Fatalf("want one warning naming what the URL serves:\n%s", out)
	}
	for i := range 4 {
		if st, hdr, b := post(t, http.DefaultClient, url, body(20+i)); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d while kept out: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 1 || other.Load(0).Finished != 0 {
		t.Fatalf("wrong_model attempts %v, other engine finished %d: it was tried again", got, other.Load(0).Finished)
	}
}

// listingProxy serves, on addr ("" a free port), the engine at target
// with a /v1/models that lists only ids (as SGLang without
// --served-model-name, or llama.cpp, lists its model path); it returns its
// address and a func that stops it.
func listingProxy(t *testing.T, addr, target string, ids ...string) (string, func()) {
	t.Helper()
	u, err := neturl.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		var list struct {
			Data []map[string]string `json:"data"`
		}
		for _, id := range ids {
			list.Data = append(list.Data, map[string]string{"id": id, "object": "model"})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	})
	mux.Handle("/", httputil.NewSingleHostReverseProxy(u))
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), func() { _ = srv.Close() }
}

// An engine whose /v1/models does not list the name the ingress routes by
// (SGLang without --served-model-name lists its model path; a static
// engine's friendly name) is readmitted by its health probe after an
// ordinary ejection (a connect error) and serves again. Before (H1), the
// probe checked /v1/models on every readmission and kept it out for good.
func TestProbeReadmitsEngineNotListingTheRoutedName(t *testing.T) {
	good, backend := simServing(t, "llama3", ""), simServing(t, "llama3", "")
	addr, stop := listingProxy(t, "", backend.URL(), "/models/llama3")
	cfg := testConfig(StaticEngine{ID: "good", Model: "llama3", URL: good.URL()}, StaticEngine{ID: "sgl", Model: "llama3", URL: "http://" + addr})
	cfg.Scheduler.Policy = "round-robin"
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 20*time.Millisecond, 40*time.Millisecond
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	body := func(i int) string {
		return `{"model":"llama3","prompt":[` + strconv.Itoa(i+1) + `,2,3],"max_tokens":2}`
	}
	stop()
	for i := range 4 {
		if st, hdr, b := post(t, http.DefaultClient, url, body(i)); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"sgl"}) {
		t.Fatalf("ejected %v, want [sgl]", ej)
	}
	listingProxy(t, addr, backend.URL(), "/models/llama3") // back at its address
	testutil.WaitFor(t, 20*time.Second, "the health probe to readmit the engine", func() bool { return len(s.health.ejected()) == 0 })
	for i := range 4 {
		if st, _, b := post(t, http.DefaultClient, url, body(10+i)); st != 200 {
			t.Fatalf("request %d after the readmission: %d %s", i, st, b)
		}
	}
	if backend.Load(0).Finished == 0 || len(s.health.ejected()) != 0 {
		t.Fatalf("the readmitted engine got no requests, or was ejected again (%v)", s.health.ejected())
	}
}

// An adapter that every engine of its base model answers it does not serve
// (a --lora-adapter name none has loaded) is a 404 model_not_found, as vLLM
// answers it, for the request that found out and for the next ones while
// the engines are kept from it; before, a 503 with Retry-After that the
// SDKs retried. The base model is served meanwhile.
func TestAdapterNoEngineServesIs404(t *testing.T) {
	a, b := simServing(t, "m", ""), simServing(t, "m", "")
	cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: a.URL()}, StaticEngine{ID: "b", Model: "m", URL: b.URL()})
	cfg.LoRAAdapters = map[string]string{"ghost": "m"}
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 3 {
		st, hdr, body := post(t, http.DefaultClient, url, `{"model":"ghost","prompt":[1,2,3],"max_tokens":2}`)
		d, ok := openai.DecodeError(body)
		if st != 404 || !ok || string(d.Code) != `"model_not_found"` || !strings.Contains(d.Message, `"ghost" does not exist`) || hdr.Get("Retry-After") != "" {
			t.Fatalf("request %d for an adapter no engine serves: %d %s (Retry-After %q), want 404 model_not_found", i+1, st, body, hdr.Get("Retry-After"))
		}
	}
	if got := val(s.m.attempts.WithLabelValues("wrong_model")); got != 2 {
		t.Errorf("wrong_model attempts %v, want 2 (each engine once, then kept from the adapter)", got)
	}
	if st, _, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3],"max_tokens":2}`); st != 200 {
		t.Fatalf("the base model: %d %s", st, body)
	}
}
