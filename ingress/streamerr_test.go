package ingress

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An error event inside a 200 stream (vLLM's and SGLang's way to fail a
// request they already answered) is no output token: the access line and
// the request metrics carry the event's code and an error, not a 200 with
// one token.
func TestStreamErrorEventNotAToken(t *testing.T) {
	fe := startFaultEngine(t, faultStreamError400)
	var alog testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}),
		Deps{Registry: reg, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	if evs := sseEvents(b); st != 200 || len(evs) != 2 || !strings.HasPrefix(evs[0], `{"error"`) {
		t.Fatalf("%d %s", st, b)
	}
	testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return len(accessLines(t, &alog)) == 1 })
	l := accessLines(t, &alog)[0]
	if l["status"] != float64(400) || l["output_tokens"] != float64(0) || !strings.Contains(l["error"].(string), "error event") {
		t.Fatalf("access line %v", l)
	}
	if got := val(s.m.requests.WithLabelValues("completions", "400")); got != 1 {
		t.Fatalf("requests_total{status=400} = %v", got)
	}
}
