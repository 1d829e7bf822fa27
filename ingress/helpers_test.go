package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
)

// faultMode is how the fault-injecting engine answers.
type faultMode int

const (
	faultOK             faultMode = iota // a well-formed completions answer (stream or not)
	fault500                             // 500 with an error body
	faultHang                            // accept, never answer (until the test ends)
	faultBreakStream                     // 200, two events, then the connection drops
	faultSlowStream                      // one event per tick until the client goes away
	faultHangAlive                       // inference requests hang; GET /health answers 200 (slow, not dead)
	faultStreamError400                  // 200, then an error event with code 400 first, as vLLM raises a request's error inside its stream
	faultStreamError500                  // the same with code 500 (the engine failed)
	faultHugeAnswer                      // a 200 JSON answer over the ingress's 64 MiB buffer
	faultShed                            // 429 (shedding load) with Retry-After: retryAfter
	faultSlowAlive                       // GET /health answers 200; an inference answer (a stream's headers go at once) waits until slowProbes probes were answered
	faultHeadersHang                     // hung after a stream's headers: 200 and headers, then nothing; GET /health gets nothing either
	faultFloodStream                     // a stream of 8 KiB events as fast as they are taken, until the client goes away
	faultBigAnswer                       // a 200 JSON answer of 16 MiB, under the ingress's 64 MiB buffer
)

// faultEngine is a FAKE engine for what the simulator cannot be made to do on
// cue (answer 5xx, hang, drop a stream halfway). Normal traffic in the other
// tests goes to the real simulator.
type faultEngine struct {
	mode     faultMode
	srv      *http.Server
	ln       net.Listener
	scheme   string // "http" unless startTLSFaultEngine
	hits     atomic.Int64
	canceled atomic.Int64 // requests whose client went away
	probes   atomic.Int64 // GET /health answered (faultHangAlive)
	bodies   chan []byte  // request bodies seen (buffered, dropped when full)
	quit     chan struct{}
	once     sync.Once

	// faultShed: the Retry-After header ("" for none). faultSlowAlive: the
	// answered probes an answer waits for. Set before the first request.
	retryAfter string
	slowProbes int64
	probeMu    sync.Mutex
	probed     chan struct{} // closed (and replaced) at each answered probe
}

func startFaultEngine(t testing.TB, mode faultMode) *faultEngine {
	t.Helper()
	return startTLSFaultEngine(t, mode, nil)
}

// startTLSFaultEngine is startFaultEngine serving https with tc (nil:
// plain http).
func startTLSFaultEngine(t testing.TB, mode faultMode, tc *tls.Config) *faultEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http"
	if tc != nil {
		ln, scheme = tls.NewListener(ln, tc), "https"
	}
	fe := &faultEngine{mode: mode, ln: ln, scheme: scheme, bodies: make(chan []byte, 64), quit: make(chan struct{}), probed: make(chan struct{})}
	fe.srv = &http.Server{Handler: http.HandlerFunc(fe.serve), ReadHeaderTimeout: 5 * time.Second}
	go fe.srv.Serve(ln)
	t.Cleanup(fe.close)
	return fe
}

func (fe *faultEngine) url() string { return fe.scheme + "://" + fe.ln.Addr().String() }

func (fe *faultEngine) close() {
	fe.once.Do(func() {
		close(fe.quit)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		fe.srv.Shutdown(ctx)
		fe.srv.Close()
	})
}

func (fe *faultEngine) serve(w http.ResponseWriter, r *http.Request) {
	if (fe.mode == faultHangAlive || fe.mode == faultSlowAlive) && r.URL.Path == "/health" {
		fe.probeMu.Lock()
		fe.probes.Add(1)
		close(fe.probed)
		fe.probed = make(chan struct{})
		fe.probeMu.Unlock()
		return
	}
	if (fe.mode == faultFloodStream || fe.mode == faultBigAnswer) && r.URL.Path == "/health" {
		return // live: the stall watch's probe of an engine busy writing
	}
	if fe.mode == faultHeadersHang && r.URL.Path == "/health" {
		select {
		case <-r.Context().Done():
		case <-fe.quit:
		}
		return
	}
	fe.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	select {
	case fe.bodies <- body:
	default:
	}
	stream := bytes.Contains(body, []byte(`"stream":true`))
	switch fe.mode {
	case fault500:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"engine broke","type":"server_error","param":null,"code":500}}`)
	case faultStreamError400, faultStreamError500:
		code := 400
		if fe.mode == faultStreamError500 {
			code = 500
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"error\": {\"message\": \"bad prompt\", \"type\": \"BadRequestError\", \"param\": null, \"code\": %d}}\n\ndata: [DONE]\n\n", code)
	case faultHugeAnswer:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"data":"`)
		chunk := bytes.Repeat([]byte("a"), 1<<20)
		for i := 0; i <= maxUpstreamBody>>20; i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		io.WriteString(w, `"}`)
	case faultShed:
		if fe.retryAfter != "" {
			w.Header().Set("Retry-After", fe.retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"too many requests waiting","type":"RateLimitError","param":null,"code":429}}`)
	case faultHeadersHang:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			fe.canceled.Add(1)
		case <-fe.quit:
		}
	case faultSlowAlive:
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
		}
		for {
			fe.probeMu.Lock()
			n, probed := fe.probes.Load(), fe.probed
			fe.probeMu.Unlock()
			if n >= fe.slowProbes {
				break
			}
			select {
			case <-probed:
			case <-r.Context().Done():
				fe.canceled.Add(1)
				return
			case <-fe.quit:
				return
			}
		}
		fe.answer(w, stream, body)
	case faultHang, faultHangAlive:
		select {
		case <-r.Context().Done():
			fe.canceled.Add(1)
		case <-fe.quit:
		}
	case faultBreakStream:
		hj, _ := w.(http.Hijacker)
		conn, bw, err := hj.Hijack()
		if err != nil {
			return
		}
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < 2; i++ {
			ev := completionEvent(i, "tok", "")
			fmt.Fprintf(bw, "%x\r\n%s\r\n", len(ev), ev)
		}
		// Half an event, then the connection drops.
		fmt.Fprintf(bw, "%x\r\n%s\r\n", 6, "data: ")
		bw.Flush()
		conn.Close()
	case faultBigAnswer:
		w.Header().Set("Content-Type", "application/json")
		// With its length (not chunked), as engines send whole answers:
		// the ingress reads it in large pieces even on a loaded machine
		// under the race detector.
		big := `{"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"` +
			strings.Repeat("x", 16<<20) + `","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`
		w.Header().Set("Content-Length", strconv.Itoa(len(big)))
		io.WriteString(w, big)
	case faultFloodStream:
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		ev := completionEvent(0, strings.Repeat("x", 8<<10), "")
		fe.streamUntilGone(w, r, fl, func(int) string { return ev }, nil)
	case faultSlowStream:
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		fe.streamUntilGone(w, r, fl, func(i int) string { return completionEvent(i, "x", "") }, tk.C)
	default:
		fe.answer(w, stream, body)
	}
}

// answer writes a well-formed completions answer, streamed or not.
// streamUntilGone writes event(0), event(1), ... until the client goes
// (counted in canceled) or the engine closes; between events it waits for
// tick, or not at all when tick is nil.
func (fe *faultEngine) streamUntilGone(w http.ResponseWriter, r *http.Request, fl http.Flusher, event func(int) string, tick <-chan time.Time) {
	if tick == nil {
		now := make(chan time.Time)
		close(now) // always ready: no wait
		tick = now
	}
	for i := 0; ; i++ {
		if _, err := io.WriteString(w, event(i)); err != nil {
			fe.canceled.Add(1)
			return
		}
		fl.Flush()
		select {
		case <-r.Context().Done():
			fe.canceled.Add(1)
			return
		case <-fe.quit:
			return
		case <-tick:
		}
	}
}

func (fe *faultEngine) answer(w http.ResponseWriter, stream bool, body []byte) {
	if stream {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			io.WriteString(w, completionEvent(i, fmt.Sprintf("t%d", i), ""))
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, completionEvent(3, "", "length"))
		if bytes.Contains(body, []byte(`"include_usage":true`)) { // as vLLM: only when asked
			io.WriteString(w, `data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":4,"total_tokens":6}}`+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"t0t1t2","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`)
}

func completionEvent(i int, text, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":%q,"logprobs":null,"finish_reason":%s}]}`+"\n\n", text, fr)
}

// startIngress starts a Server on a free loopback port; it is closed at cleanup.
func startIngress(t testing.TB, cfg Config, deps Deps) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if deps.AccessLog == nil {
		deps.AccessLog = deps.Logger
	}
	s, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// post sends a JSON body and returns status, headers and the whole body.
func post(t testing.TB, c *http.Client, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp.StatusCode, resp.Header, b
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, p)
		}
	}
	return out
}

// seriesSum adds up the current values of every series of a counter or gauge
// vector (e.g. a per-engine counter over all engines).
func seriesSum(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }() // ends when Collect returns
	n := 0.0
	for m := range ch {
		n += val(m)
	}
	return n
}

// val reads a counter's or gauge's current value.
func val(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return -1
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return -1
}

// settled reports whether every engine's local load is back to zero (no
// request, prefill or active tokens still charged).
// waitSettled waits until s has no request in flight and every upstream's
// bookkeeping is back to zero.
func waitSettled(t *testing.T, s *Server) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, "the ingress settled: nothing in flight", func() bool { return settled(s) })
}

func settled(s *Server) bool {
	s.ups.mu.RLock()
	defer s.ups.mu.RUnlock()
	for _, up := range s.ups.m {
		if up.inflight.Load() != 0 || up.prefill.Load() != 0 || up.active.Load() != 0 {
			return false
		}
	}
	return s.inflight.Load() == 0
}

// startSidecar runs a sidecar for one engine on NATS natsURL, joined to the
// gossip cluster at seed with fast timings; it stops at cleanup.
func startSidecar(t testing.TB, ec sidecar.EngineConfig, natsURL, seed string, log *slog.Logger) {
	t.Helper()
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{ec}
	sc.NATS = natsutil.DefaultConfig()
	sc.NATS.URLs = []string{natsURL}
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.Join = "sidecar-"+ec.ID, "local", []string{seed}
	gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, 500*time.Millisecond
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "sidecar-" + ec.ID}
	gc.Logger = log
	sc.Gossip = &gc
	sc.GossipInterval, sc.ScrapeInterval = 50*time.Millisecond, 100*time.Millisecond
	sc.Logger = log
	car, err := sidecar.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); car.Run(ctx) }()
	t.Cleanup(func() { cancel(); car.Close(); <-done })
}

// healthyEngines counts the engines s's membership offers for routing: a
// sidecar that just joined gossip reports its engine unready until its event
// loop runs and a metrics scrape succeeds, and the scheduler skips it till then.
func healthyEngines(s *Server) int {
	n := 0
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.Healthy {
			n++
		}
	}
	return n
}

// dialIngress is a raw TCP connection to s, closed with the test, that
// gives up on reads and writes after 10 s.
func dialIngress(t *testing.T, s *Server) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return conn
}
