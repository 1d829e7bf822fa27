package ingress

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A live engine's long generation is not cut by the idle timeout: until the
// answer commits to the client only the stall watch (which probes the
// engine and finds it alive) and FirstByteTimeout (off by default) judge the
// wait, streamed (headers at once, the first event late) or not (nothing
// until the end). The engines answer only after the watch has probed them
// slowProbes times, so at least slowProbes × stallAfter (8 × 100ms) passed,
// 16 idle timeouts: before, the read timed out, the generation was run again
// on the other engine and the client got 504.
func TestLongGenerationOutlivesIdleTimeout(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			a, b := startFaultEngine(t, faultSlowAlive), startFaultEngine(t, faultSlowAlive)
			a.slowProbes, b.slowProbes = 8, 8
			cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: a.url()}, StaticEngine{ID: "b", Model: "m", URL: b.url()})
			cfg.IdleTimeout = 50 * time.Millisecond
			cfg.MaxAttempts = 2
			cfg.Health.StallAfter = 100 * time.Millisecond
			cfg.Health.ProbeTimeout = 10 * time.Second // however busy the machine, a live engine's probe answers
			s := startIngress(t, cfg, Deps{})
			client := &http.Client{Timeout: time.Minute} // a deadlock guard only
			st, _, body := post(t, client, "http://"+s.Addr()+"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":[1,2],"stream":%v}`, stream))
			if st != 200 {
				t.Fatalf("status %d: %s", st, body)
			}
			if stream {
				if evs := sseEvents(body); len(evs) == 0 || evs[len(evs)-1] != "[DONE]" || strings.Contains(string(body), `"error"`) {
					t.Fatalf("events %q", evs)
				}
			} else if !json.Valid(body) || !strings.Contains(string(body), `"text":"t0t1t2"`) {
				t.Fatalf("body %s", body)
			}
			if hits := a.hits.Load() + b.hits.Load(); hits != 1 {
				t.Fatalf("the generation ran %d times; want once", hits)
			}
			waitSettled(t, s)
			if v := val(s.m.attempts.WithLabelValues("timeout")); v != 0 || seriesSum(s.health.ejections) != 0 || seriesSum(s.health.stalls) != 0 {
				t.Fatalf("timeouts %v, ejections %v, stalls %v; want none for live engines", v, seriesSum(s.health.ejections), seriesSum(s.health.stalls))
			}
		})
	}
}

// A hung engine that sent a stream's response headers and no event has not
// committed the request to its client: the stall watch ejects the engine
// and cuts the request, which is retried on the live engine. Before, the
// header bytes marked the request as answered, the cut passed it by, and it
// waited for the idle timeout (10 minutes here; the client gives up first).
func TestStallWatchCutsStreamWithHeadersOnly(t *testing.T) {
	hung := startFaultEngine(t, faultHeadersHang)
	good := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "hung", Model: "m", URL: hung.url()}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
	cfg.Scheduler.Policy = "round-robin" // one of the first two requests goes to each engine
	cfg.IdleTimeout = 10 * time.Minute
	cfg.MaxAttempts = 2
	// Loose enough that a busy machine does not get the live engine
	// probed, and failing both its probes, by mistake.
	cfg.Health.StallAfter = 300 * time.Millisecond
	cfg.Health.ProbeTimeout = time.Second
	cfg.Health.ProbeGrace = time.Second // the hung engine's probes fail then
	s := startIngress(t, cfg, Deps{})
	client := &http.Client{Timeout: time.Minute} // far below the idle timeout: a stuck request fails the test
	for i := 0; i < 4; i++ {
		st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
		evs := sseEvents(b)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" || len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
			t.Fatalf("request %d: %d via %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if hung.hits.Load() != 1 || seriesSum(s.health.stalls) != 1 {
		t.Fatalf("hung engine got %d requests, %v stall ejections; want 1 and 1", hung.hits.Load(), seriesSum(s.health.stalls))
	}
	testutil.WaitFor(t, 10*time.Second, "the hung engine saw its request cut", func() bool { return hung.canceled.Load() == 1 })
	waitSettled(t, s)
}

// When every engine tried sheds load (429), the client gets 429 in the
// OpenAI error shape with the soonest Retry-After the engines asked for (1s
// when none did), not a 503; a 429 never ejects. An engine that failed
// otherwise among them makes it the 503 of a failed upstream.
func TestEnginesSheddingLoadIs429(t *testing.T) {
	shed := func(after string) *faultEngine {
		fe := startFaultEngine(t, faultShed)
		fe.retryAfter = after
		return fe
	}
	e7, e3, none, e500 := shed("7"), shed("3"), shed(""), startFaultEngine(t, fault500)
	for _, tc := range []struct {
		name       string
		engines    []*faultEngine
		status     int
		retryAfter string
	}{
		{"one engine", []*faultEngine{e7}, 429, "7"},
		{"the soonest of two", []*faultEngine{e7, e3}, 429, "3"},
		{"no Retry-After", []*faultEngine{none}, 429, "1"},
		{"one failed", []*faultEngine{e7, e500}, 503, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var engines []StaticEngine
			for i, fe := range tc.engines {
				engines = append(engines, StaticEngine{ID: fmt.Sprint("e", i), Model: "m", URL: fe.url()})
			}
			cfg := testConfig(engines...)
			cfg.Health.ConsecutiveFailures = 1
			s := startIngress(t, cfg, Deps{})
			for _, fe := range tc.engines {
				prompts(fe) // drop what earlier cases left
			}
			for i := 0; i < 3; i++ {
				st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1]}`)
				var e struct{ Error struct{ Type, Code string } }
				if st != tc.status || hdr.Get("Retry-After") != tc.retryAfter || json.Unmarshal(b, &e) != nil || e.Error.Type == "" {
					t.Fatalf("request %d: %d Retry-After %q: %s; want %d, %q", i, st, hdr.Get("Retry-After"), b, tc.status, tc.retryAfter)
				}
				if st == 429 && (e.Error.Type != "rate_limit_error" || e.Error.Code != "engine_overloaded") {
					t.Fatalf("error body %s", b)
				}
				if tc.status == 503 && i == 0 {
					break // the 5xx ejects its engine: later requests see only the shedding one
				}
			}
			if tc.status == 429 {
				hits := 0
				for _, fe := range tc.engines {
					hits += prompts(fe)
				}
				if hits != 3*len(tc.engines) || seriesSum(s.health.ejections) != 0 {
					t.Fatalf("%d attempts, %v ejections; want every engine tried each time and none ejected", hits, seriesSum(s.health.ejections))
				}
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", time.Second}, {"7", 7 * time.Second}, {"0", time.Second}, {"x", time.Second}, {"-3", time.Second},
		{"99999999999", time.Second}, {"86400", maxRetryAfter},
		{"Fri, 04 Dec 2026 03:00:30 GMT", 30 * time.Second}, {"Fri, 04 Dec 2026 02:00:00 GMT", time.Second},
	} {
		if got := retryAfter([]byte(tc.in), now); got != tc.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// A stream that breaks after it started is the engine's failure for passive
// ejection (health.go), though the request is not retried: an engine whose
// streams keep breaking leaves routing. A broken stream is no success (a
// stream succeeds when it ends cleanly), so three in a row eject, as three
// 5xx answers do (consecutiveFailures).
func TestMidStreamBreakCountsTowardEjection(t *testing.T) {
	fe := startFaultEngine(t, faultBreakStream)
	cfg := testConfig(StaticEngine{ID: "broken", Model: "m", URL: fe.url()})
	// No probe brings the engine back during the test.
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = time.Hour, time.Hour
	s := startIngress(t, cfg, Deps{})
	for i := 0; i < 3; i++ {
		if ej := s.health.ejected(); len(ej) != 0 {
			t.Fatalf("ejected %v after %d broken streams, want only after 3", ej, i)
		}
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
		if evs := sseEvents(b); st != 200 || len(evs) != 4 || !strings.Contains(evs[2], `"error"`) {
			t.Fatalf("request %d: %d %q", i, st, evs)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the engine ejected after three broken streams", func() bool {
		ej := s.health.ejected()
		return len(ej) == 1 && ej[0] == "broken"
	})
	if n := prompts(fe); n != 3 || seriesSum(s.health.ejections) != 1 {
		t.Fatalf("%d upstream requests, %v ejections; want 3 (a broken stream is not retried) and 1", n, seriesSum(s.health.ejections))
	}
}

// A first-byte bound shorter than the stall watch's time to judge would
// time out a hung engine's requests as a slow one's (504, not retried):
// refused at start. Negative is refused too; with the watch off any bound
// goes.
func TestValidateFirstByteTimeout(t *testing.T) {
	for _, tc := range []struct {
		first, stall time.Duration
		ok           bool
	}{
		{0, time.Second, true}, {10 * time.Minute, time.Second, true}, {-time.Second, time.Second, false},
		{2 * time.Second, time.Second, false}, {2 * time.Second, 0, true},
	} {
		cfg := DefaultConfig()
		cfg.FirstByteTimeout, cfg.Health.StallAfter = tc.first, tc.stall
		err := cfg.Validate()
		if (err == nil) != tc.ok || err != nil && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "first byte timeout")) {
			t.Errorf("first %v stall %v: %v", tc.first, tc.stall, err)
		}
	}
}
