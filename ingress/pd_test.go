package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// fakePDEngine is a FAKE engine speaking the HTTP half of vLLM's NIXL P/D
// protocol, until the simulator's own P/D mode (branch pdengine) is merged
// and the end-to-end tests run against it: a request with
// kv_transfer_params.do_remote_decode is a prefill leg and is answered with
// kv_transfer_params; any other request is answered as a normal completion
// (streamed or not) and its kv_transfer_params are recorded.
type fakePDEngine struct {
	ln   net.Listener
	srv  *http.Server
	fail bool // answer prefill legs with 500
	// notFound, when set, is the body of a 404 answering prefill legs.
	notFound atomic.Pointer[string]
	// unauthorized answers prefill legs 401 as vLLM started with
	// --api-key answers a request without its key.
	unauthorized atomic.Bool
	prefills     atomic.Int64
	decodes      atomic.Int64
	params       atomic.Value // string: the last decode leg's kv_transfer_params
	prefillB     atomic.Value // string: the last prefill leg's body
	// onPrefill, when set, runs as a prefill leg arrives (the leg is in
	// flight at the ingress meanwhile).
	onPrefill func()
}

func startFakePD(t *testing.T, fail bool) *fakePDEngine {
	t.Helper()
	return startFakePDWith(t, fail, nil)
}

// startFakePDWith is startFakePD with onPrefill run as each prefill leg
// arrives.
func startFakePDWith(t *testing.T, fail bool, onPrefill func()) *fakePDEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePDEngine{ln: ln, fail: fail, onPrefill: onPrefill}
	f.params.Store("")
	f.prefillB.Store("")
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve)}
	go f.srv.Serve(ln)
	t.Cleanup(func() { f.srv.Close() })
	return f
}

func (f *fakePDEngine) url() string { return "http://" + f.ln.Addr().String() }

func (f *fakePDEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var m struct {
		Stream bool            `json:"stream"`
		KV     json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, 400)
		return
	}
	if strings.Contains(string(m.KV), `"do_remote_decode":true`) {
		if f.onPrefill != nil {
			f.onPrefill()
		}
		f.prefills.Add(1)
		f.prefillB.Store(string(body))
		if f.fail {
			http.Error(w, `{"error":{"message":"boom"}}`, 500)
			return
		}
		if f.unauthorized.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"Unauthorized"}`)
			return
		}
		if nf := f.notFound.Load(); nf != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, *nf)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[7,8],"remote_engine_id":"eng-p","remote_request_id":"req-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}}`)
		return
	}
	f.decodes.Add(1)
	f.params.Store(string(m.KV))
	if m.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, completionEvent(0, "t0", ""))
		io.WriteString(w, completionEvent(1, "t1", "length"))
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"cmpl-d","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"t0t1","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
}

// roleMembership lists engines with roles (static membership has none).
type roleMembership []EngineInfo

func (m roleMembership) Engines(dst []EngineInfo) []EngineInfo { return append(dst, m...) }

func startPDIngress(t *testing.T, policy string, cfg PDConfig, engines ...EngineInfo) *Server {
	t.Helper()
	return startPDIngressWith(t, policy, cfg, testConfig(), engines...)
}

// startPDIngressWith is startPDIngress with the rest of the ingress's
// config from c.
func startPDIngressWith(t *testing.T, policy string, cfg PDConfig, c Config, engines ...EngineInfo) *Server {
	t.Helper()
	c.PD = cfg
	return startIngress(t, c, Deps{Membership: roleMembership(engines), PD: pdRouter(t, policy)})
}

// pdRouter is the P/D step of policy over kvmesh's scheduler.
func pdRouter(t *testing.T, policy string) *pd.Router {
	t.Helper()
	sched, err := registry.NewPolicy("kvmesh", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := pd.New(pd.Config{Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	router, err := pd.NewRouter(sched, pol)
	if err != nil {
		t.Fatal(err)
	}
	return router
}

func pdEngine(id string, role scheduler.Role, url string) EngineInfo {
	return EngineInfo{Engine: scheduler.Engine{ID: id, Model: "m", Healthy: true, Role: role}, URL: url}
}

// TestPDTwoLegs: a disaggregated request's prefill leg carries the NIXL
// request fields, the decode leg the prefill answer's kv_transfer_params
// verbatim, and the client gets the decode engine's ordinary answer
// (streamed and not).
func TestPDTwoLegs(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	for _, stream := range []bool{false, true} {
		body := `{"model":"m","prompt":[1,2,3],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`
		if !stream { // vLLM refuses stream_options without stream
			body = `{"model":"m","prompt":[1,2,3],"max_tokens":2,"stream":false}`
		}
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("stream %v: status %d engine %q body %s", stream, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		if stream {
			evs := sseEvents(b)
			if len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("stream events %q", evs)
			}
		} else if !strings.Contains(string(b), `"text":"t0t1"`) || strings.Contains(string(b), "kv_transfer_params") {
			t.Fatalf("body %s: want the decode engine's answer", b)
		}
		var pb map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p.prefillB.Load().(string)), &pb); err != nil {
			t.Fatal(err)
		}
		if string(pb["stream"]) != "false" || string(pb["max_tokens"]) != "1" || pb["stream_options"] != nil {
			t.Fatalf("prefill leg body %v", p.prefillB.Load())
		}
		var kv map[string]any
		if err := json.Unmarshal([]byte(d.params.Load().(string)), &kv); err != nil {
			t.Fatalf("decode leg kv_transfer_params %q: %v", d.params.Load(), err)
		}
		if kv["remote_engine_id"] != "eng-p" || kv["remote_request_id"] != "req-1" || kv["do_remote_prefill"] != true || kv["tp_size"] != float64(1) {
			t.Fatalf("decode leg kv_transfer_params %v", kv)
		}
	}
	if p.decodes.Load() != 0 || d.prefills.Load() != 0 {
		t.Fatalf("legs crossed: prefill engine decoded %d, decode engine prefilled %d", p.decodes.Load(), d.prefills.Load())
	}
}

// TestPDPrefillFailsFallsBack: a 5xx prefill leg costs the client nothing:
// the decode engine serves the request aggregated (no kv_transfer_params).
func TestPDPrefillFailsFallsBack(t *testing.T) {
	p, d := startFakePD(t, true), startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || p.prefills.Load() != 1 {
		t.Fatalf("status %d engine %q prefills %d body %s", st, hdr.Get("X-Kvmesh-Engine"), p.prefills.Load(), b)
	}
	if kv := d.params.Load().(string); kv != "" {
		t.Fatalf("fallback decode leg carried kv_transfer_params %s", kv)
	}
}

// TestPDPrefillStatus5xxEjects: a NIXL prefill engine answering every leg
// with 500 is held to account as on the aggregated path and SGLang's leg:
// three in a row eject it (its probe fails: it stays out), and the legs go
// to the healthy prefill engine. Its 5xx used to count nowhere: the engine
// looked idle and fast, and the cost model sent it almost every leg.
func TestPDPrefillStatus5xxEjects(t *testing.T) {
	bad, good, d := startFakePD(t, true), startFakePD(t, false), startFakePD(t, false)
	loaded := pdEngine("p1", scheduler.RolePrefill, good.url())
	loaded.Waiting = 2 // the cost model ranks the failing p0 first while it is in routing
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, bad.url()), loaded, pdEngine("d0", scheduler.RoleDecode, d.url()))
	for i := range 6 {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	legs := s.pdInit().legs
	if n, f, ok := bad.prefills.Load(), val(legs.WithLabelValues("prefill", "fallback_status_5xx")), val(legs.WithLabelValues("prefill", "ok")); n != 3 || f != 3 || ok != 3 {
		t.Fatalf("failing engine sent %d legs, %v fell back, %v ok on the healthy one; want 3, 3, 3", n, f, ok)
	}
	if s.health.allowed("p0") || !s.health.allowed("p1") {
		t.Fatalf("allowed: p0 %v, p1 %v; want the failing prefill engine ejected only", s.health.allowed("p0"), s.health.allowed("p1"))
	}
	if up := s.ups.lookup("p0"); up == nil || up.failures.Load() != 3 {
		t.Fatalf("p0's failures not counted: %v", up)
	}
}

// TestPDPrefillDeniesModel: a prefill engine answering that it does not
// serve the model (it was swapped in place, or another engine took its
// address) is not the request's fault: the request is served aggregated
// on the decode engine, the prefill engine is ejected (the next request
// sends it no leg), and the leg counts as fallback_wrong_model. A 404 that
// does not name the model is the engine's verdict and is relayed.
func TestPDPrefillDeniesModel(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	denial := "{\"error\":{\"message\":\"The model `m` does not exist.\",\"type\":\"NotFoundError\",\"code\":404}}"
	p.notFound.Store(&denial)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	// The results to alert on exist at 0 before any leg (docs/OPERATIONS.md).
	if n := promtest.CollectAndCount(s.pdInit().legs); n != len(pdAlertResults) {
		t.Fatalf("%d P/D leg series before any request, want the %d alert results at 0", n, len(pdAlertResults))
	}
	for i := range 2 {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || d.params.Load().(string) != "" {
			t.Fatalf("request %d: status %d engine %q decode params %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), d.params.Load(), b)
		}
	}
	if n, f := p.prefills.Load(), val(s.pdInit().legs.WithLabelValues("prefill", "fallback_wrong_model")); n != 1 || f != 1 {
		t.Fatalf("prefill legs sent %d, counted fallback_wrong_model %v; want 1 each (the denying engine is ejected)", n, f)
	}
	if s.health.allowed("p0") || !s.health.allowed("d0") {
		t.Fatalf("ejected: prefill %v, decode %v; want only the denying prefill engine", !s.health.allowed("p0"), !s.health.allowed("d0"))
	}

	// Another 404, naming no model: relayed as the prefill engine's answer.
	p2 := startFakePD(t, false)
	other := `{"error":{"message":"no such route","type":"NotFoundError","code":404}}`
	p2.notFound.Store(&other)
	s2 := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p2.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	st, hdr, b := post(t, http.DefaultClient, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 404 || hdr.Get("X-Kvmesh-Engine") != "p0" || string(b) != other {
		t.Fatalf("status %d engine %q body %s; want the prefill engine's 404 relayed", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if !s2.health.allowed("p0") {
		t.Fatal("a 404 naming no model ejected the prefill engine")
	}
}

// TestPDPrefillRefusesCredential: a prefill engine answering 401 refused
// the ingress's engine key, not the client's: the request is served
// aggregated on the decode engine (fallback_credential_refused), never
// relayed as the client's 401, and the engine gets no more prefill legs for
// a while (markRefusedKey): before, the cost model kept choosing it, idle as
// it looked, and 49 of 50 legs went to it and fell back (tester h-reg3).
func TestPDPrefillRefusesCredential(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	p.unauthorized.Store(true)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || d.params.Load().(string) != "" {
		t.Fatalf("status %d engine %q decode params %q body %s; want served aggregated on d0", st, hdr.Get("X-Kvmesh-Engine"), d.params.Load(), b)
	}
	if f := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_credential_refused")); f != 1 {
		t.Fatalf("fallback_credential_refused legs = %v, want 1", f)
	}

	// Beside an open prefill engine: the refusing one is tried once at most.
	open := startFakePD(t, false)
	s2 := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("p1", scheduler.RolePrefill, open.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	before := p.prefills.Load()
	for i := range 8 {
		if st, _, b := post(t, http.DefaultClient, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`); st != 200 {
			t.Fatalf("request %d: status %d body %s", i, st, b)
		}
	}
	if n, ok := p.prefills.Load()-before, open.prefills.Load(); n > 1 || ok < 7 {
		t.Fatalf("prefill legs: %d to the refusing engine, %d to the open one; want at most 1 refused, the rest on the open one", n, ok)
	}
}

// TestPDPrefillEngineHung: a prefill engine that accepts connections and
// answers nothing costs the client nothing either: the stall watch ejects it
// and cuts the waiting prefill leg, and the decode engine serves the request
// aggregated, long before the idle timeout.
func TestPDPrefillEngineHung(t *testing.T) {
	d := startFakePD(t, false)
	c := testConfig()
	c.IdleTimeout = 10 * time.Minute
	c.Health.StallAfter, c.Health.ProbeTimeout = 100*time.Millisecond, 200*time.Millisecond
	s := startPDIngressWith(t, "kvmesh-always", PDConfig{}, c,
		pdEngine("p0", scheduler.RolePrefill, frozenEngine(t)), pdEngine("d0", scheduler.RoleDecode, d.url()))
	client := &http.Client{Timeout: time.Minute} // far below the idle timeout
	st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if kv := d.params.Load().(string); kv != "" {
		t.Fatalf("fallback decode leg carried kv_transfer_params %s", kv)
	}
	if got := seriesSum(s.health.stalls); got != 1 {
		t.Fatalf("%v stall ejections, want 1", got)
	}
	if got := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_stalled")); got != 1 {
		t.Fatalf("%v prefill legs counted as cut by the stall watch, want 1", got)
	}
}

// TestPDPrefillQueueFull: with no slot and no queue on the prefill engine,
// the request falls back like any prefill failure and is served aggregated
// on the decode engine (it used to get 429 although the decode engine was
// free), and the access log names the leg's result (it was written before
// the result was recorded, which then touched a call already back in its
// pool).
func TestPDPrefillQueueFull(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	var log testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	s := startIngress(t, c, Deps{PD: pdRouter(t, "kvmesh-always"), AccessLog: slog.New(slog.NewJSONHandler(&log, nil)),
		Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url())}})
	s.pdInit().gate("p0").slots <- struct{}{} // the one slot is taken
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || p.prefills.Load() != 0 || d.decodes.Load() != 1 || d.params.Load().(string) != "" {
		t.Fatalf("status %d engine %q body %s; prefills %d decodes %d with params %q", st, hdr.Get("X-Kvmesh-Engine"), b, p.prefills.Load(), d.decodes.Load(), d.params.Load())
	}
	if n := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_queue_full")); n != 1 {
		t.Fatalf("%v legs fell back for a full queue, want 1", n)
	}
	testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(log.String(), `"prefill_result"`) })
	if l := log.String(); !strings.Contains(l, `"prefill_result":"fallback_queue_full"`) {
		t.Fatalf("access log %s", l)
	}
}

// TestPDPrefillQueueFullDecodeQueueing: a full prefill queue falls back to
// aggregated only onto a decode engine that is not queueing itself; when
// it is, no engine is left for the request and the client gets 429
// prefill_queue_full (OpenAI's error body), and neither engine is sent it.
func TestPDPrefillQueueFullDecodeQueueing(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	busy := pdEngine("d0", scheduler.RoleDecode, d.url())
	busy.Waiting = 3
	s := startIngress(t, c, Deps{PD: pdRouter(t, "kvmesh-always"),
		Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p.url()), busy}})
	s.pdInit().gate("p0").slots <- struct{}{} // the one slot is taken
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 429 || hdr.Get("Retry-After") == "" || !strings.Contains(string(b), `"code":"prefill_queue_full"`) || p.prefills.Load() != 0 || d.decodes.Load() != 0 {
		t.Fatalf("status %d retry-after %q body %s; prefills %d decodes %d", st, hdr.Get("Retry-After"), b, p.prefills.Load(), d.decodes.Load())
	}
	if n := val(s.pdInit().legs.WithLabelValues("prefill", "rejected")); n != 1 {
		t.Fatalf("%v legs rejected, want 1", n)
	}
}

// TestPDRejectionHidesEnginesWithHeaderOff: with Config.EngineHeader off
// (an engine id defaults to its address) the 429 of a full prefill queue
// names no engine to the client; the access log keeps them. It named both
// whatever the header's setting.
func TestPDRejectionHidesEnginesWithHeaderOff(t *testing.T) {
	for _, on := range []bool{true, false} {
		p, d := startFakePD(t, false), startFakePD(t, false)
		var log testutil.SyncBuffer
		c := testConfig()
		c.EngineHeader = on
		c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
		busy := pdEngine("10.9.8.7:8001", scheduler.RoleDecode, d.url())
		busy.Waiting = 3
		s := startIngress(t, c, Deps{PD: pdRouter(t, "kvmesh-always"), AccessLog: slog.New(slog.NewJSONHandler(&log, nil)),
			Membership: roleMembership{pdEngine("10.9.8.7:8000", scheduler.RolePrefill, p.url()), busy}})
		s.pdInit().gate("10.9.8.7:8000").slots <- struct{}{} // the one slot is taken
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 429 || !strings.Contains(string(b), `"code":"prefill_queue_full"`) || strings.Contains(string(b), "10.9.8.7") == !on {
			t.Fatalf("header on %v: status %d body %s; want a 429 naming the engines only with the header on", on, st, b)
		}
		testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(log.String(), `"prefill_result"`) })
		if l := log.String(); !strings.Contains(l, "10.9.8.7:8000, and 10.9.8.7:8001 is queueing") {
			t.Fatalf("header on %v: access log %s: want the engines named", on, l)
		}
	}
}

// TestPDPrefillQueueFullFallbackEngineQueueing: the 429 is decided on the
// engine the aggregated fallback would take (the ranking's head), not on
// the plan's decode engine, here one the scheduler did not rank.
func TestPDPrefillQueueFullFallbackEngineQueueing(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	busy := pdEngine("d0", scheduler.RoleDecode, d.url())
	busy.Waiting = 3
	s := startIngress(t, c, Deps{PD: goneDecodePlanner{pdRouter(t, "kvmesh-always")},
		Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p.url()), busy}})
	s.pdInit().gate("p0").slots <- struct{}{} // the one slot is taken
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 429 || !strings.Contains(string(b), `"code":"prefill_queue_full"`) || p.prefills.Load() != 0 || d.decodes.Load() != 0 {
		t.Fatalf("status %d body %s; prefills %d decodes %d", st, b, p.prefills.Load(), d.decodes.Load())
	}
}

// TestPDPrefillQueueFullNextPrefill: a prefill engine whose queue is full
// moves the leg to the plan's next prefill engine for the same decode
// engine (vLLM's NIXL protocol, as SGLang's next pair); the refusal is
// counted as next_queue_full, the leg's own result as ok, and the access
// log names the prefill engine that ran it. With every prefill queue full
// the request is served aggregated on the decode engine as before.
func TestPDPrefillQueueFullNextPrefill(t *testing.T) {
	p0, p1, d := startFakePD(t, false), startFakePD(t, false), startFakePD(t, false)
	var log testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	loaded := pdEngine("p1", scheduler.RolePrefill, p1.url())
	loaded.Waiting = 2 // the cost model ranks p0 first
	s := startIngress(t, c, Deps{PD: pdRouter(t, "kvmesh-always"), AccessLog: slog.New(slog.NewJSONHandler(&log, nil)),
		Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p0.url()), loaded, pdEngine("d0", scheduler.RoleDecode, d.url())}})
	p := s.pdInit()
	p.gate("p0").slots <- struct{}{} // p0's one slot is taken, and it has no queue
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || p0.prefills.Load() != 0 || p1.prefills.Load() != 1 || d.decodes.Load() != 1 || d.params.Load().(string) == "" {
		t.Fatalf("status %d engine %q body %s; prefills p0 %d p1 %d, decodes %d with params %q", st, hdr.Get("X-Kvmesh-Engine"), b,
			p0.prefills.Load(), p1.prefills.Load(), d.decodes.Load(), d.params.Load())
	}
	next, ok, full := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "ok")), val(p.legs.WithLabelValues("prefill", "fallback_queue_full"))
	if next != 1 || ok != 1 || full != 0 {
		t.Fatalf("legs: %v next_queue_full, %v ok, %v fallback_queue_full; want 1, 1, 0", next, ok, full)
	}
	testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(log.String(), `"prefill_result"`) })
	if l := log.String(); !strings.Contains(l, `"prefill_engine":"p1","prefill_result":"ok"`) {
		t.Fatalf("access log %s", l)
	}

	p.gate("p1").slots <- struct{}{} // now both are full: aggregated on d0
	st, hdr, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || p0.prefills.Load()+p1.prefills.Load() != 1 || d.params.Load().(string) != "" {
		t.Fatalf("both full: status %d engine %q body %s; prefills %d, decode params %q", st, hdr.Get("X-Kvmesh-Engine"), b,
			p0.prefills.Load()+p1.prefills.Load(), d.params.Load())
	}
	if next, full := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "fallback_queue_full")); next != 2 || full != 1 {
		t.Fatalf("both full: %v next_queue_full (want 2), %v fallback_queue_full (want 1)", next, full)
	}
}

// fixedPlanner is a FAKE P/D planner that returns one plan, for tests of
// how the ingress walks a plan's options.
type fixedPlanner struct{ plan pd.Plan }

func (f fixedPlanner) Policy() string { return "fixed" }

func (f fixedPlanner) Route(_ *scheduler.Request, _ []scheduler.Engine, plan *pd.Plan) error {
	opts := append(plan.Options[:0], f.plan.Options...)
	*plan = f.plan
	plan.Options = opts
	return nil
}

// TestPDPrefillQueueFullNextPrefillCharge: the leg moved to another
// prefill engine charges that engine's load with the tokens it does not
// cache (its own option's prefix match, not the plan's first engine's);
// and the walk down the options stops at the aggregated option on the
// decode engine: a pair the cost model ranks below serving the request
// whole is not tried.
func TestPDPrefillQueueFullNextPrefillCharge(t *testing.T) {
	var srv atomic.Pointer[Server] // set before any request: the hook reads it on the engine's goroutine
	charged := make(chan int64, 1)
	p0, p2 := startFakePD(t, false), startFakePD(t, false)
	p1 := startFakePDWith(t, false, func() { charged <- srv.Load().ups.lookup("p1").prefill.Load() })
	d := startFakePD(t, false)
	cached := index.Match{GPU: 1, CPU: 1, Other: 1, Spec: 1} // p0 caches the prompt's block, p1 nothing
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", PrefillMatch: cached, Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0", PrefillMatch: cached}, {Prefill: "p1", Decode: "d0"}, {Decode: "d0"}, {Prefill: "p2", Decode: "d0"}}}
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	s := startIngress(t, c, Deps{PD: fixedPlanner{plan}, Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p0.url()),
		pdEngine("p1", scheduler.RolePrefill, p1.url()), pdEngine("p2", scheduler.RolePrefill, p2.url()), pdEngine("d0", scheduler.RoleDecode, d.url())}})
	srv.Store(s)
	p := s.pdInit()
	p.gate("p0").slots <- struct{}{}
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || p1.prefills.Load() != 1 {
		t.Fatalf("status %d, p1 prefills %d: %s", st, p1.prefills.Load(), b)
	}
	if got := <-charged; got != 3 {
		t.Fatalf("p1 was charged %d prefill tokens during its leg, want 3 (the whole prompt: it caches none of it)", got)
	}

	p.gate("p1").slots <- struct{}{} // p0 and p1 full; p2 has room but ranks below aggregated on d0
	st, _, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || p2.prefills.Load() != 0 || d.params.Load().(string) != "" {
		t.Fatalf("status %d, p2 prefills %d, decode params %q: %s", st, p2.prefills.Load(), d.params.Load(), b)
	}
	if full := val(p.legs.WithLabelValues("prefill", "fallback_queue_full")); full != 1 {
		t.Fatalf("%v fallback_queue_full, want 1", full)
	}
}

func FuzzKVTransferParams(f *testing.F) {
	f.Add([]byte(`{"kv_transfer_params":{"remote_block_ids":[1]}}`))
	f.Add([]byte(`{"kv_transfer_params":null}`))
	f.Add([]byte(`{"choices":[]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		kv, _, ok := kvTransferParams(b)
		if ok && (len(kv) == 0 || kv[0] != '{') {
			t.Fatalf("accepted %q", kv)
		}
		if ok {
			if _, err := withKVParams([]byte(`{"model":"m"}`), kv); err != nil {
				t.Fatalf("params %q from a valid answer do not embed: %v", kv, err)
			}
		}
		_, _ = prefillBody(b, 16, false)
	})
}

// TestPDFromConfig: PDConfig.Policy alone turns the P/D path on over the
// server's own scheduler.
func TestPDFromConfig(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url())}})
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || p.prefills.Load() != 1 || d.params.Load().(string) == "" {
		t.Fatalf("status %d engine %q prefills %d params %q body %s", st, hdr.Get("X-Kvmesh-Engine"), p.prefills.Load(), d.params.Load(), b)
	}
	// The decode answer's output length went into the distribution the
	// P/D step prices streams' TPOT risk over.
	if s.outs == nil || s.outs.Weight("m") <= 0 {
		t.Fatalf("output lengths observed: %v", s.outs)
	}
	bad := testConfig()
	bad.PD = PDConfig{Policy: "nope"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "pd") {
		t.Fatalf("Validate with an unknown P/D policy: %v", err)
	}
}

// TestPDParallelSamplingAggregated: a request with n > 1 (several
// sequences decoded from one prompt) is not split even by kvmesh-always:
// the decode engine serves it whole, no prefill leg is sent.
func TestPDParallelSamplingAggregated(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2,"n":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if p.prefills.Load() != 0 || d.params.Load().(string) != "" {
		t.Fatalf("n=2 was split: %d prefill legs, decode kv_transfer_params %q", p.prefills.Load(), d.params.Load())
	}
	if got := val(s.pdInit().decisions.WithLabelValues("aggregated", "several_sequences")); got != 1 {
		t.Fatalf("%v aggregated decisions counted for n=2, want 1", got)
	}
	// The same request with n 1 is split (the test's control).
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2,"n":1}`); st != 200 || p.prefills.Load() != 1 {
		t.Fatalf("n=1: status %d, %d prefill legs: %s", st, p.prefills.Load(), b)
	}
}

// wholePlanner is a FAKE P/D planner that serves every request whole on
// the first prefill engine that may take one (what kvmesh's P/D step does
// when no decode engine keeps the TPOT objective), and records the
// PrefillOnly mark of every engine it is shown.
type wholePlanner struct {
	only map[string]bool
}

func (w *wholePlanner) Policy() string { return "whole-on-prefill" }

func (w *wholePlanner) Route(_ *scheduler.Request, es []scheduler.Engine, plan *pd.Plan) error {
	*plan = pd.Plan{Mode: pd.Aggregated, Policy: w.Policy(), Reason: "aggregated-on-prefill"}
	for _, e := range es {
		w.only[e.ID] = e.PrefillOnly
		if e.Role == scheduler.RolePrefill && !e.PrefillOnly && plan.Decode == "" {
			plan.Decode = e.ID
		}
	}
	plan.Options = append(plan.Options, pd.Choice{Decode: plan.Decode})
	return nil
}

// TestPDWholeRequestOnPrefillEngine: a plan that serves a request whole on
// a prefill engine sends it there as an ordinary request (no
// kv_transfer_params, streamed and not), and the client gets that engine's
// answer; SGLang's prefill servers reach the planner marked PrefillOnly
// (they take prefill legs only), vLLM's NIXL ones and decode engines not.
func TestPDWholeRequestOnPrefillEngine(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	sg := pdEngine("sg0", scheduler.RolePrefill, "http://127.0.0.1:1")
	sg.PDProtocol = gossip.PDProtocolSGLang
	w := &wholePlanner{only: map[string]bool{}}
	s := startIngress(t, testConfig(), Deps{Membership: roleMembership{sg, pdEngine("p0", scheduler.RolePrefill, p.url()),
		pdEngine("d0", scheduler.RoleDecode, d.url())}, PD: w})
	for _, stream := range []bool{false, true} {
		body := `{"model":"m","prompt":[1,2,3],"max_tokens":2,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "p0" {
			t.Fatalf("stream %v: status %d engine %q body %s", stream, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if p.decodes.Load() != 2 || p.prefills.Load() != 0 || d.decodes.Load()+d.prefills.Load() != 0 {
		t.Fatalf("prefill engine served %d whole, %d legs; decode engine %d requests; want 2, 0, 0",
			p.decodes.Load(), p.prefills.Load(), d.decodes.Load()+d.prefills.Load())
	}
	if kv := p.params.Load().(string); kv != "" {
		t.Fatalf("the whole request carried kv_transfer_params %s", kv)
	}
	if !w.only["sg0"] || w.only["p0"] || w.only["d0"] {
		t.Fatalf("PrefillOnly marks %v: want SGLang's prefill engine only", w.only)
	}
}

// blockingPrefill is a FAKE prefill engine whose legs never finish: each
// waits until its connection is closed (as vLLM aborts a request whose
// client left) and reports it on cut. Other requests (health probes) get 200.
func blockingPrefill(t *testing.T) (url string, arrived, cut <-chan struct{}) {
	t.Helper()
	in := make(chan struct{}, 16)
	ch := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		_, _ = io.ReadAll(r.Body)
		in <- struct{}{}
		<-r.Context().Done()
		ch <- struct{}{}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, in, ch
}

// TestPDPrefillLegTimesOut: PrefillTimeout bounds the leg itself, not only
// its wait for a slot: the engine's connection is closed (it aborts the
// request and frees what it holds) and the request is served aggregated.
// The leg used to wait on an engine as long as it took.
func TestPDPrefillLegTimesOut(t *testing.T) {
	purl, arrived, cut := blockingPrefill(t)
	d := startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{PrefillTimeout: 200 * time.Millisecond},
		pdEngine("p0", scheduler.RolePrefill, purl), pdEngine("d0", scheduler.RoleDecode, d.url()))
	client := &http.Client{Timeout: time.Minute}
	st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || d.params.Load().(string) != "" {
		t.Fatalf("status %d engine %q decode params %q body %s", st, hdr.Get("X-Kvmesh-Engine"), d.params.Load(), b)
	}
	// A leg that reached the engine has its connection closed; one whose
	// deadline passed before it was written (a starved goroutine) is cut
	// before it is sent and never reaches the engine.
	select {
	case <-arrived:
		select {
		case <-cut:
		case <-time.After(30 * time.Second):
			t.Fatal("the prefill engine's connection was never closed")
		}
	default:
	}
	if got := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_timeout")); got != 1 {
		t.Fatalf("%v legs counted as timed out, want 1", got)
	}
}

// TestPDPrefillLegDeadlineBeforeWrite: a leg whose deadline passes before it
// is written (here at once; in production a leg admitted just before its
// deadline, or a slow dial) is cut as it is written, not left unbounded: the
// request is served aggregated. The deadline used to be lost when it fired
// before the leg had a connection, and the leg waited on the engine.
func TestPDPrefillLegDeadlineBeforeWrite(t *testing.T) {
	purl, _, _ := blockingPrefill(t)
	d := startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{PrefillTimeout: time.Nanosecond},
		pdEngine("p0", scheduler.RolePrefill, purl), pdEngine("d0", scheduler.RoleDecode, d.url()))
	client := &http.Client{Timeout: time.Minute} // a hang guard: the leg's engine never answers
	for i := range 5 {
		st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_timeout")); got != 5 {
		t.Fatalf("%v legs counted as timed out, want 5", got)
	}
}

// TestPDPrefillLegClientGone: a client that leaves during the prefill leg
// cancels it (the engine's connection is closed) and no decode leg is sent.
// Abandoned legs used to run to the end and hold their blocks for 480 s.
func TestPDPrefillLegClientGone(t *testing.T) {
	purl, arrived, cut := blockingPrefill(t)
	d := startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{PrefillTimeout: 10 * time.Minute},
		pdEngine("p0", scheduler.RolePrefill, purl), pdEngine("d0", scheduler.RoleDecode, d.url()))
	conn := dialIngress(t, s)
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":2}`
	if _, err := fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	// The leg's request must have reached the engine before the client
	// leaves: a leg cancelled before it is written (the watcher fires
	// watchDelay after the slot is taken) never reaches the engine, and
	// there is no engine connection to see closed.
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the prefill leg never reached the engine")
	}
	_ = conn.Close()
	select {
	case <-cut:
	case <-time.After(30 * time.Second):
		t.Fatal("the prefill engine's connection was never closed")
	}
	testutil.WaitFor(t, 30*time.Second, "the leg counted as the client's", func() bool {
		return val(s.pdInit().legs.WithLabelValues("prefill", "client_gone")) == 1
	})
	if n := d.decodes.Load(); n != 0 {
		t.Fatalf("%d decode legs sent for a client that left", n)
	}
}

// TestPDPrefillConnectErrorEjects: a prefill engine that refuses
// connections leaves this replica's ranking at once, as a decode engine
// would (the request itself is served aggregated); its legs used to be
// planned onto it until gossip marked it down.
func TestPDPrefillConnectErrorEjects(t *testing.T) {
	d := startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, "http://127.0.0.1:1"), pdEngine("d0", scheduler.RoleDecode, d.url()))
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if s.health.allowed("p0") {
		t.Fatal("a prefill engine refusing connections is still allowed")
	}
}

// TestPDFallbackRecordsServingEngine: a request whose prefill leg is given
// up and served aggregated had its prefill done by the engine that
// answered, and every record says so: the learner takes that engine's
// prefill sample (its first token is its own prefill's), the SLO recorder
// credits it the TTFT and the prompt, and the access log names it as the
// prefill engine (prefill_planned keeps the one given up). They used to
// name the plan's prefill engine, which never ran the prefill. The access
// log's pd_mode is "fallback" (pd_planned "disaggregated"), and the request
// counts once in kvmesh_ingress_pd_decisions_total{mode="aggregated"} with
// its protocol's fallback reason; pd_mode used to be the plan's
// ("disaggregated") and NIXL fallbacks were not counted as aggregated,
// SGLang's were. Both protocols: a NIXL leg that fails (500) or finds the
// queue full, and an SGLang pair whose queue is full.
func TestPDFallbackRecordsServingEngine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sglang bool
		fail   bool // the prefill engine answers 500; else its queue is full
		result string
	}{
		{name: "nixl-failed", fail: true, result: "fallback_status_5xx"},
		{name: "nixl-queue-full", result: "fallback_queue_full"},
		{name: "sglang-queue-full", sglang: true, result: "fallback_queue_full"}, // was "concurrent", though no leg ran
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := startFakePD(t, tc.fail), startFakePD(t, false)
			pe := pdEngine("p0", scheduler.RolePrefill, p.url())
			if tc.sglang {
				pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, "127.0.0.1:8998"
			}
			plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", Policy: "fixed", Reason: "test",
				Options: []pd.Choice{{Prefill: "p0", Decode: "d0"}}}
			var log testutil.SyncBuffer
			cfg := testConfig()
			cfg.Listen = "127.0.0.1:0"
			cfg.Scheduler.Policy = "kvmesh" // the learner runs
			cfg.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			s, err := New(cfg, Deps{PD: fixedPlanner{plan}, Logger: quiet, AccessLog: slog.New(slog.NewJSONHandler(&log, nil)),
				Membership: roleMembership{pe, pdEngine("d0", scheduler.RoleDecode, d.url())}})
			if err != nil {
				t.Fatal(err)
			}
			s.slo = NewSLORecorder(SLOConfig{Interval: time.Second}) // what Start does with gossip
			if err := s.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if s.learn == nil {
				t.Fatal("no learner")
			}
			if !tc.fail {
				s.pdInit().gate("p0").slots <- struct{}{} // the one slot is taken, and there is no queue
			}
			st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2,"stream":true}`)
			if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || d.decodes.Load() != 1 || d.params.Load().(string) != "" {
				t.Fatalf("status %d engine %q body %s; decodes %d with params %q", st, hdr.Get("X-Kvmesh-Engine"), b, d.decodes.Load(), d.params.Load())
			}
			testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(log.String(), `"prefill_result"`) })
			if pl, dl := s.learned("p0"), s.learned("d0"); pl.PrefillSamples != 0 || dl.PrefillSamples != 1 {
				t.Errorf("learner: %d prefill samples on p0, %d on d0; want 0 and 1 (d0 did the prefill)", pl.PrefillSamples, dl.PrefillSamples)
			}
			sum := decodeSummary(t, s.slo.Summary())
			if len(sum.Engines) != 1 || sum.Engines[0].ID != "d0" || sum.Engines[0].TTFTN != 1 || sum.Engines[0].PromptTokens != 3 {
				t.Errorf("SLO summary %+v: want the TTFT and prompt on d0 alone", sum.Engines)
			}
			l := log.String()
			for _, want := range []string{`"pd_mode":"fallback","pd_planned":"disaggregated"`, `"prefill_engine":"d0","prefill_result":"` + tc.result + `"`,
				`"prefill_planned":"p0"`} {
				if !strings.Contains(l, want) {
					t.Errorf("access log %s: want %s", l, want)
				}
			}
			reason, other := "nixl_fallback", "sglang_fallback"
			if tc.sglang {
				reason, other = other, reason
			}
			dec := s.pdInit().decisions
			if n, o := val(dec.WithLabelValues("aggregated", reason)), val(dec.WithLabelValues("aggregated", other)); n != 1 || o != 0 {
				t.Errorf("decisions{aggregated,%s} %v, {aggregated,%s} %v; want 1, 0", reason, n, other, o)
			}
		})
	}
}

// TestPDAccessLogServedMode: the access log's pd_mode is how the request
// was served and pd_planned the plan's mode: a NIXL request whose prefill
// leg succeeded is disaggregated in both, one planned aggregated is
// aggregated in both, and neither counts a fallback.
func TestPDAccessLogServedMode(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	var log testutil.SyncBuffer
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0"}}}
	planner := &switchPlanner{}
	planner.plan.Store(&plan)
	s := startIngress(t, testConfig(), Deps{PD: planner, AccessLog: slog.New(slog.NewJSONHandler(&log, nil)),
		Membership: roleMembership{pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url())}})
	lines := func() int { return strings.Count(log.String(), `"prefill_result"`) }
	send := func() {
		t.Helper()
		n := lines()
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return lines() > n })
	}
	last := func() string {
		ls := strings.Split(strings.TrimSpace(log.String()), "\n")
		return ls[len(ls)-1]
	}
	send()
	if l := last(); !strings.Contains(l, `"pd_mode":"disaggregated","pd_planned":"disaggregated","prefill_engine":"p0","prefill_result":"ok"`) {
		t.Fatalf("disaggregated: access log %s", l)
	}
	planner.plan.Store(&pd.Plan{Mode: pd.Aggregated, Decode: "d0", Policy: "fixed", Reason: "test", Options: []pd.Choice{{Decode: "d0"}}})
	send()
	if l := last(); !strings.Contains(l, `"pd_mode":"aggregated","pd_planned":"aggregated","prefill_engine":"","prefill_result":""`) {
		t.Fatalf("aggregated: access log %s", l)
	}
	dec := s.pdInit().decisions
	if n := val(dec.WithLabelValues("aggregated", "nixl_fallback")) + val(dec.WithLabelValues("aggregated", "sglang_fallback")); n != 0 {
		t.Fatalf("%v fallbacks counted, want 0", n)
	}
}

// switchPlanner is a FAKE P/D planner returning the plan last stored.
type switchPlanner struct{ plan atomic.Pointer[pd.Plan] }

func (f *switchPlanner) Policy() string { return "fixed" }

func (f *switchPlanner) Route(_ *scheduler.Request, _ []scheduler.Engine, plan *pd.Plan) error {
	return fixedPlanner{*f.plan.Load()}.Route(nil, nil, plan)
}
