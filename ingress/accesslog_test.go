package ingress

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// accessLines returns the access log's lines in buf, decoded.
func accessLines(t *testing.T, buf *testutil.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not one JSON object: %.300s: %v", line, err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// Client-chosen strings (the model, X-Session-ID) reach the access log and
// the error messages that echo them cut to maxEcho bytes with their length:
// a 2 MB model name makes a line of a few KB, not 4 MB.
func TestAccessLogBoundsClientStrings(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}),
		Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	model := strings.Repeat("M", 2_000_000)
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"`+model+`","prompt":[1],"max_tokens":1}`,
		"X-Session-ID", strings.Repeat("S", 8000))
	if st != http.StatusNotFound || len(b) > 2048 || !strings.Contains(string(b), "…(2000000 bytes)") {
		t.Fatalf("%d, %d bytes: %.400s", st, len(b), b)
	}
	st, _, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/"+strings.Repeat("p", 8000), `{}`)
	if st != http.StatusNotFound || len(b) > 2048 || !strings.Contains(string(b), "…(8001 bytes)") {
		t.Fatalf("a long unknown path: %d, %d bytes: %.400s", st, len(b), b)
	}
	testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return strings.Contains(alog.String(), `"msg":"request"`) })
	if n := len(alog.String()); n > 4096 {
		t.Fatalf("access log of %d bytes for one request", n)
	}
	l := accessLines(t, &alog)[0]
	if m, _ := l["model"].(string); !strings.HasPrefix(m, strings.Repeat("M", maxEcho)+"…(2000000 bytes)") {
		t.Fatalf("model %.400q", m)
	}
	if sid, _ := l["session"].(string); sid != strings.Repeat("S", maxEcho)+"…(8000 bytes)" {
		t.Fatalf("session %.400q", sid)
	}
	// A short string is kept whole, a long one is cut at a character boundary.
	if long := strings.Repeat("a", maxEcho-1) + "éb"; clip("é") != "é" || clip(long) != strings.Repeat("a", maxEcho-1)+"…(258 bytes)" {
		t.Fatalf("clip: %q", clip(long))
	}
}

// TestAccessLogResponseByID: GET /v1/responses/{id} and its cancel write
// one access line per request, as the inference endpoints do: the engine
// that answered, the status, the request id sent upstream, the API key's
// name, and the error when the ingress answered itself (an unknown id, a
// method the path does not take, a bad key).
func TestAccessLogResponseByID(t *testing.T) {
	var alog testutil.SyncBuffer
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"`+strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/cancel")+`","object":"response","status":"completed"}`)
	}))
	t.Cleanup(engine.Close)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: engine.URL}),
		Deps{Auth: edgeKeys(t), AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	tag := make([]byte, respTagLen)
	engineTag(tag, "e1")
	id := respIDPrefix + string(tag) + strings.Repeat("0", 32)
	send := func(method, path, key, reqID string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+s.Addr()+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("X-Request-Id", reqID)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	want := []struct {
		method, path, key, reqID string
		status                   int
		engine                   string
		failed                   bool
	}{
		{"GET", "/v1/responses/" + id, edgeKey, "get-1", 200, "e1", false},
		{"POST", "/v1/responses/" + id + "/cancel", edgeKey, "cancel-1", 200, "e1", false},
		{"DELETE", "/v1/responses/" + id, edgeKey, "delete-1", 405, "", true},
		{"GET", "/v1/responses/resp_unknown", edgeKey, "unknown-1", 404, "", true},
		{"GET", "/v1/responses/" + id, "sk-wrong-0123456789", "badkey-1", 401, "", true},
	}
	for _, w := range want {
		if st := send(w.method, w.path, w.key, w.reqID); st != w.status {
			t.Fatalf("%s %s: status %d, want %d", w.method, w.path, st, w.status)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "the access lines", func() bool { return len(accessLines(t, &alog)) >= len(want) })
	lines := accessLines(t, &alog)
	if len(lines) != len(want) {
		t.Fatalf("%d access lines for %d requests:\n%s", len(lines), len(want), alog.String())
	}
	for i, w := range want {
		l := lines[i]
		if l["endpoint"] != "responses" || l["method"] != w.method || l["path"] != w.path || l["status"] != float64(w.status) ||
			l["engine"] != w.engine || l["request_id"] != w.reqID || (l["error"] != "") != w.failed {
			t.Errorf("line %d for %s %s: %v", i, w.method, w.path, l)
		}
		if key := l["key"]; (w.status == 401) != (key == "") {
			t.Errorf("line %d for %s %s: key %q", i, w.method, w.path, key)
		}
	}
	if strings.Contains(alog.String(), "sk-wrong") {
		t.Fatalf("the rejected key is in the log:\n%s", alog.String())
	}
}

// A request for a stored response with no X-Request-Id, or one the ingress
// does not forward (over maxRequestID), gets an id of the ingress's own,
// as an inference request does (keepForwardHeaders): the engine receives
// it and the access line names it. A client's valid id is sent as it is.
func TestResponseByIDMakesRequestID(t *testing.T) {
	var alog testutil.SyncBuffer
	got := make(chan string, 3)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Request-Id")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"response","status":"completed"}`)
	}))
	t.Cleanup(engine.Close)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: engine.URL})
	cfg.AccessLog = true
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	tag := make([]byte, respTagLen)
	engineTag(tag, "e1")
	url := "http://" + s.Addr() + "/v1/responses/" + respIDPrefix + string(tag) + strings.Repeat("0", 32)
	sent := []string{"", strings.Repeat("x", maxRequestID+1), "client-1"}
	var upstream []string
	for _, id := range sent {
		req, _ := http.NewRequest("GET", url, nil)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("X-Request-Id %q: status %d", id, resp.StatusCode)
		}
		up := <-got
		if h := resp.Header.Get("X-Request-Id"); h != up {
			t.Errorf("X-Request-Id %.20q: the client's answer says %q, the engine got %q", id, h, up)
		}
		upstream = append(upstream, up)
	}
	testutil.WaitFor(t, 5*time.Second, "the access lines", func() bool { return len(accessLines(t, &alog)) >= len(sent) })
	lines := accessLines(t, &alog)
	if len(lines) != len(sent) {
		t.Fatalf("%d access lines for %d requests:\n%s", len(lines), len(sent), alog.String())
	}
	for i, id := range sent {
		up := upstream[i]
		switch {
		case i == len(sent)-1 && up != id:
			t.Errorf("the client's X-Request-Id %q reached the engine as %q", id, up)
		case i < len(sent)-1 && (len(up) != 32 || strings.Trim(up, "0123456789abcdef") != "" || !validRequestID([]byte(up))):
			t.Errorf("X-Request-Id %.20q: the engine got %q, want an id of the ingress's own (32 hex digits)", id, up)
		}
		if l := lines[i]; l["request_id"] != up {
			t.Errorf("X-Request-Id %.20q: the access line says request_id %q, the engine got %q", id, l["request_id"], up)
		}
	}
	if upstream[0] == upstream[1] {
		t.Errorf("two requests sent the same made id %q", upstream[0])
	}
}

// TestAccessLogNamesTheAdapter: the access line of a request for a LoRA
// adapter has the adapter in "adapter", so per-adapter usage can be read:
// one a route names is served, and logged as "model", under its pool's
// model; one --lora-adapter names is logged as "model" under its own name;
// a base model's request has "adapter" "".
func TestAccessLogNamesTheAdapter(t *testing.T) {
	sm := loraSim(t)
	var alog testutil.SyncBuffer
	cfg := testConfig(StaticEngine{ID: "e", Model: "llama", URL: sm.URL()})
	cfg.LoRAAdapters = map[string]string{"flag-lora": "llama"}
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil)),
		Routes: routeTable(t, "routes:\n  - name: r\n    match: {model: coder}\n    backends: [{model: llama}]\n    loraAdapters: [sql-lora]\n")})
	client := &http.Client{Timeout: 10 * time.Second}
	want := []struct{ asked, model, adapter string }{
		{"sql-lora", "llama", "sql-lora"},
		{"flag-lora", "flag-lora", "flag-lora"},
		{"llama", "llama", ""},
	}
	for _, w := range want {
		if st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", promptOf(w.asked, 3)); st != 200 {
			t.Fatalf("%s: %d %s", w.asked, st, b)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "three access lines", func() bool { return strings.Count(alog.String(), `"msg":"request"`) == 3 })
	lines := accessLines(t, &alog)
	for _, w := range want {
		found := false
		for _, l := range lines {
			if l["model"] == w.model && l["adapter"] == w.adapter {
				found = true
			}
		}
		if !found {
			t.Errorf("no access line with model %q adapter %q for %s: %v", w.model, w.adapter, w.asked, lines)
		}
	}
}

// TestAccessLogNamesAnUnloadedAdapter: a request for an adapter the
// engines listed and no longer list, refused with 404 model_not_found while
// its base model's engines are live, is logged with its adapter too, so
// per-adapter error counts see it. Before, that 404 returned before the
// adapter's base model was set and logged "adapter" "" (tester h-docs2 F5).
func TestAccessLogNamesAnUnloadedAdapter(t *testing.T) {
	alpha := simServing(t, "alpha", "", "chem")
	m := &swapMembership{}
	setEngines(m, modelEngine("alpha0", "alpha", alpha.URL(), "chem"))
	var alog testutil.SyncBuffer
	s := startIngress(t, testConfig(), Deps{Membership: m, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	url := "http://" + s.Addr() + "/v1/completions"
	req := `{"model":"chem","max_tokens":1,"prompt":"x"}`
	if st, _, b := post(t, http.DefaultClient, url, req); st != http.StatusOK {
		t.Fatalf("chem while loaded: %d %s", st, b)
	}
	if st, _, b := post(t, http.DefaultClient, alpha.URL()+"/v1/unload_lora_adapter", `{"lora_name":"chem"}`); st != http.StatusOK {
		t.Fatalf("unload: %d %s", st, b)
	}
	// The sidecar's next poll: alpha's engine no longer lists chem.
	setEngines(m, modelEngine("alpha0", "alpha", alpha.URL()))
	if st, _, b := post(t, http.DefaultClient, url, req); st != http.StatusNotFound || !strings.Contains(string(b), "lists it any more") {
		t.Fatalf("chem after the poll: %d %s, want the unloaded adapter's 404", st, b)
	}
	testutil.WaitFor(t, 5*time.Second, "two access lines", func() bool { return strings.Count(alog.String(), `"msg":"request"`) == 2 })
	for i, l := range accessLines(t, &alog) {
		if l["model"] != "chem" || l["adapter"] != "chem" {
			t.Errorf("access line %d (status %v): model %q adapter %q, want chem, chem", i+1, l["status"], l["model"], l["adapter"])
		}
	}
}

// A body over maxBodyBytes, refused by fasthttp before any handler runs, is
// answered, counted and logged as a request the handlers refused: the
// client's X-Request-Id echoed (one made when it sent none), Vary: Origin
// beside the CORS header, one access line under its endpoint, and the
// request counted under that endpoint, not "unknown". Before, the 413 had
// no request id and no access line, so an SDK's requestID was undefined.
func TestTooLargeBodyIsAnsweredWithItsRequestID(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.MaxBodyBytes = 64 << 10
	cfg.CORSOrigins = []string{"http://app.example"}
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	big := `{"model":"m","prompt":"` + strings.Repeat("a", 70<<10) + `"}`
	// send posts big to the chat endpoint: with a Content-Length, with
	// Expect: 100-continue too (refused before the body: curl's way past
	// 1 MB), or chunked (fasthttp resets the head when the body fails).
	send := func(id, mode string) http.Header {
		t.Helper()
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n"
		body := big
		switch mode {
		case "chunked":
			head += "Transfer-Encoding: chunked\r\n"
			body = strconv.FormatInt(int64(len(big)), 16) + "\r\n" + big + "\r\n0\r\n\r\n"
		case "expect":
			head += "Expect: 100-continue\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n"
			body = ""
		default:
			head += "Content-Length: " + strconv.Itoa(len(big)) + "\r\n"
		}
		if id != "" {
			head += "X-Request-Id: " + id + "\r\n"
		}
		go io.WriteString(conn, head+"\r\n"+body) //nolint:errcheck // the server may close before it is all written
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: status %d, want 413", mode, resp.StatusCode)
		}
		return resp.Header
	}
	for _, mode := range []string{"length", "expect", "chunked"} {
		if h := send("r413-"+mode, mode); h.Get("X-Request-Id") != "r413-"+mode || h.Get("Vary") != "Origin" || h.Get("Access-Control-Allow-Origin") != "http://app.example" {
			t.Fatalf("%s: a 413 with X-Request-Id r413-%s answered with headers %v", mode, mode, h)
		}
	}
	if id := send("", "length").Get("X-Request-Id"); len(id) != 32 {
		t.Fatalf("a 413 without a request id answered with X-Request-Id %q, want one the ingress made", id)
	}
	testutil.WaitFor(t, 5*time.Second, "four access lines", func() bool { return strings.Count(alog.String(), `"msg":"request"`) == 4 })
	for i, l := range accessLines(t, &alog)[:3] {
		if l["request_id"] == "" || l["endpoint"] != "chat" || l["status"] != float64(413) || l["path"] != "/v1/chat/completions" ||
			!strings.Contains(l["error"].(string), "limit is") {
			t.Fatalf("access line %d: %v", i, l)
		}
	}
	if got := val(s.m.requests.WithLabelValues("chat", "413")); got != 4 {
		t.Fatalf("requests_total{endpoint=chat,status=413} = %v, want 4", got)
	}
}
