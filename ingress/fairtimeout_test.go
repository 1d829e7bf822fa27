package ingress

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A request that waits in the fair queue longer than its maxWait gets
// fair.ErrQueueTimeout, which the ingress answers 504 (timeout, an OpenAI
// error body), as the fair package's documentation says; the request in
// service is unaffected.
func TestFairQueueTimeoutIs504(t *testing.T) {
	eng := startGateEngine(t)
	fc := fair.DefaultConfig()
	fc.MaxConcurrent, fc.MaxWait = 1, 50*time.Millisecond
	q, err := fair.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + eng.ln.Addr().String()})
	cfg.IdleTimeout = time.Minute
	s := startIngress(t, cfg, Deps{Admitter: q, ClassifyError: FairErrors})
	url := "http://" + s.Addr() + "/v1/completions"

	first := make(chan int, 1)
	released := false
	t.Cleanup(func() { // on failure too, before the ingress drains
		if !released {
			eng.gate <- struct{}{}
		}
	})
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "the first request at the engine", func() bool { return len(eng.arrived()) == 1 })
	st, _, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[4,5,6],"max_tokens":1}`)
	var e openAIError
	if err := json.Unmarshal(body, &e); st != 504 || err != nil || e.Error.Type != "server_error" || e.Error.Code != "timeout" {
		t.Fatalf("a request past the fair queue's maxWait: %d %s; want 504 timeout", st, body)
	}
	eng.gate <- struct{}{}
	released = true
	if st := <-first; st != 200 {
		t.Fatalf("the request in service: %d", st)
	}
}
