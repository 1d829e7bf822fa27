package ingress

import (
	"net/http"
	"testing"
	"time"
)

// A dial that times out is not by itself proof that the engine is dead: the
// ingress's own overload (thousands of dials at once) times dials out too.
// While the stall watch is on, it asks the engine (probes) before ejecting,
// so a connect timeout is retried elsewhere and counted as connect_timeout
// but ejects nothing; with the watch off nothing tells slow from dead and it
// ejects as before. A nanosecond ConnectTimeout makes every dial time out
// at once, deterministically.
func TestConnectTimeoutEjectsOnlyWithoutStallWatch(t *testing.T) {
	for _, c := range []struct {
		name       string
		stallAfter time.Duration
		ejected    bool
	}{
		{"stall watch on", time.Hour, false}, // on, and never due within the test
		{"stall watch off", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fe := startFaultEngine(t, faultOK)
			cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
			cfg.ConnectTimeout = time.Nanosecond
			cfg.Health.StallAfter = c.stallAfter
			s := startIngress(t, cfg, Deps{})
			for range 3 {
				st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
				if st == 200 {
					t.Fatalf("served with a 1 ns connect timeout: %s", body)
				}
				if !c.ejected && st != 504 {
					t.Fatalf("status %d %s, want 504", st, body)
				}
			}
			if got := !s.health.allowed("e1"); got != c.ejected {
				t.Errorf("ejected %v after 3 connect timeouts, want %v", got, c.ejected)
			}
			if n := val(s.m.attempts.WithLabelValues("connect_timeout")); n < 1 {
				t.Errorf("attempts{result=connect_timeout} = %v", n)
			}
		})
	}
}
