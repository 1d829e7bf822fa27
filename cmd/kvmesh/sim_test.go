package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// TestSimCommandRefuses: a value the simulator cannot run with, and a flag
// whose feature the command line leaves off, are usage errors (exit 2)
// naming the flag, found before anything starts: no address is printed.
func TestSimCommandRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Non-finite values passed every "x <= 0" check.
		{[]string{"--time-scale", "NaN"}, "--time-scale NaN: want a finite value"},
		{[]string{"--time-scale", "Inf"}, "--time-scale +Inf: want a finite value"},
		{[]string{"--kv-events", "tcp://127.0.0.1:0", "--drop-rate", "NaN"}, "--drop-rate NaN: want a finite value"},
		{[]string{"--eos-rate", "NaN"}, "--eos-rate NaN: want a finite value"},
		{[]string{"--disaggregation-mode", "decode", "--kv-transfer-gbps", "NaN"}, "--kv-transfer-gbps NaN: want a finite value"},
		// Found by the simulator's own validation, after start-up began (exit 1).
		{[]string{"--time-scale", "-1"}, "--time-scale -1: want > 0"},
		{[]string{"--dp", "-1"}, "--dp -1: want > 0"},
		{[]string{"--disaggregation-mode", "bogus"}, `disaggregation mode "bogus"`},
		{[]string{"--kv-events", "localhost"}, `endpoint "localhost"`},
		{[]string{"--eos-rate", "1"}, "eos rate 1"},
		// 0 or less read as "the default" (or as 1) without a word.
		{[]string{"--max-waiting", "0"}, "--max-waiting 0: want > 0"},
		{[]string{"--kv-events", "tcp://127.0.0.1:0", "--replay-buffer", "0"}, "--replay-buffer 0: want > 0"},
		{[]string{"--enable-lora", "--max-loras", "0"}, "--max-loras 0: want > 0"},
		{[]string{"--enable-lora", "--max-loras", "-2"}, "--max-loras -2: want > 0"},
		{[]string{"--disaggregation-mode", "decode", "--disaggregation-timeout", "-1s"}, "--disaggregation-timeout -1s: want > 0"},
		{[]string{"--disaggregation-mode", "decode", "--nixl-abort-timeout", "0s"}, "--nixl-abort-timeout 0s: want > 0"},
		{[]string{"--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "65536"}, "--disaggregation-bootstrap-port 65536: want 0..65535"},
		// Flags of a feature that is off.
		{[]string{"--drop-rate", "0.5"}, "--drop-rate is not read without --kv-events"},
		{[]string{"--event-form", "map"}, "--event-form is not read without --kv-events"},
		{[]string{"--topic", "x"}, "--topic is not read without --kv-events"},
		{[]string{"--replay-layout", "old"}, "--replay-layout is not read without --kv-events"},
		{[]string{"--max-loras", "3"}, "--max-loras is not read without --enable-lora"},
		{[]string{"--lora-modules", "a=/p"}, "--lora-modules is not read without --enable-lora"},
		{[]string{"--nixl-side-channel", "127.0.0.1:0"}, "--nixl-side-channel is not read without --kv-transfer-config"},
		{[]string{"--disaggregation-mode", "decode", "--nixl-side-channel", "127.0.0.1:0"}, "--nixl-side-channel is not read without --kv-transfer-config"},
		{[]string{"--disaggregation-bootstrap-port", "9000"}, "--disaggregation-bootstrap-port is not read without --disaggregation-mode prefill"},
		{[]string{"--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "9000"}, "--disaggregation-bootstrap-port is not read without --disaggregation-mode prefill"},
		{[]string{"--disaggregation-timeout", "1s"}, "--disaggregation-timeout is not read without --disaggregation-mode"},
		{[]string{"--kv-transfer-gbps", "10"}, "--kv-transfer-gbps is not read without --kv-transfer-config or --disaggregation-mode"},
	} {
		// A context already done: a simulator that starts stops at once
		// (no test hangs on a regression).
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errOut bytes.Buffer
		args := append([]string{"--http", "127.0.0.1:0", "--log-level", "error"}, tc.args...)
		err := runSim(ctx, args, &out, &errOut)
		if !errors.Is(err, errUsage) || !strings.Contains(fmt.Sprint(err), tc.want) || out.Len() != 0 {
			t.Errorf("%v: %v, stdout %q; want a usage error with %q and nothing started", tc.args, err, out.String(), tc.want)
		}
	}
	// The same flags with their feature on are read.
	for _, args := range [][]string{
		{"--kv-events", "tcp://127.0.0.1:0", "--drop-rate", "0.5", "--event-form", "map", "--topic", "x", "--replay-layout", "old", "--replay-buffer", "5"},
		{"--enable-lora", "--max-loras", "3", "--lora-modules", "a=/p"},
		{"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`, "--nixl-side-channel", "127.0.0.1:0",
			"--kv-transfer-gbps", "10", "--nixl-abort-timeout", "1s"},
		{"--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", "--disaggregation-timeout", "1s", "--kv-transfer-gbps", "10"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out, errOut bytes.Buffer
		if err := runSim(ctx, append([]string{"--http", "127.0.0.1:0", "--log-level", "error"}, args...), &out, &errOut); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}
