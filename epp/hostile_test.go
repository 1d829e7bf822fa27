package epp

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The picker against the data plane's odd and heavy cases (a black-box
// test's findings), one ext_proc message at a time. A picker over static
// engines (never contacted: the stand-in only reads the answers) is enough.

var (
	fd       = extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	buffered = extprocfilter.ProcessingMode_BUFFERED
	partial  = extprocfilter.ProcessingMode_BUFFERED_PARTIAL
	streamed = extprocfilter.ProcessingMode_STREAMED
)

type staticRig struct {
	s   *Server
	reg *prometheus.Registry
}

// newStaticRig starts a picker over static engines (id → URL).
func newStaticRig(t *testing.T, engines [][2]string, cfg Config, deps Deps, mut func(*ingress.Config)) *staticRig {
	t.Helper()
	return newStaticRigWith(t, engines, cfg, deps, mut, nil)
}

// newStaticRigWith is newStaticRig with the ingress's dependencies set by
// ideps (authentication, for one).
func newStaticRigWith(t *testing.T, engines [][2]string, cfg Config, deps Deps, mut func(*ingress.Config), ideps func(*ingress.Deps)) *staticRig {
	t.Helper()
	nt, tpl := testTokenizer(t)
	tk, err := ingress.NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	ic := ingress.DefaultConfig()
	ic.Listen = "127.0.0.1:0"
	ic.AccessLog = false
	ic.Scheduler.Policy = "kvmesh"
	for _, e := range engines {
		ic.Engines = append(ic.Engines, ingress.StaticEngine{ID: e[0], Model: model, URL: e[1]})
	}
	if mut != nil {
		mut(&ic)
	}
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ideps0 := ingress.Deps{Logger: quiet, AccessLog: quiet, Registry: reg, Index: idx, Tokenizers: ingress.TokenizerMap{model: tk}}
	if ideps != nil {
		ideps(&ideps0)
	}
	ing, err := ingress.New(ic, ideps0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.TLS, cfg.Logger, cfg.Registerer = "127.0.0.1:0", TLSOff, quiet, reg
	deps.Ingress = ing
	s, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ing.Close() })
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return &staticRig{s: s, reg: reg}
}

var twoEngines = [][2]string{{"e1", "http://10.0.0.1:8000"}, {"e2", "http://10.0.0.2:8000"}}

// stream is one ext_proc stream the test plays message by message.
type stream struct {
	t      *testing.T
	env    *envoyStandIn
	st     extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
	sent   bool
}

func (r *staticRig) open(t *testing.T, reqMode extprocfilter.ProcessingMode_BodySendMode) *stream {
	t.Helper()
	env := newEnvoy(t, r.s.Addr(), reqMode, extprocfilter.ProcessingMode_NONE)
	// A guard, not a timing: an answer that never comes fails the test
	// instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	st, err := env.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &stream{t: t, env: env, st: st, cancel: cancel}
}

func (s *stream) send(m *extprocv3.ProcessingRequest) *stream {
	s.t.Helper()
	if !s.sent {
		s.env.first(m)
		s.sent = true
	}
	if err := s.st.Send(m); err != nil {
		s.t.Fatal(err)
	}
	return s
}

// headers sends the request headers (POST path, unless kv names another
// :method; kv added).
func (s *stream) headers(path string, eos bool, kv ...[2]string) *stream {
	hs := [][2]string{{":method", "POST"}, {":path", path}, {"content-type", "application/json"}}
	for _, h := range kv {
		if h[0] == ":method" {
			hs[0][1] = h[1]
		} else {
			hs = append(hs, h)
		}
	}
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: s.env.headerMap(hs), EndOfStream: eos}}})
}

func (s *stream) body(b []byte, eos bool) *stream {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
}

func (s *stream) trailers() *stream {
	return s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{
		Trailers: s.env.headerMap([][2]string{{"x-trailer", "1"}})}}})
}

func (s *stream) recv() *extprocv3.ProcessingResponse {
	s.t.Helper()
	m, err := s.st.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return m
}

// refused reads an answer that must be an ImmediateResponse with status
// and code, and returns it.
func (s *stream) refused(status int, code string) *extprocv3.ImmediateResponse {
	s.t.Helper()
	m := s.recv()
	checkImmediate(s.t, &exchangeResult{immediate: m.GetImmediateResponse()}, status, code)
	return m.GetImmediateResponse()
}

// end closes the request side as the data plane does after a response
// with no body, and waits for the stream's end.
func (s *stream) end() {
	s.t.Helper()
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: s.env.headerMap([][2]string{{":status", "200"}}), EndOfStream: true}}})
	s.recv()
	s.closed()
}

// closed half-closes the stream and waits for the picker to end it.
func (s *stream) closed() {
	s.t.Helper()
	if err := s.st.CloseSend(); err != nil {
		s.t.Fatal(err)
	}
	if _, err := s.st.Recv(); !errors.Is(err, io.EOF) {
		s.t.Fatalf("stream end: %v", err)
	}
}

// destOf is the destination a routing answer sets (header mutation) and
// its envoy.lb metadata value.
func destOf(m *extprocv3.ProcessingResponse) (header, meta string) {
	var c *extprocv3.CommonResponse
	switch {
	case m.GetRequestHeaders() != nil:
		c = m.GetRequestHeaders().GetResponse()
	case m.GetRequestBody() != nil:
		c = m.GetRequestBody().GetResponse()
	}
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == DestinationKey {
			header = string(h.GetHeader().GetRawValue())
		}
	}
	if v := m.GetDynamicMetadata().GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationKey]; v != nil {
		meta = v.GetStringValue()
	}
	return header, meta
}

// routed checks a routing answer and returns its destination.
func routed(t *testing.T, m *extprocv3.ProcessingResponse) string {
	t.Helper()
	if ir := m.GetImmediateResponse(); ir != nil {
		t.Fatalf("refused %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	h, md := destOf(m)
	if h == "" || h != md {
		t.Fatalf("destination header %q, metadata %q: %v", h, md, m)
	}
	return h
}

func immediateHeader(ir *extprocv3.ImmediateResponse, key string) string {
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == key {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// padded is a valid completions body of about n bytes (a long "user"
// field the ingress skips).
func padded(n int) []byte {
	head := `{"model":"` + model + `","prompt":"hello there","max_tokens":3,"user":"`
	return []byte(head + strings.Repeat("u", max(n-len(head)-2, 0)) + `"}`)
}

// TestBodyBudget: the bodies the picker buffers are charged to the
// ingress's --max-body-in-flight as they arrive (or at their headers, by
// their content-length); past it a large body is
// refused at once with the ingress's 503 and Retry-After (counted as
// overloaded), a small one still passes, and the charge is given back
// whichever way the stream ends (cancel, refusal, response).
func TestBodyBudget(t *testing.T) {
	const budget = 1 << 20
	r := newStaticRig(t, twoEngines, Config{MaxBodyBytes: budget}, Deps{}, func(c *ingress.Config) {
		c.MaxBodyBytes, c.MaxBodyBytesInFlight = budget, budget
	})
	inFlight := func() float64 { return counter(t, r.reg, "kvmesh_ingress_body_bytes_in_flight") }

	// A slow upload holds the whole budget.
	slow := r.open(t, fd).headers("/v1/completions", false).body(make([]byte, budget), false)
	testutil.WaitFor(t, 30*time.Second, "the slow body charged", func() bool { return inFlight() == budget })

	// A large body is refused while it lasts, as the ingress refuses it.
	big := r.open(t, fd).headers("/v1/completions", false).body(make([]byte, 100<<10), false)
	ir := big.refused(503, "ingress_body_budget_exhausted")
	if immediateHeader(ir, "retry-after") != "1" || ir.GetDetails() != "kvmesh_epp_body_budget" {
		t.Fatalf("budget refusal headers %v details %q", ir.GetHeaders(), ir.GetDetails())
	}
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "overloaded"); got != 1 {
		t.Fatalf("overloaded counted %v, want 1", got)
	}
	// A body that says its size is refused at its headers, before it comes
	// (BUFFERED would send it whole, into gRPC's buffers); one past
	// --max-body gets its 413 there.
	r.open(t, buffered).headers("/v1/completions", false, [2]string{"content-length", strconv.Itoa(100 << 10)}).refused(503, "ingress_body_budget_exhausted")
	r.open(t, fd).headers("/v1/completions", false, [2]string{"content-length", strconv.Itoa(budget + 1)}).refused(413, "request_too_large")
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "overloaded"); got != 2 {
		t.Fatalf("overloaded counted %v, want 2", got)
	}
	// A small one (at most 64 KiB) always passes.
	small := r.open(t, fd).headers("/v1/completions", false).body([]byte(completionsBody("a small one", false)), true)
	routed(t, small.recv())
	small.recv() // the body passed back
	small.end()
	// A small gzip body is decoded only as far as the budget has room (the
	// 64 KiB that always pass): a bomb past --max-body is the budget's 503
	// now, not a 413 after decoding --max-body's bytes the budget has no
	// room for.
	r.open(t, fd).headers("/v1/completions", false, [2]string{"content-encoding", "gzip"}).body(gz(t, padded(4*budget)), true).refused(503, "ingress_body_budget_exhausted")
	testutil.WaitFor(t, 30*time.Second, "the bomb's reservation released", func() bool { return inFlight() == budget })

	// The slow client gives up: its charge is given back.
	slow.cancel()
	testutil.WaitFor(t, 30*time.Second, "the cancelled stream's charge released", func() bool { return inFlight() == 0 })

	// Room again for a large body, routed; and one refused past
	// --max-body after its first chunk was charged.
	again := r.open(t, fd).headers("/v1/completions", false).body(padded(100<<10), true)
	routed(t, again.recv())
	if b := again.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); len(b) != len(padded(100<<10)) {
		t.Fatalf("body passed back: %d bytes", len(b))
	}
	tooBig := r.open(t, fd).headers("/v1/completions", false).body(make([]byte, 100<<10), false).body(make([]byte, budget), false)
	tooBig.refused(413, "request_too_large")
	again.end()
	testutil.WaitFor(t, 30*time.Second, "every charge released", func() bool { return inFlight() == 0 })
	if got := counter(t, r.reg, "kvmesh_ingress_body_budget_refusals_total"); got != 3 {
		t.Fatalf("ingress budget refusals %v, want 3", got)
	}
}

// TestPooledExchangeDropsLargeBodies: a finished stream's exchange goes
// back to the pool without a body buffer over 1 MiB or the answers that
// point into it; a small buffer is kept for reuse.
func TestPooledExchangeDropsLargeBodies(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	for _, c := range []struct {
		size int
		kept bool
	}{{2 << 20, false}, {64 << 10, true}} {
		x := r.s.xs.Get().(*exchange)
		x.reset()
		r.s.m.streams.Inc()
		x.body = append(x.body, make([]byte, c.size)...)
		x.out = append(x.out, bodyResponse(streamedBody(x.body, true)))
		out := x.out
		r.s.finish(x)
		if kept := x.body != nil && cap(x.body) >= c.size; kept != c.kept {
			t.Errorf("%d-byte body: buffer kept %v (cap %d), want %v", c.size, kept, cap(x.body), c.kept)
		}
		if out[0] != nil {
			t.Errorf("%d-byte body: the pooled exchange still holds its answers", c.size)
		}
	}
}

// TestLargeMessages: a body in one message past grpc-go's 4 MiB default
// (BUFFERED sends the whole body in one; a large full-duplex chunk) is
// routed, and its answer (the body passed back) sent; past --max-body it
// is the documented 413, not a broken stream.
func TestLargeMessages(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{MaxBodyBytes: 12 << 20}, Deps{}, nil)
	body := padded(10 << 20)
	s := r.open(t, buffered).headers("/v1/completions", false)
	s.recv() // headers answered empty
	routed(t, s.body(body, true).recv())
	s.end()

	s = r.open(t, fd).headers("/v1/completions", false).body(padded(5<<20), true)
	routed(t, s.recv())
	if b := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); len(b) != 5<<20 {
		t.Fatalf("full duplex: %d bytes passed back, want %d", len(b), 5<<20)
	}
	s.end()

	s = r.open(t, buffered).headers("/v1/completions", false)
	s.recv()
	s.body(padded(12<<20+1), true).refused(413, "request_too_large")
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "too_large"); got != 1 {
		t.Fatalf("too_large counted %v, want 1", got)
	}
}

// TestDuplicateEndpoint: two engines of the mesh at one URL (a sidecar
// restarted under a new id) put their endpoint in the fallback list once.
func TestDuplicateEndpoint(t *testing.T) {
	r := newStaticRig(t, [][2]string{{"e1", "http://10.0.0.1:8000"}, {"e1-again", "http://10.0.0.1:8000"}, {"e2", "http://10.0.0.2:8000"}},
		Config{}, Deps{}, nil)
	for i := range 4 {
		s := r.open(t, fd).headers("/v1/completions", false).body([]byte(completionsBody("duplicate "+strconv.Itoa(i), false)), true)
		dest := routed(t, s.recv())
		s.recv()
		eps := strings.Split(dest, ",")
		if len(eps) != 2 || eps[0] == eps[1] {
			t.Fatalf("destination %q: want 10.0.0.1:8000 and 10.0.0.2:8000 once each", dest)
		}
		s.end()
	}
}

// emptyPool is a listed InferencePool with no ready endpoint.
type emptyPool struct{}

func (emptyPool) Has(string) bool { return false }
func (emptyPool) Synced() bool    { return true }

// TestEmptyPoolIsNoEndpoint: a request with a body while the pool has no
// ready endpoint of the mesh is the protocol's no_endpoint 503, as a
// bodyless one, not the ingress's refusal.
func TestEmptyPoolIsNoEndpoint(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{Pool: emptyPool{}}, nil)
	s := r.open(t, fd).headers("/v1/chat/completions", false).body([]byte(chatBody("sys", "hi", false)), true)
	ir := s.refused(503, "service_unavailable")
	if ir.GetDetails() != "kvmesh_epp_no_endpoint" || immediateHeader(ir, "retry-after") != "1" || !strings.Contains(string(ir.GetBody()), "pool") {
		t.Fatalf("details %q headers %v body %s", ir.GetDetails(), ir.GetHeaders(), ir.GetBody())
	}
	r.open(t, fd).headers("/anything", true).refused(503, "service_unavailable")
	if ne, rej := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "no_endpoint"), counter(t, r.reg, "kvmesh_epp_requests_total", "result", "rejected"); ne != 2 || rej != 0 {
		t.Fatalf("no_endpoint %v rejected %v, want 2 and 0", ne, rej)
	}
}

// TestBufferedTrailersWithoutBody: in the buffered modes, headers without
// end_of_stream then trailers and no body get a decision on the trailers:
// a route with a body to decide on (inference, embeddings) the ingress's
// refusal of an empty body, another path a destination in the trailers
// answer's metadata.
func TestBufferedTrailersWithoutBody(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	for _, mode := range []extprocfilter.ProcessingMode_BodySendMode{buffered, partial} {
		s := r.open(t, mode).headers("/v1/completions", false)
		if h := s.recv(); h.GetRequestHeaders() == nil || h.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
			t.Fatalf("%v: headers answer %v", mode, h)
		}
		s.trailers().refused(400, "")

		s = r.open(t, mode).headers("/v1/embeddings", false)
		s.recv()
		s.trailers().refused(400, "")

		s = r.open(t, mode).headers("/v1/responses/"+respIDFor("e1"), false)
		s.recv()
		m := s.trailers().recv()
		_, meta := destOf(m)
		if m.GetRequestTrailers() == nil || len(strings.Split(meta, ",")) != 2 {
			t.Fatalf("%v: trailers answer %v", mode, m)
		}
		s.end()
	}
}

// TestBufferedPartialWholeBody: BUFFERED_PARTIAL sends a whole body that
// trailers follow without end_of_stream, as it sends the first buffer-full
// of a larger one: the content-length tells them apart, else whether the
// body is one whole JSON value.
func TestBufferedPartialWholeBody(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	body := []byte(completionsBody("a whole body and trailers", false))
	cl := func(n int) [2]string { return [2]string{"content-length", strconv.Itoa(n)} }
	for _, c := range []struct {
		name string
		body []byte
		kv   [][2]string
		path string
		cut  bool
	}{
		{"whole, content-length", body, [][2]string{cl(len(body))}, "/v1/completions", false},
		{"whole, no content-length", body, nil, "/v1/completions", false},
		{"cut, content-length", body[:40], [][2]string{cl(len(body))}, "/v1/completions", true},
		{"cut in a string, no content-length", body[:40], nil, "/v1/completions", true},
		{"cut after a member, no content-length", body[:len(body)-30], nil, "/v1/completions", true},
		{"cut, embeddings (its model is read too)", body[:40], [][2]string{cl(len(body))}, "/v1/embeddings", true},
		{"cut, a body the picker does not read", body[:40], [][2]string{cl(len(body))}, "/v1/responses/" + respIDFor("e1") + "/cancel", false},
	} {
		s := r.open(t, partial).headers(c.path, false, c.kv...)
		s.recv()
		s.body(c.body, false)
		if c.cut {
			if ir := s.refused(413, "request_too_large"); ir.GetDetails() != "kvmesh_epp_body_truncated" {
				t.Fatalf("%s: details %q", c.name, ir.GetDetails())
			}
			continue
		}
		routed(t, s.recv())
		if m := s.trailers().recv(); m.GetRequestTrailers() == nil {
			t.Fatalf("%s: trailers answer %v", c.name, m)
		}
		s.end()
	}
}

func gz(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestContentEncoding: an encoded body is decoded as the ingress decodes
// it, routed on, and sent to the engine decoded (its content-encoding
// removed, its content-length set) in every body mode; an encoding the
// ingress does not take is 415 naming it, bytes that do not decode 400,
// a body past --max-body once decoded 413.
func TestContentEncoding(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{MaxBodyBytes: 1 << 20}, Deps{}, nil)
	plain := []byte(completionsBody("an encoded request "+words("gz", 200), false))
	enc := gz(t, plain)
	ce := [2]string{"content-encoding", "gzip"}
	checkHeaders := func(mode extprocfilter.ProcessingMode_BodySendMode, c *extprocv3.CommonResponse) {
		t.Helper()
		cl := ""
		for _, h := range c.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == "content-length" {
				cl = string(h.GetHeader().GetRawValue())
			}
		}
		if cl != strconv.Itoa(len(plain)) || !strings.Contains(strings.Join(c.GetHeaderMutation().GetRemoveHeaders(), ","), "content-encoding") {
			t.Fatalf("%v: header mutation %v", mode, c.GetHeaderMutation())
		}
	}

	s := r.open(t, fd).headers("/v1/completions", false, ce).body(enc, true)
	h := s.recv()
	routed(t, h)
	checkHeaders(fd, h.GetRequestHeaders().GetResponse())
	if b := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody(); !bytes.Equal(b, plain) {
		t.Fatalf("full duplex passes back %q", b)
	}
	s.end()

	s = r.open(t, buffered).headers("/v1/completions", false, ce)
	s.recv()
	m := s.body(enc, true).recv()
	routed(t, m)
	checkHeaders(buffered, m.GetRequestBody().GetResponse())
	if b := m.GetRequestBody().GetResponse().GetBodyMutation().GetBody(); !bytes.Equal(b, plain) {
		t.Fatalf("buffered body mutation %q", b)
	}
	s.end()

	// STREAMED: each chunk waits for its answer; the first carries the
	// decoded body, the others are cleared.
	s = r.open(t, streamed).headers("/v1/completions", false, ce)
	half := len(enc) / 2
	s.body(enc[:half], false).body(enc[half:], true)
	h = s.recv()
	routed(t, h)
	checkHeaders(streamed, h.GetRequestHeaders().GetResponse())
	if b := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetBody(); !bytes.Equal(b, plain) {
		t.Fatalf("streamed first chunk answer %q", b)
	}
	if m := s.recv().GetRequestBody().GetResponse().GetBodyMutation(); !m.GetClearBody() {
		t.Fatalf("streamed second chunk answer %v", m)
	}
	s.end()

	// identity is no encoding: the body passes as it came.
	s = r.open(t, fd).headers("/v1/completions", false, [2]string{"content-encoding", "Identity"}).body(plain, true)
	h = s.recv()
	routed(t, h)
	if rm := h.GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(); len(rm) != 1 || rm[0] != PrefillerHeader {
		t.Fatalf("identity: removes %v", rm)
	}
	s.recv()
	s.end()

	ir := r.open(t, fd).headers("/v1/completions", false, [2]string{"content-encoding", "compress"}).body(enc, true).refused(415, "unsupported_content_encoding")
	if !strings.Contains(string(ir.GetBody()), `\"compress\"`) {
		t.Fatalf("415 does not name the encoding: %s", ir.GetBody())
	}
	ir = r.open(t, fd).headers("/v1/completions", false, ce).body(plain, true).refused(400, "")
	if !strings.Contains(string(ir.GetBody()), "content-encoding gzip") {
		t.Fatalf("400 does not name the encoding: %s", ir.GetBody())
	}
	bomb := gz(t, padded(2<<20))
	r.open(t, fd).headers("/v1/completions", false, ce).body(bomb, true).refused(413, "request_too_large")
	if got := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "bad_encoding"); got != 2 {
		t.Fatalf("bad_encoding counted %v, want 2", got)
	}
}

// TestStreamedResponsesRequestID: STREAMED (send_body_without_waiting)
// hands the engine a Responses body with the request_id naming it, as the
// other modes do.
func TestStreamedResponsesRequestID(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	body := []byte(`{"model":"` + model + `","input":"hello there, ` + words("resp", 60) + `"}`)
	s := r.open(t, streamed).headers("/v1/responses", false)
	chunks := 0
	for b := body; len(b) > 0; chunks++ {
		n := min(100, len(b))
		s.body(b[:n], n == len(b))
		b = b[n:]
	}
	routed(t, s.recv())
	var fwd []byte
	for i := range chunks {
		m := s.recv().GetRequestBody().GetResponse().GetBodyMutation()
		if (i == 0) != (m.GetBody() != nil) || (i > 0) != m.GetClearBody() {
			t.Fatalf("chunk %d answer %v", i, m)
		}
		fwd = append(fwd, m.GetBody()...)
	}
	var v struct {
		RequestID string `json:"request_id"`
		Input     string `json:"input"`
	}
	if err := json.Unmarshal(fwd, &v); err != nil || !strings.HasPrefix(v.RequestID, "resp_kvm") || !strings.HasPrefix(v.Input, "hello there") {
		t.Fatalf("forwarded %s: %v", fwd, err)
	}
	s.end()
}

// TestOutOfOrderRefused: a message out of the order Envoy sends them (a
// body, trailers or a response before the request headers; a second
// request's headers on one stream) ends the stream with gRPC
// InvalidArgument, counted as bad_message, instead of an answer to a phase
// the data plane never opened (or no answer, which leaves it waiting).
func TestOutOfOrderRefused(t *testing.T) {
	r := newStaticRig(t, twoEngines, Config{}, Deps{}, nil)
	invalid := func(name string, s *stream) {
		t.Helper()
		m, err := s.st.Recv()
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: answer %v, error %v; want InvalidArgument", name, m, err)
		}
	}
	invalid("body first", r.open(t, fd).body([]byte(completionsBody("hi", false)), true))
	invalid("trailers first", r.open(t, fd).trailers())
	s := r.open(t, fd)
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: s.env.headerMap([][2]string{{":status", "200"}})}}})
	invalid("response first", s)

	s = r.open(t, fd).headers("/anything", true)
	routed(t, s.recv())
	invalid("second headers", s.headers("/anything", true))

	s = r.open(t, fd).headers("/v1/completions", false).body([]byte(completionsBody("hi", false)), true)
	routed(t, s.recv())
	s.recv()
	invalid("second request", s.headers("/v1/completions", false))
	if n := counter(t, r.reg, "kvmesh_epp_requests_total", "result", "bad_message"); n != 5 {
		t.Fatalf("bad_message %v, want 5", n)
	}
}
