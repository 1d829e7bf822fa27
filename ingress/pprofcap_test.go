package ingress

import (
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
)

// /debug/pprof/profile and /trace take at most maxPprofSeconds (a clear
// 400 above, before any profiling), and /debug/pprof/cmdline shows no
// secret given as a flag or in a URL.
func TestPprofBounded(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminToken = "admin-secret"
	s := startIngress(t, cfg, Deps{})
	admin := "http://" + s.AdminAddr()
	for _, q := range []string{"/debug/pprof/trace?seconds=3600", "/debug/pprof/profile?seconds=61", "/debug/pprof/trace?seconds=0", "/debug/pprof/profile?seconds=x", "/debug/pprof/allocs?seconds=86400", "/debug/pprof/goroutine?seconds=61"} {
		if st, body := getAuth(t, admin+q, "admin-secret"); st != http.StatusBadRequest || !strings.Contains(body, "seconds must be a whole number from 1 to 60") {
			t.Errorf("%s: %d %.200s", q, st, body)
		}
	}
	if st, body := getAuth(t, admin+"/debug/pprof/trace?seconds=1", "admin-secret"); st != http.StatusOK || len(body) == 0 {
		t.Errorf("a 1 s trace: %d, %d bytes", st, len(body))
	}

	saved := os.Args
	t.Cleanup(func() { os.Args = saved })
	os.Args = []string{"kvmesh", "ingress", "--admin-token", "tok-SECRET1", "--nats-password=pw-SECRET2", "--gossip-key", "gk-SECRET3",
		"--nats", "nats://u:url-SECRET4@h:4222,nats://h2:4222", "--tokenizer-store", "--listen", "127.0.0.1:8000", "--api-keys-file", "/keys"}
	st, body := getAuth(t, admin+"/debug/pprof/cmdline", "admin-secret")
	if st != http.StatusOK || strings.Contains(body, "SECRET") {
		t.Fatalf("cmdline: %d %q", st, body)
	}
	args := strings.Split(body, "\x00")
	if !slices.Contains(args, "--listen") || !slices.Contains(args, "127.0.0.1:8000") || !slices.Contains(args, "/keys") || !slices.Contains(args, "--nats-password=redacted") {
		t.Fatalf("cmdline redacted too much or too little: %q", args)
	}
}
