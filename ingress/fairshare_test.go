package ingress

import (
	"encoding/json"
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

// tenantGates is a stand-in engine over real HTTP whose completions wait
// for their tenant's gate (a: the prompt [1,2,3]; b: any other), so the
// test decides whose request ends.
type tenantGates struct {
	addr string
	gate map[string]chan struct{}
	mu   sync.Mutex
	seen []string // the tenant of each request, in arrival order
}

func startTenantGates(t *testing.T) *tenantGates {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &tenantGates{addr: ln.Addr().String(), gate: map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}}
	done := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		body, _ := io.ReadAll(r.Body)
		tenant := "b"
		if strings.Contains(string(body), `"prompt":[1,2,3]`) {
			tenant = "a"
		}
		g.mu.Lock()
		g.seen = append(g.seen, tenant)
		g.mu.Unlock()
		select {
		case <-g.gate[tenant]:
		case <-done:
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { close(done); srv.Close() })
	return g
}

func (g *tenantGates) arrived() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.seen...)
}

// fairClients sends requests as tenants to a fair ingress over g; the
// test's cleanups open every gate and wait for the clients.
type fairClients struct {
	url string
	wg  sync.WaitGroup
}

func newFairClients(t *testing.T, g *tenantGates, fc fair.Config) (*fair.Queue, *fairClients) {
	t.Helper()
	q, err := fair.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + g.addr})
	cfg.TenantHeader = "X-Tenant"
	cfg.IdleTimeout = time.Minute
	s := startIngress(t, cfg, Deps{Admitter: q, ClassifyError: FairErrors})
	c := &fairClients{url: "http://" + s.Addr() + "/v1/completions"}
	stop := make(chan struct{})
	t.Cleanup(func() { c.wg.Wait(); close(stop) })
	t.Cleanup(func() {
		for _, gate := range g.gate {
			go func() {
				for {
					select {
					case gate <- struct{}{}:
					case <-stop:
						return
					}
				}
			}()
		}
	})
	return q, c
}

// send posts body as tenant in the background; done is closed when the
// answer has been read.
func (c *fairClients) send(tenant, body string) (done chan struct{}) {
	done = make(chan struct{})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		req, _ := http.NewRequest("POST", c.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", tenant)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	return done
}

const (
	aBody = `{"model":"m","prompt":[1,2,3],"max_tokens":1}`
	bBody = `{"model":"m","prompt":[4,5,6],"max_tokens":1}`
)

// F1 of the tenant report: tenant a's requests hold both slots and a has
// more queued; tenant b waits with one. b's earlier request asked for 1,000
// tokens of output, so by start tags (work asked for) b is behind a's
// backlog of cheap requests, though a's hold their slots as long as they
// run. a holds its share of the slots (1 of 2) and b none: the slot a's
// ending request frees goes to b, not to a's next request.
func TestFairFreedSlotGoesToTenantBelowShare(t *testing.T) {
	g := startTenantGates(t)
	fc := fair.DefaultConfig()
	fc.MaxConcurrent = 2
	q, c := newFairClients(t, g, fc)
	atEngine := func(n int) {
		t.Helper()
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d requests at the engine", n), func() bool { return len(g.arrived()) == n })
	}
	c.send("a", aBody)
	atEngine(1)
	bigB := c.send("b", `{"model":"m","prompt":[4,5,6],"max_tokens":1000}`)
	atEngine(2)
	g.gate["b"] <- struct{}{}
	<-bigB
	c.send("a", aBody) // a holds both slots
	atEngine(3)
	for range 4 {
		c.send("a", aBody)
	}
	testutil.WaitFor(t, 10*time.Second, "a's backlog queued", func() bool { _, n := q.Stats(); return n == 4 })
	c.send("b", bBody)
	testutil.WaitFor(t, 10*time.Second, "b queued", func() bool { _, n := q.Stats(); return n == 5 })
	g.gate["a"] <- struct{}{}
	atEngine(4)
	if got := g.arrived()[3]; got != "b" {
		t.Fatalf("the slot a's request freed went to %s; want b (a holds its share, b none)", got)
	}
}

// The fair queue's 429s say which bound refused the request: a tenant's
// own queue (maxQueuePerTenant) names the tenant; the queue all tenants
// share (maxQueue) does not blame a tenant that has nothing waiting. Both
// keep Retry-After and the OpenAI error body.
func TestFairQueueFullSaysWhich(t *testing.T) {
	g := startTenantGates(t)
	fc := fair.DefaultConfig()
	fc.MaxConcurrent, fc.MaxQueue, fc.MaxQueuePerTenant = 1, 3, 2
	q, c := newFairClients(t, g, fc)
	c.send("a", aBody)
	testutil.WaitFor(t, 10*time.Second, "a's request at the engine", func() bool { return len(g.arrived()) == 1 })
	c.send("a", aBody)
	c.send("a", aBody)
	testutil.WaitFor(t, 10*time.Second, "two of a's queued", func() bool { _, n := q.Stats(); return n == 2 })
	refused := func(tenant string) string {
		t.Helper()
		st, hdr, body := post(t, http.DefaultClient, c.url, aBody, "X-Tenant", tenant)
		var e openAIError
		if err := json.Unmarshal(body, &e); st != 429 || err != nil || hdr.Get("Retry-After") == "" || e.Error.Message == "" {
			t.Fatalf("%s: %d %v %s; want 429 with Retry-After and an OpenAI error body", tenant, st, hdr, body)
		}
		return e.Error.Message
	}
	if msg := refused("a"); !strings.Contains(msg, `tenant "a" already has 2 requests waiting`) {
		t.Errorf("a's own queue full: %q", msg)
	}
	c.send("b", bBody)
	testutil.WaitFor(t, 10*time.Second, "three queued", func() bool { _, n := q.Stats(); return n == 3 })
	if msg := refused("c"); strings.Contains(msg, `"c"`) || !strings.Contains(msg, "3 requests of all tenants are waiting, the most the queue holds") {
		t.Errorf("the whole queue full, c with nothing waiting: %q", msg)
	}
}
