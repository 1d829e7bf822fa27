package ingress

import (
	"encoding/json"
	"log/slog"
	"net/http"
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
