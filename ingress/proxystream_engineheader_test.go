package ingress

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestMidStreamErrorHidesEngineWithHeaderOff: the error event of a stream
// that broke names its engine only with Config.EngineHeader on (an engine
// id defaults to its address); the access log names it either way. The
// event named it whatever the header's setting.
func TestMidStreamErrorHidesEngineWithHeaderOff(t *testing.T) {
	fe := startFaultEngine(t, faultBreakStream)
	for _, on := range []bool{true, false} {
		var log testutil.SyncBuffer
		cfg := testConfig(StaticEngine{ID: "10.9.8.7:8000", Model: "m", URL: fe.url()})
		cfg.EngineHeader = on
		s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&log, nil))})
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":8,"stream":true}`)
		if st != 200 || !strings.Contains(string(body), "failed mid-stream") || strings.Contains(string(body), "10.9.8.7") == !on {
			t.Fatalf("header on %v: %d %s; want a stream that broke, naming its engine only with the header on", on, st, body)
		}
		testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(log.String(), `"engine":"10.9.8.7:8000"`) })
	}
}

// An attempt's failure (here a refused connection) names its engine to the
// client only with the header on; the access log names it either way.
func TestUpstreamErrorHidesEngineWithHeaderOff(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := testConfig(StaticEngine{ID: "10.9.8.7:8000", Model: "m", URL: "http://127.0.0.1:1"})
		cfg.EngineHeader = on
		s := startIngress(t, cfg, Deps{})
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":8}`)
		if st < 500 || strings.Contains(string(body), "10.9.8.7") == !on {
			t.Fatalf("header on %v: %d %s; want a failure naming its engine only with the header on", on, st, body)
		}
	}
}
