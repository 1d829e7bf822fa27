package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

func routeTable(t testing.TB, body string) routes.Static {
	t.Helper()
	c, err := routes.Parse([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\n" + body))
	if err != nil {
		t.Fatal(err)
	}
	return routes.Static{T: routes.NewTable(c, nil)}
}

// poolEngines names each sim "<model><i>", so X-Kvmesh-Engine tells the pool.
func poolEngines(sims []*sim.Server, model string) []StaticEngine {
	var es []StaticEngine
	for i, s := range sims {
		es = append(es, StaticEngine{ID: model + strconv.Itoa(i), Model: model, URL: s.URL()})
	}
	return es
}

// send posts body and returns the status, the serving engine and the body;
// a streamed answer is read to its end and must end with [DONE] and carry
// no error event. Safe from any goroutine (no t.Fatal).
func send(c *http.Client, url, body string) (int, string, string, error) {
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", "", err
	}
	eng := resp.Header.Get("X-Kvmesh-Engine")
	if resp.StatusCode == 200 && strings.Contains(body, `"stream":true`) {
		if !bytes.Contains(b, []byte("data: [DONE]")) || bytes.Contains(b, []byte(`data: {"error"`)) {
			return resp.StatusCode, eng, string(b), fmt.Errorf("broken stream: %s", b)
		}
	}
	return resp.StatusCode, eng, string(b), nil
}

func pool(engine string) string { return strings.TrimRight(engine, "0123456789") }

// TestRouteWeightedSplit: an 80/20 split over 400 requests lands within ±8
// percentage points of 80%. The count of "big" picks is Binomial(400, 0.8):
// sd = 8 requests (2 pp); |X-320| > 32 (4 sd) has exact probability
// 5.6e-5, so this fails fewer than 1 in 10,000 runs. (±6 pp would fail
// 2.2e-3 of runs: too flaky.) Every answer is a 200 from the sim, which
// refuses a model it does not serve: the body's "model" was rewritten.
func TestRouteWeightedSplit(t *testing.T) {
	engines := append(poolEngines(startSims(t, 2, "big"), "big"), poolEngines(startSims(t, 1, "small"), "small")...)
	rt := routeTable(t, `routes:
  - name: split
    match: {model: chat}
    backends: [{model: big, weight: 80}, {model: small, weight: 20}]
    loraAdapters: [sql-lora]
`)
	s := startIngress(t, testConfig(engines...), Deps{Routes: rt})
	url := "http://" + s.Addr() + "/v1/completions"
	const n = 400
	counts := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int, n)
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				st, eng, body, err := send(http.DefaultClient, url, fmt.Sprintf(`{"model":"chat","prompt":"request %d","max_tokens":2}`, i))
				if err == nil && st != 200 {
					err = fmt.Errorf("status %d: %s", st, body)
				}
				if err != nil {
					errs <- err
					continue
				}
				mu.Lock()
				counts[pool(eng)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if counts["big"]+counts["small"] != n {
		t.Fatalf("counts %v", counts)
	}
	share := float64(counts["big"]) / n
	if share < 0.72 || share > 0.88 {
		t.Fatalf("big got %.1f%% of %d requests, want 80%% ± 8 pp (counts %v)", share*100, n, counts)
	}
	t.Logf("split: %v (big %.1f%%)", counts, share*100)

	// /v1/models lists the pools and the names the route accepts.
	resp, err := http.Get("http://" + s.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Data []struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, ",") != "big,chat,small,sql-lora" {
		t.Fatalf("/v1/models = %v", ids)
	}
}

// TestRouteFallsBackWhenPoolKilled: with the primary pool's engines gone,
// every request (streamed or not) is answered by the fallback pool, with no
// failure the client sees.
func TestRouteFallsBackWhenPoolKilled(t *testing.T) {
	prim := startSims(t, 2, "primary")
	engines := append(poolEngines(prim, "primary"), poolEngines(startSims(t, 1, "backup"), "backup")...)
	rt := routeTable(t, `routes:
  - name: r
    match: {model: "chat*"}
    backends: [{model: primary}]
    fallback: [backup]
`)
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(engines...), Deps{Routes: rt, Registry: reg})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := 0; i < 4; i++ {
		st, eng, body, err := send(http.DefaultClient, url, `{"model":"chat","prompt":"hello","max_tokens":2}`)
		if err != nil || st != 200 || pool(eng) != "primary" {
			t.Fatalf("before the kill: %d %q %v %s", st, eng, err, body)
		}
	}
	for _, p := range prim {
		p.Close()
	}
	for i := 0; i < 20; i++ {
		body := fmt.Sprintf(`{"model":"chat-v2","prompt":"after %d","max_tokens":3,"stream":%v}`, i, i%2 == 0)
		st, eng, out, err := send(http.DefaultClient, url, body)
		if err != nil || st != 200 || pool(eng) != "backup" {
			t.Fatalf("request %d after the kill: status %d engine %q err %v body %s", i, st, eng, err, out)
		}
	}
	// The first requests after the kill reached the dead pool and moved on
	// (later ones may skip it once passive health ejects its engines).
	if v := counterVecValue(t, reg, "kvmesh_ingress_upstream_attempts_total", "connect_error"); v < 1 {
		t.Fatalf("no failed attempt on the dead pool (connect_error = %v): the fallback path was not exercised", v)
	}
}

func TestRouteRateLimit(t *testing.T) {
	engines := poolEngines(startSims(t, 1, "m"), "m")
	rt := routeTable(t, `routes:
  - name: limited
    match: {model: m}
    backends: [{model: m}]
    rateLimit: {requestsPerMinute: 2}
`)
	s := startIngress(t, testConfig(engines...), Deps{Routes: rt})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := 0; i < 2; i++ {
		if st, _, body, err := send(http.DefaultClient, url, `{"model":"m","prompt":"x","max_tokens":1}`); err != nil || st != 200 {
			t.Fatalf("request %d: %d %v %s", i, st, err, body)
		}
	}
	st, hdr, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":"x","max_tokens":1}`)
	if st != 429 {
		t.Fatalf("third request: %d %s", st, body)
	}
	if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 1 || ra > 30 {
		t.Fatalf("Retry-After %q, want 1..30 s", hdr.Get("Retry-After"))
	}
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, `"limited"`) {
		t.Fatalf("error body %s", body)
	}
	// /v1/models lists the served model and the route's names once.
	resp, err := http.Get("http://" + s.Addr() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Data []struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "m" {
		t.Fatalf("/v1/models: %+v %v", list, err)
	}
	// A model no route matches is not limited by the route.
	if st, _, _, _ := send(http.DefaultClient, url, `{"model":"nope","prompt":"x"}`); st != 404 {
		t.Fatalf("unrouted unknown model: %d", st)
	}
}

// TestRouteHotReloadDropsNothing rewrites the routes file (good and bad
// versions) while requests stream; every request must succeed, and both
// pools must have served after the reloads.
func TestRouteHotReloadDropsNothing(t *testing.T) {
	engines := append(poolEngines(startSims(t, 1, "a"), "a"), poolEngines(startSims(t, 1, "b"), "b")...)
	path := filepath.Join(t.TempDir(), "routes.yaml")
	cfgFor := func(model string) string {
		return "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: r, match: {model: chat}, backends: [{model: " + model + "}]}]\n"
	}
	gen := 0
	writeGen := func(data string) {
		gen++
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		mt := time.Unix(1_800_000_000+int64(gen), 0) // distinct mtimes: each write is seen
		if err := os.Chtimes(path, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	writeGen(cfgFor("a"))
	w, err := routes.NewWatcher(routes.WatcherConfig{Path: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s := startIngress(t, testConfig(engines...), Deps{Routes: w})
	url := "http://" + s.Addr() + "/v1/completions"

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := map[string]int{}
	var failures []string
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":"chat","prompt":"g%d r%d","max_tokens":4,"stream":%v}`, g, i, i%2 == 0)
				st, eng, out, err := send(http.DefaultClient, url, body)
				mu.Lock()
				if err != nil || st != 200 {
					failures = append(failures, fmt.Sprintf("%d %v %.200s", st, err, out))
				} else {
					served[pool(eng)]++
				}
				mu.Unlock()
			}
		}(g)
	}
	total := func() int { mu.Lock(); defer mu.Unlock(); return served["a"] + served["b"] }
	for k := 0; k < 12; k++ {
		next := cfgFor([]string{"b", "a"}[k%2])
		if k%3 == 2 {
			next = "kind: broken\n" // rejected: the previous table stays
		}
		writeGen(next)
		w.Check()
		before := total()
		testutil.WaitFor(t, 30*time.Second, "requests after a reload", func() bool { return total() >= before+5 })
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d requests failed during reloads, first: %s", len(failures), failures[0])
	}
	if served["a"] == 0 || served["b"] == 0 || w.ReloadErrors() != 4 {
		t.Fatalf("served %v, reload errors %v (want both pools and 4)", served, w.ReloadErrors())
	}
}

func TestRewriteModel(t *testing.T) {
	cases := []struct{ in, model, want string }{
		{`{"model":"chat","prompt":"x"}`, "big", `{"model":"big","prompt":"x"}`},
		{`{ "prompt":"model", "model" : "c\"x" }`, `q"1`, `{ "prompt":"model", "model" : "q\"1" }`},
		{`{"prompt":"x"}`, "big", `{"prompt":"x"}`},
		// A repeated key: the ingress routed on the last; every one names
		// the routed model, whichever the engine's parser reads.
		{`{"model":"a","n":1,"mod\u0065l":"chat"}`, "big", `{"model":"big","n":1,"mod\u0065l":"big"}`},
	}
	for _, tc := range cases {
		if got := string(rewriteModel(nil, []byte(tc.in), tc.model)); got != tc.want {
			t.Errorf("rewriteModel(%s, %q) = %s, want %s", tc.in, tc.model, got, tc.want)
		}
	}
}

// counterVecValue sums a counter's series whose label values include value.
func counterVecValue(t *testing.T, reg *prometheus.Registry, name, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == value {
					v += m.GetCounter().GetValue()
				}
			}
		}
	}
	return v
}

// TestRoutesFileWiredByOptions: Config.Routes (YAML routesFile) becomes a
// hot-reloading Deps.Routes; a bad file fails at start.
func TestRoutesFileWiredByOptions(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: r, match: {model: chat}, backends: [{model: m}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]byte("routesFile: " + good + "\n"))
	if err != nil || cfg.Routes != good {
		t.Fatalf("routesFile: %q %v", cfg.Routes, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := DefaultOptions()
	o.Config = cfg
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	deps, err := o.deps(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	if deps.Routes == nil || deps.Routes.Table().Len() != 1 {
		t.Fatal("no routes wired")
	}
	o.Config.Routes = filepath.Join(dir, "missing.yaml")
	if _, err := o.deps(ctx, log); !errors.Is(err, routes.ErrConfig) {
		t.Fatalf("missing routes file: err = %v", err)
	}
}

// TestRouteAdapterKeepsItsName: a request naming a route's LoRA adapter is
// served by the backend pool, keyed and scheduled as that adapter on it, and
// keeps the adapter name upstream; a plain request to the route is rewritten.
func TestRouteAdapterKeepsItsName(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "a0", Model: "a", URL: "http://127.0.0.1:1"})
	rt := routeTable(t, `routes:
  - name: r
    match: {model: chat}
    backends: [{model: a}]
    loraAdapters: [sql-lora]
`)
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Routes: rt})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ asked, lora, upstream string }{
		{"sql-lora", "sql-lora", `{"model":"sql-lora","prompt":[1,2,3]}`},
		{"chat", "", `{"model":"a","prompt":[1,2,3]}`},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetBody([]byte(`{"model":"` + tc.asked + `","prompt":[1,2,3]}`))
		c := &call{}
		c.reset()
		c.s, c.ep = s, epCompletions
		if err := c.prepare(&ctx); err != nil {
			t.Fatal(err)
		}
		if served, lora := c.adapterOf(); served != "a" || lora != tc.lora || c.sreq.LoRA != tc.lora {
			t.Errorf("%s: served %q lora %q (sreq %q), want a and %q", tc.asked, served, lora, c.sreq.LoRA, tc.lora)
		}
		if got := string(c.upstreamBody()); got != tc.upstream {
			t.Errorf("%s: upstream body %s, want %s", tc.asked, got, tc.upstream)
		}
	}
}

// TestRoutesWatcherRunsWithTheServer: the routes file's watcher is one of
// the server's goroutines: it reloads while the server runs and stops with
// Close, also when the context the server was built with never ends (it
// used to run on that context and outlive the server).
func TestRoutesWatcherRunsWithTheServer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.yaml")
	write := func(model string) {
		t.Helper()
		body := "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: r, match: {model: chat}, backends: [{model: " + model + "}]}]\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	o := DefaultOptions()
	o.Config = testConfig(StaticEngine{ID: "a0", Model: "a", URL: "http://127.0.0.1:1"})
	o.Config.Listen = "127.0.0.1:0"
	o.Config.Routes = path
	s, err := o.NewServer(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	backend := func() string {
		r, ok := s.deps.Routes.Table().Match("chat", "/v1/completions", func(string) []byte { return nil })
		if !ok {
			return ""
		}
		return r.Pick(0)
	}
	write("b")
	testutil.WaitFor(t, 30*time.Second, "the routes file reloaded", func() bool { return backend() == "b" })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "no routes watcher left after Close", func() bool {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		return !strings.Contains(b.String(), "routes.(*Watcher).Run")
	})
}
