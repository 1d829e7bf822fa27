package ingress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// churnMembership is a membership the test changes as engines come and go.
type churnMembership struct {
	mu      sync.Mutex
	engines []EngineInfo
}

func (m *churnMembership) Engines(dst []EngineInfo) []EngineInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(dst, m.engines...)
}

func (m *churnMembership) set(es ...EngineInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.engines = es
}

// testClock is the departures sweep's fake clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// sweepConfig is testConfig with a load loop that never ticks during the
// test: the test sweeps (forgetDeparted) itself, on its fake clock.
func sweepConfig() Config {
	c := testConfig()
	c.LoadInterval = time.Hour
	return c
}

// engineState counts what s keeps per engine, by holder.
func engineState(s *Server) map[string]int {
	n := map[string]int{}
	s.ups.mu.RLock()
	n["upstreams"] = len(s.ups.m)
	s.ups.mu.RUnlock()
	n["health"] = len(s.health.ids(nil))
	n["gates"] = len(s.pd.gateIDs(nil))
	if s.learn != nil {
		seen := map[string]bool{}
		for _, id := range s.learn.Engines(nil) {
			seen[id] = true
		}
		n["learner"] = len(seen)
	}
	if s.deps.Index != nil {
		n["index"] = len(s.deps.Index.Engines())
	}
	d := &s.ups.departed
	d.mu.Lock()
	n["departures"] = len(d.seen)
	d.mu.Unlock()
	return n
}

// tokenPrompt is a completions body whose prompt is token ids (several
// blocks: the index gets speculative entries).
func tokenPrompt(round int) string {
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint(1000*round + i + 1)
	}
	return `{"model":"m","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":2}`
}

// TestDepartedEnginesForgotten: engines join and leave (a new pair of ids
// per round, as pod-named engines do at every rollout) while the replica
// serves them through real loopback engines; what it keeps per engine
// (upstreams, health records, P/D gates, the learner's lines, the index's
// slots, the scheduler policy's routed history) stays bounded by the
// engines seen within the grace period, and once the churn stops only the
// engines still there are left.
func TestDepartedEnginesForgotten(t *testing.T) {
	const (
		grace  = time.Minute
		step   = 20 * time.Second // a round; the engines of 3 rounds are within the grace
		rounds = 12
	)
	eng := startFakePD(t, false)
	type setup struct {
		name    string
		engines func(round int) []EngineInfo
		start   func(t *testing.T, mem Membership) (*Server, func() int)
	}
	setups := []setup{{
		name: "pd",
		engines: func(i int) []EngineInfo {
			return []EngineInfo{pdEngine(fmt.Sprintf("p%d", i), scheduler.RolePrefill, eng.url()), pdEngine(fmt.Sprintf("d%d", i), scheduler.RoleDecode, eng.url())}
		},
		start: func(t *testing.T, mem Membership) (*Server, func() int) {
			c := sweepConfig()
			c.PD = PDConfig{Policy: "kvmesh-always"} // the learner is on: the P/D step prices with it
			return startIngress(t, c, Deps{Membership: mem}), nil
		},
	}, {
		name: "sglang",
		engines: func(i int) []EngineInfo {
			return []EngineInfo{{Engine: scheduler.Engine{ID: fmt.Sprintf("e%d", i), Model: "m", Healthy: true}, URL: eng.url()}}
		},
		start: func(t *testing.T, mem Membership) (*Server, func() int) {
			idx, err := index.New(index.Config{})
			if err != nil {
				t.Fatal(err)
			}
			pol := policies.NewSGLang() // keeps a routed-prefix history per engine
			sch, err := scheduler.New(nil, pol, idx, scheduler.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return startIngress(t, sweepConfig(), Deps{Membership: mem, Scheduler: sch, Index: idx}), pol.History.Engines
		},
	}}
	for _, st := range setups {
		t.Run(st.name, func(t *testing.T) {
			mem := &churnMembership{}
			s, history := st.start(t, mem)
			clk := &testClock{t: time.Now()}
			s.ups.departed.setClock(clk.now, grace, time.Second)
			per := len(st.engines(0))
			bound := 3 * per
			for i := 0; i < rounds; i++ {
				mem.set(st.engines(i)...)
				code, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenPrompt(i))
				if code != 200 {
					t.Fatalf("round %d: status %d body %s", i, code, b)
				}
				if want := st.engines(i)[per-1].ID; hdr.Get("X-Kvmesh-Engine") != want {
					t.Fatalf("round %d: served by %q, want %q", i, hdr.Get("X-Kvmesh-Engine"), want)
				}
				s.forgetDeparted()
				n := engineState(s)
				if history != nil {
					n["history"] = history()
				}
				for holder, v := range n {
					if v > bound {
						t.Fatalf("round %d: %s holds %d engines, want at most %d (those of the last %v): %v", i, holder, v, bound, grace, n)
					}
				}
				if i == rounds-1 && (n["upstreams"] != bound || (s.learn != nil && n["learner"] == 0) || (history != nil && n["history"] != bound)) {
					t.Fatalf("round %d: %v: the engines within the grace were forgotten too", i, n)
				}
				clk.add(step)
			}
			clk.add(grace)
			s.forgetDeparted()
			n := engineState(s)
			if history != nil {
				n["history"] = history()
			}
			for holder, v := range n {
				if v > per {
					t.Fatalf("after the churn: %s holds %d engines, want at most the %d still there: %v", holder, v, per, n)
				}
			}
			if n["upstreams"] != per {
				t.Fatalf("after the churn: %v: the engines still there were forgotten", n)
			}
			code, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenPrompt(rounds))
			if code != 200 || hdr.Get("X-Kvmesh-Engine") == "" {
				t.Fatalf("after the churn: status %d body %s", code, b)
			}
		})
	}
}

// TestReturningEngineKeepsState: an engine back within the grace keeps
// what this replica learned of it; gone for longer, it is forgotten.
func TestReturningEngineKeepsState(t *testing.T) {
	const grace = time.Minute
	eng := startFakePD(t, false)
	pair := func(i int) []EngineInfo {
		return []EngineInfo{pdEngine(fmt.Sprintf("p%d", i), scheduler.RolePrefill, eng.url()), pdEngine(fmt.Sprintf("d%d", i), scheduler.RoleDecode, eng.url())}
	}
	mem := &churnMembership{}
	c := sweepConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: mem})
	clk := &testClock{t: time.Now()}
	s.ups.departed.setClock(clk.now, grace, time.Second)
	mem.set(pair(0)...)
	if code, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenPrompt(0)); code != 200 {
		t.Fatalf("status %d body %s", code, b)
	}
	if !s.learn.Measured("p0") || s.learned("p0").PrefillSamples != 1 {
		t.Fatalf("p0 not learned: %+v", s.learned("p0"))
	}
	s.forgetDeparted()
	kept := func(when string) {
		t.Helper()
		if !s.learn.Measured("p0") || s.learned("p0").PrefillSamples != 1 || s.ups.lookup("d0") == nil || len(s.pd.gateIDs(nil)) == 0 {
			t.Fatalf("%s: p0/d0 state lost: learned %+v, upstream d0 %v, gates %v", when, s.learned("p0"), s.ups.lookup("d0"), s.pd.gateIDs(nil))
		}
	}
	// Gone for most of the grace, then back: everything is kept.
	mem.set(pair(1)...)
	clk.add(grace - time.Second)
	s.forgetDeparted()
	kept("gone for less than the grace")
	mem.set(pair(0)...)
	clk.add(2 * time.Second)
	s.forgetDeparted()
	kept("back")
	// Its grace starts afresh at the next departure.
	mem.set(pair(1)...)
	clk.add(grace - time.Second)
	s.forgetDeparted()
	kept("gone again for less than the grace")
	clk.add(2 * time.Second)
	s.forgetDeparted()
	if s.learn.Measured("p0") || s.ups.lookup("p0") != nil || s.ups.lookup("d0") != nil || len(s.pd.gateIDs(nil)) != 0 {
		t.Fatalf("gone past the grace: p0/d0 kept: measured %v, gates %v, state %v", s.learn.Measured("p0"), s.pd.gateIDs(nil), engineState(s))
	}
}

// blockingEngine answers completions only once released; /health at once.
type blockingEngine struct {
	ln      net.Listener
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// free answers the requests waiting and those to come.
func (be *blockingEngine) free() { be.once.Do(func() { close(be.release) }) }

func startBlockingEngine(t *testing.T) *blockingEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	be := &blockingEngine{ln: ln, arrived: make(chan struct{}, 1), release: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		io.Copy(io.Discard, r.Body)
		be.arrived <- struct{}{}
		<-be.release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-b","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return be
}

// TestDepartedEngineWithRequestsKept: an engine gone past the grace that
// still holds a request of this replica is kept until the request ends.
func TestDepartedEngineWithRequestsKept(t *testing.T) {
	const grace = time.Minute
	be := startBlockingEngine(t)
	mem := &churnMembership{}
	mem.set(EngineInfo{Engine: scheduler.Engine{ID: "b", Model: "m", Healthy: true}, URL: "http://" + be.ln.Addr().String()})
	s := startIngress(t, sweepConfig(), Deps{Membership: mem})
	t.Cleanup(be.free) // before the ingress's drain, should the test fail with the request waiting
	clk := &testClock{t: time.Now()}
	s.ups.departed.setClock(clk.now, grace, time.Second)
	done := make(chan int, 1)
	go func() {
		code, _, _ := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":1}`)
		done <- code
	}()
	<-be.arrived
	s.forgetDeparted()
	mem.set()
	clk.add(2 * grace)
	s.forgetDeparted()
	if up := s.ups.lookup("b"); up == nil || up.inflight.Load() != 1 {
		t.Fatalf("engine b forgotten with a request in flight (upstream %v)", up)
	}
	be.free()
	if code := <-done; code != 200 {
		t.Fatalf("status %d", code)
	}
	clk.add(time.Second)
	s.forgetDeparted()
	if n := engineState(s); s.ups.lookup("b") != nil || n["health"] != 0 || n["departures"] != 0 {
		t.Fatalf("engine b kept after its request ended: %v", n)
	}
}

// TestForgetEjectedEngine: forgetting an ejected engine takes its ejection
// with it (the fast path's count included), and a probe still out for the
// forgotten record cannot eject it again.
func TestForgetEjectedEngine(t *testing.T) {
	ej := newEjector(DefaultHealthConfig(), prometheus.NewRegistry(), "i")
	up := &upstream{id: "x", url: "http://127.0.0.1:1"}
	ej.observe(up, "connect_error")
	if ej.allowed("x") || ej.nEjected.Load() != 1 {
		t.Fatalf("not ejected: %v", ej.ejected())
	}
	h := ej.get("x", up.url)
	ej.forget("x")
	if !ej.allowed("x") || ej.nEjected.Load() != 0 || len(ej.ids(nil)) != 0 {
		t.Fatalf("after forget: ejected %v, count %d", ej.ejected(), ej.nEjected.Load())
	}
	h.mu.Lock()
	ej.ejectLocked(h, time.Now(), "stalled") // a failed stall probe landing on the old record
	h.mu.Unlock()
	if ej.nEjected.Load() != 0 {
		t.Fatalf("a forgotten record was ejected: count %d", ej.nEjected.Load())
	}
}
