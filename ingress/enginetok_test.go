package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/sim"
)

// A model the ingress has no tokenizer for is keyed on the tokens the
// engine's /tokenize gives: every key of a chat request (the engine's own
// template) and of a text prompt is a block the engine cached, and the
// engine's prompt token count agrees. A request with an image is not sent
// there; an engine without /tokenize is asked once, then the model is
// routed unkeyed.
func TestEngineTokenize(t *testing.T) {
	nt, tpl := llama(t)
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	// Two more models on proxies to the same simulator: one hides
	// /tokenize, as an engine without it answers, the other refuses chat
	// there (422), as an engine whose /tokenize takes no messages.
	target, _ := url.Parse(sm.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := func(model string, status int, asked *atomic.Int64) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/tokenize" {
				asked.Add(1)
				http.Error(w, "no", status)
				return
			}
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			b = bytes.Replace(b, []byte(`"model":"`+model+`"`), []byte(`"model":"llama"`), 1)
			r2 := r.Clone(r.Context())
			r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			rp.ServeHTTP(w, r2)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	var asked, refused atomic.Int64
	hidden := proxy("other", http.StatusNotFound, &asked)
	refusing := proxy("refusing", http.StatusUnprocessableEntity, &refused)

	cfg := testConfig(StaticEngine{ID: "s", Model: "llama", URL: sm.URL()}, StaticEngine{ID: "h", Model: "other", URL: hidden.URL},
		StaticEngine{ID: "r", Model: "refusing", URL: refusing.URL})
	cfg.Scheduler.Policy = "kvmesh"
	deps := Deps{Logger: quietLog(), Registry: prometheus.NewRegistry()}
	s, spy := spiedIngress(t, cfg, deps)

	system := strings.Repeat("You translate short English phrases into French and say nothing else. ", 10)
	send := func(path, body string) []uint64 {
		t.Helper()
		if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+path, body); st != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, st, b)
		}
		return spy.last()
	}
	chat := `{"model":"llama","max_tokens":2,"messages":[{"role":"system","content":` + string(mustJSON(t, system)) + `},{"role":"user","content":"Good morning"}]}`
	keys := send("/v1/chat/completions", chat)
	if len(keys) < len(nt.Encode(system, false))/16 {
		t.Fatalf("chat: %d keys for a %d-token system prompt", len(keys), len(nt.Encode(system, false)))
	}
	engineCachedAll(t, sm, keys)
	text := `{"model":"llama","max_tokens":2,"prompt":` + string(mustJSON(t, system+"Thank you")) + `}`
	keys = send("/v1/completions", text)
	if len(keys) == 0 {
		t.Fatal("text prompt: no keys")
	}
	engineCachedAll(t, sm, keys)
	if ok, eq, df := val(s.etok.ok), val(s.check.equal), val(s.check.differ); ok != 2 || eq != 1 || df != 0 {
		t.Fatalf("%v prompts tokenized on the engine (want 2); token counts %v equal, %v different (want 1, 0)", ok, eq, df)
	}

	image := `{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`
	if keys := send("/v1/chat/completions", image); len(keys) != 0 || val(s.etok.ok) != 2 {
		t.Fatalf("a request with an image: %d keys, %v engine tokenizations", len(keys), val(s.etok.ok))
	}

	other := strings.Replace(chat, `"model":"llama"`, `"model":"other"`, 1)
	for range 3 {
		if keys := send("/v1/chat/completions", other); len(keys) != 0 {
			t.Fatalf("engine without /tokenize: %d keys", len(keys))
		}
	}
	if n := asked.Load(); n != 1 || val(s.etok.unsup) != 1 {
		t.Fatalf("an engine without /tokenize was asked %d times (%v counted), want once", n, val(s.etok.unsup))
	}
	refusingChat := strings.Replace(chat, `"model":"llama"`, `"model":"refusing"`, 1)
	for range failRun + 3 {
		if keys := send("/v1/chat/completions", refusingChat); len(keys) != 0 {
			t.Fatalf("engine refusing chat on /tokenize: %d keys", len(keys))
		}
	}
	if n := refused.Load(); n != failRun {
		t.Fatalf("an engine refusing chat on /tokenize was asked %d times for %d requests, want %d", n, failRun+3, failRun)
	}
}

// FuzzTokenizeAnswer: reading a /tokenize answer never panics, and what it
// accepts is the answer's top-level "tokens" as encoding/json reads them.
func FuzzTokenizeAnswer(f *testing.F) {
	f.Add([]byte(`{"count":3,"max_model_len":8192,"tokens":[1,2,3],"token_strs":null}`))
	f.Add([]byte(`{"tokens":[]}`))
	f.Add([]byte(`{"a":"\"tokens\":[9]","tokens":[4294967295]}`))
	f.Add([]byte(`{"tokens":[1,-2]}`))
	f.Add([]byte(`{"tokens":[1],"tokens":[2]}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, ok := tokenizeAnswerIDs(nil, b)
		if !ok {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		if bytes.IndexByte(b, '\\') >= 0 {
			return // an escaped key may spell "tokens": the reference below would see it
		}
		want, found := firstTokens(b)
		if !found || !slices.Equal(ids, want) {
			t.Fatalf("%q: read %v, encoding/json's first \"tokens\" %v (found %v)", b, ids, want, found)
		}
	})
}

// firstTokens decodes the first top-level "tokens" member of b with
// encoding/json.
func firstTokens(b []byte) ([]uint32, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if k == "tokens" {
			var ids []uint32
			if err := json.Unmarshal(raw, &ids); err != nil {
				return nil, false
			}
			return ids, true
		}
	}
	return nil, false
}

// TestEngineTokenizeHungEngine: an engine whose /tokenize hangs (a stopped
// process: the port accepts, nothing answers) costs a request at most
// EngineTokenizeTimeout there; the request is routed unkeyed and served,
// and the next one does not ask that engine (its backoff; the model has no
// other). The upstream connection's read deadline used to ignore the
// call's timeout, so the request waited as long as the engine did.
func TestEngineTokenizeHungEngine(t *testing.T) {
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	srv, asked := hungTokenizeProxy(t, sm.URL())
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: srv.URL})
	cfg.Scheduler.Policy = "kvmesh"
	s := startIngress(t, cfg, Deps{Logger: quietLog(), Registry: prometheus.NewRegistry()})
	client := &http.Client{Timeout: 30 * time.Second} // far above the 250 ms bound: only a hang reaches it
	for i := range 2 {
		st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"a prompt the ingress cannot tokenize"}`)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "e" {
			t.Fatalf("request %d: status %d engine %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if n, failed, ok := asked.Load(), val(s.etok.failed), val(s.etok.ok); n != 1 || failed != 1 || ok != 0 {
		t.Fatalf("/tokenize asked %d times, %v failed, %v ok; want 1, 1, 0", n, failed, ok)
	}
}

// TestEngineTokenizeHungEngineAmongOthers: one engine of the model whose
// /tokenize hangs (a stopped process the stall watch has not ejected yet,
// listed first so that the least-loaded pick takes it while every engine
// is idle) costs one request one timeout: that request asks the next
// engine, every later one skips the hung engine for its backoff, every
// prompt is keyed on an engine's tokens, and the model's engines are still
// asked. Before, three requests in a row timed out on the hung engine
// (unkeyed) and engine-side tokenization went off for the whole model.
// Real engines on loopback: two simulators and a proxy to a third whose
// /tokenize never answers.
func TestEngineTokenizeHungEngineAmongOthers(t *testing.T) {
	var sims []*sim.Server
	for i := range 3 {
		sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Seed: uint64(i + 1), Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		sims = append(sims, sm)
	}
	srv, asked := hungTokenizeProxy(t, sims[0].URL())
	cfg := testConfig(StaticEngine{ID: "hung", Model: "m", URL: srv.URL}, StaticEngine{ID: "a", Model: "m", URL: sims[1].URL()},
		StaticEngine{ID: "b", Model: "m", URL: sims[2].URL()})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.EngineTokenizeTimeout = 2 * time.Second // the live engines must answer in time on a busy machine
	s, spy := spiedIngress(t, cfg, Deps{Logger: quietLog(), Registry: prometheus.NewRegistry()})
	client := &http.Client{Timeout: time.Minute}
	const n = 6
	for i := range n {
		body := `{"model":"m","max_tokens":2,"prompt":"request ` + strconv.Itoa(i) + ` ` + strings.Repeat("a prompt the ingress cannot tokenize ", 8) + `"}`
		if st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", body); st != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, st, b)
		}
		if keys := spy.last(); len(keys) == 0 {
			t.Fatalf("request %d routed unkeyed", i)
		}
		if !s.etok.asking("m") {
			t.Fatalf("after request %d the model's engines are not asked", i)
		}
	}
	if got, failed, ok := asked.Load(), val(s.etok.failed), val(s.etok.ok); got != 1 || failed != 1 || ok != n {
		t.Fatalf("the hung engine asked %d times, %v failed, %v tokenized; want 1, 1, %d", got, failed, ok, n)
	}
}

// TestEngineTokenizeDeadlineEndsWithTheCall: the /tokenize call's deadline
// does not outlive it. With one connection to the engine, the stream after
// a tokenized prompt runs on the connection the call used, and is not cut
// when that deadline passes: the engine's answer is held after its first
// bytes until EngineTokenizeTimeout has run out since the stream began
// (so since after the call's deadline was set), then let go.
func TestEngineTokenizeDeadlineEndsWithTheCall(t *testing.T) {
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 0.05, Logger: quietLog()}) // 20× slower than the model: a token per write
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	target, _ := url.Parse(sm.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	streaming, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" && held.CompareAndSwap(false, true) {
			w = &holdingWriter{ResponseWriter: w, first: streaming, gate: release}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close) // after close(release) below: cleanups run last first
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: srv.URL})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.MaxConnsPerEngine = 1
	cfg.EngineTokenizeTimeout = 2 * time.Second // the call itself must not time out on a busy machine
	s := startIngress(t, cfg, Deps{Logger: quietLog(), Registry: prometheus.NewRegistry()})
	go func() {
		select {
		case <-streaming:
		case <-time.After(30 * time.Second):
			let() // the request failed before its stream; the checks below report it
			return
		}
		// The call's deadline was set before the stream began: it has
		// passed once its timeout has since the stream's first bytes.
		<-time.After(cfg.EngineTokenizeTimeout)
		let()
	}()
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","max_tokens":12,"ignore_eos":true,"stream":true,"prompt":"a prompt the ingress cannot tokenize"}`)
	evs := sseEvents(b)
	if st != http.StatusOK || len(evs) < 2 || evs[len(evs)-1] != "[DONE]" || strings.Contains(string(b), `"error"`) {
		t.Fatalf("status %d, %d events: %s", st, len(evs), b)
	}
	if val(s.etok.ok) != 1 {
		t.Fatalf("%v prompts tokenized on the engine, want 1", val(s.etok.ok))
	}
	select {
	case <-streaming:
	default:
		t.Fatal("the stream did not go through the holding engine")
	}
}

// holdingWriter sends the first write of a response, closes first and
// holds the rest of the response until gate closes.
type holdingWriter struct {
	http.ResponseWriter
	first, gate chan struct{}
	n           int
}

func (w *holdingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	if w.n++; w.n == 1 {
		w.Flush()
		close(w.first)
		<-w.gate
	}
	return n, err
}

func (w *holdingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *holdingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hungTokenizeProxy is a proxy to the engine at engineURL whose /tokenize
// never answers (until the test ends); asked counts the /tokenize calls.
func hungTokenizeProxy(t *testing.T, engineURL string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	target, err := url.Parse(engineURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	hung := make(chan struct{})
	asked := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			asked.Add(1)
			<-hung
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close) // after close(hung) below: cleanups run last first
	t.Cleanup(func() { close(hung) })
	return srv, asked
}
