package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

const edgeKey = "sk-edge-test-0123456789"

// edgeKeys is an auth.Store holding edgeKey (as "tester").
func edgeKeys(t *testing.T) *auth.Store {
	t.Helper()
	return keyFileStore(t, "tester "+edgeKey+"\n")
}

// keyFileStore is the key store of a --api-keys-file holding lines
// ("name key" each).
func keyFileStore(t *testing.T, lines string) *auth.Store {
	t.Helper()
	kf := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(kf, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(auth.Config{KeysFile: kf, EnvVar: "-"})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// edgeSend makes one request with hdr (name, value pairs; a name may repeat)
// and returns the status, the headers and the body.
func edgeSend(t *testing.T, method, url, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// rawChunked sends a POST with a chunked body of n bytes over a raw
// connection (the server may stop reading it) and returns the answer.
func rawChunked(t *testing.T, addr, path string, n int, hdr string) (int, http.Header, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sTransfer-Encoding: chunked\r\n\r\n", path, hdr)
		body := `{"model":"m","prompt":"` + strings.Repeat("a", max(n-len(`{"model":"m","prompt":""}`), 0)) + `"}`
		for len(body) > 0 {
			c := body[:min(len(body), 256)]
			body = body[len(c):]
			if _, err := fmt.Fprintf(conn, "%x\r\n%s\r\n", len(c), c); err != nil {
				return
			}
		}
		fmt.Fprint(conn, "0\r\n\r\n")
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// denyAll is a rate limiter that refuses every request.
type denyAll struct{}

func (denyAll) Admit(string, string, int) (time.Duration, bool) { return 3 * time.Second, false }
func (denyAll) Observe(string, string, int)                     {}

// Every answer to an allowed origin carries the CORS headers, errors
// included (writeError resets the response): a browser application can read
// a 401, a 400, a 413 (chunked too), a 429 and its Retry-After, a 503 and a
// stream's error before it started. Other origins still get none.
func TestCORSOnErrorAnswers(t *testing.T) {
	const app = "https://app.example"
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.CORSOrigins = []string{app}
	cfg.MaxBodyBytes = 1000
	s := startIngress(t, cfg, Deps{Auth: edgeKeys(t)})
	url := "http://" + s.Addr()
	bearer := "Bearer " + edgeKey

	dead := testConfig(StaticEngine{ID: "gone", Model: "m", URL: "http://127.0.0.1:1"})
	dead.CORSOrigins = []string{app}
	dead.MaxAttempts = 1
	deadS := startIngress(t, dead, Deps{})
	limited := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	limited.CORSOrigins = []string{app}
	limS := startIngress(t, limited, Deps{Limiter: denyAll{}})

	ok := `{"model":"m","prompt":[1,2,3],"max_tokens":1}`
	for _, c := range []struct {
		name, url, body string
		status          int
		hdr             []string
	}{
		{"401 no key", url + "/v1/completions", ok, 401, nil},
		{"401 wrong key", url + "/v1/completions", ok, 401, []string{"Authorization", "Bearer nope-nope-nope"}},
		{"401 models", url + "/v1/models", "", 401, nil},
		{"400 bad json", url + "/v1/completions", `{"model":`, 400, []string{"Authorization", bearer}},
		{"400 two credentials", url + "/v1/completions", ok, 400, []string{"Authorization", bearer, "Authorization", bearer}},
		{"404", url + "/nope", "", 404, []string{"Authorization", bearer}},
		{"413", url + "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("a", 2000) + `"}`, 413, []string{"Authorization", bearer}},
		{"429", "http://" + limS.Addr() + "/v1/completions", ok, 429, nil},
		{"503", "http://" + deadS.Addr() + "/v1/completions", ok, 503, nil},
		{"503 stream", "http://" + deadS.Addr() + "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":1,"stream":true}`, 503, nil},
		{"200", url + "/v1/completions", ok, 200, []string{"Authorization", bearer}},
	} {
		method := "POST"
		if c.body == "" {
			method = "GET"
		}
		st, h, body := edgeSend(t, method, c.url, c.body, append([]string{"Origin", app}, c.hdr...)...)
		if st != c.status || h.Get("Access-Control-Allow-Origin") != app || h.Get("Vary") != "Origin" ||
			!strings.Contains(h.Get("Access-Control-Expose-Headers"), "Retry-After") {
			t.Errorf("%s: %d %v %.200s, want %d with CORS headers", c.name, st, h, body, c.status)
		}
		if c.status == 429 && h.Get("Retry-After") != "3" {
			t.Errorf("429: Retry-After %q", h.Get("Retry-After"))
		}
		if st, h, _ := edgeSend(t, method, c.url, c.body, append([]string{"Origin", "https://evil.example"}, c.hdr...)...); st != c.status || h.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s from another origin: %d %v", c.name, st, h)
		}
	}
	// Chunked bodies too long: fasthttp wipes the request's head; the
	// ingress remembered its Origin.
	for _, c := range []struct {
		name, hdr string
		status    int
	}{{"413 chunked", "Authorization: " + bearer + "\r\n", 413}, {"401 chunked", "", 401}} {
		st, h, body := rawChunked(t, s.Addr(), "/v1/completions", 5000, "Origin: "+app+"\r\n"+c.hdr)
		if st != c.status || h.Get("Access-Control-Allow-Origin") != app {
			t.Errorf("%s: %d %v %.200s", c.name, st, h, body)
		}
	}
}

// An oversized chunked body from a client with a valid key gets 413, as a
// Content-Length one does, not a 401 for a credential fasthttp wiped with
// the head (it resets the request when reading a chunked body fails); on
// the Messages API the error keeps Anthropic's shape. Without a key, or
// with a wrong one, the answer is still 401.
func TestChunkedTooLargeWithValidKey(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.MaxBodyBytes = 1000
	s := startIngress(t, cfg, Deps{Auth: edgeKeys(t)})
	for _, c := range []struct {
		name, path, hdr string
		n, status       int
		has             string
	}{
		{"valid key", "/v1/completions", "Authorization: Bearer " + edgeKey + "\r\n", 1001, 413, "request_too_large"},
		{"valid key, lowercase scheme", "/v1/completions", "Authorization: bearer " + edgeKey + "\r\n", 64 << 10, 413, "request_too_large"},
		{"valid x-api-key, Messages API", "/v1/messages", "X-Api-Key: " + edgeKey + "\r\n", 1001, 413, `"type":"error"`},
		{"no key", "/v1/completions", "", 1001, 401, "invalid_api_key"},
		{"wrong key", "/v1/completions", "Authorization: Bearer sk-wrong-0123456789\r\n", 1001, 401, "invalid_api_key"},
		{"valid key, small body", "/v1/completions", "Authorization: Bearer " + edgeKey + "\r\n", 200, 200, "text_completion"},
	} {
		st, _, body := rawChunked(t, s.Addr(), c.path, c.n, c.hdr)
		if st != c.status || !strings.Contains(body, c.has) {
			t.Errorf("%s: %d %.200s, want %d with %s", c.name, st, body, c.status, c.has)
		}
	}
}

// A request with two Authorization (or X-Api-Key) headers is refused: the
// ingress read the first, a proxy in front of it may read the last.
func TestRepeatedCredentialRefused(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{Auth: edgeKeys(t)})
	url := "http://" + s.Addr()
	good, bad := "Bearer "+edgeKey, "Bearer sk-other-0123456789"
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":1}`
	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
	}{
		{"good then bad", "POST", "/v1/completions", body, []string{"Authorization", good, "Authorization", bad}},
		{"good twice", "POST", "/v1/completions", body, []string{"Authorization", good, "Authorization", good}},
		{"two x-api-keys", "POST", "/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`,
			[]string{"X-Api-Key", edgeKey, "X-Api-Key", "sk-other-0123456789"}},
		{"models", "GET", "/v1/models", "", []string{"Authorization", good, "Authorization", bad}},
		{"responses by id", "GET", "/v1/responses/resp_x", "", []string{"Authorization", good, "Authorization", bad}},
	} {
		st, _, b := edgeSend(t, c.method, url+c.path, c.body, c.hdr...)
		if st != http.StatusBadRequest || !strings.Contains(b, "more than one") {
			t.Errorf("%s: %d %.200s, want 400", c.name, st, b)
		}
	}
	// A large body is refused from the head, as an unauthenticated one is
	// (the test sends none of it).
	conn, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n", good, bad, 16<<20)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "more than one") {
		t.Errorf("large body: %d %.200s, want 400 before any body byte", resp.StatusCode, b)
	}
	if st, _, b := edgeSend(t, "POST", url+"/v1/completions", body, "Authorization", good); st != 200 {
		t.Fatalf("one credential: %d %s", st, b)
	}
}

// X-Api-Key is the credential on Anthropic's API's paths, /v1/models
// included (its SDKs' models.list()); elsewhere it is not read.
func TestAPIKeyHeaderPaths(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{Auth: edgeKeys(t)})
	url := "http://" + s.Addr()
	if st, _, b := edgeSend(t, "GET", url+"/v1/models", "", "X-Api-Key", edgeKey); st != 200 || !strings.Contains(b, `"id": "m"`) {
		t.Errorf("/v1/models with x-api-key: %d %.200s", st, b)
	}
	if st, _, b := edgeSend(t, "GET", url+"/v1/models?limit=20", "", "X-Api-Key", edgeKey); st != 200 {
		t.Errorf("/v1/models?limit with x-api-key: %d %.200s", st, b)
	}
	if st, _, _ := edgeSend(t, "GET", url+"/v1/models", "", "X-Api-Key", "sk-wrong-0123456789"); st != 401 {
		t.Errorf("/v1/models with a wrong x-api-key: %d", st)
	}
	if st, _, _ := edgeSend(t, "POST", url+"/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1}`, "X-Api-Key", edgeKey); st != 401 {
		t.Errorf("/v1/completions with x-api-key: %d, want 401", st)
	}
}

// With client authentication on and no admin listener, the client port's
// /metrics needs a client credential (a scraper's bearer token); without
// authentication it stays open, and with an admin listener it is 404 here.
func TestClientPortMetricsNeedCredential(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	s := startIngress(t, cfg, Deps{Auth: edgeKeys(t)})
	url := "http://" + s.Addr() + "/metrics"
	if st, _, b := edgeSend(t, "GET", url, ""); st != 401 || strings.Contains(b, "kvmesh_") {
		t.Errorf("no credential: %d %.100s", st, b)
	}
	if st, _, _ := edgeSend(t, "GET", url, "", "Authorization", "Bearer sk-wrong-0123456789"); st != 401 {
		t.Errorf("wrong credential: %d", st)
	}
	if st, _, b := edgeSend(t, "GET", url, "", "Authorization", "Bearer "+edgeKey); st != 200 || !strings.Contains(b, "kvmesh_ingress_") {
		t.Errorf("credential: %d %.100s", st, b)
	}
	open := startIngress(t, cfg, Deps{})
	if st, _, _ := edgeSend(t, "GET", "http://"+open.Addr()+"/metrics", ""); st != 200 {
		t.Errorf("no authentication: %d", st)
	}
}

// The admin token's scheme is case-insensitive, as the client port's.
func TestAdminTokenSchemeCaseInsensitive(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.AdminListen, cfg.AdminToken = "127.0.0.1:0", "admin-secret"
	s := startIngress(t, cfg, Deps{})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		if st, _, _ := edgeSend(t, "GET", "http://"+s.AdminAddr()+"/health", "", "Authorization", scheme+" admin-secret"); st != 200 {
			t.Errorf("%s: %d", scheme, st)
		}
	}
	for _, h := range []string{"Basic admin-secret", "bearer admin-secrets", "bearer", "admin-secret"} {
		if st, _, _ := edgeSend(t, "GET", "http://"+s.AdminAddr()+"/health", "", "Authorization", h); st != 401 {
			t.Errorf("%q: %d, want 401", h, st)
		}
	}
}

// An origin a browser never sends (a path, a trailing slash, no scheme,
// uppercase, a default port, null) is refused at start by name.
func TestCORSOriginsChecked(t *testing.T) {
	for _, good := range []string{"*", "https://app.example", "http://localhost:3000", "http://[::1]:8080", "chrome-extension://abcdef"} {
		if err := checkCORSOrigins([]string{good}); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	bad := []string{"app.example", "https://app.example/", "https://app.example/chat", "HTTPS://App.Example", "https://app.example:443",
		"http://app.example:80", "null", "https://user@app.example", "https://app.example?x=1", "https://app.example:", "https://app.example:99999", ""}
	err := checkCORSOrigins(bad)
	for _, b := range bad {
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", b)) {
			t.Errorf("%q not refused by name: %v", b, err)
		}
	}
	// An IP address a browser writes otherwise (tester h-ipv6 F5): it would
	// never match; the error names the form browsers send.
	for o, want := range map[string]string{
		"http://[0:0::1]:3001":           "as ::1",
		"http://[::ffff:127.0.0.1]:3000": "as ::ffff:7f00:1",
		"http://[fd00:0:0:0:0:0:0:5]":    "as fd00::5",
		"http://[fe80::1%25eth0]:3000":   "IPv6 compressed, no zone",
		"http://127.1:3000":              "IPv4 in dotted decimal",
		"http://0x7f.0.0.1":              "IPv4 in dotted decimal",
		"http://010.0.0.1":               "IPv4 in dotted decimal",
		"http://1.2.3.4.":                "as 1.2.3.4",
	} {
		if err := checkCORSOrigins([]string{o}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", o)) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want refused with %q", o, err, want)
		}
	}
	for _, good := range []string{"http://[::ffff:7f00:1]:3000", "http://[fd00::5]", "http://127.0.0.1:3000", "http://10.0.0.5", "https://app2.example", "http://v6.1x"} {
		if err := checkCORSOrigins([]string{good}); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	o := DefaultOptions()
	o.Config.Engines = []StaticEngine{{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}}
	o.Config.CORSOrigins = []string{"https://app.example/"}
	if err := o.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), `"https://app.example/"`) {
		t.Errorf("Options.Validate: %v", err)
	}
	if _, err := New(o.Config, Deps{Logger: quietLog()}); !errors.Is(err, ErrConfig) {
		t.Errorf("New: %v", err)
	}
}

// An API keys file, or a $KVMESH_API_KEYS, that holds no key is a
// configuration error (not an open ingress); start logs how clients
// authenticate.
func TestOptionsRefuseEmptyKeys(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(empty, []byte("# keys go here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.Config.Engines = []StaticEngine{{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}}
	t.Setenv(auth.DefaultEnvVar, "")
	os.Unsetenv(auth.DefaultEnvVar) // t.Setenv restores it afterwards
	if err := o.Validate(); err != nil {
		t.Fatalf("no keys named: %v", err)
	}
	o.APIKeysFile = empty
	if err := o.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "holds no key") {
		t.Errorf("comments-only keys file: %v", err)
	}
	o.APIKeysFile = ""
	t.Setenv(auth.DefaultEnvVar, " ")
	if err := o.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "KVMESH_API_KEYS is set but holds no key") {
		t.Errorf("blank $KVMESH_API_KEYS: %v", err)
	}
}

// syncLog is a log buffer safe for the server's goroutines.
func syncLog() (*slog.Logger, *testutil.SyncBuffer) {
	var b testutil.SyncBuffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

// The keys file is re-read while the server runs (the reloader goroutine
// is the server's and stops with Close): a revoked key gets 401, a new one
// is served, a broken file keeps the keys in force; start logs that client
// authentication is on.
func TestServerReloadsKeysFile(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	kf := filepath.Join(t.TempDir(), "keys")
	write := func(data string, gen int) {
		t.Helper()
		if err := os.WriteFile(kf, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		mt := time.Unix(1_800_000_000+int64(gen), 0)
		if err := os.Chtimes(kf, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	write("alice sk-alice-00000001\nbob sk-bob-000000002\n", 0)
	t.Setenv(auth.DefaultEnvVar, "")
	os.Unsetenv(auth.DefaultEnvVar)
	o := DefaultOptions()
	o.Config = testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	o.Config.Listen = "127.0.0.1:0"
	o.APIKeysFile = kf
	log, logBuf := syncLog()
	s, err := o.NewServer(context.Background(), log)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.Contains(logBuf.String(), "client authentication on") || !strings.Contains(logBuf.String(), "api_keys=2") {
		t.Errorf("start log: %s", logBuf.String())
	}
	testutil.WaitFor(t, 10*time.Second, "the keys reloader", func() bool { return strings.Contains(goroutineStacks(), "auth.(*Keys).Run") })
	url := "http://" + s.Addr() + "/v1/completions"
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":1}`
	is := func(key string, want int) {
		t.Helper()
		if st, _, b := edgeSend(t, "POST", url, body, "Authorization", "Bearer "+key); st != want {
			t.Fatalf("%s: %d %.200s, want %d", key, st, b, want)
		}
	}
	is("sk-bob-000000002", 200)
	keys := s.deps.Auth.(*auth.Keys)
	write("alice sk-alice-00000001\ncarol sk-carol-00000003\n", 1) // bob's key leaked
	keys.Poll()                                                    // what the reloader does every 2 s
	is("sk-bob-000000002", 401)
	is("sk-carol-00000003", 200)
	write("# emptied by mistake\n", 2)
	keys.Poll()
	is("sk-carol-00000003", 200)
	if !strings.Contains(logBuf.String(), "level=ERROR") || !strings.Contains(logBuf.String(), "keeping the previous keys") {
		t.Errorf("rejected reload not logged at ERROR: %s", logBuf.String())
	}
	if st, _, b := edgeSend(t, "GET", "http://"+s.Addr()+"/metrics", "", "Authorization", "Bearer sk-carol-00000003"); st != 200 ||
		!strings.Contains(b, `kvmesh_ingress_api_keys_reload_errors_total{ingress="`+s.cfg.ID+`"} 1`) {
		t.Errorf("metrics: %d %s", st, b)
	}
	s.Close()
	if strings.Contains(goroutineStacks(), "auth.(*Keys).Run") {
		t.Fatal("the keys reloader outlived the server")
	}
}

func goroutineStacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// Start logs a warning when no client authentication is configured.
func TestStartLogsAuthOff(t *testing.T) {
	t.Setenv(auth.DefaultEnvVar, "")
	os.Unsetenv(auth.DefaultEnvVar)
	o := DefaultOptions()
	o.Config = testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	log, logBuf := syncLog()
	if _, err := o.deps(context.Background(), log); err != nil {
		t.Fatal(err)
	}
	if out := logBuf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "client authentication off") || !strings.Contains(out, `metrics="client port, open"`) {
		t.Errorf("start log: %s", out)
	}

	// An admin listener off loopback without a token is warned about; on
	// loopback, or with a token, it is not.
	const adminWarn = "admin listener is on a non-loopback address without a token"
	for _, c := range []struct {
		admin, token string
		warn         bool
	}{{":9100", "", true}, {"0.0.0.0:9100", "", true}, {"10.1.2.3:9100", "", true}, {"[::]:9100", "", true},
		{"127.0.0.1:9100", "", false}, {"[::1]:9100", "", false}, {"localhost:9100", "", false}, {":9100", "tok", false}} {
		o.Config.AdminListen, o.Config.AdminToken = c.admin, c.token
		log, logBuf := syncLog()
		o.logAuth(log, 0, false)
		if got := strings.Contains(logBuf.String(), adminWarn); got != c.warn {
			t.Errorf("admin %q token %q: warned %v, want %v: %s", c.admin, c.token, got, c.warn, logBuf.String())
		}
	}
}

// With TLS on, the address printed on stdout is https://.
func TestRunPrintsHTTPSWithTLS(t *testing.T) {
	_, cert, key := testutil.ServerCert(t, t.TempDir())
	t.Setenv(auth.DefaultEnvVar, "")
	os.Unsetenv(auth.DefaultEnvVar)
	o := DefaultOptions()
	o.Config = testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	o.Config.Listen = "127.0.0.1:0"
	o.Config.TLS.CertFile, o.Config.TLS.KeyFile = cert, key
	o.TokenizerStore = false
	ctx, cancel := context.WithCancel(context.Background())
	var out testutil.SyncBuffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, &out, io.Discard) }()
	testutil.WaitFor(t, 10*time.Second, "the listening line", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		default:
		}
		return strings.Contains(out.String(), "listening on")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "listening on https://127.0.0.1:") {
		t.Fatalf("stdout %q", out.String())
	}
}

// The checks every request now passes through allocate nothing: the
// repeated-credential check, authentication with API keys (re-read or not)
// and the CORS headers.
func TestEdgeChecksAllocateNothing(t *testing.T) {
	const app = "https://app.example"
	kf := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(kf, []byte("tester "+edgeKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	watched, err := auth.WatchKeys(auth.Config{KeysFile: kf, EnvVar: "-"}, auth.WatchConfig{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	h := &ctx.Request.Header
	h.SetMethod("POST")
	h.SetRequestURI("/v1/completions")
	h.Set("Authorization", "Bearer "+edgeKey)
	h.Set("Origin", app)
	for name, a := range map[string]Authenticator{"store": edgeKeys(t), "watched": watched, "chain": auth.Chain{Keys: watched}} {
		s := &Server{cfg: Config{CORSOrigins: []string{"https://other.example", app}}, deps: Deps{Auth: a}}
		if n := testing.AllocsPerRun(200, func() {
			if err := repeatedCredential(h); err != nil {
				t.Fatal(err)
			}
			if id, err := s.authenticate(h); err != nil || id != "tester" {
				t.Fatal(id, err)
			}
			s.corsHeaders(&ctx, s.corsIndex(h.Peek("Origin")))
		}); n != 0 {
			t.Errorf("%s: %v allocations per request", name, n)
		}
	}
	if got := string(ctx.Response.Header.Peek("Access-Control-Allow-Origin")); got != app {
		t.Fatalf("Access-Control-Allow-Origin %q", got)
	}
}

// TestResponseByIDAuthLikeInference: GET /v1/responses/{id} and its cancel
// authenticate as POST /v1/responses does, through the same code
// (identify): for every credential a client may send, the three give the
// same verdict, and the Messages API's x-api-key is read on none of them
// (it is on /v1/messages). A stored response is not scoped to the key that
// made it, as in vLLM (docs/SECURITY.md): another valid key holding its id
// reads it; no key, or a wrong one, does not.
func TestResponseByIDAuthLikeInference(t *testing.T) {
	const alice, bob = "sk-alice-0123456789", "sk-bob-0123456789"
	keys := keyFileStore(t, "alice "+alice+"\nbob "+bob+"\n")
	engine := startSim(t, sim.Config{Model: "m", ResponsesStore: true})
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: engine.URL()}), Deps{Auth: keys})
	url := "http://" + s.Addr()
	st, _, b := edgeSend(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":2,"store":true}`, "Authorization", "Bearer "+alice)
	var made struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(b), &made); st != 200 || err != nil || !strings.HasPrefix(made.ID, respIDPrefix) {
		t.Fatalf("alice's response: %d %.300s (%v)", st, b, err)
	}
	for _, c := range []struct {
		name string
		hdr  []string
		ok   bool
	}{
		{"alice", []string{"Authorization", "Bearer " + alice}, true},
		{"bob", []string{"Authorization", "bearer " + bob}, true},
		{"none", nil, false},
		{"wrong key", []string{"Authorization", "Bearer sk-wrong-0123456789"}, false},
		{"x-api-key", []string{"X-Api-Key", alice}, false},
		{"x-api-key beside a wrong bearer", []string{"Authorization", "Bearer sk-wrong-0123456789", "X-Api-Key", alice}, false},
	} {
		for _, r := range []struct{ method, path, body string }{
			{"POST", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1}`},
			{"GET", "/v1/responses/" + made.ID, ""},
			{"POST", "/v1/responses/" + made.ID + "/cancel", ""},
		} {
			st, _, b := edgeSend(t, r.method, url+r.path, r.body, c.hdr...)
			if (st != http.StatusUnauthorized) != c.ok {
				t.Errorf("%s: %s %s: %d %.200s; want accepted %v", c.name, r.method, r.path, st, b, c.ok)
			}
			if c.ok && r.method == "GET" && (st != 200 || !strings.Contains(b, made.ID)) {
				t.Errorf("%s: GET of alice's response: %d %.200s", c.name, st, b)
			}
		}
	}
	// The same key as x-api-key is a credential on the Messages API.
	if st, _, b := edgeSend(t, "POST", url+"/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, "X-Api-Key", alice); st != 200 {
		t.Errorf("/v1/messages with x-api-key: %d %.200s", st, b)
	}
}
