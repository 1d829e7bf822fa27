package local

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// replica is one engine: a `kvmesh sim` and the `kvmesh sidecar` beside it.
// The supervisor's mutex guards the fields that change after start.
type replica struct {
	id      string // engine id in the mesh: <deployment>-<role>-<index>
	md      string
	role    string
	kind    v1alpha1.RoleKind
	index   int
	model   string
	simArgs []string // extra flags from the spec
	rev     string   // revision of the spec it was made from

	backoffLogged bool // its pending back-off was logged (loop goroutine only)

	sim, sidecar *proc
	addrs        simAddrs
	started      time.Time
	restarts     int
	draining     bool
}

// simAddrs is what a sim reports on stdout once it serves.
type simAddrs struct {
	url, events, replay, side string
}

// parseSimLine records one `kvmesh sim` stdout line (sim.Run writes them).
func (a *simAddrs) parseSimLine(line string) {
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "http":
		a.url = f[1]
	case len(f) >= 4 && f[0] == "kv-events" && f[2] == "0":
		a.events = f[3]
	case len(f) >= 4 && f[0] == "kv-replay" && f[2] == "0":
		a.replay = f[3]
	case len(f) >= 4 && f[0] == "nixl-side-channel" && f[2] == "0":
		a.side = f[3]
	}
}

func (a simAddrs) complete() bool { return a.url != "" && a.events != "" && a.replay != "" }

// host:port of a URL or a tcp:// endpoint.
func hostPort(s string) string {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "http://"), "tcp://")
	return strings.TrimSuffix(s, "/")
}

// simCommand is the sim's argument list; pinned (after a crash with the
// None recovery policy) reuses the previous addresses so the sidecar beside
// it keeps working.
func (r *replica) simCommand(pinned *simAddrs) []string {
	httpAddr, events, replay, side := "127.0.0.1:0", "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", "127.0.0.1:0"
	if pinned != nil {
		httpAddr, events, replay = hostPort(pinned.url), pinned.events, pinned.replay
		if pinned.side != "" {
			side = pinned.side
		}
	}
	args := []string{"sim", "--model", r.model, "--http", httpAddr, "--kv-events", events, "--kv-replay", replay,
		"--seed", strconv.Itoa(r.index + 1)}
	if r.kind == v1alpha1.RolePrefill || r.kind == v1alpha1.RoleDecode {
		args = append(args, "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`, "--nixl-side-channel", side)
	}
	return append(args, r.simArgs...)
}

// sidecarCommand: node is the sidecar's gossip name, its own for every
// sidecar started. A restarted sidecar must not claim its old self's name:
// the mesh keeps that name for the old member until it is found dead
// (seconds after a SIGKILL), and refuses it meanwhile (gossip.ErrNameTaken:
// the new sidecar would exit, and be restarted, in a loop). The engine id
// stays the replica's; two members gossiping one engine for a moment is
// what a restart beside the old self looks like, and the mesh follows the
// newest.
func (r *replica) sidecarCommand(natsURL, seed, node string) []string {
	return []string{"sidecar", "--engine-id", r.id, "--model", r.model, "--engine-url", r.addrs.url,
		"--role", string(r.kind), "--events", r.addrs.events, "--replay", r.addrs.replay,
		"--nats", natsURL, "--gossip-bind", "127.0.0.1:0", "--join", seed, "--gossip-profile", "local",
		"--node-name", node, "--admin", "", "--block-size", r.blockSize(),
		"--pd-group", r.md + "-0", // one group per deployment locally, named as the controller names group 0
		"--log-format", "text"} // beside the simulators' and the supervisor's own text on the terminal
}

// blockSize is the sim's --block-size among the spec's sim flags, else
// the sim's default (16); the sidecar gossips it for the ingresses.
func (r *replica) blockSize() string {
	bs := "16"
	for i, a := range r.simArgs {
		if v, ok := strings.CutPrefix(a, "--block-size="); ok {
			bs = v
		} else if (a == "--block-size" || a == "-block-size") && i+1 < len(r.simArgs) {
			bs = r.simArgs[i+1]
		}
	}
	return bs
}

// startSim starts the sim and waits until it reports its addresses.
func (s *Supervisor) startSim(ctx context.Context, r *replica, pinned *simAddrs) (*proc, simAddrs, error) {
	var mu sync.Mutex
	var a simAddrs
	got := make(chan struct{})
	var once sync.Once
	p, err := startProc("sim "+r.id, s.cfg.Exe, r.simCommand(pinned), s.env, s.cfg.ChildStderr, func(line string) {
		mu.Lock()
		a.parseSimLine(line)
		ok := a.complete()
		mu.Unlock()
		if ok {
			once.Do(func() { close(got) })
		}
	}, s.exited)
	if err != nil {
		return nil, a, err
	}
	t := time.NewTimer(s.cfg.StartTimeout)
	defer t.Stop()
	select {
	case <-got:
		mu.Lock()
		defer mu.Unlock()
		return p, a, nil
	case <-p.done:
		err = fmt.Errorf("sim %s exited at start: %v", r.id, p.err)
	case <-t.C:
		err = fmt.Errorf("sim %s did not report its addresses within %v", r.id, s.cfg.StartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = p.stop(context.Background(), s.cfg.StopTimeout)
	return nil, a, err
}

func (s *Supervisor) startSidecar(r *replica) (*proc, error) {
	s.mu.Lock()
	s.sidecarSeq++
	node := fmt.Sprintf("sidecar-%s-%d", r.id, s.sidecarSeq)
	s.mu.Unlock()
	return startProc("sidecar "+r.id, s.cfg.Exe, r.sidecarCommand(s.natsURL, s.seed, node), s.env, s.cfg.ChildStderr, nil, s.exited)
}

// start runs the replica's sim, then its sidecar.
func (s *Supervisor) start(ctx context.Context, r *replica) error {
	sim, addrs, err := s.startSim(ctx, r, nil)
	if err != nil {
		return err
	}
	r.sim, r.addrs, r.started = sim, addrs, time.Now()
	sc, err := s.startSidecar(r)
	if err != nil {
		_ = sim.stop(context.Background(), s.cfg.StopTimeout)
		return err
	}
	r.sidecar = sc
	return nil
}

// stopNow stops the sidecar (it leaves the gossip cluster, so ingresses
// stop routing to the engine), then the sim.
func (s *Supervisor) stopNow(ctx context.Context, r *replica) error {
	var errs []error
	if r.sidecar != nil {
		errs = append(errs, r.sidecar.stop(ctx, s.cfg.StopTimeout))
	}
	if r.sim != nil {
		errs = append(errs, r.sim.stop(ctx, s.cfg.StopTimeout))
	}
	return errors.Join(errs...)
}

// drain is a scale-down: the sidecar goes first (the mesh stops sending),
// then the sim is given until DrainTimeout to finish what it runs, then
// SIGTERM. ctx ending (the orchestrator stopping) cuts the wait short.
func (s *Supervisor) drain(ctx context.Context, r *replica) error {
	var errs []error
	if r.sidecar != nil {
		errs = append(errs, r.sidecar.stop(ctx, s.cfg.StopTimeout))
	}
	if r.sim != nil {
		s.waitIdle(ctx, r.addrs.url)
		errs = append(errs, r.sim.stop(ctx, s.cfg.StopTimeout))
	}
	return errors.Join(errs...)
}

// waitIdle polls the engine's /metrics until it runs and queues nothing,
// DrainTimeout passes or ctx ends.
func (s *Supervisor) waitIdle(ctx context.Context, url string) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DrainTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for {
		if busy, err := engineBusy(ctx, client, url); err == nil && busy == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
