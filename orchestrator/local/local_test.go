package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// observer joins the mesh at seed as an orchestrator-role member, as
// `kvmesh get engines` does, and sees what the sidecars gossip.
func observer(t *testing.T, seed string) *gossip.Node {
	t.Helper()
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.Join = "test-observer", "local", []string{seed}
	g.Meta = gossip.NodeMeta{Role: gossip.RoleOrchestrator, ID: "test-observer"}
	g.RejoinInterval = 200 * time.Millisecond
	n, err := gossip.New(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func readyEngine(n *gossip.Node, id, role string) bool {
	e, ok := n.Engine(id)
	return ok && e.Ready && e.EngineRole == role && e.Group == "demo-0" // the deployment's one P/D group
}

// startLocal runs an Orchestrator on spec until the test ends and returns
// it with a stop function that waits for Run to return.
func startLocal(t *testing.T, spec string, tweak func(*Config)) (*Orchestrator, string, func() error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.File, cfg.Exe, cfg.Interval = path, kvmeshBin(t), 200*time.Millisecond
	cfg.DrainTimeout = 5 * time.Second
	if testing.Verbose() {
		cfg.ChildStderr = os.Stderr
	}
	if tweak != nil {
		tweak(&cfg)
	}
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * time.Minute):
			t.Fatal("Run did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case <-o.Started():
	case err := <-done:
		stopped = true
		t.Fatalf("Run: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("not started")
	}
	return o, path, stop
}

// TestLocalPDLifecycle: a P/D ModelDeployment's replicas come up and join
// the mesh with their roles; raising the policy's min adds a process that
// joins; a killed child is restarted; stopping leaves no process.
func TestLocalPDLifecycle(t *testing.T) {
	o, path, stop := startLocal(t, pdSpec, nil)
	obs := observer(t, o.Status().Gossip)
	pids := map[int]string{}
	record := func() {
		for _, p := range o.Status().PIDs() {
			pids[p] = "child"
		}
	}
	testutil.WaitFor(t, time.Minute, "prefill and decode engines ready in the mesh", func() bool {
		return readyEngine(obs, "demo-prefill-0", "prefill") && readyEngine(obs, "demo-decode-0", "decode")
	})
	record()

	// Scale: raise the policy's prefill min to 2.
	raised := strings.Replace(pdSpec, "{name: prefill, minReplicas: 1", "{name: prefill, minReplicas: 2", 1)
	if err := os.WriteFile(path, []byte(raised), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "a second prefill engine in the mesh", func() bool {
		return readyEngine(obs, "demo-prefill-1", "prefill")
	})
	testutil.WaitFor(t, 30*time.Second, "status: prefill desired 2, ready 2", func() bool {
		r, _ := o.Status().Role("demo", "prefill")
		return r.Desired == 2 && r.Ready == 2
	})
	record()

	// Crash: kill the decode sim; RoleRecreate restarts the replica.
	r, _ := o.Status().Role("demo", "decode")
	old := r.Engines[0]
	if err := syscall.Kill(old.SimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the decode replica restarted and ready", func() bool {
		r, _ := o.Status().Role("demo", "decode")
		return len(r.Engines) == 1 && r.Engines[0].Restarts >= 1 && r.Engines[0].SimPID != old.SimPID && r.Engines[0].Ready
	})
	if alive(old.SidecarPID) {
		t.Errorf("the crashed replica's old sidecar %d still runs", old.SidecarPID)
	}
	record()

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(pids) < 5 {
		t.Fatalf("saw %d child pids, want ≥ 5: %v", len(pids), pids)
	}
	noneAlive(t, pids)
}

// TestLocalCommandSIGTERM runs `kvmesh orchestrator --local` as a process:
// its status file lists the children, SIGTERM stops it and every child.
func TestLocalCommandSIGTERM(t *testing.T) {
	dir := t.TempDir()
	spec, status := filepath.Join(dir, "spec.yaml"), filepath.Join(dir, "status.json")
	if err := os.WriteFile(spec, []byte(pdSpec+routeDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	cmd := exec.Command(kvmeshBin(t), "orchestrator", "--local", spec, "--status-file", status, "--interval", "200ms", "--ingress")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "TMPDIR="+dir) // its temporary files (NATS store, route file) go with the test's
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	var st Status
	testutil.WaitFor(t, time.Minute, "status file with both roles ready and an ingress", func() bool {
		b, err := os.ReadFile(status)
		if err != nil || json.Unmarshal(b, &st) != nil {
			return false
		}
		p, _ := st.Role("demo", "prefill")
		d, _ := st.Role("demo", "decode")
		return p.Ready == 1 && d.Ready == 1 && st.Ingress != ""
	})
	// The spec's ModelRoute reaches the ingress, and a changed one replaces it.
	complete := func(model string) int {
		resp, err := http.Post(st.Ingress+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":2}`))
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	testutil.WaitFor(t, time.Minute, "model chat served through the route (once the ingress sees the engines)", func() bool {
		return complete("chat") == http.StatusOK
	})
	if err := os.WriteFile(spec, []byte(pdSpec+strings.ReplaceAll(routeDoc, "chat", "assistant")), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the changed route served, the old one gone", func() bool {
		return complete("assistant") == http.StatusOK && complete("chat") == http.StatusNotFound
	})
	pids := map[int]string{}
	for _, p := range st.PIDs() {
		pids[p] = "child"
	}
	if len(pids) != 5 {
		t.Fatalf("status lists %d children, want 2 sims + 2 sidecars + 1 ingress", len(pids))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("no exit after SIGTERM\n%s", out.String())
	}
	noneAlive(t, pids)
	if !strings.Contains(out.String(), "demo/prefill (prefill): desired 1, replicas 1, ready 1") {
		t.Errorf("no status line on stdout:\n%s", out.String())
	}
}

// TestLocalKilledOrchestratorTakesChildren: even SIGKILL (no chance to
// stop anything) leaves no child behind: the kernel ends them (Pdeathsig).
func TestLocalKilledOrchestratorTakesChildren(t *testing.T) {
	dir := t.TempDir()
	spec, status := filepath.Join(dir, "spec.yaml"), filepath.Join(dir, "status.json")
	if err := os.WriteFile(spec, []byte(pdSpec), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kvmeshBin(t), "orchestrator", "--local", spec, "--status-file", status, "--interval", "200ms", "--quiet")
	var out bytes.Buffer
	cmd.Stderr = &out
	cmd.Env = append(os.Environ(), "TMPDIR="+dir) // killed, it cannot remove its temporary files: the test's directory takes them
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var st Status
	testutil.WaitFor(t, time.Minute, "status file with four children", func() bool {
		b, err := os.ReadFile(status)
		return err == nil && json.Unmarshal(b, &st) == nil && len(st.PIDs()) == 4
	})
	_ = cmd.Process.Kill()
	if err := cmd.Wait(); err == nil || !errors.As(err, new(*exec.ExitError)) {
		t.Fatalf("wait: %v", err)
	}
	testutil.WaitFor(t, 30*time.Second, "every child gone", func() bool {
		for _, p := range st.PIDs() {
			if alive(p) {
				return false
			}
		}
		return true
	})
}

// TestLocalRecoveryPolicies: a SIGKILLed sidecar is recovered once per
// policy, not in a loop: None restarts it alone (the sim beside it keeps
// its pid), RoleRecreate recreates its replica, GroupRecreate every replica
// of the deployment. The new sidecar joins under a name of its own while
// the mesh still holds the killed one's (it would be refused the old name
// until the mesh finds its owner dead), and once the killed member is gone
// from the mesh and several more steps have run, each replica was
// recovered exactly once.
func TestLocalRecoveryPolicies(t *testing.T) {
	for _, policy := range []string{"None", "RoleRecreate", "GroupRecreate"} {
		t.Run(policy, func(t *testing.T) {
			spec := strings.Replace(pdSpec, "engine: vllm", "engine: vllm\n  recoveryPolicy: "+policy, 1)
			var steps atomic.Int64
			o, _, stop := startLocal(t, spec, func(c *Config) { c.OnStatus = func(Status) { steps.Add(1) } })
			obs := observer(t, o.Status().Gossip)
			testutil.WaitFor(t, time.Minute, "both engines ready", func() bool {
				return readyEngine(obs, "demo-prefill-0", "prefill") && readyEngine(obs, "demo-decode-0", "decode")
			})
			testutil.WaitFor(t, 30*time.Second, "status shows both ready", func() bool {
				p, _ := o.Status().Role("demo", "prefill")
				d, _ := o.Status().Role("demo", "decode")
				return p.Ready == 1 && d.Ready == 1
			})
			p0, _ := o.Status().Role("demo", "prefill")
			d0, _ := o.Status().Role("demo", "decode")
			before := map[string]EngineStatus{"prefill": p0.Engines[0], "decode": d0.Engines[0]}
			oldNode := func() string { e, _ := obs.Engine("demo-decode-0"); return e.Node }()
			oldGone := make(chan struct{})
			var once sync.Once
			obs.OnLeave(func(node string) {
				if node == oldNode {
					once.Do(func() { close(oldGone) })
				}
			})
			if err := syscall.Kill(before["decode"].SidecarPID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, time.Minute, "recovered and ready", func() bool {
				p, _ := o.Status().Role("demo", "prefill")
				d, _ := o.Status().Role("demo", "decode")
				return len(d.Engines) == 1 && d.Engines[0].Restarts >= 1 && d.Ready == 1 && p.Ready == 1
			})
			// The killed member stays in the mesh until it is found dead;
			// meanwhile the new sidecar gossips the engine beside it.
			select {
			case <-oldGone:
			case <-time.After(time.Minute):
				t.Fatalf("the killed sidecar %s never left the mesh", oldNode)
			}
			mark := steps.Load()
			testutil.WaitFor(t, time.Minute, "ten more steps", func() bool { return steps.Load() >= mark+10 })
			d1, _ := o.Status().Role("demo", "decode")
			testutil.WaitFor(t, time.Minute, "the recovered engine serving in the observer's view", func() bool {
				e, ok := obs.Engine("demo-decode-0")
				return ok && e.Ready && gossip.NormalURL(e.URL) == gossip.NormalURL(d1.Engines[0].URL)
			})
			if e, _ := obs.Engine("demo-decode-0"); e.Node == oldNode {
				t.Errorf("the new sidecar took the killed one's gossip name %q", oldNode)
			}
			p1, _ := o.Status().Role("demo", "prefill")
			d1, _ = o.Status().Role("demo", "decode")
			pe, de := p1.Engines[0], d1.Engines[0]
			wantPrefill := 0
			if policy == "GroupRecreate" {
				wantPrefill = 1
			}
			if de.Restarts != 1 || pe.Restarts != wantPrefill || d1.Ready != 1 || p1.Ready != 1 {
				t.Errorf("%s: decode %+v, prefill %+v: want decode recovered once, prefill %d times, both ready", policy, de, pe, wantPrefill)
			}
			switch policy {
			case "None":
				if de.SimPID != before["decode"].SimPID || de.SidecarPID == before["decode"].SidecarPID {
					t.Errorf("None: decode %+v after %+v: want the same sim and a new sidecar", de, before["decode"])
				}
				if pe.SimPID != before["prefill"].SimPID {
					t.Errorf("None: prefill restarted too")
				}
			case "RoleRecreate":
				if de.SimPID == before["decode"].SimPID || pe.SimPID != before["prefill"].SimPID {
					t.Errorf("RoleRecreate: decode %+v prefill %+v: want decode alone recreated", de, pe)
				}
			case "GroupRecreate":
				if de.SimPID == before["decode"].SimPID || pe.SimPID == before["prefill"].SimPID {
					t.Errorf("GroupRecreate: prefill %+v decode %+v: want both recreated", pe, de)
				}
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// editSpec is a deployment without a policy: prefill 1, decode 2 and a
// mixed role "extra" 1.
const editSpec = `apiVersion: kvmesh.io/v1alpha1
kind: ModelDeployment
metadata: {name: demo}
spec:
  model: kvmesh-sim
  engine: vllm
  roles:
    - {name: prefill, kind: prefill, replicas: 1, template: {}}
    - {name: decode, kind: decode, replicas: 2, template: {}}
    - {name: extra, kind: mixed, replicas: 1, template: {}}
`

// TestLocalSpecEdits: a role removed from a deployment that stays is
// drained (its processes end, it leaves the mesh); a changed model rolls
// every replica to it, a role's replicas one at a time (one decode
// replica stays ready throughout), and none is left on the old model.
func TestLocalSpecEdits(t *testing.T) {
	var mu sync.Mutex
	var decodeReady []int32 // per step, once the roll began
	rolling := atomic.Bool{}
	o, path, stop := startLocal(t, editSpec, func(c *Config) {
		c.OnStatus = func(s Status) {
			if d, ok := s.Role("demo", "decode"); ok && rolling.Load() {
				mu.Lock()
				decodeReady = append(decodeReady, d.Ready)
				mu.Unlock()
			}
		}
	})
	obs := observer(t, o.Status().Gossip)
	ids := []string{"demo-prefill-0", "demo-decode-0", "demo-decode-1"}
	onModel := func(model string, ids ...string) bool {
		for _, id := range ids {
			if e, ok := obs.Engine(id); !ok || !e.Ready || e.Model != model {
				return false
			}
		}
		return true
	}
	testutil.WaitFor(t, time.Minute, "every engine ready", func() bool {
		return onModel("kvmesh-sim", append(ids, "demo-extra-0")...)
	})
	var extra []int
	for _, r := range o.sup.Snapshot() {
		if r.Role == "extra" {
			extra = append(extra, r.SimPID, r.SidecarPID)
		}
	}
	if len(extra) != 2 {
		t.Fatalf("extra role processes %v", extra)
	}

	// The role "extra" removed: drained.
	noExtra := strings.Replace(editSpec, "    - {name: extra, kind: mixed, replicas: 1, template: {}}\n", "", 1)
	if err := os.WriteFile(path, []byte(noExtra), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the removed role's replica stopped and gone from the mesh", func() bool {
		for _, r := range o.sup.Snapshot() {
			if r.Role == "extra" {
				return false
			}
		}
		_, inMesh := obs.Engine("demo-extra-0")
		return !inMesh && !alive(extra[0]) && !alive(extra[1])
	})

	// The model changed: every replica rolls to it. The roll is watched
	// from both decode replicas ready: one that is not (a scrape missed on
	// a starved machine, CI once: [0 0 0 0 1 ...]) is replaced at once, as
	// a Deployment replaces an unavailable pod first, which is not what
	// this checks.
	testutil.WaitFor(t, time.Minute, "status: decode 2 ready before the roll", func() bool {
		d, _ := o.Status().Role("demo", "decode")
		return d.Ready == 2
	})
	before := map[string]int{}
	for _, r := range o.sup.Snapshot() {
		before[r.ID] = r.SimPID
	}
	rolling.Store(true)
	if err := os.WriteFile(path, []byte(strings.Replace(noExtra, "model: kvmesh-sim", "model: kvmesh-sim-2", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Minute, "every engine serving the new model", func() bool { return onModel("kvmesh-sim-2", ids...) })
	testutil.WaitFor(t, 30*time.Second, "status: decode 2 ready", func() bool {
		d, _ := o.Status().Role("demo", "decode")
		return d.Ready == 2
	})
	for _, r := range o.sup.Snapshot() {
		if r.SimPID == before[r.ID] || r.Restarts != 1 {
			t.Errorf("%s: sim pid %d (was %d), restarts %d: want recreated once", r.ID, r.SimPID, before[r.ID], r.Restarts)
		}
	}
	mu.Lock()
	for i, n := range decodeReady {
		if n < 1 {
			t.Errorf("step %d of the roll: no decode replica ready (%v): want one at a time", i, decodeReady)
			break
		}
	}
	mu.Unlock()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
