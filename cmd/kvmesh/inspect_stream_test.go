package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

func TestInspectStreamTailsDecodedDeltas(t *testing.T) {
	srv := testutil.NATS(t)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut, keysErr bytes.Buffer
	// Keys and epochs print in decimal, as kvmesh keys prints keys and the
	// sidecar's /debug/state and the ingress's /debug/index (JSON numbers)
	// epochs: cross-checking needs no conversion (h-kvev finding 3). The
	// tail printed them in hex.
	var keysOut bytes.Buffer
	if code := run([]string{"keys", "--model", "m/x", "--block-size", "2", "--tokens", "1,2,3,4"}, &keysOut, &keysErr); code != 0 {
		t.Fatalf("kvmesh keys: exit %d: %s", code, keysErr.String())
	}
	keyLines := strings.Fields(keysOut.String())
	keys := make([]uint64, len(keyLines))
	for i, k := range keyLines {
		if keys[i], err = strconv.ParseUint(k, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	epoch := uint64(3231056790460373371)
	debugState, _ := json.Marshal(map[string]uint64{"epoch": epoch}) // as /debug/state writes it
	d := kvevents.Delta{Engine: "e1", Model: "m/x", Epoch: epoch, Seq: 7, TS: time.Now().UnixNano(),
		Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: keys}, {Kind: kvevents.OpClear, Tier: kvevents.TierCPU}}}
	msg := kvevents.AppendDelta(nil, &d)
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"inspect", "stream", "--nats", srv.URL(), "--count", "2", "--keys"}, &out, &errOut)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// Publish until the tail (which subscribes asynchronously) has seen two.
		_ = nc.Publish(natsutil.Default().DeltaSubject(d.Model, d.Engine), msg)
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			// No sidecar made the stream here: said, the tail still read.
			if !strings.Contains(errOut.String(), "no stream KVMESH_DELTAS on this NATS") {
				t.Errorf("stderr %q does not say the stream is missing", errOut.String())
			}
			line := strings.SplitN(out.String(), "\n", 2)[0]
			wantEpoch := "epoch=" + strings.TrimSuffix(strings.TrimPrefix(string(debugState), `{"epoch":`), "}")
			for _, want := range []string{"engine=e1", "model=m/x", wantEpoch + " ", "seq=7", "store gpu 2 " + strings.Join(keyLines, " "), "clear cpu"} {
				if !strings.Contains(line, want) {
					t.Errorf("line %q lacks %q", line, want)
				}
			}
			return
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("inspect stream did not finish")
		}
	}
}

func TestSidecarFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"sidecar", "--engine", "id=a,model=m,events=tcp://127.0.0.1:1,bogus=1"}, &out, &errOut); code != 2 {
		t.Fatalf("bad engine spec: exit %d", code)
	}
	if code := run([]string{"sidecar", "--model", "m"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "no KV-event endpoint") {
		t.Fatalf("missing events endpoint: exit %d, %s", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"sidecar", "--model", "m", "--events", "tcp://127.0.0.1:1", "--events-silent-after", "-1s"}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), "events silent after -1s must not be negative") {
		t.Fatalf("a negative --events-silent-after: exit %d, %s", code, errOut.String())
	}
}

// TestInspectStreamUsage: flags the chosen mode does not read, and an
// interval or count out of range (a zero --interval would panic the
// summary's ticker), are usage errors before any connection is made.
func TestInspectStreamUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--summary", "--keys", "--count", "3"}, "--keys is not read by a --summary run"},
		{[]string{"--interval", "5s"}, "--interval is not read by a delta tail"},
		{[]string{"--summary", "--interval", "0s"}, "--interval must be > 0"},
		{[]string{"--count", "-1"}, "--count >= 0"},
	} {
		var out, errOut bytes.Buffer
		err := runInspectStream(context.Background(), append([]string{"--nats", "nats://127.0.0.1:1"}, tc.args...), &out, &errOut)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a usage error saying %q", tc.args, err, tc.want)
		}
	}
}

// The summary prints epochs in decimal too, as /debug/index does.
func TestInspectSummaryEpochDecimal(t *testing.T) {
	var out bytes.Buffer
	printSummary(&out, []materialize.EngineStatus{{Engine: "e1", Model: "m", Epoch: 3231056790460373371, Seq: 9}})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(f) < 4 || f[2] != "3231056790460373371" {
		t.Fatalf("summary %q: want the epoch in decimal", out.String())
	}
}
