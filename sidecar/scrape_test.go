package sidecar

import (
	"strings"
	"testing"
)

func TestParseLoad(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       Load
	}{
		{"vllm two dp ranks", `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
`, Load{Running: 4, Waiting: 4, KVUsage: 0.375}},
		{"older vllm", "vllm:gpu_cache_usage_perc 0.9\nvllm:num_requests_running 2\n", Load{Running: 2, KVUsage: 0.9}},
		{"sglang", "sglang:num_running_reqs{tp_rank=\"0\"} 7\nsglang:num_queue_reqs 3\nsglang:token_usage 0.1\n", Load{Running: 7, Waiting: 3, KVUsage: 0.1}},
		{"queued prefill", "kvmesh_sim_queued_prefill_tokens 1234\n", Load{QueuedPrefill: 1234}},
		{"clamped usage", "vllm:kv_cache_usage_perc 7\n", Load{KVUsage: 1}},
		// The counters whose growth shows the engine working (silent.go), summed.
		{"vllm work counters", `# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100
vllm:prompt_tokens_total{engine="1",model_name="m"} 20
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 5
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 300
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7
`, Load{work: 432, workOK: true}},
		{"sglang work counters", "sglang:prompt_tokens_total 10\nsglang:generation_tokens_total 2\nsglang:num_requests_total 1\n", Load{work: 13, workOK: true}},
		{"broken work counter", "vllm:prompt_tokens_total NaN\n", Load{}},
	} {
		got, err := parseLoad(strings.NewReader(tc.text))
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	if _, err := parseLoad(strings.NewReader("vllm:num_requests_running{ 3\n")); err == nil {
		t.Error("broken exposition accepted")
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add("vllm:num_requests_running{engine=\"0\"} 3\nvllm:kv_cache_usage_perc 0.5\n")
	f.Add("# TYPE sglang:token_usage gauge\nsglang:token_usage NaN\n")
	f.Add("# TYPE vllm:cache_config_info gauge\n" + cacheInfo("0", "4096") + cacheInfo("1", "None"))
	f.Add("sglang:max_total_num_tokens{tp_rank=\"0\"} 471258\n")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLoad(strings.NewReader(s))
		if err == nil && !(l.KVUsage >= 0 && l.KVUsage <= 1) || l.Running < 0 || l.Waiting < 0 || l.QueuedPrefill < 0 ||
			l.GPUBlocks < 0 || l.GPUBlocks > MaxGPUBlocks || l.KVTokens < 0 || l.capacity(16) < 0 || l.capacity(1) > MaxGPUBlocks {
			t.Fatalf("load out of range: %+v", l)
		}
	})
}
