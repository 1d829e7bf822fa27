package demo

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// TestRunPD runs `kvmesh demo --pd` small: every mode serves every request
// through the ingress and real NIXL side channels, and the table lists
// each mode.
func TestRunPD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := PDConfig{Workload: workload.SharedPrefix{Groups: 4, Prompts: 4, Shared: 512, Question: 256, Output: 8, Seed: 1},
		Concurrency: 4, TimeScale: 20}
	res, err := RunPD(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range PDModes {
		r := res.Runs[m]
		if r == nil || r.Completed != 16 || r.Failed != 0 {
			t.Fatalf("%s: %+v", m, r)
		}
	}
	var b bytes.Buffer
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, m := range PDModes {
		if !strings.Contains(b.String(), m) {
			t.Fatalf("table lacks %s:\n%s", m, b.String())
		}
	}
	if _, err := RunPD(ctx, PDConfig{Modes: []string{"nope"}}); err == nil {
		t.Fatal("unknown mode accepted")
	}
}

// TestRunPDPortBase: with a port base every listener of the P/D demo is on
// the 127.0.0.1 port its layout says (engine i on base+2i and base+2i+1,
// the ingress last), and the requests are served there; `kvmesh demo --pd`
// refused --port-base.
func TestRunPDPortBase(t *testing.T) {
	if n := PDPorts(2, 2); n != 9 {
		t.Fatalf("PDPorts(2, 2) = %d, want 9 (2 per engine, the ingress)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for attempt := 0; ; attempt++ { // another process may take a probed port before the demo binds it
		base := testutil.FreePortBase(t, PDPorts(1, 1))
		var mu sync.Mutex
		var closed []int
		checked := false
		cfg := PDConfig{Prefill: 1, Decode: 1, PortBase: base, Modes: []string{"pd"}, Concurrency: 2, TimeScale: 20,
			Workload: workload.SharedPrefix{Groups: 2, Prompts: 2, Shared: 256, Question: 64, Output: 4, Seed: 1}}
		cfg.Progress = func(_ string, _ loadgen.Progress) {
			mu.Lock()
			defer mu.Unlock()
			if checked {
				return
			}
			checked = true
			for p := base; p < base+PDPorts(1, 1); p++ {
				c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), 5*time.Second)
				if err != nil {
					closed = append(closed, p-base)
					continue
				}
				c.Close()
			}
		}
		res, err := RunPD(ctx, cfg)
		if err != nil && attempt < 4 && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			continue
		}
		if err != nil {
			t.Fatalf("port base %d: %v", base, err)
		}
		if r := res.Runs["pd"]; r == nil || r.Completed != 4 {
			t.Fatalf("port base %d: %+v", base, r)
		}
		mu.Lock()
		defer mu.Unlock()
		if !checked || len(closed) > 0 {
			t.Fatalf("port base %d: checked %v, nothing listening at base+%v", base, checked, closed)
		}
		break
	}
	if err := (PDConfig{PortBase: 65530}).withDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "take 9 ports") {
		t.Fatalf("P/D demo at 65530: %v", err)
	}
}
