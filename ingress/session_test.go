package ingress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/scheduler"
)

// lockedBuffer is an io.Writer safe for the access log's concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
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
	var logBuf lockedBuffer
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
	waitFor(t, 2e9, func() bool { return len(logBuf.lines()) == 7 })
	lines := logBuf.lines()
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
