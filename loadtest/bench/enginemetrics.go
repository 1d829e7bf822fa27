package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// engineTotals are the engines' own latency histograms (vLLM metric
// names, engine seconds) summed over engines and ranks. Live mode scrapes
// them before and after each policy's run: the difference is what the
// engines measured for that run, free of the mesh's wall-clock overheads
// that the time scale multiplies in the client's measurements.
type engineTotals struct {
	requests, ttftSum, queueSum, preemptions float64
}

const (
	metricTTFT    = "vllm:time_to_first_token_seconds"
	metricQueue   = "vllm:request_queue_time_seconds"
	metricPreempt = "vllm:num_preemptions_total"
	// maxMetricsBytes bounds one /metrics body.
	maxMetricsBytes = 8 << 20
)

// scrapeEngines sums the totals of every engine at urls.
func scrapeEngines(ctx context.Context, client *http.Client, urls []string) (engineTotals, error) {
	var t engineTotals
	for _, u := range urls {
		e, err := scrapeEngine(ctx, client, u+"/metrics")
		if err != nil {
			return t, err
		}
		t.requests, t.ttftSum, t.queueSum = t.requests+e.requests, t.ttftSum+e.ttftSum, t.queueSum+e.queueSum
		t.preemptions += e.preemptions
	}
	return t, nil
}

func scrapeEngine(ctx context.Context, client *http.Client, url string) (engineTotals, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return engineTotals{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return engineTotals{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engineTotals{}, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return parseEngineTotals(io.LimitReader(resp.Body, maxMetricsBytes))
}

// parseEngineTotals reads the TTFT and queue-time histograms and the
// preemption counter from a
// Prometheus text exposition (every label set summed).
func parseEngineTotals(r io.Reader) (engineTotals, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return engineTotals{}, fmt.Errorf("parse engine metrics: %w", err)
	}
	var t engineTotals
	for _, m := range fams[metricTTFT].GetMetric() {
		t.requests += float64(m.GetHistogram().GetSampleCount())
		t.ttftSum += m.GetHistogram().GetSampleSum()
	}
	for _, m := range fams[metricQueue].GetMetric() {
		t.queueSum += m.GetHistogram().GetSampleSum()
	}
	for _, m := range fams[metricPreempt].GetMetric() {
		t.preemptions += m.GetCounter().GetValue()
	}
	return t, nil
}

// means returns the mean TTFT and queue time of the requests between
// before and t (0, 0 when none).
func (t engineTotals) means(before engineTotals) (ttft, queue float64) {
	n := t.requests - before.requests
	if n <= 0 {
		return 0, 0
	}
	return (t.ttftSum - before.ttftSum) / n, (t.queueSum - before.queueSum) / n
}
