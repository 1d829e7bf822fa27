package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

func promPolicy(addr string, stale int32, metrics ...v1alpha1.MetricTarget) *v1alpha1.AutoscalingPolicy {
	ap := &v1alpha1.AutoscalingPolicy{Spec: v1alpha1.AutoscalingPolicySpec{
		Prometheus: &v1alpha1.PrometheusSource{Address: addr, StaleAfterSeconds: &stale},
		Roles:      []v1alpha1.RoleAutoscaling{{Name: "decode", MinReplicas: 1, MaxReplicas: 4, Metrics: metrics}},
	}}
	ap.Generation = 1
	return ap
}

func promMetric(name, q string) v1alpha1.MetricTarget {
	return v1alpha1.MetricTarget{Name: name, Target: 1, Source: "prometheus", Query: q}
}

type promStep struct {
	obs  map[string]autoscale.Observation
	cond *metav1.Condition
}

func stepProm(c *Controller, e *policyEntry, ap *v1alpha1.AutoscalingPolicy, now time.Time) promStep {
	obs := map[string]autoscale.Observation{"decode": {Current: 1, Metrics: map[string]float64{}}}
	pc := &policyConds{gen: 1}
	c.observePrometheus(context.Background(), now, ap, e, obs, pc)
	return promStep{obs, meta.FindStatusCondition(pc.st.Conditions, v1alpha1.ConditionMetricsAvailable)}
}

// TestPrometheusSourceAgainstStandIn: answers of a Prometheus stand-in on
// loopback are reduced per metric (counts summed, averages meaned, NaN and
// empty left unobserved); error envelopes, non-JSON and unsupported result
// types are errors, counted and reported as MetricsAvailable=False.
func TestPrometheusSourceAgainstStandIn(t *testing.T) {
	p := newPromStandIn(t)
	p.setVector("waiting", 3, 4)
	p.setVector("kv", 0.2, 0.6)
	p.setVector("ttft_nan", math.NaN())
	p.setVector("empty_total")
	p.set("envelope", 422, `{"status":"error","errorType":"execution","error":"query timed out in expression evaluation"}`)
	p.set("html", 500, `<html>bad gateway</html>`)
	p.set("truncated", 200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"`)
	p.set("matrix", 200, `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}`)
	p.set("scalar", 200, `{"status":"success","data":{"resultType":"scalar","result":[1,"7.5"]}}`)
	p.set("bad_number", 200, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"twelve"]}]}}`)
	c := &Controller{cfg: Config{PrometheusTimeout: 5 * time.Second}}
	now := time.Unix(1700000000, 0)

	good := []struct {
		metric, q string
		want      float64
		observed  bool
	}{
		{autoscale.WaitingRequests, "waiting", 7, true},
		{autoscale.KVUsage, "kv", 0.4, true},
		{autoscale.TTFTP90, "ttft_nan", 0, false},
		{autoscale.RunningRequests, "empty_total", 0, true},
		{autoscale.TPOTP90, "scalar", 7.5, true},
	}
	for _, g := range good {
		s := stepProm(c, &policyEntry{}, promPolicy(p.srv.URL, 60, promMetric(g.metric, g.q)), now)
		v, ok := s.obs["decode"].Metrics[g.metric]
		if ok != g.observed || math.Abs(v-g.want) > 1e-9 {
			t.Errorf("%s: got %v (observed %v), want %v (%v)", g.q, v, ok, g.want, g.observed)
		}
		if s.cond == nil || s.cond.Status != metav1.ConditionTrue {
			t.Errorf("%s: condition %+v, want MetricsAvailable True", g.q, s.cond)
		}
	}
	for _, q := range []string{"envelope", "html", "truncated", "matrix", "bad_number", "unknown"} {
		before := promtest.ToFloat64(promQueries.WithLabelValues("error"))
		s := stepProm(c, &policyEntry{}, promPolicy(p.srv.URL, 60, promMetric(autoscale.WaitingRequests, q)), now)
		if _, ok := s.obs["decode"].Metrics[autoscale.WaitingRequests]; ok {
			t.Errorf("%s: observed a value from a failed query", q)
		}
		if s.cond == nil || s.cond.Status != metav1.ConditionFalse || s.cond.Reason != "PrometheusError" {
			t.Errorf("%s: condition %+v, want MetricsAvailable False PrometheusError", q, s.cond)
		}
		if promtest.ToFloat64(promQueries.WithLabelValues("error")) != before+1 {
			t.Errorf("%s: error not counted", q)
		}
		if p.queries(q) == 0 {
			t.Errorf("%s: the stand-in was not asked", q)
		}
	}
	// No address at all: a condition, not a panic or a silent hold.
	s := stepProm(c, &policyEntry{}, promPolicy("", 60, promMetric(autoscale.WaitingRequests, "waiting")), now)
	if s.cond == nil || s.cond.Status != metav1.ConditionFalse {
		t.Errorf("no address: condition %+v", s.cond)
	}
}

// TestPrometheusLastGoodValueIsBounded: after a good answer, failures keep
// the last value for staleAfterSeconds, then the metric is unobserved.
func TestPrometheusLastGoodValueIsBounded(t *testing.T) {
	p := newPromStandIn(t)
	p.setVector("q", 12)
	c := &Controller{cfg: Config{PrometheusTimeout: 5 * time.Second}}
	ap := promPolicy(p.srv.URL, 30, promMetric(autoscale.WaitingRequests, "q"))
	e := &policyEntry{}
	t0 := time.Unix(1700000000, 0)
	if v := stepProm(c, e, ap, t0).obs["decode"].Metrics[autoscale.WaitingRequests]; v != 12 {
		t.Fatalf("first answer: %v", v)
	}
	p.set("q", 503, `{"status":"error","errorType":"unavailable","error":"shutting down"}`)
	s := stepProm(c, e, ap, t0.Add(30*time.Second))
	if v, ok := s.obs["decode"].Metrics[autoscale.WaitingRequests]; !ok || v != 12 {
		t.Errorf("within staleness: got %v %v, want the last good 12", v, ok)
	}
	if s.cond == nil || s.cond.Status != metav1.ConditionFalse {
		t.Errorf("failing query: condition %+v", s.cond)
	}
	s = stepProm(c, e, ap, t0.Add(31*time.Second))
	if _, ok := s.obs["decode"].Metrics[autoscale.WaitingRequests]; ok {
		t.Error("stale value still used")
	}
	p.setVector("q", 5)
	if v := stepProm(c, e, ap, t0.Add(40*time.Second)).obs["decode"].Metrics[autoscale.WaitingRequests]; v != 5 {
		t.Errorf("recovered: %v", v)
	}
}

// memTransport is a stand-in for the network in the fuzz target only: it
// answers every request with the fuzzer's status and body, so each input
// costs microseconds. The loopback tests above use a real server.
type memTransport struct {
	status int
	body   []byte
}

func (m memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: m.status, Status: strconv.Itoa(m.status), Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(m.body)), Request: r, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// FuzzPrometheusResponse: any response body and status decode to a finite
// value or an error, never a panic.
func FuzzPrometheusResponse(f *testing.F) {
	for _, s := range []string{
		`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"b"},"value":[1,"3"]}]}}`,
		`{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}`,
		`{"status":"success","data":{"resultType":"matrix","result":[]}}`,
		`{"status":"success","data":{"resultType":"string","result":[1,"x"]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[null]}}`,
		`{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"+Inf"]}]}}`,
		`{"status":"error","errorType":"bad_data","error":"x"}`,
		`{"status":"success","data":null}`,
		`{"status":"success"}`,
		`[]`, ``, `{`,
	} {
		f.Add(200, []byte(s))
		f.Add(400, []byte(s))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if status < 100 || status > 599 {
			status = 200
		}
		pc, err := newPromClient("http://prometheus.invalid", memTransport{status, body}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{autoscale.WaitingRequests, autoscale.KVUsage} {
			v, ok, err := pc.query(context.Background(), "q", time.Unix(1, 0), m)
			if err != nil && (ok || v != 0) {
				t.Fatalf("error with a value: %v %v %v", v, ok, err)
			}
			if err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
				t.Fatalf("non-finite value %v", v)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("in-memory answer timed out")
			}
		}
	})
}

// blockingProm is a Prometheus that answers nothing until released (or
// the client gives up): it counts the queries it received and the most it
// held at once.
type blockingProm struct {
	srv                  *httptest.Server
	release              chan struct{}
	once                 sync.Once
	mu                   sync.Mutex
	received, held, most int
}

func newBlockingProm(t *testing.T) *blockingProm {
	t.Helper()
	b := &blockingProm{release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.received++
		b.held++
		b.most = max(b.most, b.held)
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			b.held--
			b.mu.Unlock()
		}()
		select {
		case <-b.release:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}`))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		b.open()
		b.srv.Close()
	})
	return b
}

func (b *blockingProm) open() { b.once.Do(func() { close(b.release) }) }

// countingTransport counts the requests a client sends.
type countingTransport struct {
	mu sync.Mutex
	n  int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (b *blockingProm) counts() (received, held, most int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.received, b.held, b.most
}

// TestPromQueriesRunConcurrently: a step's queries run at once: while one
// Prometheus holds its queries (as many at a time as promPerAddress
// allows), another's are answered; nothing waits for its turn behind a
// slow address.
func TestPromQueriesRunConcurrently(t *testing.T) {
	slow, fast := newBlockingProm(t), newPromStandIn(t)
	fast.setVector("q", 5)
	c := &Controller{cfg: Config{PrometheusTimeout: time.Minute}}
	var jobs []*promJob
	for i := range 6 {
		jobs = append(jobs, &promJob{addr: slow.srv.URL, key: promKey{"decode", autoscale.WaitingRequests, strconv.Itoa(i)}})
	}
	for _, r := range []string{"prefill", "decode"} {
		jobs = append(jobs, &promJob{addr: fast.srv.URL, key: promKey{r, autoscale.WaitingRequests, "q"}})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.runPromJobs(context.Background(), time.Unix(1700000000, 0), jobs)
	}()
	testutil.WaitFor(t, time.Minute, "the fast Prometheus answered while the slow one holds 4 queries", func() bool {
		_, held, _ := slow.counts()
		return held == promPerAddress && fast.queries("q") == 2
	})
	slow.open()
	<-done
	if _, _, most := slow.counts(); most != promPerAddress {
		t.Errorf("at most %d queries at once to one address, want %d", most, promPerAddress)
	}
	for _, j := range jobs {
		if j.err != nil || !j.ok {
			t.Errorf("%+v: %v", j.key, j.err)
		}
	}
}

// TestPromBackoffAfterTimeout: an address whose query timed out is not
// asked at the next steps: 30 s, then 60 s after a second timeout; the
// step says so (MetricsAvailable False) and keeps the last good value
// meanwhile. An answer clears the back-off.
func TestPromBackoffAfterTimeout(t *testing.T) {
	p := newBlockingProm(t)
	c := &Controller{cfg: Config{PrometheusTimeout: 20 * time.Millisecond}}
	sent := &countingTransport{}
	pc, err := newPromClient(p.srv.URL, sent, time.Minute) // the step's deadline bounds it
	if err != nil {
		t.Fatal(err)
	}
	c.promClients = map[string]*promClient{p.srv.URL: pc}
	ap := promPolicy(p.srv.URL, 3600, promMetric(autoscale.WaitingRequests, "q"))
	t0 := time.Unix(1700000000, 0)
	e := &policyEntry{prom: map[promKey]promSample{{"decode", autoscale.WaitingRequests, "q"}: {v: 9, at: t0}}}
	step := func(s int, asked int) promStep {
		t.Helper()
		r := stepProm(c, e, ap, t0.Add(time.Duration(s)*time.Second))
		if got := sent.sent(); got != asked {
			t.Fatalf("at %d s: %d queries sent in all, want %d", s, got, asked)
		}
		return r
	}
	s := step(0, 1)
	if s.cond == nil || s.cond.Status != metav1.ConditionFalse || !strings.Contains(s.cond.Message, "timed out") {
		t.Fatalf("a timed-out query: %+v", s.cond)
	}
	s = step(15, 1)
	if s.cond == nil || s.cond.Status != metav1.ConditionFalse || !strings.Contains(s.cond.Message, "not asked") {
		t.Errorf("backed off: %+v", s.cond)
	}
	if v := s.obs["decode"].Metrics[autoscale.WaitingRequests]; v != 9 {
		t.Errorf("backed off: %v, want the last good 9", v)
	}
	step(30, 2) // asked again, timed out again: 60 s
	step(89, 2) // still backed off
	p.open()    // answers from now on
	c.cfg.PrometheusTimeout = time.Minute
	step(90, 3) // asked again, answered
	s = step(91, 4)
	if s.cond == nil || s.cond.Status != metav1.ConditionTrue || s.obs["decode"].Metrics[autoscale.WaitingRequests] != 2 {
		t.Errorf("answered: %+v %v", s.cond, s.obs)
	}
}
