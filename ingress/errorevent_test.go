package ingress

import "testing"

// TestErrorEventStatus: the status an engine's error event gives its
// request. A Responses stream's error event carries a string code and no
// status: the simulator's (and vLLM's) shutdown says "service_unavailable",
// which was counted 500 where the same outage on chat is 502 (tester h-cli2).
func TestErrorEventStatus(t *testing.T) {
	for _, tc := range []struct {
		ev   string
		want int
	}{
		{`{"error":{"message":"bad","code":400}}`, 400},
		{`{"type":"error","code":"service_unavailable","message":"sim: closed","sequence_number":9}`, 503},
		{`{"type":"error","error":{"type":"overloaded_error","message":"x"}}`, 503},
		{`{"type":"error","code":"invalid_prompt","message":"x"}`, 400},
		{`{"error":{"message":"x"}}`, 500},
	} {
		if got := errorEventStatus([]byte(tc.ev)); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.ev, got, tc.want)
		}
	}
}
