package epp

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The request id of the picker's access log is the X-Request-Id the data
// plane sent (Envoy makes one per request; GAIE's picker names requests by
// it), so a decision joins the gateway's and the engine's lines. Without a
// valid one (none, or not 1–128 bytes of visible ASCII, as on the
// ingress) the picker makes one and sets it on the request for the engine.
func TestRequestIDFromTheGateway(t *testing.T) {
	var alog testutil.SyncBuffer
	r := newStaticRigWith(t, twoEngines, Config{}, Deps{}, func(ic *ingress.Config) { ic.AccessLog = true }, func(d *ingress.Deps) {
		d.AccessLog = slog.New(slog.NewJSONHandler(&alog, nil))
	})
	setOf := func(m *extprocv3.ProcessingResponse) string {
		for _, h := range mutationOf(m).GetSetHeaders() {
			if h.GetHeader().GetKey() == "x-request-id" {
				return string(h.GetHeader().GetRawValue())
			}
		}
		return ""
	}
	chat := []byte(chatBody("sys", "hi", false))
	for i, c := range []struct {
		sent string // "": none
		kept bool
	}{{"envoy-rid-12345", true}, {"", false}, {strings.Repeat("x", 200), false}, {"has space", false}} {
		var kv [][2]string
		if c.sent != "" {
			kv = append(kv, [2]string{"x-request-id", c.sent})
		}
		s := r.open(t, fd).headers("/v1/chat/completions", false, kv...).body(chat, true)
		m := s.recv()
		routed(t, m)
		s.recv()
		s.end()
		lines := strings.Split(strings.TrimSpace(alog.String()), "\n")
		if len(lines) != i+1 {
			t.Fatalf("%d access lines after %d requests: %s", len(lines), i+1, alog.String())
		}
		var line struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &line); err != nil {
			t.Fatal(err)
		}
		set := setOf(m)
		switch {
		case c.kept && (line.RequestID != c.sent || set != ""):
			t.Fatalf("x-request-id %q: logged %q, set %q; want it logged and nothing set", c.sent, line.RequestID, set)
		case !c.kept && (len(line.RequestID) != 32 || set != line.RequestID):
			t.Fatalf("x-request-id %q: logged %q, set %q; want the picker's own id logged and set", c.sent, line.RequestID, set)
		}
	}
	// A request refused while it is decided is logged with its id (not
	// empty, not a pooled call's last one).
	bad := []byte(`{"model":"no-such-model","prompt":"hi"}`)
	for _, sent := range []string{"rid-refused", ""} {
		var kv [][2]string
		if sent != "" {
			kv = append(kv, [2]string{"x-request-id", sent})
		}
		s := r.open(t, fd).headers("/v1/completions", false, kv...).body(bad, true)
		s.refused(404, "model_not_found")
		s.closed()
		lines := strings.Split(strings.TrimSpace(alog.String()), "\n")
		var line struct {
			RequestID string `json:"request_id"`
			Status    int
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &line); err != nil {
			t.Fatal(err)
		}
		if line.Status != 404 || (sent != "" && line.RequestID != sent) || (sent == "" && (len(line.RequestID) != 32 || strings.Contains(alog.String()[:len(alog.String())-len(lines[len(lines)-1])-1], line.RequestID))) {
			t.Fatalf("refused request with x-request-id %q logged as %s", sent, lines[len(lines)-1])
		}
	}
}
