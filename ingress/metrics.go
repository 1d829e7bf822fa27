package ingress

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the ingress's Prometheus series, all in one place.
type metrics struct {
	requests     *prometheus.CounterVec   // endpoint, status
	ttft         *prometheus.HistogramVec // endpoint
	duration     *prometheus.HistogramVec // endpoint
	stage        *prometheus.HistogramVec // stage: parse, tokenize, schedule
	tokens       *prometheus.CounterVec   // direction: in, out
	attempts     *prometheus.CounterVec   // result
	decisions    *prometheus.CounterVec   // policy, reason
	matchRatio   prometheus.Histogram
	inflight     prometheus.Gauge
	streamErrors prometheus.Counter
	// renderFallbacks counts chat requests the ingress's template
	// interpreter failed to render: forwarded unkeyed, for the engine to
	// render.
	renderFallbacks prometheus.Counter
	// tokenizeStopped counts prompts whose tokenizing stopped early
	// (tokenize_stage.go): too_long (over MaxPromptTokens, refused),
	// budget (over TokenizeBudget, routed untokenized), client_gone.
	tokenizeStopped                                                    *prometheus.CounterVec // reason
	tokenizeStoppedTooLong, tokenizeStoppedBudget, tokenizeStoppedGone prometheus.Counter
	// acceptErrors counts accept errors the listeners waited out (accept.go).
	acceptErrors *prometheus.CounterVec // listener, errno
	// upstreamTLS counts TLS failures with engines by cause (upstreamtls.go).
	upstreamTLS *prometheus.CounterVec // cause
	// loops counts requests refused as routing loops (loop.go).
	loops prometheus.Counter
	// bodyBytes is the request body bytes held now, bodyRefused the
	// requests refused for MaxBodyBytesInFlight (bodybudget.go).
	bodyBytes   prometheus.Gauge
	bodyRefused prometheus.Counter

	statusLabels map[int]string // avoids strconv per request

	// Children resolved once: the request path does no label hashing for these.
	stageParse, stageTokenize, stageSchedule prometheus.Observer
	tokensIn, tokensOut                      prometheus.Counter
	attemptOK                                prometheus.Counter
	ttftBy, durationBy                       [epOther + 1]prometheus.Observer // by endpoint
}

// latencyBuckets are TTFT's and request duration's: a long generation
// streams for minutes (each gap bounded by the 5 min idle timeout), after
// up to 30 s of admission wait, so the buckets go to 30 min and a
// percentile over a minute is still known.
// Between 1 s and 5 s, where TTFT objectives and short answers sit, the
// steps are half a second or a second: a p99 there reads within a step.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 1.5, 2, 2.5, 3, 4, 5, 10, 30, 60, 120, 300, 600, 1800}

func newMetrics(reg prometheus.Registerer, id string, indexKeys, propLag func() float64, engines func() float64) *metrics {
	constLabels := prometheus.Labels{"ingress": id}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_requests_total",
			Help: "Requests answered, by endpoint and HTTP status.", ConstLabels: constLabels}, []string{"endpoint", "status"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_ingress_ttft_seconds",
			Help: "Time from request arrival to the first event of a streamed answer (non-streamed answers are left out: their first token is not seen).", ConstLabels: constLabels, Buckets: latencyBuckets}, []string{"endpoint"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_ingress_request_duration_seconds",
			Help: "Time from request arrival to the end of the response.", ConstLabels: constLabels, Buckets: latencyBuckets}, []string{"endpoint"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_ingress_stage_seconds",
			Help: "Time spent in each ingress stage before proxying.", ConstLabels: constLabels,
			// To 1 s: the tokenize stage includes the engine /tokenize
			// fallback (--engine-tokenize-timeout, 250 ms by default).
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05, .1, .25, .5, 1}}, []string{"stage"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tokens_total",
			Help: "Tokens of requests an engine took (a 200 head, a stream cut later included): their prompt tokens (in; an embeddings-family answer only by its reported usage) and the output tokens the client was sent (out, as the access log's output_tokens).", ConstLabels: constLabels}, []string{"direction"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_upstream_attempts_total",
			Help: "Upstream attempts by result, one per attempt (ok, connect_error, connect_timeout, local_error, client_cert_refused, credential_refused, protocol_error, timeout, first_byte_timeout, status_429, status_5xx, status_4xx, wrong_model, routing_loop, empty_response, client_gone, pd_prefill_failed; a stream counts when it ends: stream_error when it broke, else ok).", ConstLabels: constLabels}, []string{"result"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_routing_decisions_total",
			Help: "Routing decisions by policy and reason.", ConstLabels: constLabels}, []string{"policy", "reason"}),
		matchRatio: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvmesh_ingress_prefix_match_ratio",
			Help: "Matched prefix blocks (any tier) on the chosen engine / full blocks of the prompt; a prompt with no full block (or not keyed) is not observed.", ConstLabels: constLabels,
			Buckets: []float64{0, .1, .2, .3, .4, .5, .6, .7, .8, .9, .95, 1}}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_ingress_inflight_requests",
			Help: "Requests this replica is serving now.", ConstLabels: constLabels}),
		streamErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_stream_errors_total",
			Help: "Streams ended with an error event after bytes reached the client.", ConstLabels: constLabels}),
		renderFallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_chat_render_fallbacks_total",
			Help: "Chat requests whose template failed to render here (not a raise_exception): routed by load, unkeyed, for the engine to render.", ConstLabels: constLabels}),
		tokenizeStopped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tokenize_stopped_total",
			Help: "Prompts whose tokenizing stopped early, by reason: too_long (past --max-prompt-tokens, refused without tokenizing the rest), budget (past --tokenize-budget, routed as untokenized), client_gone.", ConstLabels: constLabels}, []string{"reason"}),
		acceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_accept_errors_total",
			Help: "Accept errors a listener (client, admin) waited out and retried, by errno (EMFILE: out of file descriptors).", ConstLabels: constLabels}, []string{"listener", "errno"}),
		upstreamTLS: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_upstream_tls_errors_total",
			Help: "TLS failures with engines by cause: engine_certificate (the engine's did not verify), client_certificate_refused (the engine refused this ingress's), handshake (any other).", ConstLabels: constLabels}, []string{"cause"}),
		loops: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_routing_loops_total",
			Help: "Requests refused with 508 Loop Detected: they carried X-Kvmesh-Hop, sent by a kvmesh ingress whose engine URL points at this one (or by a client).", ConstLabels: constLabels}),
		bodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_ingress_body_bytes_in_flight",
			Help: "Request body bytes the requests in service hold (a compressed body's decoded bytes too), bounded by --max-body-in-flight.", ConstLabels: constLabels}),
		bodyRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_body_budget_refusals_total",
			Help: "Requests refused with 503 (ingress_body_budget_exhausted): their body would take the bytes in flight past --max-body-in-flight.", ConstLabels: constLabels}),
		statusLabels: map[int]string{},
	}
	for _, c := range tlsCauses {
		m.upstreamTLS.WithLabelValues(c)
	}
	for _, c := range []int{200, 400, 401, 404, 413, 429, 499, 500, 502, 503, 504, 508} {
		m.statusLabels[c] = strconv.Itoa(c)
	}
	m.stageParse = m.stage.WithLabelValues("parse")
	m.stageTokenize = m.stage.WithLabelValues("tokenize")
	m.stageSchedule = m.stage.WithLabelValues("schedule")
	m.tokensIn = m.tokens.WithLabelValues("in")
	m.tokensOut = m.tokens.WithLabelValues("out")
	m.attemptOK = m.attempts.WithLabelValues("ok")
	m.tokenizeStoppedTooLong = m.tokenizeStopped.WithLabelValues("too_long")
	m.tokenizeStoppedBudget = m.tokenizeStopped.WithLabelValues("budget")
	m.tokenizeStoppedGone = m.tokenizeStopped.WithLabelValues("client_gone")
	// At 0 from the start, for an alert on its rate: an engine that is not
	// the one gossip says it is (wrongmodel.go).
	m.attempts.WithLabelValues("wrong_model")
	m.attempts.WithLabelValues(loopResult) // an engine URL that is a kvmesh ingress (loop.go)
	for _, ep := range []endpoint{epCompletions, epChat, epResponses, epMessages, epOther} {
		m.ttftBy[ep] = m.ttft.WithLabelValues(ep.String())
		m.durationBy[ep] = m.duration.WithLabelValues(ep.String())
	}
	reg.MustRegister(m.requests, m.ttft, m.duration, m.stage, m.tokens, m.attempts, m.decisions, m.matchRatio, m.inflight, m.streamErrors, m.renderFallbacks, m.tokenizeStopped, m.acceptErrors, m.upstreamTLS, m.loops, m.bodyBytes, m.bodyRefused)
	if indexKeys != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_index_keys",
			Help: "(key, engine) entries in the local index, all tiers: the sum of the engines' key sets (kvmesh_index_keys counts distinct keys).", ConstLabels: constLabels}, indexKeys))
	}
	if propLag != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_index_propagation_lag_seconds",
			Help: "The largest propagation lag (engine event to local index) of the engines' last applied deltas, over the engines with a delta applied in the last minute (0: none).", ConstLabels: constLabels}, propLag))
	}
	if engines != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_engines",
			Help: "Live engines known to this replica.", ConstLabels: constLabels}, engines))
	}
	return m
}

func (m *metrics) status(code int) string {
	if s, ok := m.statusLabels[code]; ok {
		return s
	}
	return strconv.Itoa(code)
}
