package orchestrator

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// promStandIn is a stand-in for Prometheus (none runs here): a real HTTP
// server on loopback that answers /api/v1/query with the Prometheus HTTP
// API's JSON. Each query string maps to a canned response body and status;
// an unknown query is a bad_data error, as Prometheus answers a bad PromQL.
type promStandIn struct {
	srv *httptest.Server
	mu  sync.Mutex
	ans map[string]promAnswer
	n   map[string]int // queries received, by query
}

type promAnswer struct {
	status int
	body   string
}

func newPromStandIn(t *testing.T) *promStandIn {
	t.Helper()
	p := &promStandIn{ans: map[string]promAnswer{}, n: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" {
			http.NotFound(w, r)
			return
		}
		q := r.FormValue("query") // POST form or GET query, as client_golang sends either
		p.mu.Lock()
		a, ok := p.ans[q]
		p.n[q]++
		p.mu.Unlock()
		if !ok {
			a = promAnswer{400, `{"status":"error","errorType":"bad_data","error":"unknown query in the stand-in"}`}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *promStandIn) set(q string, status int, body string) {
	p.mu.Lock()
	p.ans[q] = promAnswer{status, body}
	p.mu.Unlock()
}

// setVector answers q with an instant vector of the values (one series each).
func (p *promStandIn) setVector(q string, vals ...float64) {
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"metric":{"pod":"p%d"},"value":[1700000000.5,"%g"]}`, i, v)
	}
	p.set(q, 200, `{"status":"success","data":{"resultType":"vector","result":[`+b.String()+`]}}`)
}

func (p *promStandIn) queries(q string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[q]
}
