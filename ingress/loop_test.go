package ingress

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// An engine URL that points at another kvmesh ingress (B): the request A
// sends there carries A's hop header, and B refuses it at once with 508
// routing_loop, routing nothing (its own engine gets no request); A counts
// the attempt as routing_loop, serves the request on the next engine, and
// ejects the "engine" with a warning that names it, its URL and the
// sidecar's --engine-url. Its probes carry the hop header and get the 508
// from B's /health: it stays out, where /health alone readmitted it (F1).
// Before, B routed A's request to its own engine and the "engine" was a
// healthy one.
func TestRoutingLoopToAnIngressFailsOverAndStaysEjected(t *testing.T) {
	behind := startFaultEngine(t, faultOK)
	var logsB testutil.SyncBuffer
	b := startIngress(t, testConfig(StaticEngine{ID: "behind-b", Model: "m", URL: behind.url()}),
		Deps{Logger: slog.New(slog.NewTextHandler(&logsB, nil))})
	good := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "good", Model: "m", URL: good.url()}, StaticEngine{ID: "loop", Model: "m", URL: "http://" + b.Addr()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 20*time.Millisecond, 40*time.Millisecond
	var logsA testutil.SyncBuffer
	a := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logsA, nil))})
	if got, loops := val(a.m.attempts.WithLabelValues("routing_loop")), val(b.m.loops); got != 0 || loops != 0 {
		t.Fatalf("routing_loop attempts %v, refused loops %v at start, want both series at 0", got, loops)
	}
	url := "http://" + a.Addr() + "/v1/completions"
	for i := range 6 {
		body := `{"model":"m","prompt":[` + strconv.Itoa(i+1) + `,2,3],"max_tokens":2}`
		if st, hdr, out := post(t, http.DefaultClient, url, body); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), out)
		}
	}
	if got := val(a.m.attempts.WithLabelValues("routing_loop")); got != 1 {
		t.Fatalf("routing_loop attempts %v, want 1 (then ejected)", got)
	}
	if got := val(a.m.attempts.WithLabelValues("status_5xx")); got != 0 {
		t.Fatalf("status_5xx attempts %v: the 508 was read as an engine failure", got)
	}
	if ej := a.health.ejected(); !slices.Equal(ej, []string{"loop"}) {
		t.Fatalf("ejected %v, want [loop]", ej)
	}
	// B refused the request (the attempts above say only one went there);
	// a probe of the ejected "engine" (20 ms later) may have been refused
	// too by now.
	if got := val(b.m.loops); got < 1 {
		t.Fatalf("ingress B refused %v loops, want the request's", got)
	}
	if n := behind.hits.Load(); n != 0 {
		t.Fatalf("ingress B routed the looped request: its engine got %d requests", n)
	}

	// The probes get B's 508 from /health: the engine stays out.
	testutil.WaitFor(t, 20*time.Second, "two probes of the looped engine to fail", func() bool { return probesFailed(a, "loop") >= 3 })
	if ej := a.health.ejected(); !slices.Equal(ej, []string{"loop"}) {
		t.Fatalf("ejected %v after its probes, want [loop]: /health readmitted an ingress", ej)
	}
	if got := val(b.m.loops); got < 3 {
		t.Fatalf("ingress B refused %v loops, want the request's and the probes'", got)
	}
	out := logsA.String()
	if strings.Count(out, "engine ejected from routing") != 1 || !strings.Contains(out, "engine=loop") ||
		!strings.Contains(out, b.Addr()) || !strings.Contains(out, "is a kvmesh ingress") || !strings.Contains(out, "--engine-url") {
		t.Fatalf("want one ejection warning naming the engine, its URL, that it is a kvmesh ingress and --engine-url:\n%s", out)
	}
	if strings.Contains(out, "engine restored") {
		t.Fatalf("the looped engine was restored:\n%s", out)
	}
	if n := strings.Count(logsB.String(), "refused a request carrying X-Kvmesh-Hop"); n < 1 || float64(n) >= val(b.m.loops) {
		t.Fatalf("ingress B warned %d times for %v refusals, want at least one and fewer than refusals:\n%s", n, val(b.m.loops), logsB.String())
	}
}

// selfMembership lists one engine whose URL is set once the ingress
// listens: the ingress's own address.
type selfMembership struct{ url atomic.Pointer[string] }

func (m *selfMembership) Engines(dst []EngineInfo) []EngineInfo {
	u := m.url.Load()
	if u == nil {
		return dst
	}
	return append(dst, EngineInfo{Engine: scheduler.Engine{ID: "self", Model: "m", Healthy: true}, URL: *u})
}

// An ingress whose only engine URL is its own address (a sidecar's
// --engine-url set to the ingress's port in its pod) answers the client
// 503 naming the loop after one hop: the request it sent itself is refused
// with 508 and not routed again, and the access log has two lines for the
// request id (the refused hop's 508 and the client's 503), not one per
// hop until --max-concurrent (F1). Before, the request recursed and the
// client got 429 engine_overloaded.
func TestRoutingLoopToItselfIsOneHop(t *testing.T) {
	mem := &selfMembership{}
	var alog testutil.SyncBuffer
	cfg := DefaultConfig()
	cfg.MaxConcurrent = 8
	s := startIngress(t, cfg, Deps{Membership: mem, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	self := "http://" + s.Addr()
	mem.url.Store(&self)
	st, _, body := post(t, http.DefaultClient, self+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`, "X-Request-Id", "loop-req-1")
	var e openAIError
	if err := json.Unmarshal(body, &e); err != nil || st != http.StatusServiceUnavailable || !strings.Contains(e.Error.Message, "is a kvmesh ingress") {
		t.Fatalf("%d %s, want 503 naming the kvmesh ingress", st, body)
	}
	if got, loops := val(s.m.attempts.WithLabelValues("routing_loop")), val(s.m.loops); got != 1 || loops != 1 {
		t.Fatalf("routing_loop attempts %v, refused loops %v, want 1 and 1", got, loops)
	}
	testutil.WaitFor(t, 5*time.Second, "two access lines", func() bool { return len(accessLines(t, &alog)) >= 2 })
	var statuses []float64
	for _, l := range accessLines(t, &alog) {
		if l["request_id"] != "loop-req-1" {
			t.Fatalf("access line of another request: %v", l)
		}
		statuses = append(statuses, l["status"].(float64))
		if l["status"] == 503.0 && !strings.Contains(l["error"].(string), "routing loop") {
			t.Fatalf("the client's access line does not say the loop: %v", l)
		}
		if l["status"] == 508.0 && (l["endpoint"] != "routing_loop" || !strings.Contains(l["error"].(string), "this kvmesh ingress itself")) {
			t.Fatalf("the refused hop's access line: %v", l)
		}
	}
	if slices.Sort(statuses); !slices.Equal(statuses, []float64{503, 508}) {
		t.Fatalf("access line statuses %v, want the hop's 508 and the client's 503", statuses)
	}
}

// A client that sends the hop header is refused like an ingress: 508
// routing_loop naming the ingress, on any path, and nothing is routed.
func TestClientHopHeaderIsRefused(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.ID = "ingress-x"
	s := startIngress(t, cfg, Deps{})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/health"} {
		st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+path, `{"model":"m","prompt":[1,2,3],"max_tokens":2}`, hopHeader, "ingress-y")
		var e openAIError
		if err := json.Unmarshal(body, &e); err != nil || st != http.StatusLoopDetected || e.Error.Code != "routing_loop" ||
			hdr.Get(ingressHeader) != ingressMark || !strings.Contains(e.Error.Message, `kvmesh ingress ingress-y`) {
			t.Fatalf("%s: %d %v %s, want 508 routing_loop naming the sender", path, st, hdr, body)
		}
		if strings.Contains(string(body), "ingress-x") || strings.Contains(fmt.Sprint(hdr), "ingress-x") {
			t.Fatalf("%s: the refusal names this ingress's id to a client: %v %s", path, hdr, body)
		}
	}
	if n := fe.hits.Load(); n != 0 {
		t.Fatalf("the engine got %d requests", n)
	}
	if got := val(s.m.loops); got != 5 {
		t.Fatalf("refused loops %v, want 5", got)
	}
}

// A P/D prefill "engine" that is a kvmesh ingress: the leg gets its 508,
// the engine is ejected (the next request sends it no leg) and the request
// is served aggregated on the decode engine (fallback_routing_loop).
// Before, the 508 counted as any 5xx leg failure: no ejection, and every
// disaggregated request sent it a leg.
func TestRoutingLoopPrefillLegEjects(t *testing.T) {
	behind := startFaultEngine(t, faultOK)
	b := startIngress(t, testConfig(StaticEngine{ID: "behind-b", Model: "m", URL: behind.url()}), Deps{})
	d := startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, "http://"+b.Addr()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	for i := range 3 {
		st, hdr, out := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), out)
		}
	}
	if got, loops := val(s.pdInit().legs.WithLabelValues("prefill", "fallback_routing_loop")), val(b.m.loops); got != 1 || loops != 1 {
		t.Fatalf("%v prefill legs counted fallback_routing_loop, %v refused at the other ingress; want 1 each (then ejected)", got, loops)
	}
	if s.health.allowed("p0") || behind.hits.Load() != 0 {
		t.Fatalf("the looped prefill engine allowed %v, the other ingress routed %d requests", s.health.allowed("p0"), behind.hits.Load())
	}
}
