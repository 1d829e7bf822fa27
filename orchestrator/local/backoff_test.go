package local

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// fakeKVMesh is a kvmesh stand-in: its sim reports addresses and runs,
// its sidecar fails at once, every time.
const fakeKVMesh = `#!/bin/sh
case "$1" in
sim)
	echo "$*" >> "$0.sim-args"
	echo "http http://127.0.0.1:9"
	echo "kv-events x 0 tcp://127.0.0.1:9"
	echo "kv-replay x 0 tcp://127.0.0.1:9"
	exec sleep 600 ;;
*) exit 1 ;;
esac
`

const oneDecode = `apiVersion: kvmesh.io/v1alpha1
kind: ModelDeployment
metadata: {name: demo}
spec:
  model: kvmesh-sim
  engine: vllm
  roles: [{name: decode, kind: decode, replicas: 1, template: {}}]
`

// TestRecoveryBacksOff: a replica whose sidecar keeps failing is
// recovered at once the first time, then after 1 s, 2 s, 4 s ... at most
// 30 s after each failure, and at once again once its last recovery is
// 60 s old. The clock is the step's (injected), the processes are real.
func TestRecoveryBacksOff(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "kvmesh")
	if err := os.WriteFile(exe, []byte(fakeKVMesh), 0o700); err != nil {
		t.Fatal(err)
	}
	spec, err := ParseSpec([]byte(oneDecode))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.File, cfg.Exe, cfg.StartTimeout, cfg.StopTimeout = "x", exe, 10*time.Second, 5*time.Second
	var logs testutil.SyncBuffer
	s := newSupervisor(cfg, slog.New(slog.NewTextHandler(&logs, nil)), "nats://127.0.0.1:1", "127.0.0.1:1", make(chan struct{}, 1))
	t.Cleanup(s.stopAll)
	s.setSpec(&spec.Deployments[0])
	ctx := context.Background()
	if err := s.Scale(ctx, "demo", "decode", 1); err != nil {
		t.Fatal(err)
	}
	failed := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.roles[roleKey{"demo", "decode"}][0].sidecar.exitedUnasked()
	}
	now := time.Unix(1_000_000, 0)
	recoverAt := func(at time.Duration) []string {
		testutil.WaitFor(t, 10*time.Second, "the sidecar failed", failed)
		return s.recoverCrashed(ctx, now.Add(at))
	}
	if got := recoverAt(0); len(got) != 1 {
		t.Fatalf("first failure: recovered %v, want at once", got)
	}
	seen := time.Duration(0) // when the pending failure was first seen
	for _, delay := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		delay *= time.Second
		seen += 100 * time.Millisecond
		if got := recoverAt(seen); len(got) != 0 {
			t.Fatalf("failure seen at %v: recovered %v at once, want a wait of %v", seen, got, delay)
		}
		if got := recoverAt(seen + delay - time.Millisecond); len(got) != 0 {
			t.Fatalf("recovered %v before the %v back-off ended", got, delay)
		}
		if got := recoverAt(seen + delay); len(got) != 1 {
			t.Fatalf("not recovered once the %v back-off ended: %v", delay, got)
		}
		seen += delay
	}
	// Up for the reset time since its last recovery: at once again.
	if got := recoverAt(seen + backoffReset); len(got) != 1 {
		t.Fatalf("after %v up: recovered %v, want at once", backoffReset, got)
	}
	if r := s.Snapshot()[0]; r.Restarts != 9 {
		t.Errorf("restarts %d, want 9", r.Restarts)
	}
	if n := strings.Count(logs.String(), "backing off"); n != 7 {
		t.Errorf("%d back-off warnings, want one per delayed failure (7):\n%s", n, logs.String())
	}
}

// TestRecoveryUsesCurrentSpec: a replica recovered after its spec changed
// is made from the current spec, not its old copy, under every policy
// (None included: an outdated replica is recreated whole).
func TestRecoveryUsesCurrentSpec(t *testing.T) {
	for _, policy := range []string{"None", "RoleRecreate", "GroupRecreate"} {
		t.Run(policy, func(t *testing.T) {
			exe := filepath.Join(t.TempDir(), "kvmesh")
			if err := os.WriteFile(exe, []byte(fakeKVMesh), 0o700); err != nil {
				t.Fatal(err)
			}
			parse := func(doc string) *Spec {
				s, err := ParseSpec([]byte(strings.Replace(doc, "engine: vllm", "engine: vllm\n  recoveryPolicy: "+policy, 1)))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			cfg := DefaultConfig()
			cfg.File, cfg.Exe, cfg.StartTimeout, cfg.StopTimeout = "x", exe, 10*time.Second, 5*time.Second
			s := newSupervisor(cfg, slog.New(slog.DiscardHandler), "nats://127.0.0.1:1", "127.0.0.1:1", make(chan struct{}, 1))
			t.Cleanup(s.stopAll)
			s.setSpec(&parse(oneDecode).Deployments[0])
			ctx := context.Background()
			if err := s.Scale(ctx, "demo", "decode", 1); err != nil {
				t.Fatal(err)
			}
			changed := strings.Replace(oneDecode, "model: kvmesh-sim", "model: other-model", 1)
			changed = strings.Replace(changed, "template: {}", `template: {metadata: {annotations: {kvmesh.io/local-sim-args: "--time-scale 2"}}}`, 1)
			s.setSpec(&parse(changed).Deployments[0])
			testutil.WaitFor(t, 10*time.Second, "the sidecar failed", func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.roles[roleKey{"demo", "decode"}][0].sidecar.exitedUnasked()
			})
			if got := s.recoverCrashed(ctx, time.Now()); len(got) != 1 || !strings.HasPrefix(got[0], "replica ") {
				t.Fatalf("recovered %v, want the replica recreated", got)
			}
			b, err := os.ReadFile(exe + ".sim-args")
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 2 || !strings.Contains(lines[1], "--model other-model") || !strings.HasSuffix(lines[1], "--time-scale 2") {
				t.Fatalf("sim command lines:\n%s\nwant the second on the changed model and flags", b)
			}
		})
	}
}
