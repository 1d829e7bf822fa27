package ingress

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestLogKeysUnique: every JSON log line the ingress and the parts it starts
// (gossip, the materializer) write names each key once. slog's JSON handler
// does not merge a With("component", ...) over an inherited one, and log
// pipelines keep the first or the last of a repeated key as they please, so
// a materializer line used to read as the ingress's.
func TestLogKeysUnique(t *testing.T) {
	url := "nats://" + testutil.NewGate(t).Addr() // never opened: the materializer logs that it waits for NATS

	var buf testutil.SyncBuffer
	cfg := DefaultConfig()
	cfg.ID = "ingress-logkeys"
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{url}}
	startIngress(t, cfg, Deps{Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	testutil.WaitFor(t, 10*time.Second, "a materializer log line", func() bool {
		return strings.Contains(buf.String(), `"component":"materializer"`)
	})
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if k, dup := repeatedKey([]byte(line)); dup {
			t.Errorf("key %q twice in %s", k, line)
		}
	}
}

// repeatedKey reports the first key an object line names twice.
func repeatedKey(line []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := tok.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}
