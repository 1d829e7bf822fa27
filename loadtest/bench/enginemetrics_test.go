package bench

import (
	"strings"
	"testing"
)

const sampleMetrics = `# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="0.1"} 2
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"} 3
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.9
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3
vllm:time_to_first_token_seconds_bucket{engine="1",model_name="m",le="+Inf"} 1
vllm:time_to_first_token_seconds_sum{engine="1",model_name="m"} 0.3
vllm:time_to_first_token_seconds_count{engine="1",model_name="m"} 1
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",model_name="m",le="+Inf"} 4
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.2
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2
vllm:num_preemptions_total{engine="1",model_name="m"} 3
`

func TestParseEngineTotals(t *testing.T) {
	got, err := parseEngineTotals(strings.NewReader(sampleMetrics))
	if err != nil {
		t.Fatal(err)
	}
	if got != (engineTotals{requests: 4, ttftSum: 1.2, queueSum: 0.2, preemptions: 5}) {
		t.Fatalf("%+v", got)
	}
	ttft, queue := got.means(engineTotals{requests: 2, ttftSum: 0.2})
	if ttft != 0.5 || queue != 0.1 {
		t.Fatalf("means %v %v", ttft, queue)
	}
	if ttft, queue := got.means(got); ttft != 0 || queue != 0 {
		t.Fatal("no requests between: want zeros")
	}
	if _, err := parseEngineTotals(strings.NewReader("vllm:x{ 1\n")); err == nil {
		t.Fatal("malformed exposition accepted")
	}
}

// FuzzParseEngineTotals: any input gives totals or an error, never a panic.
func FuzzParseEngineTotals(f *testing.F) {
	f.Add(sampleMetrics)
	f.Add("")
	f.Add("# TYPE vllm:time_to_first_token_seconds counter\nvllm:time_to_first_token_seconds 3\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseEngineTotals(strings.NewReader(s))
	})
}
