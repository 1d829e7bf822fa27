package main

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestSimCommand runs `kvmesh sim` with free ports, reads the printed
// addresses, and follows its events with `kvmesh inspect events --zmq`.
func TestSimCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut testutil.SyncBuffer
	simDone := make(chan error, 1)
	go func() {
		simDone <- runSim(ctx, []string{"--model", "m", "--http", "127.0.0.1:0", "--kv-events", "tcp://127.0.0.1:0",
			"--kv-replay", "tcp://127.0.0.1:0", "--block-size", "4", "--gpu-blocks", "64", "--profile", "tiny",
			"--time-scale", "50", "--seed", "3", "--log-level", "error"}, &out, &errOut)
	}()
	addr := map[string]string{}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for len(addr) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no addresses printed: %q / %q", out.String(), errOut.String())
		}
		<-tick.C
		for _, l := range strings.Split(out.String(), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 2 && f[0] == "http":
				addr["http"] = f[1]
			case len(f) == 4 && f[0] == "kv-events" && f[2] == "0":
				addr["events"] = f[3]
			case len(f) == 4 && f[0] == "kv-replay" && f[2] == "0":
				addr["replay"] = f[3]
			}
		}
	}
	var iout, ierr testutil.SyncBuffer
	inspDone := make(chan int, 1)
	go func() {
		inspDone <- run([]string{"inspect", "events", "--zmq", addr["events"], "--replay", addr["replay"], "--count", "2"}, &iout, &ierr)
	}()
	for i := 0; ; i++ {
		select {
		case code := <-inspDone:
			if code != 0 {
				t.Fatalf("inspect exit %d: %s", code, ierr.String())
			}
			if !strings.Contains(iout.String(), "BlockStored") {
				t.Fatalf("inspect saw no BlockStored: %s", iout.String())
			}
			cancel()
			if err := <-simDone; err != nil {
				t.Fatalf("sim: %v", err)
			}
			return
		case <-time.After(20 * time.Millisecond):
			if i > 500 {
				t.Fatal("inspect did not see 2 batches")
			}
			// A distinct first token per request, so every request stores new blocks.
			body := `{"model":"m","prompt":[` + itoa(i+1) + strings.Repeat(",7", 8) + `],"max_tokens":1}`
			resp, err := http.Post(addr["http"]+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("completion: %d", resp.StatusCode)
			}
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestSimCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "--profile", "nope"},
		{"sim", "--event-form", "xml"},
		{"sim", "--replay-layout", "mid"},
		{"sim", "--log-level", "loud"},
		{"sim", "extra"},
		{"sim", "--gpu-blocks", "x"},
		{"sim", "--kv-transfer-config", `{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`},
		{"sim", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","typo":1}`},
		{"sim", "--nixl-side-channel", "no-port"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"sim", "--dp", "-1", "--http", "127.0.0.1:0"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "dp") {
		t.Errorf("--dp -1: exit %d, %q", code, errOut.String())
	}
	// 0 given for a setting whose configuration reads 0 as its default is
	// reported, every one at once (it ran with the default before).
	errOut.Reset()
	code := run([]string{"sim", "--http", "127.0.0.1:0", "--time-scale", "0", "--dp", "0", "--block-size", "0", "--gpu-blocks", "0",
		"--kv-transfer-gbps", "0"}, &out, &errOut)
	for _, f := range []string{"time-scale", "dp", "block-size", "gpu-blocks", "kv-transfer-gbps"} {
		if code != 2 || !strings.Contains(errOut.String(), "--"+f+" 0: want > 0") {
			t.Errorf("--%s 0: exit %d, stderr %q", f, code, errOut.String())
		}
	}
}
