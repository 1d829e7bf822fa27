package ingress

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// jsonLines decodes every line of s that is a JSON object.
func jsonLines(s string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// A session stays on its engine although the policy (round-robin) would
// move it; every request leaves one access-log line explaining it.
func TestSessionAffinityAndAccessLog(t *testing.T) {
	sims := startSims(t, 2, "m")
	cfg := testConfig(simEngines(sims, "m")...)
	cfg.Scheduler.Policy = "round-robin"
	aff, err := session.NewAffinity(session.DefaultAffinityConfig())
	if err != nil {
		t.Fatal(err)
	}
	var logBuf testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Affinity: aff, AccessLog: slog.New(slog.NewJSONHandler(&logBuf, nil))})
	url := "http://" + s.Addr() + "/v1/completions"
	const body = `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18],"max_tokens":2}`
	first := ""
	for i := 0; i < 5; i++ {
		st, hdr, b := post(t, http.DefaultClient, url, body, "X-Session-ID", "conv-1")
		if st != 200 {
			t.Fatalf("%d %s", st, b)
		}
		if first == "" {
			first = hdr.Get("X-Kvmesh-Engine")
		} else if got := hdr.Get("X-Kvmesh-Engine"); got != first {
			t.Fatalf("turn %d went to %s, session was on %s", i, got, first)
		}
	}
	// Without a session, round-robin alternates.
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		_, hdr, _ := post(t, http.DefaultClient, url, body)
		seen[hdr.Get("X-Kvmesh-Engine")] = true
	}
	if len(seen) != 2 {
		t.Fatalf("round-robin without session used %v", seen)
	}
	testutil.WaitFor(t, 10*time.Second, "7 access-log lines", func() bool { return len(jsonLines(logBuf.String())) == 7 })
	lines := jsonLines(logBuf.String())
	for _, k := range []string{"model", "engine", "policy", "reason", "attempts", "matched_gpu", "matched_cpu", "prompt_tokens", "output_tokens", "parse_ms", "tokenize_ms", "schedule_ms", "ttft_ms", "total_ms", "status"} {
		if _, ok := lines[0][k]; !ok {
			t.Errorf("access log line lacks %q: %v", k, lines[0])
		}
	}
	if lines[1]["session"] != "conv-1" || lines[1]["engine"] != first || lines[1]["status"] != float64(200) || lines[1]["prompt_tokens"] != float64(18) {
		t.Errorf("second line %v", lines[1])
	}
}

func TestKeepSessionUnlessOverloaded(t *testing.T) {
	mk := func(sessLoad int) *call {
		s := &Server{cfg: DefaultConfig()}
		c := &call{s: s}
		c.cands = []scheduler.Engine{{ID: "a", InFlight: 1}, {ID: "b", InFlight: sessLoad}}
		c.dec.Ranked = []scheduler.EngineScore{{Engine: "a"}, {Engine: "b"}}
		c.sreq.SessionEngine = "b"
		c.keepSession()
		return c
	}
	if c := mk(5); c.dec.Ranked[0].Engine != "b" || c.dec.Reason != "session-affinity" || c.dec.Ranked[1].Engine != "a" {
		t.Fatalf("not kept: %+v", c.dec)
	}
	if c := mk(1 + DefaultConfig().SessionSlack + 1); c.dec.Ranked[0].Engine != "a" {
		t.Fatalf("kept on an overloaded engine: %+v", c.dec)
	}
}

// With the admission queue in front, a request that waits longer than the
// queue allows gets 504, and one that finds the queue full gets 429.
func TestAdmissionQueueTimeoutAndFull(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream)
	ac := session.DefaultAdmissionConfig()
	ac.MaxConcurrent, ac.MaxQueue, ac.MaxWait = 1, 1, 100*time.Millisecond
	adm, err := session.NewAdmitter(ac)
	if err != nil {
		t.Fatal(err)
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()}), Deps{Admitter: adm, ClassifyError: SessionErrors})
	url := "http://" + s.Addr() + "/v1/completions"
	// Hold the only slot with an endless stream.
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("holder: %v %v", resp, err)
	}
	defer resp.Body.Close()
	// One waiter fills the queue and times out ...
	done := make(chan int, 1)
	go func() {
		st, _, _ := post(t, http.DefaultClient, url, `{"model":"m","prompt":[2]}`)
		done <- st
	}()
	testutil.WaitFor(t, 5*time.Second, "one request queued for admission", func() bool { _, _, queued, _ := adm.Stats(); return queued == 1 })
	// ... while the next finds the queue full.
	st, hdr, b := post(t, http.DefaultClient, url, `{"model":"m","prompt":[3]}`)
	if st != 429 || hdr.Get("Retry-After") == "" {
		t.Fatalf("queue full: %d %s", st, b)
	}
	select {
	case st := <-done:
		if st != 504 {
			t.Fatalf("queue timeout: status %d", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter never answered")
	}
}

// switchableMembership is a FAKE membership whose engines' queues the test
// sets: saturating real engines on cue is not practical in a unit test.
type switchableMembership struct {
	mu      sync.Mutex
	waiting int
}

func (m *switchableMembership) set(w int) { m.mu.Lock(); m.waiting = w; m.mu.Unlock() }

func (m *switchableMembership) Engines(dst []EngineInfo) []EngineInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range []string{"a", "b"} {
		dst = append(dst, EngineInfo{Engine: scheduler.Engine{ID: id, Model: "m", Healthy: true, Waiting: m.waiting}, URL: "http://127.0.0.1:1"})
	}
	return dst
}

// When every engine queues, the admission limit shrinks to what is in
// service; it returns to the configured one when an engine has room.
func TestAdmissionFollowsSaturation(t *testing.T) {
	ac := session.DefaultAdmissionConfig()
	ac.MaxConcurrent = 64
	adm, err := session.NewAdmitter(ac)
	if err != nil {
		t.Fatal(err)
	}
	mem := &switchableMembership{}
	cfg := DefaultConfig()
	cfg.LoadInterval = 10 * time.Millisecond
	startIngress(t, cfg, Deps{Membership: mem, Admitter: adm})
	limit := func() int { _, _, _, l := adm.Stats(); return l }
	mem.set(3)
	testutil.WaitFor(t, 5*time.Second, "the admission limit down to 1 while every engine queues", func() bool { return limit() == 1 })
	mem.set(0)
	testutil.WaitFor(t, 5*time.Second, "the admission limit back to 64", func() bool { return limit() == 64 })
}

// A client that closes its connection while queued for admission leaves
// the queue at once (long before maxWait) and is recorded as 499; its
// request never reaches the engine.
func TestAdmissionClientLeaves(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream)
	ac := session.DefaultAdmissionConfig()
	ac.MaxConcurrent, ac.MaxQueue, ac.MaxWait = 1, 4, time.Hour
	adm, err := session.NewAdmitter(ac)
	if err != nil {
		t.Fatal(err)
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()}), Deps{Admitter: adm, ClassifyError: SessionErrors})
	// Hold the only slot with an endless stream.
	holder := dialRequest(t, s.Addr(), "/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	testutil.WaitFor(t, 30*time.Second, "the slot taken", func() bool { inflight, _, _, _ := adm.Stats(); return inflight == 1 })
	leaver := dialRequest(t, s.Addr(), "/v1/completions", `{"model":"m","prompt":[2]}`)
	testutil.WaitFor(t, 30*time.Second, "one request queued for admission", func() bool { _, _, queued, _ := adm.Stats(); return queued == 1 })
	leaver.Close()
	testutil.WaitFor(t, 30*time.Second, "the queue empty after the client left", func() bool { _, _, queued, _ := adm.Stats(); return queued == 0 })
	// Counted as its handler ends, which may be after the queue let it go.
	testutil.WaitFor(t, 30*time.Second, "the request that left counted with status 499", func() bool {
		return val(s.m.requests.WithLabelValues("completions", "499")) == 1
	})
	// A buffered request that waited (its wait's watcher stopped) is still
	// watched once sent: its client leaving cancels the engine's work.
	waiter := dialRequest(t, s.Addr(), "/v1/completions", `{"model":"m","prompt":[3]}`)
	testutil.WaitFor(t, 30*time.Second, "the next request queued", func() bool { _, _, queued, _ := adm.Stats(); return queued == 1 })
	holder.Close()
	testutil.WaitFor(t, 30*time.Second, "the holder's stream canceled and the waiter sent", func() bool {
		return fe.canceled.Load() == 1 && fe.hits.Load() == 2
	})
	waiter.Close()
	testutil.WaitFor(t, 30*time.Second, "the waiter's upstream canceled", func() bool { return fe.canceled.Load() == 2 })
	if n := fe.hits.Load(); n != 2 {
		t.Fatalf("the engine got %d requests, want 2 (the one that left was never sent)", n)
	}
}
