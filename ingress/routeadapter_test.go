package ingress

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/scheduler"
)

// modelEngine is a healthy engine of model at url, listing adapters.
func modelEngine(id, model, url string, adapters ...string) EngineInfo {
	return EngineInfo{Engine: scheduler.Engine{ID: id, Model: model, Healthy: true, LoRAs: adapters}, URL: url}
}

func setEngines(m *swapMembership, es ...EngineInfo) { m.list.Store(&es) }

// TestRouteAdapterSkipsPoolWithoutIt: a request for a route's LoRA adapter
// whose weighted pick is a pool that cannot serve it (none of its engines
// lists the adapter while a fallback pool's does, or all of them lately
// answered that they lack it) goes to the next pool of the chain that can,
// before any attempt. Before, the pool was picked by health alone: a
// request whose pick was beta got, for 10 s after beta's engine denied the
// adapter once, a 404 "does not exist" at once (naming beta its base model)
// while the fallback pool alpha served it.
func TestRouteAdapterSkipsPoolWithoutIt(t *testing.T) {
	alpha, beta := simServing(t, "alpha", "", "chem"), simServing(t, "beta", "")
	rt := routeTable(t, `routes:
  - name: chat
    match: {model: chat}
    backends: [{model: alpha, weight: 1}, {model: beta, weight: 1}]
    fallback: [alpha]
    loraAdapters: [chem]
`)
	run := func(t *testing.T, adapters []string, n int, maxWasted float64) {
		m := &swapMembership{}
		setEngines(m, modelEngine("alpha0", "alpha", alpha.URL(), adapters...), modelEngine("beta0", "beta", beta.URL()))
		reg := prometheus.NewRegistry()
		s := startIngress(t, testConfig(), Deps{Membership: m, Routes: rt, Registry: reg})
		url := "http://" + s.Addr() + "/v1/completions"
		for i := range n {
			st, hdr, b := post(t, http.DefaultClient, url, fmt.Sprintf(`{"model":"chem","max_tokens":1,"prompt":"chem %d"}`, i))
			if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "alpha0" {
				t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
			}
		}
		if got := metricValue(t, reg, "kvmesh_ingress_upstream_attempts_total", "result", "wrong_model"); got > maxWasted {
			t.Fatalf("%v attempts on beta's engine, want at most %v", got, maxWasted)
		}
	}
	// No engine lists chem (alpha's loaded it since its sidecar's last poll):
	// beta is tried while not known to lack it, then skipped.
	t.Run("unlisted", func(t *testing.T) { run(t, nil, 24, 1) })
	// alpha's engine lists chem: beta, which does not, is never tried.
	t.Run("listed", func(t *testing.T) { run(t, []string{"chem"}, 16, 0) })
}

// TestRouteAdapterNotFoundNamesThePool: while the route's only pool's
// engines are kept from the adapter they denied, its 404 names the pool and
// the route, not the pool as the adapter's base model (a route's adapter is
// served under its pool's model, which need not be its base model).
func TestRouteAdapterNotFoundNamesThePool(t *testing.T) {
	beta := simServing(t, "beta", "")
	m := &swapMembership{}
	setEngines(m, modelEngine("beta0", "beta", beta.URL()))
	rt := routeTable(t, `routes:
  - name: chat
    match: {model: chat}
    backends: [{model: beta}]
    loraAdapters: [chem]
`)
	s := startIngress(t, testConfig(), Deps{Membership: m, Routes: rt})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 3 { // the engine's answer, then the engine kept from it
		st, _, b := post(t, http.DefaultClient, url, `{"model":"chem","max_tokens":1,"prompt":"x"}`)
		d, ok := openai.DecodeError(b)
		if st != http.StatusNotFound || !ok || string(d.Code) != `"model_not_found"` {
			t.Fatalf("request %d: %d %s, want a 404 model_not_found", i+1, st, b)
		}
		// The first request's 404 is the attempts' verdict (errors.go),
		// worded for a base model still.
		if i > 0 && (!strings.Contains(d.Message, `every engine of the pool "beta" of route "chat" (1)`) || strings.Contains(d.Message, "base model")) {
			t.Fatalf("request %d: %s, want a 404 naming the pool and the route", i+1, b)
		}
	}
}

// TestUnloadedAdapterIs404: an adapter the engines listed, unloaded from
// its engine at runtime, is a 404 model_not_found while its base model's
// engines are live, as vLLM answers it, also once the sidecar's poll has
// dropped it from gossip. Before, that was a 503 with Retry-After (the
// SDKs retry it) for 5 minutes after its last request: the adapter's name
// counted as a model that had lately been served and lost its engines. A
// 503 remains for the adapter when its base model's engines are all gone
// from gossip (sidecars restarting), as for the base model.
func TestUnloadedAdapterIs404(t *testing.T) {
	alpha := simServing(t, "alpha", "", "chem")
	other := simServing(t, "other", "")
	m := &swapMembership{}
	setEngines(m, modelEngine("alpha0", "alpha", alpha.URL(), "chem"), modelEngine("other0", "other", other.URL()))
	s := startIngress(t, testConfig(), Deps{Membership: m})
	url := "http://" + s.Addr() + "/v1/completions"
	req := `{"model":"chem","max_tokens":1,"prompt":"x"}`
	if st, _, b := post(t, http.DefaultClient, url, req); st != http.StatusOK {
		t.Fatalf("chem while loaded: %d %s", st, b)
	}
	st, _, b := post(t, http.DefaultClient, alpha.URL()+"/v1/unload_lora_adapter", `{"lora_name":"chem"}`)
	if st != http.StatusOK {
		t.Fatalf("unload: %d %s", st, b)
	}
	notFound := func(when string) {
		t.Helper()
		st, hdr, b := post(t, http.DefaultClient, url, req)
		d, ok := openai.DecodeError(b)
		if st != http.StatusNotFound || !ok || string(d.Code) != `"model_not_found"` || hdr.Get("Retry-After") != "" {
			t.Fatalf("%s: %d (Retry-After %q) %s, want 404 model_not_found", when, st, hdr.Get("Retry-After"), b)
		}
	}
	notFound("right after the unload") // the engine's denial
	// The sidecar's next poll: alpha's engine no longer lists chem.
	setEngines(m, modelEngine("alpha0", "alpha", alpha.URL()), modelEngine("other0", "other", other.URL()))
	for i := range 3 {
		notFound(fmt.Sprintf("request %d after the poll", i+1))
	}
	if st, _, b := post(t, http.DefaultClient, url, `{"model":"alpha","max_tokens":1,"prompt":"x"}`); st != http.StatusOK {
		t.Fatalf("the base model: %d %s", st, b)
	}

	// alpha's sidecar leaves gossip (restarting): an outage to retry.
	setEngines(m, modelEngine("other0", "other", other.URL()))
	st, hdr, b := post(t, http.DefaultClient, url, req)
	if st != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("chem with its base model's engines gone from gossip: %d (Retry-After %q) %s, want 503", st, hdr.Get("Retry-After"), b)
	}
}

// TestAdapterListedAfterDenialIsTried: an engine that denied an adapter
// (it was unloaded) and whose gossip lists it again after the denial (its
// sidecar's poll saw it unlisted, then loaded again) is tried for it at
// once: that listing is newer than the denial. Before, the denial kept the
// engine from the adapter for wrongAdapterTTL (10 s) whatever its gossip
// said since: a route's adapter got a 404 "does not exist" with no attempt,
// naming the first pool of the chain, not the one that lists it; an adapter
// gossip alone names got the same 404 from its base model's engines. A
// listing that may be the one read before the denial still keeps the
// engine out until it drops.
func TestAdapterListedAfterDenialIsTried(t *testing.T) {
	unload := func(t *testing.T, url string) {
		t.Helper()
		if st, _, b := post(t, http.DefaultClient, url+"/v1/unload_lora_adapter", `{"lora_name":"sql"}`); st != http.StatusOK {
			t.Fatalf("unload: %d %s", st, b)
		}
	}
	load := func(t *testing.T, url string) {
		t.Helper()
		if st, _, b := post(t, http.DefaultClient, url+"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/adapters/sql"}`); st != http.StatusOK {
			t.Fatalf("load: %d %s", st, b)
		}
	}
	send := func(t *testing.T, url string, wantStatus int, wantEngine, wantMsg string) {
		t.Helper()
		st, hdr, b := post(t, http.DefaultClient, url, `{"model":"sql","max_tokens":1,"prompt":"select"}`)
		if st != wantStatus || wantEngine != "" && hdr.Get("X-Kvmesh-Engine") != wantEngine || !strings.Contains(string(b), wantMsg) {
			t.Fatalf("%d from %q: %s, want %d from %q with %q", st, hdr.Get("X-Kvmesh-Engine"), b, wantStatus, wantEngine, wantMsg)
		}
	}

	t.Run("route", func(t *testing.T) {
		a, b := simServing(t, "A", "", "sql"), simServing(t, "B", "", "sql")
		rt := routeTable(t, `routes:
  - name: chat
    match: {model: chat}
    backends: [{model: A}]
    fallback: [B]
    loraAdapters: [sql]
`)
		m := &swapMembership{}
		setEngines(m, modelEngine("eA", "A", a.URL(), "sql"), modelEngine("eB", "B", b.URL(), "sql"))
		s := startIngress(t, testConfig(), Deps{Membership: m, Routes: rt})
		url := "http://" + s.Addr() + "/v1/completions"
		send(t, url, http.StatusOK, "eA", "")
		unload(t, a.URL())
		unload(t, b.URL())
		send(t, url, http.StatusNotFound, "", "model_not_found") // both engines deny it, listing it still
		// Both sidecars' polls: neither lists sql. Both pools are kept from
		// it, and the 404 names them both.
		setEngines(m, modelEngine("eA", "A", a.URL()), modelEngine("eB", "B", b.URL()))
		send(t, url, http.StatusNotFound, "", `every engine of the pools \"A\", \"B\" of route \"chat\" (2)`)
		// B loads it again, and its sidecar's next poll lists it.
		load(t, b.URL())
		setEngines(m, modelEngine("eA", "A", a.URL()), modelEngine("eB", "B", b.URL(), "sql"))
		send(t, url, http.StatusOK, "eB", "")
	})

	t.Run("stale listing", func(t *testing.T) {
		// The engine lost the adapter before its sidecar's poll: the
		// listing it denied it under is no newer than the denial.
		b := simServing(t, "B", "", "sql")
		rt := routeTable(t, `routes:
  - name: chat
    match: {model: chat}
    backends: [{model: B}]
    loraAdapters: [sql]
`)
		m := &swapMembership{}
		setEngines(m, modelEngine("eB", "B", b.URL(), "sql"))
		s := startIngress(t, testConfig(), Deps{Membership: m, Routes: rt})
		url := "http://" + s.Addr() + "/v1/completions"
		unload(t, b.URL())
		send(t, url, http.StatusNotFound, "", "model_not_found")
		send(t, url, http.StatusNotFound, "", `every engine of the pool \"B\" of route \"chat\" (1)`)
	})

	t.Run("gossip adapter", func(t *testing.T) {
		// No flag or route names sql: the engines' gossip alone does.
		a0, a1 := simServing(t, "alpha", "", "sql"), simServing(t, "alpha", "", "sql")
		m := &swapMembership{}
		setEngines(m, modelEngine("a0", "alpha", a0.URL(), "sql"), modelEngine("a1", "alpha", a1.URL(), "sql"))
		s := startIngress(t, testConfig(), Deps{Membership: m})
		url := "http://" + s.Addr() + "/v1/completions"
		send(t, url, http.StatusOK, "", "")
		unload(t, a0.URL())
		unload(t, a1.URL())
		send(t, url, http.StatusNotFound, "", "model_not_found") // both deny it
		setEngines(m, modelEngine("a0", "alpha", a0.URL()), modelEngine("a1", "alpha", a1.URL()))
		send(t, url, http.StatusNotFound, "", "no engine of its base model")
		load(t, a1.URL())
		setEngines(m, modelEngine("a0", "alpha", a0.URL()), modelEngine("a1", "alpha", a1.URL(), "sql"))
		send(t, url, http.StatusOK, "a1", "")
	})
}
