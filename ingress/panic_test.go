package ingress

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/prometheus/client_golang/prometheus"
)

// sickProxy is a FAKE fault shim in front of a real simulator: while
// failing, inference requests get 500; its /health always answers 503 (a
// probe never readmits it). Otherwise requests reach the simulator.
func sickProxy(t *testing.T, engineURL string) (string, *atomic.Bool) {
	t.Helper()
	u, err := url.Parse(engineURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	failing := &atomic.Bool{}
	failing.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
		case failing.Load():
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"error":{"message":"transient","type":"server_error"}}`))
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, failing
}

// TestPanicRoutingWhenEveryEngineIsEjected: when passive health has
// ejected every engine of a model for their answers (5xx here; on a
// starved host, stalls and timeouts), while their sidecars call them
// ready, requests are still routed to them (panic routing) rather than
// all refused until a probe answers; the first that succeeds readmits its
// engine. An engine at which nothing listens (TestAllEnginesEjectedShedsAtOnce)
// is never panic-routed.
func TestPanicRoutingWhenEveryEngineIsEjected(t *testing.T) {
	sims := startSims(t, 2, "m")
	urlA, failA := sickProxy(t, sims[0].URL())
	urlB, failB := sickProxy(t, sims[1].URL())
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "a", Model: "m", URL: urlA}, StaticEngine{ID: "b", Model: "m", URL: urlB}), Deps{Registry: reg})
	u := "http://" + s.Addr() + "/v1/completions"
	const body = `{"model":"m","prompt":[1,2,3],"max_tokens":1}`
	// Three 5xx in a row eject an engine (HealthConfig's default); each
	// request tries both engines while both are in.
	for i := 0; i < 10 && len(s.health.ejected()) < 2; i++ {
		if st, _, b := post(t, http.DefaultClient, u, body); st < 500 {
			t.Fatalf("request %d while both engines fail: %d %s", i, st, b)
		}
	}
	if ej := s.health.ejected(); len(ej) != 2 {
		t.Fatalf("ejected %v, want both engines", ej)
	}
	failA.Store(false)
	failB.Store(false)
	st, hdr, b := post(t, http.DefaultClient, u, body)
	if st != http.StatusOK {
		t.Fatalf("with every engine ejected but answering again: %d %s; want 200 (panic routing)", st, b)
	}
	served := hdr.Get("X-Kvmesh-Engine")
	if slices.Contains(s.health.ejected(), served) {
		t.Fatalf("engine %q served a request and is still ejected %v", served, s.health.ejected())
	}
	if v := val(s.health.panics); v != 1 {
		t.Fatalf("kvmesh_ingress_health_panics_total %v, want 1", v)
	}
	// The readmitted engine ends the panic: the other, still ejected,
	// gets nothing until its probe (never, here) or another panic.
	for i := 0; i < 5; i++ {
		if st, hdr, b := post(t, http.DefaultClient, u, body); st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != served {
			t.Fatalf("request %d after the panic: %d engine %q %s; want 200 on %q", i, st, hdr.Get("X-Kvmesh-Engine"), b, served)
		}
	}
	if got := gaugeValue(t, reg, "kvmesh_ingress_health_panic_models"); got != 0 {
		t.Fatalf("kvmesh_ingress_health_panic_models %v after an engine was readmitted, want 0", got)
	}
}

// TestAnswerReadmitsOnlyWhenPanicRouted: an answer to a request that was
// already in flight when its engine was ejected (a busy engine has many)
// does not readmit it; only an answer while panic routing sends it
// requests does. And a model with a ready SGLang prefill-only server but
// no engine that serves whole requests is panic-routed.
func TestAnswerReadmitsOnlyWhenPanicRouted(t *testing.T) {
	e := newEjector(DefaultHealthConfig(), prometheus.NewRegistry(), "i")
	up := &upstream{id: "d0", url: "http://127.0.0.1:1"}
	before := monoNow() // an attempt sent before the ejection
	for range 3 {
		e.observe(up, "status_5xx")
	}
	if e.allowed("d0") {
		t.Fatal("three 5xx in a row did not eject")
	}
	e.ok(up, before)
	if e.allowed("d0") {
		t.Fatal("an answer to a request sent before the ejection readmitted the engine")
	}
	list := []EngineInfo{
		sglangPrefillAt("p0", "http://127.0.0.1:2"),
		pdEngine("d0", scheduler.RoleDecode, up.url),
	}
	list[1].Healthy, list[1].panicOK = false, true // as healthMembership marks it
	e.panicRoute(list)
	if !list[1].Healthy || val(e.panics) != 1 {
		t.Fatalf("decode engine healthy %v, panics %v: a prefill-only server cannot serve the model's requests", list[1].Healthy, val(e.panics))
	}
	e.ok(up, before) // still in flight from before the ejection, answered during the panic
	if e.allowed("d0") {
		t.Fatal("an answer during the panic to a request sent before the ejection readmitted the engine")
	}
	e.ok(up, monoNow())
	if !e.allowed("d0") {
		t.Fatal("an answer while panic-routed did not readmit the engine")
	}
}

// A panic that ends because the model's ejected engines left panic routing
// (their sidecar calls them not ready) says no engine serves, not that one
// is back in routing.
func TestPanicOverWithNoEngineBackSaysSo(t *testing.T) {
	e := newEjector(DefaultHealthConfig(), prometheus.NewRegistry(), "i")
	log, logs := syncLog()
	e.log = log
	up := &upstream{id: "d0", url: "http://127.0.0.1:1"}
	for range 3 {
		e.observe(up, "status_5xx")
	}
	list := []EngineInfo{pdEngine("d0", 0, up.url)}
	list[0].Healthy, list[0].panicOK = false, true // as healthMembership marks it
	e.panicRoute(list)
	if !e.panicking.Load() {
		t.Fatal("no panic with every engine of the model ejected")
	}
	// The sidecar now calls it not ready: healthMembership no longer marks
	// it panicOK, and no engine of the model is ready.
	list = []EngineInfo{pdEngine("d0", 0, up.url)}
	list[0].Healthy = false
	e.panicRoute(list)
	if e.panicking.Load() {
		t.Fatal("the panic did not end with no ejected engine left")
	}
	out := logs.String()
	if strings.Contains(out, "back in routing") || !strings.Contains(out, "none is ready") {
		t.Fatalf("log %q: want the panic's end to say no engine is ready", out)
	}
}
