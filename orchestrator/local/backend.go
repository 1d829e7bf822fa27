package local

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Backend runs each role's replicas; the reconcile step reads and scales
// it. Methods are called from one goroutine (the orchestrator's loop).
type Backend interface {
	// Replicas lists the engine ids of a role's replicas that are not
	// draining, in index order.
	Replicas(deployment, role string) []string
	// Scale starts replicas, or drains the highest-indexed ones, until the
	// role has n. Starting returns once the processes run (readiness is
	// seen in the mesh); draining goes on in the background.
	Scale(ctx context.Context, deployment, role string, n int) error
}

var _ Backend = (*Supervisor)(nil)

// Supervisor is the process Backend: it starts, drains, restarts and stops
// the sim + sidecar children.
type Supervisor struct {
	cfg     Config
	log     *slog.Logger
	natsURL string
	seed    string   // gossip address the sidecars join
	env     []string // children's environment
	exited  chan struct{}

	// mu guards the maps and the replicas' mutable fields; the loop
	// goroutine writes, drain goroutines and Snapshot read.
	mu       sync.Mutex
	roles    map[roleKey][]*replica // live replicas by role, in index order
	specs    map[string]*v1alpha1.ModelDeployment
	draining map[*replica]bool
	// sidecarSeq numbers the sidecars started, for their gossip names.
	sidecarSeq int
	// backoffs delay repeated recoveries, by replica id or, under
	// GroupRecreate, by "group:<deployment>". Loop goroutine only.
	backoffs map[string]*backoff

	drainCtx    context.Context
	drainCancel context.CancelFunc
	drains      sync.WaitGroup
}

type roleKey struct{ md, role string }

// newSupervisor needs the NATS URL and gossip seed the children use.
func newSupervisor(cfg Config, log *slog.Logger, natsURL, seed string, exited chan struct{}) *Supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	env := os.Environ()
	if cfg.GossipKey != "" {
		env = append(env, "KVMESH_GOSSIP_KEY="+cfg.GossipKey)
	}
	return &Supervisor{cfg: cfg, log: log, natsURL: natsURL, seed: seed, env: env, exited: exited,
		roles: map[roleKey][]*replica{}, specs: map[string]*v1alpha1.ModelDeployment{}, draining: map[*replica]bool{},
		backoffs: map[string]*backoff{}, drainCtx: ctx, drainCancel: cancel}
}

// setSpec records the deployment whose roles Scale starts.
func (s *Supervisor) setSpec(md *v1alpha1.ModelDeployment) {
	s.mu.Lock()
	s.specs[md.Name] = md
	s.mu.Unlock()
}

// Replicas implements Backend.
func (s *Supervisor) Replicas(md, role string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.roles[roleKey{md, role}] {
		out = append(out, r.id)
	}
	return out
}

// EngineURL is a live replica's engine URL ("" when unknown): the SLO
// mode reads the engine's metrics there.
func (s *Supervisor) EngineURL(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range s.roles {
		for _, r := range rs {
			if r.id == id {
				return r.addrs.url
			}
		}
	}
	return ""
}

var _ engineURLs = (*Supervisor)(nil)

// Scale implements Backend. Scaling down needs no spec: a role removed
// from the file is drained to zero.
func (s *Supervisor) Scale(ctx context.Context, md, role string, n int) error {
	k := roleKey{md, role}
	s.mu.Lock()
	spec := s.specs[md]
	cur := len(s.roles[k])
	s.mu.Unlock()
	if cur < n && (spec == nil || roleOf(spec, role) == nil) {
		return fmt.Errorf("scale %s/%s: no such role", md, role)
	}
	for ; cur < n; cur++ {
		r := s.newReplica(spec, roleOf(spec, role))
		if err := s.start(ctx, r); err != nil {
			return fmt.Errorf("scale %s/%s up: %w", md, role, err)
		}
		s.mu.Lock()
		s.roles[k] = append(s.roles[k], r)
		sort.Slice(s.roles[k], func(i, j int) bool { return s.roles[k][i].index < s.roles[k][j].index })
		s.mu.Unlock()
		s.log.Info("replica started", "engine", r.id, "sim_pid", r.sim.pid(), "sidecar_pid", r.sidecar.pid())
	}
	for ; cur > n; cur-- {
		s.mu.Lock()
		rs := s.roles[k]
		r := rs[len(rs)-1]
		s.roles[k] = rs[:len(rs)-1]
		r.draining = true
		s.draining[r] = true
		s.mu.Unlock()
		s.log.Info("replica draining", "engine", r.id)
		s.drains.Add(1)
		go func() { // owned by s: drainCtx ends it early, stop waits for it
			defer s.drains.Done()
			if err := s.drain(s.drainCtx, r); err != nil {
				s.log.Warn("drain", "engine", r.id, "err", err)
			}
			s.mu.Lock()
			delete(s.draining, r)
			s.mu.Unlock()
			s.log.Info("replica stopped", "engine", r.id)
		}()
	}
	return nil
}

// newReplica takes the lowest index not in use (draining ones included,
// so an engine id is never served twice at once).
func (s *Supervisor) newReplica(md *v1alpha1.ModelDeployment, role *v1alpha1.Role) *replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := map[int]bool{}
	for _, r := range s.roles[roleKey{md.Name, role.Name}] {
		used[r.index] = true
	}
	for r := range s.draining {
		if r.md == md.Name && r.role == role.Name {
			used[r.index] = true
		}
	}
	i := 0
	for used[i] {
		i++
	}
	return &replica{id: fmt.Sprintf("%s-%s-%d", md.Name, role.Name, i), md: md.Name, role: role.Name, kind: role.Kind,
		index: i, model: md.Spec.Model, simArgs: simArgs(md, role), rev: revision(md, role)}
}

// revision is what a replica is made from in the spec: the model, the
// engine, the role's kind and the sim flags (the deployment's and the
// role template's annotation). A change rolls the role's replicas, as a
// change of the pods' revision does on Kubernetes.
func revision(md *v1alpha1.ModelDeployment, r *v1alpha1.Role) string {
	return strings.Join(append([]string{md.Spec.Model, string(md.Spec.Engine), string(r.Kind)}, simArgs(md, r)...), "\x00")
}

// current is the role spec r is to be made from now (nil: its role or
// deployment is gone).
func (s *Supervisor) current(r *replica) (*v1alpha1.ModelDeployment, *v1alpha1.Role) {
	md := s.specs[r.md]
	if md == nil {
		return nil, nil
	}
	role := roleOf(md, r.role)
	if role == nil {
		return nil, nil
	}
	return md, role
}

// outdated reports a replica made from another revision than its role's
// current one.
func (s *Supervisor) outdated(r *replica) bool {
	md, role := s.current(r)
	return md != nil && revision(md, role) != r.rev
}

// Restart back-off: a replica (a group under GroupRecreate) that fails
// again within backoffReset of its last recovery waits backoffBase, then
// twice as long each time, at most backoffMax; one that stayed up
// backoffReset is recovered at once again.
const (
	backoffBase  = time.Second
	backoffMax   = 30 * time.Second
	backoffReset = 60 * time.Second
)

type backoff struct {
	delay     time.Duration // the wait before the pending recovery
	due       time.Time     // a failure is pending until then (zero: none)
	recovered time.Time     // the last recovery
}

// ready reports whether a failure seen at now may be recovered; the
// first call for a failure sets its delay from the recoveries before it.
func (b *backoff) ready(now time.Time) (ok bool, wait time.Duration) {
	if b.due.IsZero() {
		switch {
		case b.recovered.IsZero() || now.Sub(b.recovered) >= backoffReset:
			b.delay = 0
		case b.delay == 0:
			b.delay = backoffBase
		default:
			b.delay = min(2*b.delay, backoffMax)
		}
		b.due = now.Add(b.delay)
	}
	if now.Before(b.due) {
		return false, b.due.Sub(now)
	}
	b.due, b.recovered = time.Time{}, now
	return true, 0
}

// recoverCrashed restarts children that exited unasked, per the
// deployment's recovery policy: None restarts the crashed process alone
// (a sim on its previous addresses), RoleRecreate (the default) the
// replica's sim and sidecar, GroupRecreate every replica of the deployment.
// A replica made from an outdated spec is recreated whole from the current
// one whatever the policy. Repeated failures back off (backoff). It returns
// what it restarted.
func (s *Supervisor) recoverCrashed(ctx context.Context, now time.Time) []string {
	s.mu.Lock()
	var crashed []*replica
	for _, rs := range s.roles {
		for _, r := range rs {
			if r.sim.exitedUnasked() || r.sidecar.exitedUnasked() {
				crashed = append(crashed, r)
			}
		}
	}
	s.mu.Unlock()
	sort.Slice(crashed, func(i, j int) bool { return crashed[i].id < crashed[j].id })
	var done []string
	groups := map[string]bool{}
	for _, r := range crashed {
		spec := s.specs[r.md]
		key := r.id
		if spec.Spec.RecoveryPolicy == v1alpha1.RecoverGroup {
			key = "group:" + r.md
		}
		if groups[key] {
			continue // one recovery per group per step
		}
		groups[key] = true
		b := s.backoffs[key]
		if b == nil {
			b = &backoff{}
			s.backoffs[key] = b
		}
		if ok, wait := b.ready(now); !ok {
			if !r.backoffLogged {
				r.backoffLogged = true
				s.log.Warn("replica process exited again soon after its recovery; backing off", "engine", r.id,
					"recovery", spec.Spec.RecoveryPolicy, "retry_in", wait.Round(time.Millisecond),
					"sim_err", procErr(r.sim), "sidecar_err", procErr(r.sidecar))
			}
			s.wakeAfter(wait)
			continue
		}
		r.backoffLogged = false
		switch {
		case spec.Spec.RecoveryPolicy == v1alpha1.RecoverGroup:
			done = append(done, s.restartGroup(ctx, r.md)...)
		case spec.Spec.RecoveryPolicy == v1alpha1.RecoverNone && !s.outdated(r):
			done = append(done, s.restartProcess(ctx, r))
		default:
			done = append(done, s.restartReplica(ctx, r, "replica process exited; recreating the replica"))
		}
	}
	return done
}

// wakeAfter signals the loop (as a child's exit does) once d has passed,
// so a backed-off recovery is not late by up to an interval.
func (s *Supervisor) wakeAfter(d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case s.exited <- struct{}{}:
		default:
		}
	})
}

func (s *Supervisor) restartProcess(ctx context.Context, r *replica) string {
	if r.sim.exitedUnasked() {
		s.log.Warn("sim exited; restarting it alone (recovery None)", "engine", r.id, "err", r.sim.err)
		p, _, err := s.startSim(ctx, r, &r.addrs)
		if err != nil {
			s.log.Error("restart sim", "engine", r.id, "err", err)
			return "sim " + r.id + " (failed)"
		}
		s.mu.Lock()
		r.sim, r.restarts = p, r.restarts+1
		s.mu.Unlock()
		return "sim " + r.id
	}
	s.log.Warn("sidecar exited; restarting it alone (recovery None)", "engine", r.id, "err", r.sidecar.err)
	p, err := s.startSidecar(r)
	if err != nil {
		s.log.Error("restart sidecar", "engine", r.id, "err", err)
		return "sidecar " + r.id + " (failed)"
	}
	s.mu.Lock()
	r.sidecar, r.restarts = p, r.restarts+1
	s.mu.Unlock()
	return "sidecar " + r.id
}

// restartReplica stops r's processes and starts them again, in place
// (same engine id), from the current spec.
func (s *Supervisor) restartReplica(ctx context.Context, r *replica, why string) string {
	s.log.Warn(why, "engine", r.id, "sim_err", procErr(r.sim), "sidecar_err", procErr(r.sidecar))
	_ = s.stopNow(ctx, r)
	fresh := *r
	if md, role := s.current(r); md != nil {
		fresh.kind, fresh.model, fresh.simArgs, fresh.rev = role.Kind, md.Spec.Model, simArgs(md, role), revision(md, role)
	}
	if err := s.start(ctx, &fresh); err != nil {
		s.log.Error("recreate replica", "engine", r.id, "err", err)
		return "replica " + r.id + " (failed)"
	}
	s.mu.Lock()
	r.sim, r.sidecar, r.addrs, r.started, r.restarts = fresh.sim, fresh.sidecar, fresh.addrs, fresh.started, r.restarts+1
	r.kind, r.model, r.simArgs, r.rev = fresh.kind, fresh.model, fresh.simArgs, fresh.rev
	s.mu.Unlock()
	return "replica " + r.id
}

func (s *Supervisor) restartGroup(ctx context.Context, md string) []string {
	s.log.Warn("a replica process exited; recreating the group (recovery GroupRecreate)", "deployment", md)
	s.mu.Lock()
	var rs []*replica
	for k, v := range s.roles {
		if k.md == md {
			rs = append(rs, v...)
		}
	}
	s.mu.Unlock()
	var out []string
	for _, r := range rs {
		out = append(out, s.restartReplica(ctx, r, "recreating the replica with its group (recovery GroupRecreate)"))
	}
	return out
}

// rollOutdated recreates, from the current spec, the replicas made from
// an older one (a changed model, engine, role kind or sim flags), as the
// Kubernetes controller rolls a role's pods with maxUnavailable 1: an
// outdated replica that is not ready goes at once, a ready one only while
// every replica of its role is ready (so one at a time), the highest index
// first. ready reports a replica serving in the mesh at its current URL.
// A crashed replica is left to recoverCrashed (which also uses the current
// spec). It returns what it recreated.
func (s *Supervisor) rollOutdated(ctx context.Context, ready func(id, url string) bool) []string {
	s.mu.Lock()
	keys := make([]roleKey, 0, len(s.roles))
	for k := range s.roles {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].md != keys[j].md {
			return keys[i].md < keys[j].md
		}
		return keys[i].role < keys[j].role
	})
	var out []string
	for _, k := range keys {
		s.mu.Lock()
		rs := slices.Clone(s.roles[k])
		s.mu.Unlock()
		allReady := true
		var stale []*replica
		for _, r := range rs {
			up := ready(r.id, r.addrs.url)
			allReady = allReady && up
			if !s.outdated(r) || r.sim.exitedUnasked() || r.sidecar.exitedUnasked() {
				continue
			}
			if !up {
				out = append(out, s.restartReplica(ctx, r, "rolling the replica to the changed spec (not ready: at once)"))
				continue
			}
			stale = append(stale, r)
		}
		if len(stale) > 0 && allReady {
			r := stale[len(stale)-1]
			out = append(out, s.restartReplica(ctx, r, "rolling the replica to the changed spec"))
		}
	}
	return out
}

func procErr(p *proc) string {
	if p == nil || !p.exitedUnasked() {
		return ""
	}
	if p.err == nil {
		return "exit 0"
	}
	return p.err.Error()
}

// stopAll stops every replica, live and draining, concurrently, and waits
// for each child to be reaped.
func (s *Supervisor) stopAll() {
	s.drainCancel()
	s.mu.Lock()
	var all []*replica
	for _, rs := range s.roles {
		all = append(all, rs...)
	}
	s.roles = map[roleKey][]*replica{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range all {
		wg.Go(func() {
			if err := s.stopNow(context.Background(), r); err != nil {
				s.log.Warn("stop", "engine", r.id, "err", err)
			}
		})
	}
	wg.Wait()
	s.drains.Wait()
}

// ReplicaInfo is one replica in a Snapshot.
type ReplicaInfo struct {
	ID, Deployment, Role string
	Kind                 string
	URL                  string
	SimPID, SidecarPID   int
	Restarts             int
	Draining             bool
	Started              time.Time
}

// Snapshot lists every replica, draining ones included, by id.
func (s *Supervisor) Snapshot() []ReplicaInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ReplicaInfo
	add := func(r *replica) {
		out = append(out, ReplicaInfo{ID: r.id, Deployment: r.md, Role: r.role, Kind: string(r.kind), URL: r.addrs.url,
			SimPID: r.sim.pid(), SidecarPID: r.sidecar.pid(), Restarts: r.restarts, Draining: r.draining, Started: r.started})
	}
	for _, rs := range s.roles {
		for _, r := range rs {
			add(r)
		}
	}
	for r := range s.draining {
		add(r)
	}
	slices.SortFunc(out, func(a, b ReplicaInfo) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}
