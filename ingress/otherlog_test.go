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

// Failed API keys on /v1/models and the client port's /metrics, and paths
// the ingress does not serve, are counted (fixed endpoint labels, never the
// path) and access-logged, like the same guesses on /v1/completions; their
// lines are bounded per second, and a line after dropped ones says how many.
func TestOtherRequestsCountedAndLogged(t *testing.T) {
	var alog testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}),
		Deps{Registry: reg, Auth: edgeKeys(t), AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	base := "http://" + s.Addr()
	get := func(path, key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		req.Header.Set("X-Request-Id", "probe-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if get("/v1/models", "nope") != 401 || get("/metrics", "nope") != 401 || get("/wp-login.php", "") != 404 || get("/v1/models", edgeKey) != 200 {
		t.Fatal("unexpected statuses")
	}
	for _, c := range []struct {
		ep, status string
	}{{"models", "401"}, {"metrics", "401"}, {"unknown", "404"}, {"models", "200"}} {
		if got := val(s.m.requests.WithLabelValues(c.ep, c.status)); got != 1 {
			t.Fatalf("requests_total{endpoint=%s,status=%s} = %v", c.ep, c.status, got)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "4 access lines", func() bool { return len(accessLines(t, &alog)) == 4 })
	l := accessLines(t, &alog)[0]
	if l["endpoint"] != "models" || l["status"] != float64(401) || l["path"] != "/v1/models" || l["request_id"] != "probe-1" || l["error"] == "" {
		t.Fatalf("access line %v", l)
	}
	if strings.Contains(alog.String(), "nope") {
		t.Fatalf("the rejected key is in the log:\n%s", alog.String())
	}

	// A burst: at most otherLogPerSecond lines in a second; the first line
	// of a later second counts what was dropped.
	var lim lineLimiter
	now := time.Unix(1000, 0)
	written := 0
	for i := 0; i < 3*otherLogPerSecond; i++ {
		if ok, _ := lim.allow(now, otherLogPerSecond); ok {
			written++
		}
	}
	if ok, dropped := lim.allow(now.Add(time.Second), otherLogPerSecond); written != otherLogPerSecond || !ok || dropped != 2*otherLogPerSecond {
		t.Fatalf("%d written in a second; next second %v with %d dropped", written, ok, dropped)
	}
}
