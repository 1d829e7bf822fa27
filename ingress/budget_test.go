package ingress

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// budgetLimiter is a Limiter with per-key limits l on a clock that stands still
// (the start of a window), so what it counted can be probed at the same instant.
func budgetLimiter(t *testing.T, l ratelimit.Limits) (*ratelimit.Limiter, time.Time) {
	t.Helper()
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	lim, err := ratelimit.New(ratelimit.Config{PerKey: l, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return lim, now
}

// A stream the client cuts (499) is charged what it produced: the client asks
// for max_tokens 50, reads 100 events (this engine ignores max_tokens) and
// closes the connection; the key's output budget of 300 then holds at least
// those 100 tokens, not only the 50 reserved.
func TestCutStreamChargedToBudget(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream)
	lim, now := budgetLimiter(t, ratelimit.Limits{OutputTokens: 300})
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Limiter: lim})

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Post("http://"+s.Addr()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":50,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for n := 0; n < 100 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	resp.Body.Close() // the client goes away mid-stream
	waitSettled(t, s)
	if got := val(s.m.requests.WithLabelValues("completions", "499")); got != 1 {
		t.Fatalf("requests_total{status=499} = %v, want 1", got)
	}
	if d := lim.ReserveAt("", "m", ratelimit.Ask{OutputTokens: 220}, now); d.Allowed {
		t.Fatal("220 more output tokens admitted under 300 after a cut stream produced 100: the stream was not charged")
	}
	if d := lim.ReserveAt("", "m", ratelimit.Ask{OutputTokens: 1}, now); !d.Allowed {
		t.Fatalf("one token refused: %+v (charged far more than the stream produced)", d)
	}
}

// Requests in flight reserve their max_tokens: under an output budget of 100 a
// burst of 20 parallel requests of max_tokens 20 sends 5 to the engine and 15
// get 429 with Retry-After; one request asking more than the whole budget (n 20
// × max_tokens 500) is refused as too large, saying so.
func TestParallelRequestsReserveOutput(t *testing.T) {
	eng := startGateEngine(t)
	lim, _ := budgetLimiter(t, ratelimit.Limits{OutputTokens: 100})
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + eng.ln.Addr().String()})
	cfg.IdleTimeout = time.Minute
	s := startIngress(t, cfg, Deps{Limiter: lim})
	url := "http://" + s.Addr() + "/v1/completions"

	b := parallelPosts(t, eng, url, `{"model":"m","prompt":[1,2,3],"max_tokens":20}`, 20)
	testutil.WaitFor(t, 10*time.Second, "every request at the engine or refused", func() bool { return len(eng.arrived())+b.refused() == 20 })
	if at, n := len(eng.arrived()), b.refused(); at != 5 || n != 15 {
		t.Fatalf("20 parallel requests of max_tokens 20 under 100: %d at the engine, %d refused; want 5 and 15", at, n)
	}

	st, hdr, body := post(t, &http.Client{Timeout: 10 * time.Second}, url, `{"model":"m","prompt":[1,2,3],"n":20,"max_tokens":500}`)
	if st != 429 || hdr.Get("Retry-After") != "" || !strings.Contains(string(body), "Limit 100, Requested 10000") || !strings.Contains(string(body), "too large") {
		t.Errorf("n 20 × max_tokens 500 under 100: %d Retry-After %q %s; want 429 too large, no Retry-After", st, hdr.Get("Retry-After"), body)
	}
	for range eng.arrived() {
		eng.gate <- struct{}{}
	}
	if got := b.answered(); got != len(eng.arrived()) {
		t.Errorf("%d answered, %d at the engine", got, len(eng.arrived()))
	}
}

// burst is parallelPosts' answers.
type burst struct {
	mu       sync.Mutex
	statuses []int
	wg       sync.WaitGroup
}

// parallelPosts sends n copies of body to url at once through eng, which
// holds each request until the test lets it go (eng.gate). Every 429 must
// carry Retry-After and the OpenAI body. The cleanups let the engine go and
// wait for the clients, on failure too.
func parallelPosts(t *testing.T, eng *gateEngine, url, body string, n int) *burst {
	t.Helper()
	b := &burst{}
	eng.releaseAtEnd(t, &b.wg)
	for range n {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			resp, err := http.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			rb, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == 429 {
				var e openAIError
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || json.Unmarshal(rb, &e) != nil || e.Error.Type != "rate_limit_error" {
					t.Errorf("429 without Retry-After or OpenAI body: %q %s", resp.Header.Get("Retry-After"), rb)
				}
			}
			b.mu.Lock()
			b.statuses = append(b.statuses, resp.StatusCode)
			b.mu.Unlock()
		}()
	}
	return b
}

// refused counts the 429s so far.
func (b *burst) refused() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, st := range b.statuses {
		if st == 429 {
			n++
		}
	}
	return n
}

// answered waits for every client and counts the answers that were not 429.
func (b *burst) answered() int {
	b.wg.Wait()
	return len(b.statuses) - b.refused()
}

// budgetAsk: max_tokens × sequences; without max_tokens, the output expected
// per sequence (the mean answer seen; defaultOutputTokens before any) bounded
// by what the smallest reported context leaves after each prompt, marked
// unbounded; nothing for vLLM's other endpoints.
func TestBudgetAsk(t *testing.T) {
	s, err := New(testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	infos := []EngineInfo{
		{Engine: scheduler.Engine{ID: "a", Model: "m"}, MaxModelLen: 2000},
		{Engine: scheduler.Engine{ID: "b", Model: "m"}, MaxModelLen: 1000},
		{Engine: scheduler.Engine{ID: "c", Model: "other"}, MaxModelLen: 100},
		{Engine: scheduler.Engine{ID: "d", Model: "m"}},
	}
	for _, tc := range []struct {
		name             string
		ep               endpoint
		maxTokens, n, ps int // ps: prompts in the batch
		infos            []EngineInfo
		want             ratelimit.Ask
	}{
		{"max_tokens × n", epCompletions, 100, 3, 1, infos, ratelimit.Ask{InputTokens: 100, OutputTokens: 300}},
		{"max_tokens × batch × n", epCompletions, 10, 2, 3, infos, ratelimit.Ask{InputTokens: 100, OutputTokens: 60}},
		{"max_tokens 0", epChat, 0, 0, 1, infos, ratelimit.Ask{InputTokens: 100}},
		{"no max_tokens: the output expected", epChat, -1, 2, 1, infos, ratelimit.Ask{InputTokens: 100, OutputTokens: 2 * defaultOutputTokens, Unbounded: true}},
		{"no max_tokens, batch", epCompletions, -1, 1, 2, infos, ratelimit.Ask{InputTokens: 100, OutputTokens: 2 * defaultOutputTokens, Unbounded: true}},
		{"no max_tokens, no context known", epChat, -1, 1, 1, infos[3:], ratelimit.Ask{InputTokens: 100, OutputTokens: defaultOutputTokens, Unbounded: true}},
		{"no max_tokens: bounded by the context left", epChat, -1, 1, 1, []EngineInfo{{Engine: scheduler.Engine{ID: "a", Model: "m"}, MaxModelLen: 150}}, ratelimit.Ask{InputTokens: 100, OutputTokens: 50, Unbounded: true}},
		{"embeddings", epOther, -1, 0, 1, infos, ratelimit.Ask{InputTokens: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &call{s: s, ep: tc.ep, model: "m", infos: tc.infos}
			c.req.maxTokens, c.req.n = tc.maxTokens, tc.n
			c.seqs = tc.ps * max(1, tc.n)
			if got := c.budgetAsk(100); got != tc.want {
				t.Fatalf("budgetAsk = %+v, want %+v", got, tc.want)
			}
		})
	}
	// Once answers were seen, their mean per sequence.
	s.outLens.observe("m", 40)
	c := &call{s: s, ep: epChat, model: "m", infos: infos, seqs: 3}
	c.req.maxTokens = -1
	if got, want := c.budgetAsk(100), (ratelimit.Ask{InputTokens: 100, OutputTokens: 120, Unbounded: true}); got != want {
		t.Fatalf("after answers of 40: budgetAsk = %+v, want %+v", got, want)
	}
	c = &call{s: s, ep: epCompletions, model: "m", seqs: 1 << 40}
	c.req.maxTokens = 1 << 30
	if got := c.budgetAsk(1).OutputTokens; got <= 0 {
		t.Fatalf("max_tokens × sequences overflowed to %d", got)
	}
}
