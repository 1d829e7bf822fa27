package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"inspect", "stream", "--nats", srv.URL(), "--count", "2", "--keys"}, &out, &errOut)
	}()
	d := kvevents.Delta{Engine: "e1", Model: "m/x", Epoch: 0xabc, Seq: 7, TS: time.Now().UnixNano(),
		Ops: []kvevents.Op{{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{0x1234}}, {Kind: kvevents.OpClear, Tier: kvevents.TierCPU}}}
	msg := kvevents.AppendDelta(nil, &d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// Publish until the tail (which subscribes asynchronously) has seen two.
		_ = nc.Publish(natsutil.DeltaSubject(d.Model, d.Engine), msg)
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			line := strings.SplitN(out.String(), "\n", 2)[0]
			for _, want := range []string{"engine=e1", "model=m/x", "epoch=0000000000000abc", "seq=7", "store gpu 1 0000000000001234", "clear cpu"} {
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
