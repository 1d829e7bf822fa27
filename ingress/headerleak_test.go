package ingress

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A header value fasthttp refuses (a credential with a stray control byte,
// as a badly pasted secret has) gets a 400 that names no header value, and
// the debug log of the failed connection quotes none either.
func TestMalformedHeaderNotQuoted(t *testing.T) {
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Logger: log})
	for _, h := range []string{"Authorization: Bearer sk-tenantA-SECRET\x01", "X-Api-Key: sk-tenantA-SECRET\x7f"} {
		conn := dialIngress(t, s)
		if _, err := io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"+h+"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(conn)
		if !strings.HasPrefix(string(b), "HTTP/1.1 400") || strings.Contains(string(b), "SECRET") || !strings.Contains(string(b), "malformed request header") {
			t.Fatalf("%q: %s", h, b)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "fasthttp logged the failed connections", func() bool {
		return strings.Count(logs.String(), `"source":"fasthttp"`) >= 2
	})
	if strings.Contains(logs.String(), "SECRET") {
		t.Fatalf("the log quotes the header:\n%s", logs.String())
	}
}
