package ingress

import (
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An engine that answers its probes but breaks every stream mid-way is
// ejected for longer each time, as an engine that answers 5xx is: the
// committed start of a stream is no success that resets the ejection
// backoff; only a stream that ends cleanly is. Before, each stream's start
// counted as a success, so the engine came back after the shortest
// ejection time every time, and each return cost a client a broken stream
// (which cannot be retried). The delays are the ones the ingress logs it
// set (first_probe_in), so nothing here is timed.
func TestBrokenStreamsLengthenEjection(t *testing.T) {
	fe := startFaultEngine(t, faultBreakStream)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.Health.ConsecutiveFailures = 1 // one broken stream ejects
	cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 40*time.Millisecond, 10*time.Second
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 3 {
		st, _, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3],"max_tokens":8,"stream":true}`)
		if st != 200 || !strings.Contains(string(body), "failed mid-stream") {
			t.Fatalf("stream %d: %d %s, want a stream that broke", i+1, st, body)
		}
		testutil.WaitFor(t, 30*time.Second, "the engine ejected, then restored by its probe", func() bool {
			return strings.Count(logs.String(), "engine restored") == i+1 && len(s.health.ejected()) == 0
		})
	}
	var delays []time.Duration
	for _, m := range regexp.MustCompile(`engine ejected from routing.* first_probe_in=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		delays = append(delays, d)
	}
	// The backoff doubles with ±20 % jitter: 0.8-1.2, 1.6-2.4, 3.2-4.8
	// times the ejection time; unchanged it stays within 0.8-1.2.
	if len(delays) != 3 || delays[1] <= delays[0] || delays[2] <= delays[1] || delays[2] < delays[0]*5/2 {
		t.Fatalf("ejections of an engine breaking every stream: %v, want 3, each longer (the backoff growing)\n%s", delays, logs.String())
	}
}
