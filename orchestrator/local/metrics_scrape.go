package local

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// engineBusy is running + waiting requests from an engine's /metrics
// (vLLM's gauges, which the sim serves too).
func engineBusy(ctx context.Context, client *http.Client, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("metrics: %s", resp.Status)
	}
	sum, seen := 0.0, 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := busySample(sc.Text()); ok {
			sum += v
			seen++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if seen == 0 {
		return 0, fmt.Errorf("metrics: no request gauges")
	}
	return sum, nil
}

// busySample reads a sample line of vllm:num_requests_running or
// vllm:num_requests_waiting: the value after the name and labels (not a
// timestamp after it, nor a series whose name only starts with theirs).
func busySample(line string) (float64, bool) {
	rest, ok := strings.CutPrefix(line, "vllm:num_requests_running")
	if !ok {
		if rest, ok = strings.CutPrefix(line, "vllm:num_requests_waiting"); !ok {
			return 0, false
		}
	}
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' && rest[0] != '{' {
		return 0, false // another metric, such as vllm:num_requests_waiting_by_reason
	}
	rest = strings.TrimLeft(rest, " \t")
	if strings.HasPrefix(rest, "{") {
		end := labelsEnd(rest)
		if end < 0 {
			return 0, false
		}
		rest = rest[end:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

// labelsEnd is the index after the '}' closing the label set s starts
// with (a quoted value may hold '}' and escaped quotes); -1 if none.
func labelsEnd(s string) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i + 1
		}
	}
	return -1
}
