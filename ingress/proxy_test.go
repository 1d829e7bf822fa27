package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
)

func testConfig(engines ...StaticEngine) Config {
	cfg := DefaultConfig()
	cfg.Engines = engines
	cfg.Scheduler.Policy = "least-request"
	// No time bound on tokenizing: on a loaded machine a test's large
	// prompt (a 12 MB inline image) outlasted the 2 s default and went
	// untokenized. The budget's own tests set it.
	cfg.TokenizeBudget = 0
	return cfg
}

func TestProxyStreamPassesThroughAndCounts(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Registry: reg})
	st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "e1" || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d headers %v body %s", st, hdr, body)
	}
	evs := sseEvents(body)
	// The ingress asked for the usage chunk itself; the client, who did not, does not see it.
	if len(evs) != 5 || evs[0] != strings.TrimSuffix(strings.TrimPrefix(completionEvent(0, "t0", ""), "data: "), "\n\n") || evs[4] != "[DONE]" {
		t.Fatalf("events %q", evs)
	}
	testutil.WaitFor(t, 10*time.Second, "4 output tokens counted and nothing in flight", func() bool {
		return val(s.m.tokens.WithLabelValues("out")) == 4 && s.inflight.Load() == 0
	})
	if got := val(s.m.requests.WithLabelValues("completions", "200")); got != 1 {
		t.Fatalf("requests_total = %v", got)
	}
	// The engine got the prompt as token ids, untouched; the model's first
	// stream is the forced-usage probe (forcedusage.go), sent as the client
	// wrote it, and a later one carries the ingress's usage request.
	if b := <-fe.bodies; !strings.Contains(string(b), `"prompt":[1,2,3]`) || strings.Contains(string(b), `"stream_options"`) || !json.Valid(b) {
		t.Fatalf("engine body %s", b)
	}
	if _, _, body = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`); len(sseEvents(body)) != 5 {
		t.Fatalf("events %q", sseEvents(body))
	}
	if b := <-fe.bodies; !strings.Contains(string(b), `"prompt":[1,2,3]`) || !strings.Contains(string(b), `"include_usage":true`) || !json.Valid(b) {
		t.Fatalf("engine body %s", b)
	}
	// A client that asks for usage gets it.
	_, _, body = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true,"stream_options":{"include_usage":true}}`)
	if evs := sseEvents(body); len(evs) != 6 || !strings.Contains(evs[4], `"completion_tokens":4`) {
		t.Fatalf("events with usage %q", evs)
	}
}

func TestProxyNonStream(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hello"}`)
	if st != 200 || !json.Valid(body) || !strings.Contains(string(body), `"text":"t0t1t2"`) {
		t.Fatalf("%d %s", st, body)
	}
}

// Every engine but one fails before the first byte in a different way; with
// enough attempts every request must land on the good one.
func TestRetryBeforeFirstByte(t *testing.T) {
	good := startFaultEngine(t, faultOK)
	e500 := startFaultEngine(t, fault500)
	hang := startFaultEngine(t, faultHang)
	dead := startFaultEngine(t, faultOK)
	dead.close() // connection refused from now on
	cfg := testConfig(
		StaticEngine{ID: "good", Model: "m", URL: good.url()},
		StaticEngine{ID: "e500", Model: "m", URL: e500.url()},
		StaticEngine{ID: "hang", Model: "m", URL: hang.url()},
		StaticEngine{ID: "dead", Model: "m", URL: dead.url()},
	)
	cfg.Scheduler.Policy = "random"
	cfg.MaxAttempts = 4
	cfg.IdleTimeout = 200 * time.Millisecond
	// Without the stall watch nothing tells a hung engine from a slow one:
	// the idle timeout bounds the first byte and a timeout moves on
	// (TestStallWatchEjectsHungEngine has the watch's way).
	cfg.Health.StallAfter = 0
	s := startIngress(t, cfg, Deps{})
	for i := 0; i < 12; i++ {
		stream := i%2 == 0
		body := `{"model":"m","prompt":[1,2],"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d via %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	waitSettled(t, s)
	for _, r := range []string{"status_5xx", "timeout", "connect_error"} {
		if val(s.m.attempts.WithLabelValues(r)) == 0 {
			t.Errorf("no %s attempt recorded: random routing over 12 requests should have hit it", r)
		}
	}
	// With a single failing engine the client gets a clean 503/504 error body.
	cfg2 := testConfig(StaticEngine{ID: "e500", Model: "m", URL: e500.url()})
	s2 := startIngress(t, cfg2, Deps{})
	st, hdr, b := post(t, http.DefaultClient, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
	if st != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"server_error"`) {
		t.Fatalf("%d %v %s", st, hdr, b)
	}
}

func TestMidStreamFailureEndsWithErrorEvent(t *testing.T) {
	fe := startFaultEngine(t, faultBreakStream)
	good := startFaultEngine(t, faultOK)
	// The good engine is second in the ranking: it must NOT be tried once bytes went out.
	cfg := testConfig(StaticEngine{ID: "broken", Model: "m", URL: fe.url()})
	s := startIngress(t, cfg, Deps{})
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	if st != 200 {
		t.Fatalf("status %d", st)
	}
	evs := sseEvents(body)
	if len(evs) != 4 || !strings.Contains(evs[2], `"error"`) || evs[3] != "[DONE]" {
		t.Fatalf("events %q", evs)
	}
	var e struct {
		Error struct{ Message, Type string }
	}
	if err := json.Unmarshal([]byte(evs[2]), &e); err != nil || e.Error.Type != "server_error" {
		t.Fatalf("error event %q: %v", evs[2], err)
	}
	if good.hits.Load() != 0 {
		t.Fatal("retried after bytes were sent")
	}
	testutil.WaitFor(t, 10*time.Second, "one stream error counted", func() bool { return val(s.m.streamErrors) == 1 })
}

// A stream the engine broke after it started (it died: no [DONE]) is logged
// and counted as 502, the status of the upstream_error event the ingress
// ends it with, as an engine's own error event gives the request its code.
// Before, it was counted 200 (fault tester 3), so a dashboard of errors by
// status saw an engine reporting an error but not one crashing mid-answer.
func TestBrokenStreamIsLoggedAs502(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultBreakStream)
	s := startIngress(t, testConfig(StaticEngine{ID: "broken", Model: "m", URL: fe.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	if st != 200 || !strings.Contains(string(body), `"upstream_error"`) {
		t.Fatalf("%d %s", st, body)
	}
	testutil.WaitFor(t, 10*time.Second, "the request counted", func() bool {
		return val(s.m.requests.WithLabelValues("completions", "502"))+val(s.m.requests.WithLabelValues("completions", "200")) == 1
	})
	if got := val(s.m.requests.WithLabelValues("completions", "502")); got != 1 {
		t.Fatalf("requests_total{status=502} = %v, want 1 (200: %v)", got, val(s.m.requests.WithLabelValues("completions", "200")))
	}
	testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return strings.Contains(alog.String(), `"msg":"request"`) })
	if l := accessLines(t, &alog)[0]; l["status"] != float64(502) || !strings.Contains(l["error"].(string), "stream broke") {
		t.Fatalf("access line %v", l)
	}
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream)
	s := startIngress(t, testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()}), Deps{})
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	resp.Body.Close() // client goes away mid-stream
	testutil.WaitFor(t, 5*time.Second, "the upstream request canceled", func() bool { return fe.canceled.Load() == 1 })
	waitSettled(t, s)
}

// A non-streamed request whose client goes away while the engine works is
// cancelled upstream at once (not when the upstream idle timeout fires), is
// recorded as 499, and is not retried on another engine.
func TestClientDisconnectCancelsNonStreamUpstream(t *testing.T) {
	hang := startFaultEngine(t, faultHang)
	other := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "hang", Model: "m", URL: hang.url()}, StaticEngine{ID: "ok", Model: "m", URL: other.url()})
	cfg.IdleTimeout = time.Minute
	cfg.Health.StallAfter = 0 // the hang is the client's to end here, not the stall watch's
	cfg.Scheduler.Policy = "round-robin"
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	// Round-robin: send until one request sits on the hanging engine.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	send := func() {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(`{"model":"m","prompt":[1,2]}`))
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
	}
	send()
	testutil.WaitFor(t, 5*time.Second, "a request on the hanging engine", func() bool {
		if hang.hits.Load() == 1 {
			return true
		}
		select {
		case err := <-done: // it went to the good engine: send another
			if err != nil {
				t.Fatal(err)
			}
			send()
		default:
		}
		return false
	})
	okHits := other.hits.Load()
	cancel() // the client goes away; net/http closes the connection
	if err := <-done; err == nil {
		t.Fatal("request finished although the engine hangs")
	}
	testutil.WaitFor(t, 5*time.Second, "the hanging engine's request canceled", func() bool { return hang.canceled.Load() == 1 })
	waitSettled(t, s)
	if other.hits.Load() != okHits {
		t.Fatal("a request whose client left was retried on another engine")
	}
	if got := val(s.m.requests.WithLabelValues("completions", "499")); got != 1 {
		t.Fatalf("499 count %v", got)
	}

}

// The watcher only peeks: pipelined requests on one keep-alive connection
// are all answered, in order.
func TestClientWatchKeepsPipelining(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	conn := dialIngress(t, s)
	const n = 3
	var reqs strings.Builder
	for i := 0; i < n; i++ {
		body := fmt.Sprintf(`{"model":"m","prompt":[%d,2]}`, i+1)
		fmt.Fprintf(&reqs, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	if _, err := io.WriteString(conn, reqs.String()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i := 0; i < n; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !json.Valid(b) {
			t.Fatalf("response %d: %d %s %v", i, resp.StatusCode, b, err)
		}
	}
	if fe.hits.Load() != n {
		t.Fatalf("engine saw %d requests, want %d", fe.hits.Load(), n)
	}
	waitSettled(t, s)
}

func TestDrainFinishesStreamsAndRefusesNew(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream)
	cfg := testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()})
	cfg.DrainTimeout = 300 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	testutil.WaitFor(t, 10*time.Second, "the ingress draining", func() bool { return s.draining.Load() })
	resp2, err := http.Get("http://" + s.Addr() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	st := resp2.StatusCode
	if st != 503 {
		t.Fatalf("/ready while draining = %d", st)
	}
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
	if st != 503 {
		t.Fatalf("new request while draining = %d %s", st, b)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := s.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
}

// frozenEngine is a FAKE engine for a hung process (SIGSTOP, a stuck GPU
// driver, a blackholed path): its port accepts connections (the kernel's
// backlog) and nothing ever answers, health probes included.
func frozenEngine(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return "http://" + ln.Addr().String()
}

// A request the stall watch cuts on a hung engine that is the model's only
// one fails saying so: the engine stalled and the ingress cut the request,
// not "the engine closed the connection before answering" (fault tester 4:
// a SIGSTOPped engine closed nothing).
func TestStallCutSaysTheEngineStalled(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "frozen", Model: "m", URL: frozenEngine(t)})
	cfg.IdleTimeout = 10 * time.Minute
	cfg.Health.StallAfter = 100 * time.Millisecond
	cfg.Health.ProbeTimeout = 200 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	client := &http.Client{Timeout: time.Minute} // far below the idle timeout: a stuck request fails the test
	st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2]}`)
	if st != 503 || !strings.Contains(string(b), "the engine stalled") || strings.Contains(string(b), errClosedEarly) {
		t.Fatalf("a request cut on a hung engine: %d %s", st, b)
	}
}

// A request stuck on a hung engine moves to a live one once the stall watch
// has probed the hung engine and ejected it, long before the idle timeout;
// later requests avoid it. A live engine that is merely slow (its probe
// answers) keeps its request until FirstByteTimeout, and then the client
// gets 504: not retried (another engine would start the generation over),
// and the engine stays in routing.
func TestStallWatchEjectsHungEngine(t *testing.T) {
	good := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "frozen", Model: "m", URL: frozenEngine(t)}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
	cfg.Scheduler.Policy = "round-robin" // the first request of two goes to each engine
	cfg.IdleTimeout = 10 * time.Minute
	cfg.MaxAttempts = 2
	cfg.Health.StallAfter = 100 * time.Millisecond
	cfg.Health.ProbeTimeout = 200 * time.Millisecond
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	client := &http.Client{Timeout: time.Minute} // far below the idle timeout: a stuck request fails the test
	for i := 0; i < 6; i++ {
		stream := i%2 == 1
		body := `{"model":"m","prompt":[1,2],"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d via %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if got := seriesSum(s.health.stalls); got != 1 {
		t.Fatalf("%v stall ejections, want 1 (the frozen engine, once: it stays ejected)", got)
	}
	if out := logs.String(); strings.Count(out, "engine ejected") != 1 || !strings.Contains(out, `engine=frozen reason="stalled: requests in flight`) {
		t.Fatalf("the stall ejection, logged once:\n%s", out)
	}
	if ej := s.health.ejected(); len(ej) != 1 || ej[0] != "frozen" {
		t.Fatalf("ejected %v", ej)
	}
	waitSettled(t, s)

	// Slow but alive: the probe answers, so the request stays and ends
	// with the first-byte timeout (shortened here), not with an ejection,
	// and is not retried on the other engine.
	slow := startFaultEngine(t, faultHangAlive)
	good2 := startFaultEngine(t, faultOK)
	cfg2 := testConfig(StaticEngine{ID: "slow", Model: "m", URL: slow.url()}, StaticEngine{ID: "good", Model: "m", URL: good2.url()})
	cfg2.Scheduler.Policy = "round-robin" // one of the first two requests goes to each engine
	cfg2.FirstByteTimeout = 2 * time.Second
	cfg2.MaxAttempts = 2
	cfg2.Health.StallAfter = 100 * time.Millisecond
	s2 := startIngress(t, cfg2, Deps{})
	for i := 0; i < 2; i++ {
		st, hdr, b := post(t, client, "http://"+s2.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
		if hdr.Get("X-Kvmesh-Engine") == "good" && st == 200 {
			continue
		}
		if st != 504 || hdr.Get("X-Kvmesh-Engine") != "slow" || !strings.Contains(string(b), `"code":"timeout"`) {
			t.Fatalf("status %d via %q from a slow engine, want 504 after the first-byte timeout: %s", st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if okAsked := prompts(good2); slow.hits.Load() != 1 || okAsked != 1 {
		t.Fatalf("slow engine %d requests, good one %d: want 1 and 1 (the timeout not retried)", slow.hits.Load(), okAsked)
	}
	if got := seriesSum(s2.health.stalls); got != 0 || slow.probes.Load() == 0 || len(s2.health.ejected()) != 0 {
		t.Fatalf("%v stall ejections of a live engine after %d probes, ejected %v; want 0 after at least one, none", got, slow.probes.Load(), s2.health.ejected())
	}
	if got := val(s2.m.attempts.WithLabelValues("first_byte_timeout")); got != 1 {
		t.Fatalf("%v first-byte timeouts recorded, want 1", got)
	}

	// A busy moment: the first probe of a stall gets no answer, the second
	// (overlapping it) does. Not ejected.
	var probes atomic.Int64
	quit := make(chan struct{})
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && probes.Add(1) > 1 {
			return // 200
		}
		select { // the first probe, and every request: no answer
		case <-r.Context().Done():
		case <-quit:
		}
	}))
	t.Cleanup(busy.Close)
	t.Cleanup(func() { close(quit) }) // runs first: Close waits for the handlers
	cfg3 := testConfig(StaticEngine{ID: "busy", Model: "m", URL: busy.URL})
	cfg3.FirstByteTimeout = 2 * time.Second
	cfg3.MaxAttempts = 1
	cfg3.Health.StallAfter = 100 * time.Millisecond
	cfg3.Health.ProbeTimeout = 400 * time.Millisecond
	s3 := startIngress(t, cfg3, Deps{})
	if st, _, _ := post(t, client, "http://"+s3.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`); st != 504 {
		t.Fatalf("status %d from a busy engine, want 504 after the first-byte timeout", st)
	}
	if got := seriesSum(s3.health.stalls); got != 0 || probes.Load() < 2 {
		t.Fatalf("%v stall ejections after %d probes of an engine whose second probe answers; want 0 after at least 2", got, probes.Load())
	}
}

// A first event larger than the proxy's buffer (a chunk carrying a long
// prompt's token ids, say) streams through whole, for chat-style and
// Responses streams alike.
func TestLargeFirstEvent(t *testing.T) {
	big := strings.Repeat("1,", 3*streamBufSize)
	for _, tc := range []struct{ path, events string }{
		{"/v1/completions", "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}],\"prompt_token_ids\":[" + big + "1]}\n\ndata: [DONE]\n\n"},
		{"/v1/responses", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"" + big + "\"}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":1}}}\n\n"},
	} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, tc.events)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + ln.Addr().String()}), Deps{})
		body := `{"model":"m","prompt":[1],"stream":true}`
		if tc.path == "/v1/responses" {
			body = `{"model":"m","input":"x","stream":true}`
		}
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, body)
		if st != 200 || string(b) != tc.events {
			t.Fatalf("%s: %d, %d bytes of %d (%.100q)", tc.path, st, len(b), len(tc.events), b)
		}
	}
}

// An error event with a 4xx code as a stream's first event is the request's
// own error (vLLM and SGLang raise some validation errors inside the
// stream): the client gets it as the engine sent it, no other engine is
// tried and the engine stays in routing. With a 5xx code the engine failed:
// the request is retried on the next engine, as after a 5xx answer.
func TestErrorEventFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  faultMode
		retry bool
	}{{"code 400", faultStreamError400, false}, {"code 500", faultStreamError500, true}} {
		t.Run(tc.name, func(t *testing.T) {
			bad := startFaultEngine(t, tc.mode)
			good := startFaultEngine(t, faultOK)
			cfg := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.url()}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
			cfg.Scheduler.Policy = "round-robin"
			cfg.Health.ConsecutiveFailures = 1 // one hard failure would eject
			s := startIngress(t, cfg, Deps{})
			url := "http://" + s.Addr() + "/v1/completions"
			served := 0
			for i := 0; i < 6; i++ {
				st, hdr, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1],"stream":true}`)
				if st != 200 {
					t.Fatalf("status %d: %s", st, body)
				}
				if hdr.Get("X-Kvmesh-Engine") != "bad" {
					continue
				}
				evs := sseEvents(body)
				if tc.retry {
					t.Fatalf("served by the failing engine: %q", evs)
				}
				if len(evs) != 2 || !strings.Contains(evs[0], `"code": 400`) || evs[1] != "[DONE]" {
					t.Fatalf("events %q", evs)
				}
				served++
			}
			if tc.retry {
				if bad.hits.Load() == 0 {
					t.Fatal("the failing engine was never tried")
				}
				return
			}
			if served != 3 || seriesSum(s.health.ejections) != 0 {
				t.Fatalf("the engine served %d of 6 round-robin requests, %v ejections; want 3 and none: it is not at fault", served, seriesSum(s.health.ejections))
			}
		})
	}
}

// A request head up to 16 KiB (what vLLM's server takes) is served; a
// larger one gets 431 in the OpenAI error shape, and the error quotes none
// of the head (it holds the credential).
func TestLargeRequestHeaders(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	do := func(n int) (int, string) {
		// The server answers 431 and closes with the rest of the head
		// unread, so the kernel may reset the connection before the client
		// reads the answer (a TCP race, not the ingress's behaviour): a
		// reset is tried again, three times at most.
		for try := 0; ; try++ {
			req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1]}`))
			req.Header.Set("Authorization", "Bearer secret-"+strings.Repeat("x", n))
			req.Close = true
			resp, err := http.DefaultClient.Do(req)
			if err != nil && try < 2 && errors.Is(err, syscall.ECONNRESET) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
	}
	if st, b := do(9 << 10); st != 200 {
		t.Fatalf("9 KiB header: %d %s", st, b)
	}
	st, b := do(20 << 10)
	if st != 431 || strings.Contains(b, "secret") || !strings.Contains(b, `"code":"request_header_too_large"`) {
		t.Fatalf("20 KiB header: %d %s", st, b)
	}
}

// A non-streamed answer larger than the ingress buffers is a clear 502,
// not a body cut short under a 200, and is not retried elsewhere.
func TestHugeAnswerIs502(t *testing.T) {
	huge := startFaultEngine(t, faultHugeAnswer)
	other := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "huge", Model: "m", URL: huge.url()}, StaticEngine{ID: "ok", Model: "m", URL: other.url()})
	cfg.Scheduler.Policy = "round-robin"
	// Reading 64 MiB under the race detector on a busy machine can pause
	// past stallAfter, and a probe starved as long would let the stall
	// watch cut the read (it is not committed yet): not what this is about.
	cfg.Health.StallAfter = 0
	s := startIngress(t, cfg, Deps{})
	for i := 0; i < 2; i++ {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
		if hdr.Get("X-Kvmesh-Engine") == "ok" || st == 200 && len(b) < 1<<20 {
			continue
		}
		if st != 502 || !strings.Contains(string(b), `"code":"upstream_response_too_large"`) {
			t.Fatalf("%d %.300s", st, b)
		}
	}
	if asked, okAsked := prompts(huge), prompts(other); asked != 1 || okAsked != 1 {
		t.Fatalf("requests %d and %d; want one each (the huge answer not retried)", asked, okAsked)
	}
}

// prompts counts the inference requests fe saw (its hits count health
// probes too).
func prompts(fe *faultEngine) int {
	n := 0
	for len(fe.bodies) > 0 {
		if strings.Contains(string(<-fe.bodies), `"prompt"`) {
			n++
		}
	}
	return n
}

// A streamed request whose client goes away before the first event (the
// engine still queueing or prefilling it) is cancelled upstream at once, as
// vLLM cancels on disconnect, and is not retried elsewhere.
func TestClientDisconnectCancelsStreamBeforeFirstEvent(t *testing.T) {
	hang := startFaultEngine(t, faultHang)
	cfg := testConfig(StaticEngine{ID: "hang", Model: "m", URL: hang.url()})
	cfg.IdleTimeout = time.Minute
	cfg.Health.StallAfter = 0
	s := startIngress(t, cfg, Deps{})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the request reached the engine", func() bool { return hang.hits.Load() == 1 })
	cancel()
	<-done
	testutil.WaitFor(t, 10*time.Second, "the upstream request canceled", func() bool { return hang.canceled.Load() == 1 })
	waitSettled(t, s)
	if hang.hits.Load() != 1 {
		t.Fatalf("%d upstream requests; want 1 (not retried)", hang.hits.Load())
	}
}

// truncate_prompt_tokens: the engine keeps the prompt's last k tokens, so
// the prompt limit counts k, not what the client sent.
func TestTruncatePromptTokens(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.MaxPromptTokens = 100
	s := startIngress(t, cfg, Deps{})
	ids := strings.TrimSuffix(strings.Repeat("7,", 150), ",")
	for _, tc := range []struct {
		extra string
		want  int
	}{{``, 400}, {`,"truncate_prompt_tokens":50`, 200}, {`,"truncate_prompt_tokens":-1`, 400}, {`,"truncate_prompt_tokens":0`, 400}, {`,"truncate_prompt_tokens":"x"`, 400}} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[`+ids+`]`+tc.extra+`}`)
		if st != tc.want {
			t.Fatalf("%q: %d %s", tc.extra, st, b)
		}
	}
}

// Behind real simulators, which keep the prompt's last k tokens as vLLM
// does: a request with truncate_prompt_tokens is keyed on that tail, so
// another head with the same tail goes to the engine that holds it, and
// that engine reports the tail cached. A batch is keyed on its first
// prompt's tail (before, on the whole first prompt).
func TestTruncatedPromptRoutesOnItsTail(t *testing.T) {
	cfg := testConfig(simEngines(startSims(t, 4, "m"), "m")...)
	cfg.Scheduler.Policy = "kvmesh"
	s := startIngress(t, cfg, Deps{})
	prompt := func(head, tail int) string {
		var b strings.Builder
		for i := range 300 {
			if i > 0 {
				b.WriteByte(',')
			}
			if i < 100 {
				b.WriteString(strconv.Itoa(head*1000 + i + 1))
			} else {
				b.WriteString(strconv.Itoa(500000 + tail*1000 + i))
			}
		}
		return b.String()
	}
	for tail := range 12 {
		batch := tail >= 6 // [[first], [other]]: keyed on the first
		var first string
		for head := range 2 {
			p, want := `[`+prompt(tail*10+head, tail)+`]`, 200
			if batch {
				p, want = `[`+p+`,[`+prompt(900+tail*10+head, 100+tail*2+head)+`]]`, 400
			}
			st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions",
				`{"model":"m","max_tokens":1,"truncate_prompt_tokens":200,"prompt":`+p+`}`)
			var c struct{ Usage openai.Usage }
			if st != 200 || json.Unmarshal(b, &c) != nil || c.Usage.PromptTokens != want {
				t.Fatalf("tail %d, head %d: %d %s", tail, head, st, b)
			}
			if head == 0 {
				first = hdr.Get("X-Kvmesh-Engine")
				continue
			}
			if got := hdr.Get("X-Kvmesh-Engine"); got != first || c.Usage.CachedTokens() < 176 {
				t.Errorf("tail %d (batch %v): the second head went to %s (the first to %s) with %d tokens cached", tail, batch, got, first, c.Usage.CachedTokens())
			}
		}
	}
}

// A request that does not arrive within readTimeout gets 408 (not 400 with
// the socket's error) and its connection is closed.
func TestSlowRequestIs408(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.ReadTimeout = 200 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	conn := dialIngress(t, s)
	// Half a request head, then nothing: the server's read deadline passes.
	if _, err := fmt.Fprint(conn, "POST /v1/completions HTTP/1.1\r\nHost: kvmesh\r\n"); err != nil {
		t.Fatal(err)
	}
	read408(t, conn)
}

// read408 reads the answer on conn and checks it is readTimeout's: 408,
// request_timeout, the connection closing.
func read408(t *testing.T, conn net.Conn) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 408 || !resp.Close || !strings.Contains(string(b), `"code":"request_timeout"`) {
		t.Fatalf("%d close=%v %s, want 408 closing the connection", resp.StatusCode, resp.Close, b)
	}
	return resp
}
