package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
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
)

// maxPromBody bounds a query response: a role's value needs a few samples.
const maxPromBody = 4 << 20

const defaultPromStale = 120 * time.Second

type promKey struct{ role, metric string }

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
// ok is false when the result holds no value for it.
func (p *promClient) query(ctx context.Context, q string, at time.Time, metric string) (v float64, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	val, _, _, err := p.api.Query(ctx, q, at)
	if err != nil {
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

// promClientFor returns the cached client of addr (the autoscaler
// goroutine owns the cache).
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

// observePrometheus evaluates the policy's prometheus metrics into obs and
// sets MetricsAvailable (removed when the policy has none).
func (c *Controller) observePrometheus(ctx context.Context, now time.Time, ap *v1alpha1.AutoscalingPolicy, e *policyEntry, obs map[string]autoscale.Observation, pc *policyConds) {
	addr, stale := c.cfg.PrometheusURL, defaultPromStale
	if ps := ap.Spec.Prometheus; ps != nil {
		if ps.Address != "" {
			addr = ps.Address
		}
		if ps.StaleAfterSeconds != nil && *ps.StaleAfterSeconds > 0 {
			stale = time.Duration(*ps.StaleAfterSeconds) * time.Second
		}
	}
	if e.prom == nil {
		e.prom = map[promKey]promSample{}
	}
	var failures []string
	n := 0
	for _, r := range ap.Spec.Roles {
		for _, m := range r.Metrics {
			if m.Source != "prometheus" {
				continue
			}
			n++
			k := promKey{r.Name, m.Name}
			v, ok, err := c.queryProm(ctx, addr, m.Query, now, m.Name)
			switch {
			case err != nil:
				promQueries.WithLabelValues("error").Inc()
				failures = append(failures, fmt.Sprintf("role %s %s: %v", r.Name, m.Name, err))
			case ok:
				promQueries.WithLabelValues("ok").Inc()
				e.prom[k] = promSample{v, now}
			default:
				promQueries.WithLabelValues("ok").Inc()
				delete(e.prom, k)
			}
			s, have := e.prom[k]
			o, haveObs := obs[r.Name]
			switch {
			case !have || !haveObs:
			case now.Sub(s.at) > stale:
				promQueries.WithLabelValues("stale").Inc()
				delete(e.prom, k)
			default:
				o.Metrics[m.Name] = s.v // over a mesh value of the same name
			}
		}
	}
	switch {
	case n == 0:
		meta.RemoveStatusCondition(&pc.st.Conditions, v1alpha1.ConditionMetricsAvailable)
	case len(failures) > 0:
		msg := strings.Join(failures, "; ")
		if len(msg) > 2048 {
			msg = msg[:2048] + "…"
		}
		pc.set(v1alpha1.ConditionMetricsAvailable, metav1.ConditionFalse, "PrometheusError", msg)
	default:
		pc.set(v1alpha1.ConditionMetricsAvailable, metav1.ConditionTrue, "PrometheusOK", fmt.Sprintf("%d Prometheus queries answered", n))
	}
}

func (c *Controller) queryProm(ctx context.Context, addr, q string, now time.Time, metric string) (float64, bool, error) {
	if addr == "" {
		return 0, false, ErrPromNoAddress
	}
	p, err := c.promClientFor(addr)
	if err != nil {
		return 0, false, err
	}
	return p.query(ctx, q, now, metric)
}
