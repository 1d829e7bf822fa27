package local

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vllmMetrics is a trimmed /metrics of a vLLM engine (two ranks).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 766.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 5.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.9
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.01",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.2
`

// FuzzParseEngineSample: an engine's /metrics text is a sample or a clear
// error, never a panic; the prompt tokens are the sum over ranks of the
// counter, and each histogram has one count per bound.
func FuzzParseEngineSample(f *testing.F) {
	f.Add([]byte(vllmMetrics))
	f.Add([]byte("vllm:prompt_tokens_total 5\n"))
	f.Add([]byte("# TYPE vllm:inter_token_latency_seconds histogram\nvllm:inter_token_latency_seconds_bucket{le=\"1\"} 1\nvllm:inter_token_latency_seconds_bucket{le=\"+Inf\"} 2\nvllm:inter_token_latency_seconds_count 2\nvllm:inter_token_latency_seconds_sum 1\n"))
	f.Add([]byte("vllm:prompt_tokens_total{a=\"1\"} NaN\nvllm:prompt_tokens_total{a=\"2\"} +Inf\n"))
	f.Add([]byte("not metrics at all {{{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseEngineSample(bytes.NewReader(b))
		if err != nil {
			if !strings.Contains(err.Error(), "parse metrics") {
				t.Fatalf("unclear error: %v", err)
			}
			return
		}
		tp := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := tp.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("parsed, but not by expfmt: %v", err)
		}
		want := 0.0
		if f, ok := fams["vllm:prompt_tokens_total"]; ok {
			for _, m := range f.GetMetric() {
				want += m.GetCounter().GetValue()
			}
		}
		if s.promptTokens != want && !(math.IsNaN(want) && math.IsNaN(s.promptTokens)) {
			t.Fatalf("prompt tokens %v, want %v", s.promptTokens, want)
		}
		for _, h := range []histogram{s.ttft, s.itl} {
			if len(h.bounds) != len(h.counts) {
				t.Fatalf("histogram with %d bounds and %d counts", len(h.bounds), len(h.counts))
			}
		}
	})
}

// metricsClient answers every request with body (no network).
type metricsClient struct {
	status int
	body   []byte
}

func (m metricsClient) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: m.status, Body: io.NopCloser(bytes.NewReader(m.body)), Header: http.Header{}, Request: r}, nil
}

// FuzzEngineBusy: the local backend's busy check reads /metrics as a
// Prometheus parser does: on valid exposition text, running + waiting is
// the sum of those two gauges' samples (other series, timestamps and
// labels do not count), and text without them is an error.
func FuzzEngineBusy(f *testing.F) {
	f.Add([]byte(vllmMetrics))
	f.Add([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"))
	f.Add([]byte("vllm:num_requests_running{model_name=\"a b\"} 1 1700000000000\n"))
	f.Add([]byte("vllm:num_requests_running_by_reason{r=\"x\"} 3\nvllm:num_requests_waiting 0\n"))
	f.Add([]byte("vllm:num_requests_waiting NaN\n"))
	f.Add([]byte("vllm:num_requests_running\n"))
	f.Add([]byte("vllm:num_requests_running{a=\"} 9\"} 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		client := &http.Client{Transport: metricsClient{status: 200, body: b}}
		got, err := engineBusy(context.Background(), client, "http://10.0.0.1:8000/")
		tp := expfmt.NewTextParser(model.LegacyValidation)
		fams, perr := tp.TextToMetricFamilies(bytes.NewReader(b))
		if perr != nil {
			return // not exposition text: any answer but a panic
		}
		want, seen := 0.0, 0
		for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
			for _, m := range fams[name].GetMetric() {
				v := m.GetGauge().GetValue()
				if m.GetGauge() == nil {
					v = m.GetUntyped().GetValue()
				}
				want += v
				seen++
			}
		}
		if seen == 0 {
			if err == nil {
				t.Fatalf("busy %v from text without the gauges", got)
			}
			return
		}
		if err != nil {
			t.Fatalf("error %v; want %v", err, want)
		}
		if got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("busy %v, want %v", got, want)
		}
	})
}
