package ingress

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// gateAdmitter is a FAKE admission queue: every request waits until the
// test opens the gate (waiting counts the requests in the queue).
type gateAdmitter struct {
	gate    chan struct{}
	waiting atomic.Int64
}

func (g *gateAdmitter) Acquire(ctx context.Context, _ string) (func(), error) {
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	select {
	case <-g.gate:
		return func() {}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// swapMembership reports whichever engine list was stored last.
type swapMembership struct{ list atomic.Pointer[[]EngineInfo] }

func (m *swapMembership) Engines(dst []EngineInfo) []EngineInfo {
	return append(dst, *m.list.Load()...)
}

// TestAdmittedRequestRoutedOnFreshLoad: a request that waited in the
// admission queue is routed on the engines' load when it is admitted, not
// on what they reported when it arrived (the idle engine of then may have
// filled up meanwhile).
func TestAdmittedRequestRoutedOnFreshLoad(t *testing.T) {
	sims := startSims(t, 2, "m")
	engine := func(id, url string, running int) EngineInfo {
		e := pdEngine(id, 0, url)
		e.InFlight = running // other replicas' requests there (least-request reads it)
		return e
	}
	m := &swapMembership{}
	arrival := []EngineInfo{engine("a", sims[0].URL(), 0), engine("b", sims[1].URL(), 40)}
	m.list.Store(&arrival)
	g := &gateAdmitter{gate: make(chan struct{})}
	s := startIngress(t, testConfig(), Deps{Membership: m, Admitter: g})
	type answer struct {
		status int
		engine string
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","prompt":[1,2,3],"max_tokens":1}`))
		if err != nil {
			done <- answer{status: -1}
			return
		}
		resp.Body.Close()
		done <- answer{resp.StatusCode, resp.Header.Get("X-Kvmesh-Engine")}
	}()
	testutil.WaitFor(t, 10*time.Second, "the request waiting for admission", func() bool { return g.waiting.Load() == 1 })
	// While it waits, a fills up and b drains.
	admitted := []EngineInfo{engine("a", sims[0].URL(), 40), engine("b", sims[1].URL(), 0)}
	m.list.Store(&admitted)
	close(g.gate)
	if a := <-done; a.status != http.StatusOK || a.engine != "b" {
		t.Fatalf("status %d engine %q; want 200 on b, idle when the request was admitted", a.status, a.engine)
	}
}
