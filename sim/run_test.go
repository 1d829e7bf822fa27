package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/logutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestRunJSONLogOnly: with --log-format json every line `kvmesh sim` writes
// to stderr is a JSON object, the notice that its KV-event PUB connects
// (vLLM's rule for an endpoint without a wildcard) included: a log shipper
// parsing JSON must not meet a plain-text line.
func TestRunJSONLogOnly(t *testing.T) {
	// Something for the PUB to connect to (a subscriber that binds).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	o := DefaultOptions()
	o.Config.HTTPAddr = "127.0.0.1:0"
	o.Config.KVEvents = "tcp://" + ln.Addr().String()
	o.LogFormat = logutil.JSON
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	var stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, o, pw, &stderr)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "http ") {
		t.Fatalf("stdout's first line %q, want the HTTP URL", sc.Text())
	}
	// The notice is written before the URL: all of stderr is there now.
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := strings.TrimSpace(stderr.String())
	if !strings.Contains(out, "PUB connects") {
		t.Fatalf("no notice that the PUB connects in stderr:\n%s", out)
	}
	for line := range strings.SplitSeq(out, "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("stderr line is not JSON (%v): %s", err, line)
		}
	}
}
