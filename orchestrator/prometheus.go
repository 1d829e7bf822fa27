package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// A metric target with source prometheus is an instant query evaluated
// through the Prometheus HTTP API (/api/v1/query) by client_golang's API
// client (the maintained one; it handles POST with GET fallback, error and
// warning envelopes, and every result type). One query per role and
// metric: write it so that it yields the role's value, e.g.
// sum(vllm:num_requests_waiting{kvmesh_io_role_kind="decode"}). A result
// vector is reduced per metric: counts (waitingRequests, runningRequests,
// prefillQueueTokens) sum their samples and an empty vector is zero;
// averages and percentiles take the mean of the finite samples and an empty
// vector (or only NaN, e.g. histogram_quantile without traffic) leaves the
// metric unobserved. A failed query is counted, reported as MetricsAvailable
// False, and its last good value is used until it is staleAfterSeconds old.

// Errors of a Prometheus query.
var (
	ErrPromResult    = errors.New("prometheus: unsupported result type")
	ErrPromNoAddress = errors.New("prometheus: no address (spec.prometheus.address or --prometheus-url)")
	// errPromTimeout: the query did not answer within its deadline; its
	// address is backed off (promBackoff).
	errPromTimeout = errors.New("timed out")
	// errPromBackedOff: the query was not sent, its address timed out at a
	// recent step.
	errPromBackedOff = errors.New("prometheus: not asked")
	// errPromNotSent: the step's deadline passed before the query's turn.
	errPromNotSent = errors.New("prometheus: not asked before the step's deadline")
)

// The queries of one step run concurrently under one deadline
// (Config.PrometheusTimeout): at most promPerAddress in flight to one
// address and promInFlight in all, so a slow or black-holed Prometheus
// delays only the policies that query it, by one deadline at most. An
// address that timed out is not asked again for promBackoffBase, doubling
// with each further timeout up to promBackoffMax (the last good values
// are used meanwhile, until stale).
const (
	promPerAddress  = 4
	promInFlight    = 32
	promBackoffBase = 30 * time.Second
	promBackoffMax  = 5 * time.Minute
)

func init() { promQueries.WithLabelValues("backoff") }

// maxPromBody bounds a query response: a role's value needs a few samples.
const maxPromBody = 4 << 20

const defaultPromStale = 120 * time.Second

// promKey names one query of a policy: an edited query does not inherit
// the last good value of the one it replaced.
type promKey struct{ role, metric, query string }

type promSample struct {
	v  float64
	at time.Time
}

// promClient queries one Prometheus.
type promClient struct {
	api     promv1.API
	timeout time.Duration
}

// newPromClient builds a client for addr; rt nil means
// http.DefaultTransport.
func newPromClient(addr string, rt http.RoundTripper, timeout time.Duration) (*promClient, error) {
	if rt == nil {
		rt = http.DefaultTransport
	}
	c, err := promapi.NewClient(promapi.Config{Address: addr, RoundTripper: limitBody{rt}})
	if err != nil {
		return nil, fmt.Errorf("prometheus client %q: %w", addr, err)
	}
	return &promClient{api: promv1.NewAPI(c), timeout: timeout}, nil
}

// query evaluates q at `at` and reduces the result for the named metric;
// ok is false when the result holds no value for it. A query cut off by
// its deadline (its own timeout, or the step's) is errPromTimeout.
func (p *promClient) query(ctx context.Context, q string, at time.Time, metric string) (v float64, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	val, _, _, err := p.api.Query(ctx, q, at)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, false, fmt.Errorf("prometheus query: %w: %w", errPromTimeout, err)
		}
		return 0, false, fmt.Errorf("prometheus query: %w", err)
	}
	return reducePromValue(val, metric)
}

// reducePromValue turns an instant query's result into one value.
func reducePromValue(val model.Value, metric string) (float64, bool, error) {
	total := isTotalMetric(metric)
	switch r := val.(type) {
	case *model.Scalar:
		f := float64(r.Value)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false, nil
		}
		return f, true, nil
	case model.Vector:
		sum, n := 0.0, 0
		for _, s := range r {
			if s == nil {
				continue
			}
			f := float64(s.Value)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				continue
			}
			sum += f
			n++
		}
		switch {
		case total:
			return sum, true, nil
		case n == 0:
			return 0, false, nil
		}
		return sum / float64(n), true, nil
	case nil:
		return 0, false, fmt.Errorf("%w: none", ErrPromResult)
	}
	return 0, false, fmt.Errorf("%w: %s (want vector or scalar)", ErrPromResult, val.Type())
}

// isTotalMetric: the metrics observed as a sum over the role's replicas.
func isTotalMetric(name string) bool {
	switch name {
	case autoscale.WaitingRequests, autoscale.RunningRequests, autoscale.PrefillQueueTokens:
		return true
	}
	return false
}

// limitBody caps response bodies at maxPromBody: a longer one fails to
// decode instead of filling memory.
type limitBody struct{ rt http.RoundTripper }

func (l limitBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(r)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.LimitReader(resp.Body, maxPromBody), resp.Body}
	return resp, nil
}

// promJob is one query of a step and its outcome.
type promJob struct {
	addr string
	key  promKey
	v    float64
	ok   bool
	err  error
}

// promBackoff is an address that timed out: not asked before until.
type promBackoff struct {
	timeouts int
	until    time.Time
}

// promSource is where the policy's Prometheus metrics are asked, and how
// long a last good value lasts.
func (c *Controller) promSource(ap *v1alpha1.AutoscalingPolicy) (addr string, stale time.Duration) {
	addr, stale = c.cfg.PrometheusURL, defaultPromStale
	if ps := ap.Spec.Prometheus; ps != nil {
		if ps.Address != "" {
			addr = ps.Address
		}
		if ps.StaleAfterSeconds != nil && *ps.StaleAfterSeconds > 0 {
			stale = time.Duration(*ps.StaleAfterSeconds) * time.Second
		}
	}
	return addr, stale
}

// promJobs lists the policy's Prometheus queries, one per role and metric.
func (c *Controller) promJobs(ap *v1alpha1.AutoscalingPolicy) []*promJob {
	addr, _ := c.promSource(ap)
	var out []*promJob
	for _, r := range ap.Spec.Roles {
		for _, m := range r.Metrics {
			if m.Source == "prometheus" {
				out = append(out, &promJob{addr: addr, key: promKey{r.Name, m.Name, m.Query}})
			}
		}
	}
	return out
}

// promClientFor returns the cached client of addr (the goroutine running
// the step's queries owns the cache).
func (c *Controller) promClientFor(addr string) (*promClient, error) {
	if p, ok := c.promClients[addr]; ok {
		return p, nil
	}
	p, err := newPromClient(addr, nil, c.cfg.PrometheusTimeout)
	if err != nil {
		return nil, err
	}
	if c.promClients == nil {
		c.promClients = map[string]*promClient{}
	}
	c.promClients[addr] = p
	return p, nil
}

// runPromJobs answers every job of a step: concurrently, under one
// deadline, skipping the addresses backed off after a timeout (see
// promPerAddress). Every goroutine it starts has ended when it returns.
// It owns c.promClients and c.promBackoff while it runs.
func (c *Controller) runPromJobs(ctx context.Context, now time.Time, jobs []*promJob) {
	if len(jobs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PrometheusTimeout)
	defer cancel()
	if c.promBackoff == nil {
		c.promBackoff = map[string]*promBackoff{}
	}
	byAddr := map[string][]*promJob{}
	var addrs []string
	for _, j := range jobs {
		if j.addr == "" {
			j.err = ErrPromNoAddress
			continue
		}
		if byAddr[j.addr] == nil {
			addrs = append(addrs, j.addr)
		}
		byAddr[j.addr] = append(byAddr[j.addr], j)
	}
	slots := make(chan struct{}, promInFlight)
	var wg sync.WaitGroup
	asked := map[string]bool{}
	for _, addr := range addrs {
		js := byAddr[addr]
		if b := c.promBackoff[addr]; b != nil && now.Before(b.until) {
			for _, j := range js {
				j.err = fmt.Errorf("%w: %s timed out at the last %d steps that asked it; asked again from %s",
					errPromBackedOff, addr, b.timeouts, b.until.UTC().Format(time.RFC3339))
			}
			continue
		}
		p, err := c.promClientFor(addr)
		if err != nil {
			for _, j := range js {
				j.err = err
			}
			continue
		}
		asked[addr] = true
		var next atomic.Int64
		for range min(len(js), promPerAddress) {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(js) {
						return
					}
					j := js[i]
					select {
					case slots <- struct{}{}:
					case <-ctx.Done():
						j.err = errPromNotSent
						continue
					}
					j.v, j.ok, j.err = p.query(ctx, j.key.query, now, j.key.metric)
					<-slots
				}
			})
		}
	}
	wg.Wait()
	for addr := range asked {
		timedOut := slices.ContainsFunc(byAddr[addr], func(j *promJob) bool { return errors.Is(j.err, errPromTimeout) })
		if !timedOut {
			delete(c.promBackoff, addr)
			continue
		}
		b := c.promBackoff[addr]
		if b == nil {
			b = &promBackoff{}
			c.promBackoff[addr] = b
		}
		b.timeouts++
		d := promBackoffBase
		for i := 1; i < b.timeouts && d < promBackoffMax; i++ {
			d *= 2
		}
		b.until = now.Add(min(d, promBackoffMax))
	}
}

// applyProm puts the answered jobs of a policy into obs (a Prometheus
// value over a mesh value of the same name), keeps each query's last good
// value until it is stale, and sets MetricsAvailable (removed when the
// policy has no Prometheus metric).
func (c *Controller) applyProm(now time.Time, ap *v1alpha1.AutoscalingPolicy, e *policyEntry, jobs []*promJob, obs map[string]autoscale.Observation, pc *policyConds) {
	_, stale := c.promSource(ap)
	if e.prom == nil {
		e.prom = map[promKey]promSample{}
	}
	var failures []string
	keep := map[promKey]bool{}
	for _, j := range jobs {
		k := j.key
		keep[k] = true
		switch {
		case errors.Is(j.err, errPromBackedOff), errors.Is(j.err, errPromNotSent):
			promQueries.WithLabelValues("backoff").Inc()
			failures = append(failures, fmt.Sprintf("role %s %s: %v", k.role, k.metric, j.err))
		case j.err != nil:
			promQueries.WithLabelValues("error").Inc()
			failures = append(failures, fmt.Sprintf("role %s %s: %v", k.role, k.metric, j.err))
		case j.ok:
			promQueries.WithLabelValues("ok").Inc()
			e.prom[k] = promSample{j.v, now}
		default:
			promQueries.WithLabelValues("ok").Inc()
			delete(e.prom, k)
		}
		s, have := e.prom[k]
		o, haveObs := obs[k.role]
		switch {
		case !have || !haveObs:
		case now.Sub(s.at) > stale:
			promQueries.WithLabelValues("stale").Inc()
			delete(e.prom, k)
		default:
			o.Metrics[k.metric] = s.v // over a mesh value of the same name
		}
	}
	for k := range e.prom {
		if !keep[k] {
			delete(e.prom, k) // a query the policy no longer has
		}
	}
	switch {
	case len(jobs) == 0:
		meta.RemoveStatusCondition(&pc.st.Conditions, v1alpha1.ConditionMetricsAvailable)
	case len(failures) > 0:
		msg := strings.Join(failures, "; ")
		if len(msg) > 2048 {
			msg = msg[:2048] + "…"
		}
		pc.set(v1alpha1.ConditionMetricsAvailable, metav1.ConditionFalse, "PrometheusError", msg)
	default:
		pc.set(v1alpha1.ConditionMetricsAvailable, metav1.ConditionTrue, "PrometheusOK", fmt.Sprintf("%d Prometheus queries answered", len(jobs)))
	}
}

// observePrometheus evaluates the policy's Prometheus metrics into obs and
// sets MetricsAvailable: the queries and the reduction of one policy, as a
// step runs them (stepPolicies runs every policy's queries at once).
func (c *Controller) observePrometheus(ctx context.Context, now time.Time, ap *v1alpha1.AutoscalingPolicy, e *policyEntry, obs map[string]autoscale.Observation, pc *policyConds) {
	jobs := c.promJobs(ap)
	c.runPromJobs(ctx, now, jobs)
	c.applyProm(now, ap, e, jobs, obs, pc)
}
