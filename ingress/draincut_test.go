package ingress

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A stream still running when the drain timeout passes is cut by the
// ingress (Server.Close closes the upstream connections). Its error event
// says the ingress is shutting down, with the code a draining ingress
// answers new requests with (service_unavailable), not that the engine
// failed (upstream_error, "engine slow failed mid-stream: read tcp ...: use
// of closed network connection"), which pointed alerting at a healthy engine.
func TestDrainCutStreamSaysIngressShutsDown(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream) // streams until the client goes away
	cfg := testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()})
	cfg.DrainTimeout = 200 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	var last string
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {\"error\"") {
			last = strings.TrimSpace(strings.TrimPrefix(line, "data: "))
		}
		if err != nil {
			break
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a deadlock guard, not a timing assertion
		t.Fatal("Close did not return")
	}
	var ev struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(last), &ev); err != nil {
		t.Fatalf("no error event at the end of the cut stream (%v): %q", err, last)
	}
	if ev.Error.Code != "service_unavailable" || !strings.Contains(ev.Error.Message, "the ingress is shutting down") ||
		strings.Contains(ev.Error.Message, "failed mid-stream") {
		t.Fatalf("a stream the drain cut ends with %+v", ev.Error)
	}
	// Nor is it counted against the engine.
	if n, a := val(s.m.streamErrors), val(s.m.attempts.WithLabelValues("stream_error")); n != 0 || a != 0 {
		t.Fatalf("the drain cut counted as the engine's: %v stream errors, %v stream_error attempts", n, a)
	}
}
