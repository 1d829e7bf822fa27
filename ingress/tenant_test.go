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

	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// gateEngine is a stand-in engine over real HTTP whose every completion waits
// until the test opens the gate once for it: the test decides when a slot
// frees, so shares are measured without timing assumptions.
type gateEngine struct {
	ln   net.Listener
	srv  *http.Server
	gate chan struct{}
	mu   sync.Mutex
	seen []string // the tenant of each request (by its prompt), in arrival order
}

func startGateEngine(t *testing.T) *gateEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gateEngine{ln: ln, gate: make(chan struct{})}
	done := make(chan struct{})
	g.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" { // alive while it holds requests (the stall watch probes it)
			return
		}
		g.mu.Lock()
		body, _ := io.ReadAll(r.Body)
		tenant := "b"
		if strings.Contains(string(body), `"prompt":[1,2,3]`) {
			tenant = "a"
		}
		g.seen = append(g.seen, tenant)
		g.mu.Unlock()
		select {
		case <-g.gate:
		case <-done:
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})}
	go g.srv.Serve(ln)
	t.Cleanup(func() { close(done); g.srv.Close() })
	return g
}

func (g *gateEngine) arrived() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.seen...)
}

// releaseAtEnd has the test's cleanups let every request through the gate
// and then wait for wg (the test's clients), on failure too.
func (g *gateEngine) releaseAtEnd(t *testing.T, wg *sync.WaitGroup) {
	done := make(chan struct{})
	t.Cleanup(func() { wg.Wait(); close(done) })
	t.Cleanup(func() {
		go func() {
			for {
				select {
				case g.gate <- struct{}{}:
				case <-done:
					return
				}
			}
		}()
	})
}

// TestFairSharesBetweenTenants: two tenants with weights 1:3 saturate an
// ingress whose fair queue admits one request at a time; of the next 40
// requests the engine receives, the tenants get 10 and 30 (within 10 %),
// although tenant a's whole burst arrived first.
func TestFairSharesBetweenTenants(t *testing.T) {
	eng := startGateEngine(t)
	fc := fair.DefaultConfig()
	fc.Tenants = map[string]fair.Tenant{"a": {Weight: 1}, "b": {Weight: 3}}
	q, url := fairIngress(t, eng, fc)
	got := contend(t, eng, q, url, map[string]string{
		"a": `{"model":"m","prompt":[1,2,3],"max_tokens":1}`,
		"b": `{"model":"m","prompt":[4,5,6],"max_tokens":1}`,
	}, 40)
	if got["a"] < 9 || got["a"] > 11 || got["b"] < 27 || got["b"] > 33 {
		t.Fatalf("40 admissions under contention: %v, want a:b = 10:30 within 10 %%", got)
	}
	// Let the rest drain so the ingress closes cleanly.
	go func() {
		for i := 0; i < 41; i++ {
			eng.gate <- struct{}{}
		}
	}()
	testutil.WaitFor(t, 30*time.Second, "the queue drained", func() bool { in, n := q.Stats(); return in == 0 && n == 0 })
}

// TestFairPricesOutput: the fair queue prices a request by its prompt and the
// output it asks for (max_tokens × n), not its prompt alone. Tenant a sends
// 3-token prompts asking 400 output tokens, tenant b 500-token prompts asking
// 1, with equal weights, a's burst queued first: of the next 20 admissions each
// gets its share of the work (about 11 and 9). Priced in prompt tokens, a got
// 19 of them.
func TestFairPricesOutput(t *testing.T) {
	eng := startGateEngine(t)
	q, url := fairIngress(t, eng, fair.DefaultConfig())
	long := make([]string, 500)
	for i := range long {
		long[i] = fmt.Sprint(4 + i%1000)
	}
	got := contend(t, eng, q, url, map[string]string{
		"a": `{"model":"m","prompt":[1,2,3],"max_tokens":400}`,
		"b": `{"model":"m","prompt":[` + strings.Join(long, ",") + `],"max_tokens":1}`,
	}, 20)
	if got["a"] < 8 || got["b"] < 7 {
		t.Fatalf("20 admissions under contention: %v, want about a:b = 11:9 (each at least 7)", got)
	}
}

// fairIngress starts an ingress over eng whose fair queue (fc, admitting
// one request at a time) takes the tenant from X-Tenant.
func fairIngress(t *testing.T, eng *gateEngine, fc fair.Config) (*fair.Queue, string) {
	t.Helper()
	fc.MaxConcurrent = 1
	q, err := fair.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + eng.ln.Addr().String()})
	cfg.TenantHeader = "X-Tenant"
	cfg.IdleTimeout = time.Minute
	s := startIngress(t, cfg, Deps{Admitter: q, ClassifyError: FairErrors})
	return q, "http://" + s.Addr() + "/v1/completions"
}

// contend has tenant a's first request hold the queue's one slot, queues a
// burst of n of a's requests and then n of b's (bodies by tenant), lets n
// of them through one at a time and counts those n admissions by tenant.
// The cleanups let the engine answer the rest and wait for the clients, on
// failure too.
func contend(t *testing.T, eng *gateEngine, q *fair.Queue, url string, bodies map[string]string, n int) map[string]int {
	t.Helper()
	var wg sync.WaitGroup
	eng.releaseAtEnd(t, &wg)
	send := func(tenant string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", url, strings.NewReader(bodies[tenant]))
			req.Header.Set("X-Tenant", tenant)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	send("a") // holds the one slot
	testutil.WaitFor(t, 10*time.Second, "the first request at the engine", func() bool { return len(eng.arrived()) == 1 })
	for range n {
		send("a")
	}
	testutil.WaitFor(t, 10*time.Second, "tenant a's burst queued", func() bool { _, k := q.Stats(); return k == n })
	for range n {
		send("b")
	}
	testutil.WaitFor(t, 10*time.Second, "both tenants queued", func() bool { _, k := q.Stats(); return k == 2*n })
	for i := 1; i <= n; i++ {
		eng.gate <- struct{}{}
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("admission %d at the engine", i), func() bool { return len(eng.arrived()) == i+1 })
	}
	got := map[string]int{}
	for _, tenant := range eng.arrived()[1:] {
		got[tenant]++
	}
	return got
}
