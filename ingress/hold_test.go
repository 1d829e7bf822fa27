package ingress

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// holdRig is a holdQueue with engines whose room the test sets.
type holdRig struct {
	q    *holdQueue
	mu   sync.Mutex
	full map[string]bool // engines without room
	out  chan string     // names of released (or otherwise ended) waiters
}

func newHoldRig(t *testing.T, rule policies.Hold, cfg HoldConfig, full ...string) *holdRig {
	r := &holdRig{full: map[string]bool{}, out: make(chan string, 16)}
	for _, e := range full {
		r.full[e] = true
	}
	r.q = newHoldQueue(rule, cfg, func(id string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.full[id]
	}, func() time.Duration { return 0 })
	r.q.register(prometheus.NewRegistry(), nil)
	t.Cleanup(r.q.close)
	return r
}

func (r *holdRig) setRoom(engine string, room bool) {
	r.mu.Lock()
	r.full[engine] = !room
	r.mu.Unlock()
}

// holdResult is a waiter's verdict and baton.
type holdResult struct {
	name  string
	v     holdVerdict
	baton bool
}

// start runs a waiter for engines with key; its verdict arrives on res.
func (r *holdRig) start(name string, key float64, done <-chan struct{}, res chan<- holdResult, engines ...string) {
	cands := make([]scheduler.Engine, len(engines))
	for i, e := range engines {
		cands[i].ID, cands[i].Healthy = e, true
		if id, ok := strings.CutSuffix(e, "!"); ok { // unhealthy
			cands[i].ID, cands[i].Healthy = id, false
		}
	}
	go func() {
		v, b := r.q.wait(done, cands, key)
		res <- holdResult{name, v, b}
	}()
}

// startHeld is start, then waits until the waiter is in the queue (n
// waiters in all).
func (r *holdRig) startHeld(t *testing.T, name string, key float64, res chan<- holdResult, n int64, engines ...string) {
	t.Helper()
	r.start(name, key, nil, res, engines...)
	testutil.WaitFor(t, 5*time.Second, name+" held", func() bool { return r.q.n.Load() == n })
}

func recv(t *testing.T, res <-chan holdResult) holdResult {
	t.Helper()
	select {
	case h := <-res:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter ended")
	}
	return holdResult{}
}

// TestHoldQueueOrderAndBaton: waiters go smallest key first, one at a time:
// the next is released only once the previous passes the baton. A short
// prompt held 2 s after a long one (3 s less prefill) overtakes it at
// aging 0.5; one held 8 s after it does not (0.5 · 8 > 3).
func TestHoldQueueOrderAndBaton(t *testing.T) {
	rule := policies.Hold{Seconds: 1, Aging: 0.5}
	r := newHoldRig(t, rule, DefaultHoldConfig(), "a")
	const rate = 1000
	long := rule.Key(4000, rate, 0)
	shortSoon := rule.Key(1000, rate, 2*time.Second)
	shortLate := rule.Key(1000, rate, 8*time.Second)
	if !(shortSoon < long && long < shortLate) {
		t.Fatalf("keys %v %v %v", long, shortSoon, shortLate)
	}
	res := make(chan holdResult, 3)
	r.startHeld(t, "long", long, res, 1, "a")
	r.startHeld(t, "short-soon", shortSoon, res, 2, "a")
	r.startHeld(t, "short-late", shortLate, res, 3, "a")

	r.setRoom("a", true)
	r.q.wake()
	var order []string
	for i := 0; i < 3; i++ {
		h := recv(t, res)
		if h.v != holdReleased || !h.baton {
			t.Fatalf("%s: verdict %v baton %v, want released with the baton", h.name, h.v, h.baton)
		}
		order = append(order, h.name)
		// The baton is out: nothing else goes, however often woken.
		r.q.wake()
		if n := r.q.n.Load(); n != int64(2-i) {
			t.Fatalf("after %s: %d waiting, want %d (one at a time)", h.name, n, 2-i)
		}
		select {
		case h2 := <-res:
			t.Fatalf("%s released while %s held the baton", h2.name, h.name)
		default:
		}
		r.q.pass()
	}
	if got := strings.Join(order, ","); got != "short-soon,long,short-late" {
		t.Fatalf("order %s, want short-soon,long,short-late", got)
	}
	if p := r.q.pending.Load(); p != 0 {
		t.Fatalf("pending %d after all went", p)
	}
}

// TestHoldQueueOtherModelNotBlocked: a waiter whose engines are full does
// not block a later one (larger key) whose engine has room.
func TestHoldQueueOtherModelNotBlocked(t *testing.T) {
	r := newHoldRig(t, policies.Hold{Seconds: 1, Aging: 0.5}, DefaultHoldConfig(), "a1", "a2", "b")
	res := make(chan holdResult, 2)
	// a3 is unhealthy: its room (nothing is sent there) does not count.
	r.startHeld(t, "model-a", 1, res, 1, "a1", "a2", "a3!")
	r.startHeld(t, "model-b", 2, res, 2, "b")
	r.setRoom("b", true)
	r.q.wake()
	if h := recv(t, res); h.name != "model-b" || h.v != holdReleased || !h.baton {
		t.Fatalf("%+v, want model-b released", h)
	}
	r.q.pass()
	if n := r.q.n.Load(); n != 1 {
		t.Fatalf("%d waiting, want model-a still", n)
	}
	// A request with room arriving while others wait is held too (the
	// queue decides the order) and goes at once, as nothing smaller can.
	r.start("model-b-again", 3, nil, res, "b")
	if h := recv(t, res); h.name != "model-b-again" || h.v != holdReleased || !h.baton {
		t.Fatalf("%+v, want model-b-again held and released", h)
	}
	r.q.pass()
	r.setRoom("a2", true)
	r.q.wake()
	if h := recv(t, res); h.name != "model-a" || h.v != holdReleased {
		t.Fatalf("%+v, want model-a released", h)
	}
	r.q.pass()
}

// TestHoldQueueBounds: cancelling a waiter removes it; a wait past maxWait
// ends (the request is sent anyway, counted); with maxQueue waiters a new
// request is not held; closing releases every waiter without the baton;
// a request with room and nobody waiting is not held.
func TestHoldQueueBounds(t *testing.T) {
	r := newHoldRig(t, policies.Hold{Seconds: 1}, HoldConfig{MaxWait: time.Hour, MaxQueue: 2}, "a")
	res := make(chan holdResult, 4)

	r.start("room", 1, nil, res, "b")
	if h := recv(t, res); h.v != holdNot {
		t.Fatalf("%+v with room and nobody waiting, want not held", h)
	}
	r.start("no-engine", 1, nil, res, "a!")
	if h := recv(t, res); h.v != holdNot {
		t.Fatalf("%+v with no healthy engine, want not held (the scheduler answers)", h)
	}
	done := make(chan struct{})
	r.start("canceled", 1, done, res, "a")
	testutil.WaitFor(t, 5*time.Second, "held", func() bool { return r.q.n.Load() == 1 })
	close(done)
	if h := recv(t, res); h.v != holdEnded || h.baton {
		t.Fatalf("%+v, want ended", h)
	}
	if n := r.q.n.Load(); n != 0 {
		t.Fatalf("%d waiting after the cancel", n)
	}

	r.startHeld(t, "w1", 1, res, 1, "a")
	r.startHeld(t, "w2", 2, res, 2, "a")
	r.start("full-queue", 0, nil, res, "a")
	if h := recv(t, res); h.name != "full-queue" || h.v != holdNot {
		t.Fatalf("%+v with maxQueue waiters, want full-queue not held", h)
	}
	if n := val(r.q.full); n != 1 {
		t.Fatalf("full counter %v, want 1 (room and cancel do not count)", n)
	}
	r.q.close()
	for i := 0; i < 2; i++ {
		if h := recv(t, res); h.v != holdReleased || h.baton {
			t.Fatalf("%+v, want released without the baton on close", h)
		}
	}
	r.start("after-close", 0, nil, res, "a")
	if h := recv(t, res); h.v != holdNot {
		t.Fatalf("%+v after close, want not held", h)
	}

	r2 := newHoldRig(t, policies.Hold{Seconds: 1}, HoldConfig{MaxWait: 20 * time.Millisecond, MaxQueue: 8}, "a")
	r2.start("expires", 1, nil, res, "a")
	if h := recv(t, res); h.v != holdExpired || h.baton {
		t.Fatalf("%+v, want expired", h)
	}
	if n := val(r2.q.expired); n != 1 || r2.q.n.Load() != 0 {
		t.Fatalf("expired counter %v, %d waiting", n, r2.q.n.Load())
	}
}

// TestHoldBatonPassedWhenRequestEnds: a released request that ends before
// charging an engine (a scheduling error, a gone client) passes the baton
// in finish.
func TestHoldBatonPassedWhenRequestEnds(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.AccessLog = false
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if s.holdQ == nil {
		t.Fatal("no hold with the kvmesh policy's defaults and the learner")
	}
	s.holdQ.mu.Lock()
	s.holdQ.baton = true
	s.holdQ.count()
	s.holdQ.mu.Unlock()
	c := s.reqPool.Get().(*call)
	c.reset()
	c.s, c.ep, c.start, c.baton = s, epCompletions, time.Now(), true
	s.inflight.Add(1)
	c.status = 503
	c.finish()
	if p := s.holdQ.pending.Load(); p != 0 {
		t.Fatalf("pending %d: the baton was not passed", p)
	}
}

// TestHoldOffWithoutKVMeshOrWithPD: the hold runs only with the kvmesh
// policy and its learner, and not with P/D configured.
func TestHoldOffWithoutKVMeshOrWithPD(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
		on   bool
	}{
		{"kvmesh", func(*Config) {}, true},
		{"least-request", func(c *Config) { c.Scheduler.Policy = "least-request" }, false},
		{"no learner", func(c *Config) { c.Learn.Disabled = true }, false},
		{"holdSeconds 0", func(c *Config) {
			k := policies.DefaultKVMeshConfig()
			k.HoldSeconds = 0
			if err := c.Scheduler.SetParams("kvmesh", k); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"pd", func(c *Config) { c.PD.Policy = "kvmesh" }, false},
	} {
		cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"})
		cfg.Scheduler.Policy = "kvmesh"
		cfg.AccessLog = false
		tc.set(&cfg)
		s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if on := s.holdQ != nil; on != tc.on {
			t.Errorf("%s: hold on %v, want %v", tc.name, on, tc.on)
		}
	}
	cfg := DefaultConfig()
	cfg.Hold = HoldConfig{MaxWait: 0, MaxQueue: -1}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "maxWait") || !strings.Contains(err.Error(), "maxQueue") {
		t.Fatalf("validate: %v", err)
	}
	// docs/OPERATIONS.md's example.
	c, err := ParseConfig([]byte("scheduler:\n  policy: kvmesh\n  kvmesh:\n    holdSeconds: 3\n    holdAging: 0.25\n    holdAffinity: 0.75\nhold:\n  maxWait: 5s\n  maxQueue: 16\n"))
	if err != nil || c.Hold != (HoldConfig{MaxWait: 5 * time.Second, MaxQueue: 16}) {
		t.Fatalf("parse: %+v %v", c.Hold, err)
	}
	c.Engines = []StaticEngine{{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"}}
	s, err := New(c, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if s.holdQ == nil || s.hold != (policies.Hold{Seconds: 3, Aging: 0.25, Affinity: 0.75}) || s.holdQ.maxWait != 5*time.Second || s.holdQ.maxLen != 16 {
		t.Fatalf("hold %+v", s.hold)
	}
}

// gate is a proxy in front of a simulated engine that holds completions
// until it opens, so the test decides when engines answer.
type gate struct {
	srv     *httptest.Server
	open    chan struct{}
	arrived atomic.Int64
}

func startGate(t *testing.T, target string) *gate {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{open: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(u)
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			g.arrived.Add(1)
			select {
			case <-g.open:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// holdE2E is an ingress in front of two gated simulated engines with a hold
// so small that one request fills an engine.
type holdE2E struct {
	s         *Server
	reg       *prometheus.Registry
	gates     [2]*gate
	openGates func()
}

func startHoldE2E(t *testing.T) *holdE2E {
	r := &holdE2E{}
	var engines []StaticEngine
	for i := range r.gates {
		eng, _ := startLearnSim(t, 100000)
		r.gates[i] = startGate(t, eng.URL())
		engines = append(engines, StaticEngine{ID: "e" + strconv.Itoa(i), Model: "m", URL: r.gates[i].srv.URL})
	}
	cfg := testConfig(engines...)
	cfg.Scheduler.Policy = "kvmesh"
	k := policies.DefaultKVMeshConfig()
	k.HoldSeconds = 0.01 // room while under 100 tokens at 10,000 tokens/s: one request fills an engine
	if err := cfg.Scheduler.SetParams("kvmesh", k); err != nil {
		t.Fatal(err)
	}
	// No stream has its first token before the gates open: the rate stays
	// the prior's while requests are held.
	cfg.Learn.Prior = learn.Rates{PrefillRate: 10000}
	r.reg = prometheus.NewRegistry()
	r.s = startIngress(t, cfg, Deps{Registry: r.reg})
	if r.s.holdQ == nil {
		t.Fatal("hold off")
	}
	opened := false
	r.openGates = func() {
		if !opened {
			opened = true
			for _, g := range r.gates {
				close(g.open)
			}
		}
	}
	t.Cleanup(r.openGates) // before the ingress closes: a failed test's requests end
	return r
}

// holdBody is request i of the hold's end-to-end tests: a streamed
// 1,000-token prompt sharing no prefix with another's.
func holdBody(i int) string { return holdBodyOut(i, 2) }

// holdBodyOut is holdBody with maxTokens.
func holdBodyOut(i, maxTokens int) string {
	var sb strings.Builder
	sb.WriteString(`{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":true,"prompt":[`)
	for j := 0; j < 1000; j++ {
		if j > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(1 + (i*7919+j*31)%5000))
	}
	sb.WriteString("]}")
	return sb.String()
}

// TestHoldEndToEnd: an ingress in front of two simulated engines with a
// hold so small that one request fills an engine. With both engines busy
// (their answers gated), further streamed requests wait in the ingress, not
// on the engines; once the engines answer, every request is sent and
// succeeds.
func TestHoldEndToEnd(t *testing.T) {
	const n = 8
	r := startHoldE2E(t)
	s, reg, gates, openGates := r.s, r.reg, r.gates, r.openGates
	type answer struct {
		st   int
		body []byte
		err  error
	}
	answers := make(chan answer, n)
	send := func(i int) {
		go func() {
			resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(holdBody(i)))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, b, err}
		}()
	}
	arrived := func() int64 { return gates[0].arrived.Load() + gates[1].arrived.Load() }
	// One at a time until each engine has one: the second goes to the
	// engine with room.
	send(0)
	testutil.WaitFor(t, 10*time.Second, "the first request on an engine", func() bool { return arrived() == 1 })
	send(1)
	testutil.WaitFor(t, 10*time.Second, "the second request on an engine", func() bool { return arrived() == 2 })
	if a, b := gates[0].arrived.Load(), gates[1].arrived.Load(); a != 1 || b != 1 {
		t.Fatalf("engines got %d and %d requests, want one each (the second to the engine with room)", a, b)
	}
	// Both engines full: the rest wait in the ingress.
	for i := 2; i < n; i++ {
		send(i)
	}
	held := func() float64 { return gaugeValue(t, reg, "kvmesh_ingress_held_requests") }
	testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d requests held", n-2), func() bool { return held() == n-2 })
	if a := arrived(); a != 2 {
		t.Fatalf("%d requests reached the engines while both were full, want 2", a)
	}
	openGates()
	for i := 0; i < n; i++ {
		var a answer
		select {
		case a = <-answers:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d answers of %d", i, n)
		}
		if a.err != nil || a.st != 200 {
			t.Fatalf("answer %d: status %d err %v body %.300s", i, a.st, a.err, a.body)
		}
		var events []string
		for _, l := range strings.Split(string(a.body), "\n") {
			if d, ok := strings.CutPrefix(l, "data: "); ok {
				events = append(events, d)
			}
		}
		if len(events) < 2 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("answer %d: not a whole stream: %.300s", i, a.body)
		}
		for _, e := range events[:len(events)-1] {
			var out struct {
				Object  string `json:"object"`
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(e), &out) != nil || out.Object != "text_completion" || len(out.Choices) != 1 {
				t.Fatalf("answer %d: event %.200s", i, e)
			}
		}
	}
	if h := held(); h != 0 {
		t.Fatalf("%v still held", h)
	}
	if c := histogramCount(t, reg, "kvmesh_ingress_hold_seconds"); c != n-2 {
		t.Fatalf("hold histogram count %d, want %d", c, n-2)
	}
	if e := val(s.holdQ.expired); e != 0 {
		t.Fatalf("%v sent after maxWait, want 0", e)
	}
	waitSettled(t, s)
	if p := s.holdQ.pending.Load(); p != 0 {
		t.Fatalf("pending %d: a baton was not passed", p)
	}
}

// gaugeValue reads an unlabelled (but for the ingress label) gauge.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m := metricOf(t, reg, name)
	if m == nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	m := metricOf(t, reg, name)
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

func metricOf(t *testing.T, reg *prometheus.Registry, name string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0]
		}
	}
	return nil
}

// holdServer is an ingress (not started: no re-check loop, so only the
// wake-ups release waiters) with the kvmesh policy and a hold under which
// one 1,000-token request fills an engine (room below 100 tokens).
func holdServer(t *testing.T) *Server {
	t.Helper()
	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"}, StaticEngine{ID: "e1", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.AccessLog = false
	k := policies.DefaultKVMeshConfig()
	k.HoldSeconds = 0.01
	if err := cfg.Scheduler.SetParams("kvmesh", k); err != nil {
		t.Fatal(err)
	}
	cfg.Learn.Prior = learn.Rates{PrefillRate: 10000}
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if s.holdQ == nil {
		t.Fatal("hold off")
	}
	return s
}

// holdCall is a call of s for a streamed 1,000-token completion (seed: its tokens),
// with a request context that can wait.
func holdCall(s *Server, seed int) (*call, *fasthttp.RequestCtx) {
	ctx := new(fasthttp.RequestCtx)
	ctx.Init2(nil, fasthttpLogger{slog.New(slog.NewTextHandler(io.Discard, nil))}, false)
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetBody([]byte(holdBodyOut(seed, 4)))
	c := new(call)
	c.reset()
	c.s, c.ep, c.start = s, epCompletions, time.Now()
	return c, ctx
}

// charge puts a 1,000-token request on engine id (no room left there) and
// returns it.
func charge(t *testing.T, s *Server, id string) (*call, *upstream) {
	t.Helper()
	up, err := s.ups.get(id, "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := holdCall(s, 99)
	c.promptTokens, c.block, c.req.stream = 1000, 16, true
	c.startAttempt(up, 0)
	return c, up
}

// TestHoldPrepareWakesAndPassesTheBaton: through call.prepare, requests
// with every engine full wait; a prefill charge ending (endAttempt, or a
// stream's first byte) releases the smallest waiter, which is scheduled on
// fresh candidates to the engine with room; the next goes only once the
// released one charged its engine (startAttempt passes the baton).
func TestHoldPrepareWakesAndPassesTheBaton(t *testing.T) {
	s := holdServer(t)
	q := s.holdQ
	c0, up0 := charge(t, s, "e0")
	c1, up1 := charge(t, s, "e1")

	type prepared struct {
		name string
		c    *call
		err  error
	}
	out := make(chan prepared, 2)
	a, actx := holdCall(s, 1)
	go func() { out <- prepared{"a", a, a.prepare(actx)} }()
	testutil.WaitFor(t, 5*time.Second, "a held", func() bool { return q.n.Load() == 1 })
	b, bctx := holdCall(s, 2)
	go func() { out <- prepared{"b", b, b.prepare(bctx)} }()
	testutil.WaitFor(t, 5*time.Second, "b held", func() bool { return q.n.Load() == 2 })

	next := func() prepared {
		t.Helper()
		select {
		case p := <-out:
			if p.err != nil {
				t.Fatalf("%s: %v", p.name, p.err)
			}
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("no held request was released")
		}
		return prepared{}
	}
	c1.endAttempt(up1) // e1 has room again
	p := next()
	if p.c != a || !a.baton || a.dec.Engine != "e1" {
		t.Fatalf("released %s (baton %v) to %s, want a (held first, equal keys) with the baton, to e1", p.name, p.c.baton, p.c.dec.Engine)
	}
	for _, e := range a.cands {
		if want := map[string]int{"e0": 1000, "e1": 0}[e.ID]; e.LocalPrefillTokens != want {
			t.Fatalf("a was scheduled with %s's prefill at %d, want the current %d", e.ID, e.LocalPrefillTokens, want)
		}
	}
	if q.n.Load() != 1 || q.pending.Load() != 2 {
		t.Fatalf("waiting %d, pending %d: want b waiting and a's baton out", q.n.Load(), q.pending.Load())
	}
	a.startAttempt(up1, 0) // a charged e1: the baton passes, but no engine has room
	if a.baton || q.n.Load() != 1 || q.pending.Load() != 1 {
		t.Fatalf("after a's charge: baton %v, waiting %d, pending %d; want b still waiting alone", a.baton, q.n.Load(), q.pending.Load())
	}
	c0.firstByte(up0) // e0's prefill is done: room
	if p := next(); p.c != b || b.dec.Engine != "e0" {
		t.Fatalf("released %s to %s, want b to e0", p.name, p.c.dec.Engine)
	}
	b.startAttempt(up0, 0)
	if q.pending.Load() != 0 {
		t.Fatalf("pending %d", q.pending.Load())
	}
	for _, c := range []*call{a, b} {
		c.endAttempt(map[string]*upstream{"e0": up0, "e1": up1}[c.dec.Engine])
	}
	c0.endAttempt(up0)
	if _, pre0, _ := s.ups.local("e0"); pre0 != 0 {
		t.Fatalf("e0 prefill %d", pre0)
	}
}

// TestHoldPickPrefersRoom: after the policy ranks, the request goes to the
// best-ranked engine with room. e0 is learned 20× faster, so the policy
// ranks it first even with a request's prefill queued there; that queue
// leaves it no room, and e1 has room.
func TestHoldPickPrefersRoom(t *testing.T) {
	s := holdServer(t)
	for i := 0; i < 200; i++ {
		tok := 1000 + 100*(i%50)
		s.learn.ObservePrefill("e0", tok, time.Duration(float64(tok)/30000*float64(time.Second)))
		s.learn.ObservePrefill("e1", tok, time.Duration(float64(tok)/1500*float64(time.Second)))
	}
	// Room: e0 below 0.01 s × ~30,000 tokens/s; e1 below ~15 tokens.
	up0, err := s.ups.get("e0", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	up0.prefill.Add(1000)
	up0.streamPrefill.Add(1000) // a stream's prefill (non-streamed ones do not count)
	if s.engineRoom("e0") || !s.engineRoom("e1") {
		t.Fatalf("room: e0 %v e1 %v, want e1 only", s.engineRoom("e0"), s.engineRoom("e1"))
	}
	c, ctx := holdCall(s, 3)
	if err := c.prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if c.dec.Engine != "e1" || c.dec.Reason != "hold-room" || c.picked != "e1" || c.dec.Ranked[0].Engine != "e1" {
		t.Fatalf("went to %s (%s), picked %s: want e1, the engine with room, ahead of the policy's e0", c.dec.Engine, c.dec.Reason, c.picked)
	}
	up0.prefill.Add(-1000)
	up0.streamPrefill.Add(-1000)
	c2, ctx2 := holdCall(s, 4)
	if err := c2.prepare(ctx2); err != nil {
		t.Fatal(err)
	}
	if c2.dec.Engine != "e0" {
		t.Fatalf("went to %s (%s) with room everywhere, want the policy's e0", c2.dec.Engine, c2.dec.Reason)
	}
}

// TestHoldCountsBufferedPrefillByEstimate: a stream's prefill counts
// toward its engine's room until its first byte. A non-streamed request's
// first byte is its whole answer, so its prefill counts by estimate: queued
// behind this replica's earlier non-streamed prefill there at the learned
// rate (10,000 tokens/s: 1,000 tokens take 0.1 s), freed as the clock
// passes, and what is left of it taken back when its answer comes sooner.
func TestHoldCountsBufferedPrefillByEstimate(t *testing.T) {
	s := holdServer(t) // room while under 100 tokens
	var now atomic.Int64
	now.Store(1e18)
	s.holdNow = now.Load
	at := func(ms int64) { now.Store(1e18 + ms*int64(time.Millisecond)) }
	up, err := s.ups.get("e0", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	plain := func(seed int) *call {
		c, _ := holdCall(s, seed)
		c.promptTokens, c.block, c.req.stream = 1000, 16, false
		c.startAttempt(up, 0)
		return c
	}
	room := func(ms int64, want bool, why string) {
		t.Helper()
		at(ms)
		if got := s.engineRoom("e0"); got != want {
			t.Fatalf("at %d ms: room %v, want %v (%s)", ms, got, want, why)
		}
	}
	p1 := plain(1)
	room(0, false, "1,000 tokens of non-streamed prefill just sent")
	room(50, false, "half of it prefilled by estimate")
	room(95, true, "50 tokens left by estimate")
	p2 := plain(2) // at 95 ms: queued behind p1, estimated done at 200 ms
	room(150, false, "the second request's prefill is queued behind the first's")
	at(120)
	p2.firstByte(up) // its whole answer at 120 ms: 80 ms of estimate taken back
	room(120, true, "the second answered before its estimate, the first's estimate over")
	p1.endAttempt(up)
	p2.endAttempt(up)
	if got := up.bufDone.Load(); got > now.Load() {
		t.Fatalf("estimated prefill left after every answer: until %d, now %d", got, now.Load())
	}
	c, _ := charge(t, s, "e0")
	if s.engineRoom("e0") {
		t.Fatal("a stream's prefill left the engine room")
	}
	c.firstByte(up)
	if !s.engineRoom("e0") {
		t.Fatal("the stream's first byte did not free the room")
	}
	c.endAttempt(up)
	if _, pre, _ := s.ups.local("e0"); pre != 0 || up.streamPrefill.Load() != 0 {
		t.Fatalf("charges left: prefill %d, streamed %d", pre, up.streamPrefill.Load())
	}
}

// dialRequest writes body as a POST to path on the ingress over its own
// connection and returns the connection, unread: the test closes it to
// play a client that leaves.
func dialRequest(t *testing.T, addr, path, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: kvmesh\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestHoldClientLeaves: a client that closes its connection while its
// request is held leaves the hold at once (counted, 499 in the requests
// metric) and the request never reaches an engine; the one that stays is
// sent when room frees.
func TestHoldClientLeaves(t *testing.T) {
	r := startHoldE2E(t)
	s, reg, gates := r.s, r.reg, r.gates
	arrived := func() int64 { return gates[0].arrived.Load() + gates[1].arrived.Load() }
	held := func() float64 { return gaugeValue(t, reg, "kvmesh_ingress_held_requests") }
	// One request fills each engine (raw connections, kept open).
	for i := 0; i < 2; i++ {
		dialRequest(t, s.Addr(), "/v1/completions", holdBody(i))
		testutil.WaitFor(t, 10*time.Second, "a request on an engine", func() bool { return arrived() == int64(i+1) })
	}
	// Three held: two clients leave, one stays.
	leaving := []net.Conn{dialRequest(t, s.Addr(), "/v1/completions", holdBody(2)), dialRequest(t, s.Addr(), "/v1/completions", holdBody(3))}
	stay := make(chan int, 1)
	go func() {
		resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(holdBody(4)))
		if err != nil {
			stay <- -1
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		stay <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "3 requests held", func() bool { return held() == 3 })
	for _, c := range leaving {
		c.Close()
	}
	testutil.WaitFor(t, 10*time.Second, "the two that left gone from the hold", func() bool {
		return held() == 1 && val(s.holdQ.left) == 2
	})
	if n := val(s.m.requests.WithLabelValues("completions", "499")); n != 2 {
		t.Fatalf("requests with status 499: %v, want 2", n)
	}
	r.openGates()
	select {
	case st := <-stay:
		if st != 200 {
			t.Fatalf("the request that stayed: status %d", st)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request that stayed was never answered")
	}
	// The two that left were never sent: 2 first requests + the one that stayed.
	if a := arrived(); a != 3 {
		t.Fatalf("%d requests reached the engines, want 3", a)
	}
	if e := val(s.holdQ.expired); e != 0 {
		t.Fatalf("%v sent after maxWait, want 0", e)
	}
}
