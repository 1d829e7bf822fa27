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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// sglangEngine is a membership entry of an SGLang-mode simulator.
func sglangEngine(id string, role scheduler.Role, s *sim.Server) EngineInfo {
	e := pdEngine(id, role, s.URL())
	e.PDProtocol, e.Bootstrap = gossip.PDProtocolSGLang, s.BootstrapAddr()
	return e
}

// TestSGLangDebugEnginesPrefillOnly: /debug/engines shows an SGLang
// prefill server PrefillOnly, as the scheduler sees it (it takes prefill
// legs only), vLLM's NIXL prefill engines and decode engines not; it showed
// false for every engine. The startup log names the P/D policy in force.
func TestSGLangDebugEnginesPrefillOnly(t *testing.T) {
	var logs testutil.SyncBuffer
	sg := sglangPrefillAt("sg0", "http://127.0.0.1:1")
	c := testConfig()
	c.AdminListen = "127.0.0.1:0"
	c.PD.Policy = "kvmesh-always"
	s := startIngress(t, c, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Membership: roleMembership{sg,
		pdEngine("p0", scheduler.RolePrefill, "http://127.0.0.1:1"), pdEngine("d0", scheduler.RoleDecode, "http://127.0.0.1:1")}})
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/engines", "")
	var got []struct {
		ID          string
		PrefillOnly bool
	}
	if err := json.Unmarshal([]byte(body), &got); st != 200 || err != nil {
		t.Fatalf("%d %s: %v", st, body, err)
	}
	only := map[string]bool{}
	for _, e := range got {
		only[e.ID] = e.PrefillOnly
	}
	if len(only) != 3 || !only["sg0"] || only["p0"] || only["d0"] {
		t.Fatalf("PrefillOnly %v: want SGLang's prefill server only", only)
	}
	if l := logs.String(); !strings.Contains(l, "ingress listening") || !strings.Contains(l, "pd_policy=kvmesh-always") {
		t.Fatalf("startup log does not name the P/D policy:\n%s", l)
	}
}

// sglangPrefillAt is a membership entry of an SGLang prefill engine at url
// whose bootstrap server is never dialled (the decode leg is a fake's).
func sglangPrefillAt(id, url string) EngineInfo {
	e := pdEngine(id, scheduler.RolePrefill, url)
	e.PDProtocol, e.Bootstrap = gossip.PDProtocolSGLang, "127.0.0.1:8998"
	return e
}

// startSGLangCluster starts SGLang-mode simulators (bootstrap servers on
// loopback) and an ingress disaggregating every request.
func startSGLangCluster(t *testing.T, base sim.Config, prefill, decode int) (*simtest.PD, *Server) {
	t.Helper()
	base.Model, base.Logger = "m", slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: prefill, Decode: decode})
	var m roleMembership
	for i, s := range cl.Prefill {
		m = append(m, sglangEngine("p"+string(rune('0'+i)), scheduler.RolePrefill, s))
	}
	for i, s := range cl.Decode {
		m = append(m, sglangEngine("d"+string(rune('0'+i)), scheduler.RoleDecode, s))
	}
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	return cl, startIngress(t, c, Deps{Membership: m})
}

// boundedClient fails a request the ingress never answers instead of
// hanging the test.
var boundedClient = &http.Client{Timeout: 2 * time.Minute}

// TestSGLangBothLegs: a disaggregated request goes to both SGLang engines
// at once; the client gets the decode engine's answer (streamed or not)
// in the aggregated shapes, the decode engine read the prompt's KV from
// the prefill engine's bootstrap server (its usage counts it as cached),
// the prefill engine ran a one-token prefill and freed its blocks.
func TestSGLangBothLegs(t *testing.T) {
	cl, s := startSGLangCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 1, 1)
	p := cl.Prefill[0]
	for i := 0; i < 6; i++ {
		stream := i%2 == 1
		body := `{"model":"m","prompt":"sglang ` + strings.Repeat("word ", 60+i) + `","max_tokens":4,"stream":` +
			map[bool]string{true: "true", false: "false"}[stream] + `,"stream_options":{"include_usage":true}}`
		if !stream {
			body = strings.Replace(body, `,"stream_options":{"include_usage":true}`, "", 1)
		}
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		var usage json.RawMessage
		if stream {
			evs := sseEvents(b)
			if len(evs) < 3 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("request %d: stream events %q", i, evs)
			}
			var last struct {
				Usage json.RawMessage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(evs[len(evs)-2]), &last); err != nil {
				t.Fatalf("request %d: usage chunk %q: %v", i, evs[len(evs)-2], err)
			}
			usage = last.Usage
		} else {
			var r struct {
				Object  string          `json:"object"`
				Choices []any           `json:"choices"`
				Usage   json.RawMessage `json:"usage"`
			}
			if err := json.Unmarshal(b, &r); err != nil || r.Object != "text_completion" || len(r.Choices) != 1 || strings.Contains(string(b), "bootstrap") {
				t.Fatalf("request %d: body %s (%v)", i, b, err)
			}
			usage = r.Usage
		}
		var u struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
			Details    struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		if err := json.Unmarshal(usage, &u); err != nil || u.Completion != 4 || u.Details.Cached < u.Prompt/2 {
			t.Fatalf("request %d: usage %s: want the decode engine's, with the prompt read from the prefill engine", i, usage)
		}
		testutil.WaitFor(t, 30*time.Second, "the prefill leg drained and its blocks freed", func() bool {
			l := p.Load(0)
			return l.Finished == uint64(i+1) && l.GenerationTokens == l.Finished && l.HeldBlocks == 0 && p.HeldRequests(0) == 0
		})
	}
	legs := s.pdInit().legs
	testutil.WaitFor(t, 10*time.Second, "6 prefill legs ok", func() bool { return val(legs.WithLabelValues("prefill", "ok")) == 6 })
	if l := cl.Decode[0].Load(0); l.Finished != 6 {
		t.Fatalf("decode engine finished %d requests, want 6", l.Finished)
	}
}

// fakeRejectingPrefill is a FAKE prefill engine's HTTP side: it answers
// every request with status (500: an SGLang prefill engine that cannot
// take the request; 400: one that judges it bad), so the bootstrap room it
// was given is never filled.
func fakeRejectingPrefill(t *testing.T, status int) (string, *atomic.Int64) {
	t.Helper()
	return fakeAnswering(t, status, `{"error":{"message":"prefill engine says no","type":"BadRequestError","code":`+strconv.Itoa(status)+`}}`)
}

// fakeAnswering is a FAKE engine's HTTP side answering every request with
// status and body.
func fakeAnswering(t *testing.T, status int, body string) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), &n
}

// TestSGLangPrefillRejectedCutsDecode: a prefill engine that rejects its
// leg (500) never fills the room, so the decode engine would wait for it
// until its bootstrap timeout (an hour here): the ingress cuts the decode
// leg, serves the request aggregated on the decode engine, and holds the
// failure against the prefill engine's health, not the decode engine's.
func TestSGLangPrefillRejectedCutsDecode(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	base.PD.BootstrapTimeout = time.Hour
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	url, rejected := fakeRejectingPrefill(t, http.StatusInternalServerError)
	// The prefill engine's HTTP side is the fake; its bootstrap address is
	// a real (idle) prefill simulator's, where the room stays empty.
	pe := pdEngine("p0", scheduler.RolePrefill, url)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, cl.Prefill[0].BootstrapAddr()
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	for i, stream := range []bool{false, true, false, true} {
		body := `{"model":"m","prompt":"cut ` + strings.Repeat("x ", 40+i) + `","max_tokens":3,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	// Three 5xx in a row eject the prefill engine (HealthConfig's
	// default): the fourth request is served aggregated without a leg.
	p := s.pdInit()
	if n, f := rejected.Load(), val(p.legs.WithLabelValues("prefill", "failed_status_500")); n != 3 || f != 3 {
		t.Fatalf("prefill legs sent %d, counted failed %v; want 3", n, f)
	}
	if v := val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); v != 3 {
		t.Fatalf("%v SGLang fallbacks, want 3", v)
	}
	if s.health.allowed("p0") || !s.health.allowed("d0") {
		t.Fatalf("ejected: prefill %v, decode %v; want only the failing prefill engine", !s.health.allowed("p0"), !s.health.allowed("d0"))
	}
	if l := cl.Decode[0].Load(0); l.Finished != 4 {
		t.Fatalf("decode engine finished %d requests, want 4 (aggregated)", l.Finished)
	}
}

// TestSGLangPrefillUnreachableCutsDecode: a prefill engine whose HTTP
// port refuses connections never receives its leg; the decode leg, waiting
// on an empty room (on a live bootstrap server), is cut and the request is
// served aggregated on the decode engine.
func TestSGLangPrefillUnreachableCutsDecode(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	base.PD.BootstrapTimeout = time.Hour
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	pe := pdEngine("p0", scheduler.RolePrefill, dead)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, cl.Prefill[0].BootstrapAddr()
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"unreachable","max_tokens":3,"stream":true}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	p := s.pdInit()
	if v := val(p.legs.WithLabelValues("prefill", "failed_connect_error")); v != 1 {
		t.Fatalf("%v prefill legs failed to connect, want 1", v)
	}
	if v := val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); v != 1 {
		t.Fatalf("%v SGLang fallbacks, want 1", v)
	}
}

// TestSGLangPrefill4xxRelayed: a prefill engine that judges the request
// bad (400) cuts the waiting decode leg, and the client gets the prefill
// engine's answer, as on the NIXL path.
func TestSGLangPrefill4xxRelayed(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	base.PD.BootstrapTimeout = time.Hour
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	url, rejected := fakeRejectingPrefill(t, http.StatusBadRequest)
	pe := pdEngine("p0", scheduler.RolePrefill, url)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, cl.Prefill[0].BootstrapAddr()
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	for _, stream := range []string{"false", "true"} {
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"bad one","max_tokens":3,"stream":`+stream+`}`)
		if st != 400 || hdr.Get("X-Kvmesh-Engine") != "p0" || !strings.Contains(string(b), "prefill engine says no") {
			t.Fatalf("stream %s: status %d engine %q body %s", stream, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if n := rejected.Load(); n != 2 {
		t.Fatalf("prefill legs sent %d, want 2", n)
	}
	if l := cl.Decode[0].Load(0); l.Finished != 0 || !s.health.allowed("d0") || !s.health.allowed("p0") {
		t.Fatalf("decode engine finished %d requests (want 0: its legs were cut); ejected d0 %v p0 %v", l.Finished, !s.health.allowed("d0"), !s.health.allowed("p0"))
	}
}

// modelDenial is vLLM's and SGLang's 404 for a model the engine does not
// serve.
const modelDenial = "{\"error\":{\"message\":\"The model `m` does not exist.\",\"type\":\"NotFoundError\",\"code\":404}}"

// TestSGLangPrefillDeniesModel: an SGLang prefill engine answering that it
// does not serve the model cuts its decode leg as any failed prefill does,
// but its 404 is not relayed: the request is served aggregated on the
// decode engine, and the prefill engine is ejected (failed_wrong_model),
// the decode engine not.
func TestSGLangPrefillDeniesModel(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	base.PD.BootstrapTimeout = time.Hour
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	url, denied := fakeAnswering(t, http.StatusNotFound, modelDenial)
	pe := pdEngine("p0", scheduler.RolePrefill, url)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, cl.Prefill[0].BootstrapAddr()
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	for i, stream := range []string{"false", "true"} {
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"denied `+strings.Repeat("x ", 40+i)+`","max_tokens":3,"stream":`+stream+`}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	p := s.pdInit()
	if n, f := denied.Load(), val(p.legs.WithLabelValues("prefill", "failed_wrong_model")); n != 1 || f != 1 {
		t.Fatalf("prefill legs sent %d, counted failed_wrong_model %v; want 1 each (the denying engine is ejected)", n, f)
	}
	if s.health.allowed("p0") || !s.health.allowed("d0") {
		t.Fatalf("ejected: prefill %v, decode %v; want only the denying prefill engine", !s.health.allowed("p0"), !s.health.allowed("d0"))
	}
}

// TestSGLangLegsRefuseCredential: an engine's 401 refuses the ingress's
// engine key, not the client's: a prefill leg so refused cuts its decode
// leg and the request is served aggregated; a decode leg so refused moves
// on as a failed one. Neither 401 reaches the client.
func TestSGLangLegsRefuseCredential(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	base.PD.BootstrapTimeout = 2 * time.Second
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	url, refused := fakeAnswering(t, http.StatusUnauthorized, `{"error":"Unauthorized"}`)
	pe := pdEngine("p0", scheduler.RolePrefill, url)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, cl.Prefill[0].BootstrapAddr()
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"refused `+strings.Repeat("x ", 40)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("prefill refuses: status %d engine %q body %s; want served aggregated on d0", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if n, f := refused.Load(), val(s.pdInit().legs.WithLabelValues("prefill", "failed_credential_refused")); n != 1 || f != 1 {
		t.Fatalf("prefill legs sent %d, counted failed_credential_refused %v; want 1 each", n, f)
	}
	// Left out of prefill legs for a while (markRefusedKey): the next
	// request is served without a leg to it.
	st, hdr, b = post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"refused again `+strings.Repeat("y ", 40)+`","max_tokens":3}`)
	if st != 200 || refused.Load() != 1 {
		t.Fatalf("second request: status %d engine %q body %s, %d prefill legs to the refusing engine; want 200 and still 1", st, hdr.Get("X-Kvmesh-Engine"), b, refused.Load())
	}

	url2, refused2 := fakeAnswering(t, http.StatusUnauthorized, `{"error":"Unauthorized"}`)
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "dx", Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "dx"}, {Decode: "d0"}}}
	s2 := startIngress(t, testConfig(), Deps{PD: fixedPlanner{plan}, Membership: roleMembership{sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]),
		pdEngine("dx", scheduler.RoleDecode, url2), sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	st, hdr, b = post(t, boundedClient, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":"decode refuses `+strings.Repeat("x ", 40)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("decode refuses: status %d engine %q body %s; want served on d0", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	// Its decode leg, then the request aggregated on it: each 401 counted.
	if n, a := refused2.Load(), val(s2.m.attempts.WithLabelValues("credential_refused")); n == 0 || float64(n) != a {
		t.Fatalf("the refusing decode engine got %d requests, %v credential_refused attempts; want as many, at least 1", n, a)
	}
}

// TestSGLangDecodeDeniesModel: a decode engine answering that it does not
// serve the model is ejected and the request is served aggregated on the
// next engine, not relayed the 404 and not sent to the denying engine again.
func TestSGLangDecodeDeniesModel(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	base := sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}
	// The prefill leg waits for a decode engine that never joins its room:
	// this bounds how long it holds its goroutine after the test's request.
	base.PD.BootstrapTimeout = 2 * time.Second
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	url, denied := fakeAnswering(t, http.StatusNotFound, modelDenial)
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "dx", Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "dx"}, {Decode: "dx"}}}
	c := testConfig()
	s := startIngress(t, c, Deps{PD: fixedPlanner{plan}, Membership: roleMembership{sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]),
		pdEngine("dx", scheduler.RoleDecode, url), sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"decode denies `+strings.Repeat("x ", 40)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if n, a := denied.Load(), val(s.m.attempts.WithLabelValues("wrong_model")); n != 1 || a != 1 {
		t.Fatalf("the denying decode engine got %d requests, %v wrong_model attempts; want 1 each", n, a)
	}
	if s.health.allowed("dx") || !s.health.allowed("d0") || !s.health.allowed("p0") {
		t.Fatalf("ejected: dx %v, d0 %v, p0 %v; want the denying decode engine alone", !s.health.allowed("dx"), !s.health.allowed("d0"), !s.health.allowed("p0"))
	}
}

// TestSGLangPrefillKilledMidRun: an SGLang prefill engine killed while
// legs queue on it costs no request that had not started streaming: the
// decode engines waiting for its rooms fail, and every request is served
// aggregated on the decode engine.
func TestSGLangPrefillKilledMidRun(t *testing.T) {
	// One sequence at a time, 20× slower than the model, so prefill legs queue.
	cl, s := startSGLangCluster(t, sim.Config{TimeScale: 0.05, Seed: 1, Engine: engine.Config{MaxRunning: 1}}, 1, 1)
	const n = 12
	type result struct {
		status int
		body   string
		done   bool
		stream bool
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := i%2 == 0
			body := `{"model":"m","prompt":"kill ` + strings.Repeat("token ", 200+i) + `","max_tokens":3,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
			st, _, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", body)
			r := result{status: st, body: string(b), stream: stream}
			if stream {
				evs := sseEvents(b)
				r.done = len(evs) > 0 && evs[len(evs)-1] == "[DONE]"
			}
			results[i] = r
		}(i)
	}
	p := cl.Prefill[0]
	okLegs := s.pdInit().legs.WithLabelValues("prefill", "ok")
	testutil.WaitFor(t, 60*time.Second, "a prefill leg done and others queued on the victim", func() bool {
		l := p.Load(0)
		return l.Running+l.Waiting > 0 && val(okLegs) > 0
	})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if v := val(s.pdInit().decisions.WithLabelValues("aggregated", "sglang_fallback")); v == 0 {
		t.Errorf("no request fell back: the kill must land mid-run")
	}
	for i, r := range results {
		if r.status != 200 || (r.stream && !r.done) {
			t.Errorf("request %d (stream %v): status %d body %.200s", i, r.stream, r.status, r.body)
		}
	}
}

func FuzzWithBootstrap(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hi","stream":true}`))
	f.Add([]byte(`{"model":"m","messages":[],"n":3}`))
	f.Add([]byte(`{"n":"x","bootstrap_room":-1}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := withBootstrap(b, "10.0.0.1", 8998, 1<<62)
		if err != nil {
			return
		}
		var m struct {
			Host string `json:"bootstrap_host"`
			Port int    `json:"bootstrap_port"`
			Room uint64 `json:"bootstrap_room"`
		}
		if err := json.Unmarshal(out, &m); err != nil || m.Host != "10.0.0.1" || m.Port != 8998 || m.Room != 1<<62 {
			t.Fatalf("body %q → %q: %+v %v", b, out, m, err)
		}
	})
}

// TestSGLangStaticConfig: without gossip, a YAML engine list declares the
// roles, group, protocol and bootstrap address, and the ingress drives the
// SGLang pair from it; bad values are listed by Validate.
func TestSGLangStaticConfig(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: sim.Config{Model: "m", Logger: quiet, TimeScale: 100, Seed: 1}})
	y := "pd: {policy: kvmesh-always}\nengines:\n" +
		"- {id: p0, model: m, url: \"" + cl.Prefill[0].URL() + "\", role: prefill, group: g, pdProtocol: sglang, bootstrap: \"" + cl.Prefill[0].BootstrapAddr() + "\"}\n" +
		"- {id: d0, model: m, url: \"" + cl.Decode[0].URL() + "\", role: decode, group: g, pdProtocol: sglang}\n"
	cfg, err := ParseConfig([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = "127.0.0.1:0"
	s := startIngress(t, cfg, Deps{})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"static `+strings.Repeat("w ", 80)+`","max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || !strings.Contains(string(b), `"cached_tokens"`) {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	legs := s.pdInit().legs.WithLabelValues("prefill", "ok")
	testutil.WaitFor(t, 10*time.Second, "the prefill leg ok", func() bool { return val(legs) == 1 })

	bad := DefaultConfig()
	bad.Engines = []StaticEngine{{ID: "x", Model: "m", URL: "http://127.0.0.1:1", Role: "chef", PDProtocol: "mooncake", Bootstrap: "nohost"}}
	err = bad.Validate()
	for _, want := range []string{"role", "pdProtocol", "bootstrap"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q listed", err, want)
		}
	}
}

// TestSGLangPrefillQueueFullFallsBack: a prefill engine whose admission
// queue is full sends the request to the plan's next pair, and with every
// pair full it is served aggregated: never a 429 while an engine can serve
// it.
func TestSGLangPrefillQueueFullFallsBack(t *testing.T) {
	cl, s := startSGLangCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 2, 1)
	p := s.pdInit()
	fillPrefillQueues(p, "p0", "p1")
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"full `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	next, n, agg := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "fallback_queue_full")),
		val(p.decisions.WithLabelValues("aggregated", "sglang_fallback"))
	if next != 1 || n != 1 || agg != 1 {
		t.Fatalf("%v moves to the next pair (want 1), %v legs fell back for a full queue (want 1: the last pair), %v requests served aggregated (want 1)", next, n, agg)
	}
	for i, e := range cl.Prefill {
		if l := e.Load(0); l.Finished != 0 || l.Running+l.Waiting != 0 {
			t.Fatalf("prefill engine %d was sent a leg: %+v", i, l)
		}
	}
}

// TestSGLangPrefillQueueFullDecodeQueueing: every prefill queue full and
// the decode engine queueing: 429 prefill_queue_full, no engine sent a leg.
func TestSGLangPrefillQueueFullDecodeQueueing(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: 2, Decode: 1})
	busy := sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])
	busy.Waiting = 2
	m := roleMembership{sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]), sglangEngine("p1", scheduler.RolePrefill, cl.Prefill[1]), busy}
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: m})
	p := s.pdInit()
	fillPrefillQueues(p, "p0", "p1")
	st, _, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"full `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
	if st != 429 || !strings.Contains(string(b), `"code":"prefill_queue_full"`) {
		t.Fatalf("status %d body %s", st, b)
	}
	// As NIXL counts it: a move to the next pair, then the 429.
	if next, rej, full := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "rejected")),
		val(p.legs.WithLabelValues("prefill", "fallback_queue_full")); next != 1 || rej != 1 || full != 0 {
		t.Fatalf("legs: %v next_queue_full, %v rejected, %v fallback_queue_full; want 1, 1, 0", next, rej, full)
	}
	for _, e := range append(append([]*sim.Server(nil), cl.Prefill...), cl.Decode...) {
		if l := e.Load(0); l.Finished != 0 || l.Running+l.Waiting != 0 {
			t.Fatalf("an engine was sent the request: %+v", l)
		}
	}
}

// TestSGLangPrefillQueueFullFallbackEngineQueueing: the 429 is decided on
// the engine the aggregated fallback would take (the ranking's head), not
// on the plan's decode engine: here the planner names a decode engine the
// scheduler did not rank (gone from the candidates), which queues nothing,
// while the one the fallback would reach is queueing.
func TestSGLangPrefillQueueFullFallbackEngineQueueing(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: 1, Decode: 1})
	busy := sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])
	busy.Waiting = 2
	m := roleMembership{sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]), busy}
	c := testConfig()
	c.EngineHeader = false // the 429 names no engine (TestPDRejectionHidesEnginesWithHeaderOff)
	s := startIngress(t, c, Deps{Membership: m, PD: goneDecodePlanner{pdRouter(t, "kvmesh-always")}})
	fillPrefillQueues(s.pdInit(), "p0")
	st, _, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"full `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
	if st != 429 || !strings.Contains(string(b), `"code":"prefill_queue_full"`) || strings.Contains(string(b), "d0") {
		t.Fatalf("status %d body %s", st, b)
	}
	if l := cl.Decode[0].Load(0); l.Finished != 0 || l.Running+l.Waiting != 0 {
		t.Fatalf("the queueing decode engine was sent the request: %+v", l)
	}
}

// goneDecodePlanner plans as its router does, then names a decode engine
// that is not among the candidates.
type goneDecodePlanner struct{ PDPlanner }

func (g goneDecodePlanner) Route(req *scheduler.Request, engines []scheduler.Engine, plan *pd.Plan) error {
	if err := g.PDPlanner.Route(req, engines, plan); err != nil {
		return err
	}
	plan.Decode = "gone"
	for i := range plan.Options {
		plan.Options[i].Decode = "gone"
	}
	return nil
}

// TestSGLangPrefillHungCutsDecode: a prefill engine that hangs (its port
// and its bootstrap port accept, nothing answers) is cut by the stall
// watch, and its decode leg, which would wait for the room until its
// bootstrap timeout, is cut with it: the request is served aggregated on
// the decode engine, and the leg is counted as failed_stalled.
func TestSGLangPrefillHungCutsDecode(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	base.PD.BootstrapTimeout = time.Hour // the decode leg would wait for the room that long
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	frozen := frozenEngine(t)
	hung := pdEngine("p0", scheduler.RolePrefill, frozen)
	hung.PDProtocol, hung.Bootstrap = gossip.PDProtocolSGLang, strings.TrimPrefix(frozenEngine(t), "http://")
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	c.IdleTimeout = 10 * time.Minute
	// The hung engine never answers (nothing accepts on its ports until the
	// test ends), so only the live decode engine's probes are timed: d0's
	// leg sends no byte while it waits for the room, and a long ProbeTimeout
	// keeps a busy machine from failing two of them in a row (ejecting d0).
	// The hung engine's probes fail at ProbeGrace: no longer than that.
	c.Health.StallAfter, c.Health.ProbeTimeout, c.Health.ProbeGrace = 500*time.Millisecond, 3*time.Second, 3*time.Second
	s := startIngress(t, c, Deps{Membership: roleMembership{hung, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	client := &http.Client{Timeout: time.Minute} // far below the bootstrap timeout
	st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hung `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	p := s.pdInit()
	testutil.WaitFor(t, 10*time.Second, "the prefill leg counted as stalled", func() bool {
		return val(p.legs.WithLabelValues("prefill", "failed_stalled")) == 1
	})
	if n, agg := val(p.legs.WithLabelValues("prefill", "failed_connect_error")), val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); n != 0 || agg != 1 {
		t.Fatalf("%v prefill legs counted as connect errors (want 0), %v requests served aggregated (want 1)", n, agg)
	}
	if got := seriesSum(s.health.stalls); got != 1 {
		t.Fatalf("%v stall ejections, want 1", got)
	}
}

// TestSGLangNextPairCharge: a pair tried after a full prefill queue
// charges its own prefill engine's load with the prompt tokens that engine
// does not cache (its option's prefix match), not with the plan's first
// prefill engine's match.
func TestSGLangNextPairCharge(t *testing.T) {
	var srv atomic.Pointer[Server] // set before any request: the handler reads it on the engine's goroutine
	charged := make(chan int64, 1)
	p1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case charged <- srv.Load().ups.lookup("p1").prefill.Load():
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
	}))
	t.Cleanup(p1.Close)
	d := startFakePD(t, false)
	cached := index.Match{GPU: 1, CPU: 1, Other: 1, Spec: 1} // p0 caches the prompt's block, p1 nothing
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", PrefillMatch: cached, Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0", PrefillMatch: cached}, {Prefill: "p1", Decode: "d0"}}}
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	s := startIngress(t, c, Deps{PD: fixedPlanner{plan}, Membership: roleMembership{sglangPrefillAt("p0", "http://127.0.0.1:1"), sglangPrefillAt("p1", p1.URL),
		pdEngine("d0", scheduler.RoleDecode, d.url())}})
	srv.Store(s)
	s.pdInit().gate("p0").slots <- struct{}{} // p0 is full: the next pair
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q: %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if got := <-charged; got != 3 {
		t.Fatalf("p1 was charged %d prefill tokens during its leg, want 3 (the whole prompt: it caches none of it)", got)
	}
}

// TestSGLangPrefillQueueFullNextPair: a full prefill queue on a pair that
// the next pair then serves is counted as NIXL counts a move to the next
// prefill engine, next_queue_full, and the next pair's leg as ok; only
// when no pair is left and the request is served aggregated is the last
// refusal fallback_queue_full. It used to count fallback_queue_full for
// every full pair, though the request was served disaggregated.
func TestSGLangPrefillQueueFullNextPair(t *testing.T) {
	p1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
	}))
	t.Cleanup(p1.Close)
	d := startFakePD(t, false)
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0"}, {Prefill: "p1", Decode: "d0"}}}
	c := testConfig()
	c.PD = PDConfig{MaxPrefillInFlight: 1, PrefillQueue: -1}
	s := startIngress(t, c, Deps{PD: fixedPlanner{plan}, Membership: roleMembership{sglangPrefillAt("p0", "http://127.0.0.1:1"), sglangPrefillAt("p1", p1.URL),
		pdEngine("d0", scheduler.RoleDecode, d.url())}})
	p := s.pdInit()
	p.gate("p0").slots <- struct{}{} // p0 is full: the next pair
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q: %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	testutil.WaitFor(t, 10*time.Second, "p1's leg counted ok", func() bool { return val(p.legs.WithLabelValues("prefill", "ok")) == 1 })
	if next, full, agg := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "fallback_queue_full")),
		val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); next != 1 || full != 0 || agg != 0 {
		t.Fatalf("next pair: %v next_queue_full, %v fallback_queue_full, %v served aggregated; want 1, 0, 0", next, full, agg)
	}

	p.gate("p1").slots <- struct{}{} // now both are full: aggregated on d0
	st, hdr, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" || d.decodes.Load() != 2 {
		t.Fatalf("both full: status %d engine %q: %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if next, full, agg := val(p.legs.WithLabelValues("prefill", "next_queue_full")), val(p.legs.WithLabelValues("prefill", "fallback_queue_full")),
		val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); next != 2 || full != 1 || agg != 1 {
		t.Fatalf("both full: %v next_queue_full (want 2), %v fallback_queue_full (want 1), %v served aggregated (want 1)", next, full, agg)
	}
}

// optionSpy records every option the P/D planner offers.
type optionSpy struct {
	PDPlanner
	mu   sync.Mutex
	opts []pd.Choice
}

func (o *optionSpy) Route(req *scheduler.Request, engines []scheduler.Engine, plan *pd.Plan) error {
	err := o.PDPlanner.Route(req, engines, plan)
	o.mu.Lock()
	o.opts = append(o.opts, plan.Options...)
	o.mu.Unlock()
	return err
}

// TestSGLangNeverPairsWithMixedEngine: beside an SGLang prefill and decode
// engine, an ordinary engine of the same P/D group (no disaggregation mode,
// no P/D protocol gossiped) is an aggregated target but never the decode
// half of a bootstrap pair: it would ignore the room and prefill the prompt
// again while the room pinned the prefill engine's KV until its abort
// timeout. Before, the ingress asked the P/D step for pairs by group alone,
// and kvmesh-always offered (p0, m0) for every request.
func TestSGLangNeverPairsWithMixedEngine(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: 1, Decode: 1})
	mixed, err := sim.Start(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mixed.Close() })
	spy := &optionSpy{PDPlanner: pdRouter(t, "kvmesh-always")}
	m := roleMembership{sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]), sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0]),
		pdEngine("m0", scheduler.RoleMixed, mixed.URL())}
	s := startIngress(t, testConfig(), Deps{Membership: m, PD: spy})
	for i := range 8 {
		body := `{"model":"m","prompt":"mixed ` + strings.Repeat("word ", 80+i) + `","max_tokens":2}`
		if st, _, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", body); st != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, st, b)
		}
	}
	spy.mu.Lock()
	opts := slices.Clone(spy.opts)
	spy.mu.Unlock()
	pairs, wholeM0 := 0, 0
	for _, o := range opts {
		switch {
		case o.Prefill != "" && o.Decode != "d0":
			t.Errorf("option %q → %q: an SGLang prefill engine paired with an engine that cannot read its room", o.Prefill, o.Decode)
		case o.Prefill != "":
			pairs++
		case o.Decode == "m0":
			wholeM0++
		}
	}
	if pairs == 0 || wholeM0 == 0 {
		t.Fatalf("%d (p0, d0) options and %d whole ones on m0 over 8 requests; want both: %+v", pairs, wholeM0, opts)
	}
	p := cl.Prefill[0]
	testutil.WaitFor(t, 30*time.Second, "every room read (none left pinning the prefill engine's KV)", func() bool {
		return p.Load(0).HeldBlocks == 0 && p.HeldRequests(0) == 0
	})
}

// drainingPlanner plans every request disaggregated on p0 → d0 and starts
// the ingress's drain as it does: the request is admitted, then finds the
// ingress draining when its legs would start.
type drainingPlanner struct{ s atomic.Pointer[Server] }

func (d *drainingPlanner) Route(_ *scheduler.Request, _ []scheduler.Engine, plan *pd.Plan) error {
	*plan = pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", Policy: d.Policy(),
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0"}}}
	d.s.Load().draining.Store(true)
	return nil
}

func (d *drainingPlanner) Policy() string { return "drain-test" }

// TestSGLangDrainingCountsFallback: a request planned disaggregated that
// finds the ingress draining is served aggregated (no leg may start while
// Close waits) and counted as every fallback is, a leg result and a
// second decision by the served mode.
func TestSGLangDrainingCountsFallback(t *testing.T) {
	base := sim.Config{Model: "m", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TimeScale: 100, Seed: 1}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base})
	planner := &drainingPlanner{}
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{PD: planner, Membership: roleMembership{
		sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]), sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	planner.s.Store(s)
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"drain me please","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s; want 200 served on d0", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	p := s.pdInit()
	if v := val(p.legs.WithLabelValues("prefill", "fallback_draining")); v != 1 {
		t.Fatalf("%v prefill legs counted fallback_draining, want 1", v)
	}
	if v := val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); v != 1 {
		t.Fatalf("%v SGLang fallbacks, want 1", v)
	}
	if l := cl.Prefill[0].Load(0); l.Finished != 0 {
		t.Fatalf("prefill engine finished %d requests; no leg may start while draining", l.Finished)
	}
}

// TestLegTasksRefuseAfterStop: once shutdown stops the request path's
// background legs it waits for the running ones, and a handler that
// outlived the drain can start none (an Add racing the Wait).
func TestLegTasksRefuseAfterStop(t *testing.T) {
	var lt legTasks
	if !lt.add() {
		t.Fatal("a task refused before stop")
	}
	stopped := make(chan struct{})
	go func() { defer close(stopped); lt.stopAndWait() }()
	testutil.WaitFor(t, 30*time.Second, "stop refusing new tasks", func() bool {
		lt.mu.Lock()
		defer lt.mu.Unlock()
		return lt.stopped
	})
	select {
	case <-stopped:
		t.Fatal("stopAndWait returned with a task running")
	default:
	}
	if lt.add() {
		t.Fatal("a task started after stop")
	}
	lt.done()
	<-stopped
}

// TestSGLangReservationHeldWhileQueued: an SGLang request waiting for its
// prefill engine's admission keeps its plan's reservation there, so plans
// made meanwhile see it (the legs charge their engines only once
// admitted); it is gone once the request is served. Before, it was dropped
// before the wait and a queued leg was counted nowhere (review).
func TestSGLangReservationHeldWhileQueued(t *testing.T) {
	_, s := startSGLangCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 1, 1)
	p := s.pdInit()
	g := p.gate("p0")
	taken := 0
	for len(g.slots) < cap(g.slots) {
		g.slots <- struct{}{}
		taken++
	}
	pending := func(engine string) int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.pending[engine].n
	}
	done := make(chan int, 1)
	go func() {
		st, _, _ := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"queued `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
		done <- st
	}()
	testutil.WaitFor(t, 10*time.Second, "the request queued at p0's admission", func() bool { return g.waiting.Load() == 1 })
	if n := pending("p0"); n != 1 {
		t.Fatalf("p0 reserved %d while the request waits for its admission, want 1", n)
	}
	for range taken { // the slots taken above, not the one the request takes
		<-g.slots
	}
	if st := <-done; st != 200 {
		t.Fatalf("status %d", st)
	}
	if n, d := pending("p0"), pending("d0"); n != 0 || d != 0 {
		t.Fatalf("reservations left: p0 %d, d0 %d", n, d)
	}
}

// fillPrefillQueues takes every admission slot of each prefill engine and
// fills its queue, so its next leg finds the queue full.
func fillPrefillQueues(p *pdState, ids ...string) {
	for _, id := range ids {
		g := p.gate(id)
		for len(g.slots) < cap(g.slots) {
			g.slots <- struct{}{}
		}
		g.waiting.Store(int64(p.cfg.PrefillQueue))
	}
}

// TestSGLangClientGone: a client that leaves a non-streamed SGLang P/D
// request cuts its legs, as it cuts an aggregated request: the decode
// engine's connection is closed and it aborts the answer, a prefill leg
// still running is cut too (its engine aborts it and it counts
// client_gone), and the request is counted and logged 499. The decode leg
// used to be linked to no client watcher: the engine generated the whole
// answer and the ingress counted it 200 (tester h-cancel, F1).
func TestSGLangClientGone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		during  string  // "decode": the client leaves as the answer is generated; "prefill": while the prompt is
		scale   float64 // the simulators' TimeScale
		words   int     // prompt words
		maxToks int
	}{
		{name: "decode", during: "decode", scale: 1, words: 20, maxToks: 4000},
		{name: "prefill", during: "prefill", scale: 0.002, words: 3000, maxToks: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, s := startSGLangCluster(t, sim.Config{TimeScale: tc.scale, Seed: 1}, 1, 1)
			p, d := cl.Prefill[0], cl.Decode[0]
			conn := dialIngress(t, s)
			body := `{"model":"m","prompt":"gone ` + strings.Repeat("word ", tc.words) + `","max_tokens":` + strconv.Itoa(tc.maxToks) + `}`
			if _, err := fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
				t.Fatal(err)
			}
			if tc.during == "decode" {
				testutil.WaitFor(t, 30*time.Second, "the decode engine generating", func() bool { return d.Load(0).GenerationTokens > 0 })
			} else {
				testutil.WaitFor(t, 30*time.Second, "the prefill leg running", func() bool { return p.Load(0).Running == 1 })
			}
			_ = conn.Close()
			testutil.WaitFor(t, 30*time.Second, "the request counted 499", func() bool {
				return val(s.m.requests.WithLabelValues("completions", "499")) == 1
			})
			testutil.WaitFor(t, 30*time.Second, "both engines idle", func() bool {
				return d.Load(0).Running == 0 && p.Load(0).Running == 0 && p.Load(0).Waiting == 0
			})
			waitSettled(t, s)
			if got := val(s.m.requests.WithLabelValues("completions", "200")); got != 0 {
				t.Fatalf("%v requests counted 200 for a client that left", got)
			}
			if l := d.Load(0); l.Finished != 0 || l.GenerationTokens >= uint64(tc.maxToks) {
				t.Fatalf("decode engine finished %d requests, %d tokens: the answer ran to its end", l.Finished, l.GenerationTokens)
			}
			if got := val(s.m.attempts.WithLabelValues("client_gone")); got != 1 {
				t.Fatalf("attempts{client_gone} = %v, want 1", got)
			}
			if tc.during == "prefill" {
				if l := p.Load(0); l.Finished != 0 {
					t.Fatalf("prefill engine finished %d legs: the leg was not cut", l.Finished)
				}
				legs := s.pdInit().legs
				testutil.WaitFor(t, 10*time.Second, "the prefill leg counted client_gone", func() bool {
					return val(legs.WithLabelValues("prefill", "client_gone")) == 1
				})
			}
		})
	}
}
