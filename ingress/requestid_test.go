package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Every request has an id: the client's X-Request-Id when valid, else one
// the ingress makes. The engine is sent it, the client gets it back (on
// errors too) and the access line has it as request_id. An engine that
// answers another id does not change the client's: the access line keeps
// the engine's as engine_request_id.
func TestRequestIDEndToEnd(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	front, lastSent := simRecordingIDs(t)
	own := startRawEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: engine-own-7\r\n")
	var alog testutil.SyncBuffer
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: front}, StaticEngine{ID: "own", Model: "other", URL: own.url()})
	s := startIngress(t, cfg, Deps{Logger: quiet, AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	url := "http://" + s.Addr() + "/v1/completions"

	lastLine := func(n int) map[string]any {
		t.Helper()
		testutil.WaitFor(t, 5*time.Second, "the access lines", func() bool { return len(accessLines(t, &alog)) >= n })
		return accessLines(t, &alog)[n-1]
	}
	for i, stream := range []string{"false", "true"} {
		st, hdr, b := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2],"max_tokens":2,"stream":`+stream+`}`)
		id := hdr.Get("X-Request-Id")
		got := lastSent()
		if st != 200 || len(id) != 32 || got != id {
			t.Fatalf("no client id, stream %s: %d, the client got %q, the engine %q: %.200s", stream, st, id, got, b)
		}
		if l := lastLine(i + 1); l["request_id"] != id || l["engine_request_id"] != nil {
			t.Fatalf("access line %v, want request_id %s", l, id)
		}
	}
	st, hdr, _ := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2],"max_tokens":2}`, "X-Request-Id", "client-id-1")
	got := lastSent()
	if st != 200 || hdr.Get("X-Request-Id") != "client-id-1" || got != "client-id-1" || lastLine(3)["request_id"] != "client-id-1" {
		t.Fatalf("client id: %d, answer %q, engine %q, log %v", st, hdr.Get("X-Request-Id"), got, lastLine(3))
	}
	// An error has the id too.
	st, hdr, _ = post(t, http.DefaultClient, url, `{"model":"nope","prompt":[1]}`, "X-Request-Id", "client-id-2")
	if st != 404 || hdr.Get("X-Request-Id") != "client-id-2" || lastLine(4)["request_id"] != "client-id-2" {
		t.Fatalf("404: %d, answer %q, log %v", st, hdr.Get("X-Request-Id"), lastLine(4))
	}
	// An engine answering its own id.
	st, hdr, b := post(t, http.DefaultClient, url, `{"model":"other","prompt":[1],"max_tokens":1}`, "X-Request-Id", "client-id-3")
	if l := lastLine(5); st != 200 || hdr.Get("X-Request-Id") != "client-id-3" || l["request_id"] != "client-id-3" || l["engine_request_id"] != "engine-own-7" {
		t.Fatalf("engine's own id: %d, answer %q, log %v: %.200s", st, hdr.Get("X-Request-Id"), l, b)
	}
}
