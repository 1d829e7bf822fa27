package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// Orchestrator is one local backend run. Run is called once.
type Orchestrator struct {
	cfg Config

	// Owned by Run's goroutine.
	spec      *Spec
	specStamp fileStamp
	nats      *natsutil.Embedded
	natsURL   string
	node      *gossip.Node
	sup       *Supervisor
	ingress   *proc
	ingAddr   string
	routeDir  string                   // holds routes.yaml, the ingress's --routes file
	runners   map[string]*policyRunner // by deployment
	slo       *sloScraper
	exited    chan struct{}

	mu     sync.Mutex // guards status and ready
	status Status
	ready  chan struct{} // closed once everything has started
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// New validates cfg and reads the spec file.
func New(cfg Config) (*Orchestrator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := os.Stat(cfg.File)
	if err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	spec, err := LoadSpec(cfg.File)
	if err != nil {
		return nil, err
	}
	return &Orchestrator{cfg: cfg, spec: spec, specStamp: fileStamp{st.ModTime(), st.Size()},
		runners: map[string]*policyRunner{}, exited: make(chan struct{}, 1), ready: make(chan struct{})}, nil
}

// Status is the last published status.
func (o *Orchestrator) Status() Status {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.status
}

// Started is closed once NATS, the gossip observer, every initial replica
// and the ingress have started.
func (o *Orchestrator) Started() <-chan struct{} { return o.ready }

// Run starts everything, then recovers, re-reads the file, steps the
// policies and publishes the status every Interval until ctx ends; then it
// stops every child (ingress first, then the replicas: sidecars before
// their sims), leaves the mesh and stops NATS. Every child has been reaped
// when Run returns.
func (o *Orchestrator) Run(ctx context.Context) (err error) {
	defer func() { err = errors.Join(err, o.shutdown()) }()
	if err := o.startMesh(); err != nil {
		return err
	}
	if err := o.apply(ctx, nil, o.spec); err != nil {
		return err
	}
	if o.cfg.Ingress || o.spec.wantsIngress() {
		if err := o.startIngress(ctx, ""); err != nil {
			return err
		}
	}
	o.publish(time.Now(), nil, nil)
	close(o.ready)
	tick := time.NewTicker(o.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-o.exited: // a child ended: recover now, not at the next tick
		case <-tick.C:
		}
		o.step(ctx, time.Now())
	}
}

func (o *Orchestrator) startMesh() error {
	o.natsURL = o.cfg.NATSURL
	if o.natsURL == "" {
		e, err := natsutil.StartEmbedded(natsutil.EmbeddedConfig{Host: "127.0.0.1", Port: -1})
		if err != nil {
			return fmt.Errorf("start nats: %w", err)
		}
		o.nats, o.natsURL = e, e.URL()
	}
	g := gossip.DefaultConfig()
	g.Name = fmt.Sprintf("kvmesh-local-orchestrator-%d", os.Getpid())
	g.Profile = "local"
	g.BroadcastInterval, g.PushPullInterval, g.RejoinInterval = 100*time.Millisecond, time.Second, 500*time.Millisecond
	g.Meta = gossip.NodeMeta{Role: gossip.RoleOrchestrator, ID: g.Name}
	g.Logger = o.cfg.Logger
	// The comma-separated rotation list every member takes (gossip.ParseKeys);
	// the children get the same list through their environment.
	k, extra, err := gossip.ParseKeys(o.cfg.GossipKey)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	g.SecretKey, g.ExtraKeys = k, extra
	node, err := gossip.New(g)
	if err != nil {
		return fmt.Errorf("join gossip: %w", err)
	}
	o.node = node
	o.sup = newSupervisor(o.cfg, o.cfg.Logger, o.natsURL, node.Addr(), o.exited)
	if o.cfg.SLO {
		o.slo = newSLOScraper()
	}
	return nil
}

// apply moves from the old spec (nil at start) to the new one: deployments
// and roles gone are scaled to zero (drained), roles without a policy to their replicas, roles
// with one to their replicas within the policy's bounds at start (then the
// policy decides); a changed policy keeps its windows and cool-down.
func (o *Orchestrator) apply(ctx context.Context, old, spec *Spec) error {
	var errs []error
	if old != nil {
		for _, md := range old.Deployments {
			now := spec.deployment(md.Name)
			for _, r := range md.Spec.Roles {
				if now == nil || roleOf(now, r.Name) == nil { // a deployment or a role gone: drained to zero
					errs = append(errs, o.sup.Scale(ctx, md.Name, r.Name, 0))
				}
			}
			if now == nil {
				delete(o.runners, md.Name)
			}
		}
	}
	for i := range spec.Deployments {
		md := &spec.Deployments[i]
		o.sup.setSpec(md)
		ap := spec.policyFor(md.Name)
		pr, err := o.runnerFor(md.Name, ap)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range md.Spec.Roles {
			n := *r.Replicas
			scaled := pr != nil && policyRole(&pr.ap, r.Name) != nil
			if scaled && old != nil {
				continue // the policy decides from here
			}
			if scaled {
				b := policyRole(&pr.ap, r.Name)
				n = min(max(n, b.MinReplicas), b.MaxReplicas)
			}
			errs = append(errs, o.sup.Scale(ctx, md.Name, r.Name, int(n)))
		}
	}
	return errors.Join(errs...)
}

// runnerFor returns the runner of md's policy ap (nil: none): a new one
// for a new policy; for an edited one the same runner, reconfigured, so its
// roles keep their windows, panic and scale-down cool-down (an edit such as
// a raised maxReplicas must not scale anything down). An invalid edit
// keeps the runner as it was.
func (o *Orchestrator) runnerFor(md string, ap *v1alpha1.AutoscalingPolicy) (*policyRunner, error) {
	pr := o.runners[md]
	switch {
	case ap == nil:
		delete(o.runners, md)
		return nil, nil
	case pr == nil:
		npr, err := newPolicyRunner(*ap)
		if err != nil {
			return nil, err
		}
		o.runners[md] = npr
		return npr, nil
	case !reflect.DeepEqual(pr.ap.Spec, ap.Spec) || pr.ap.Name != ap.Name:
		if err := pr.a.Reconfigure(policyFromSpec(&ap.Spec)); err != nil {
			return pr, fmt.Errorf("AutoscalingPolicy %s: %w", ap.Name, err)
		}
		pr.ap = *ap
	}
	return pr, nil
}

func policyRole(ap *v1alpha1.AutoscalingPolicy, role string) *v1alpha1.RoleAutoscaling {
	for i := range ap.Spec.Roles {
		if ap.Spec.Roles[i].Name == role {
			return &ap.Spec.Roles[i]
		}
	}
	return nil
}

func (s *Spec) deployment(name string) *v1alpha1.ModelDeployment {
	for i := range s.Deployments {
		if s.Deployments[i].Name == name {
			return &s.Deployments[i]
		}
	}
	return nil
}

// step is one pass of the loop.
func (o *Orchestrator) step(ctx context.Context, now time.Time) {
	recovered := o.sup.recoverCrashed(ctx, now)
	if o.ingress != nil && o.ingress.exitedUnasked() {
		o.cfg.Logger.Warn("ingress exited; restarting it on its address", "err", o.ingress.err)
		if err := o.startIngress(ctx, o.ingAddr); err != nil {
			o.cfg.Logger.Error("restart ingress", "err", err)
		} else {
			recovered = append(recovered, "ingress")
		}
	}
	o.reload(ctx)
	rolled := o.sup.rollOutdated(ctx, o.servesAt)
	for i := range o.spec.Deployments {
		md := &o.spec.Deployments[i]
		pr := o.runners[md.Name]
		if pr == nil {
			continue
		}
		var slo *autoscale.SLOObservation
		if o.slo != nil && pr.ap.Spec.SLO != nil {
			slo = o.slo.observe(ctx, now, md, &pr.ap, o.sup, o.node)
		}
		if err := pr.step(ctx, now, md, o.sup, o.node, slo); err != nil {
			o.cfg.Logger.Warn("autoscale", "policy", pr.ap.Name, "err", err)
		}
	}
	o.publish(now, recovered, rolled)
}

// servesAt reports whether the mesh has engine id ready at url (a
// recreated replica's old state, at its old URL, does not count).
func (o *Orchestrator) servesAt(id, url string) bool {
	e, ok := o.node.Engine(id)
	return ok && e.Ready && url != "" && gossip.NormalURL(e.URL) == gossip.NormalURL(url)
}

// reload re-reads the file when its size or time changed.
func (o *Orchestrator) reload(ctx context.Context) {
	st, err := os.Stat(o.cfg.File)
	if err != nil {
		o.cfg.Logger.Warn("spec file", "err", err)
		return
	}
	stamp := fileStamp{st.ModTime(), st.Size()}
	if stamp == o.specStamp {
		return
	}
	spec, err := LoadSpec(o.cfg.File)
	if err != nil {
		o.cfg.Logger.Warn("spec file changed but is refused; keeping the last good one", "err", err)
		o.specStamp = stamp
		return
	}
	o.specStamp = stamp
	old := o.spec
	o.spec = spec
	o.cfg.Logger.Info("spec file reloaded", "file", o.cfg.File)
	if spec.RouteFile != old.RouteFile {
		if err := o.writeRoutes(); err != nil { // the ingress reloads the file itself
			o.cfg.Logger.Warn("write route file", "err", err)
		}
	}
	if err := o.apply(ctx, old, spec); err != nil {
		o.cfg.Logger.Warn("apply spec", "err", err)
	}
}

// startIngress starts `kvmesh ingress`; addr pins the listen address (a
// restart keeps the one clients use).
func (o *Orchestrator) startIngress(ctx context.Context, addr string) error {
	if addr == "" {
		addr = o.cfg.IngressListen
	}
	if o.routeDir == "" {
		dir, err := os.MkdirTemp("", "kvmesh-local-routes-")
		if err != nil {
			return err
		}
		o.routeDir = dir
		if err := o.writeRoutes(); err != nil {
			return err
		}
	}
	args := []string{"ingress", "--listen", addr, "--gossip-bind", "127.0.0.1:0", "--join", o.sup.seed,
		"--gossip-profile", "local", "--nats", o.natsURL, "--id", "kvmesh-local-ingress", "--access-log=false",
		"--routes", filepath.Join(o.routeDir, "routes.yaml")}
	if o.spec.hasPD() {
		args = append(args, "--pd-policy", o.cfg.PDPolicy)
	}
	args = append(args, o.cfg.IngressArgs...)
	got := make(chan string, 1)
	p, err := startProc("ingress", o.cfg.Exe, args, o.sup.env, o.cfg.ChildStderr, func(line string) {
		if a, ok := strings.CutPrefix(line, "kvmesh ingress listening on http://"); ok {
			select {
			case got <- a:
			default:
			}
		}
	}, o.exited)
	if err != nil {
		return err
	}
	t := time.NewTimer(o.cfg.StartTimeout)
	defer t.Stop()
	select {
	case a := <-got:
		o.ingress, o.ingAddr = p, a
		o.cfg.Logger.Info("ingress started", "addr", a, "pid", p.pid())
		return nil
	case <-p.done:
		err = fmt.Errorf("ingress exited at start: %v", p.err)
	case <-t.C:
		err = fmt.Errorf("ingress did not report its address within %v", o.cfg.StartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = p.stop(context.Background(), o.cfg.StopTimeout)
	return err
}

// writeRoutes replaces the ingress's route file with the spec's ModelRoutes
// (written aside and renamed, so the ingress never reads half a file).
func (o *Orchestrator) writeRoutes() error {
	if o.routeDir == "" {
		return nil // no ingress yet: startIngress writes it
	}
	tmp := filepath.Join(o.routeDir, ".routes.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(o.spec.RouteFile), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(o.routeDir, "routes.yaml"))
}

func (s *Spec) hasPD() bool {
	for _, md := range s.Deployments {
		for _, r := range md.Spec.Roles {
			if r.Kind == v1alpha1.RolePrefill || r.Kind == v1alpha1.RoleDecode {
				return true
			}
		}
	}
	return false
}

// shutdown stops what startMesh and the loop started, in reverse order.
func (o *Orchestrator) shutdown() error {
	var errs []error
	if o.ingress != nil {
		errs = append(errs, o.ingress.stop(context.Background(), o.cfg.StopTimeout))
	}
	if o.routeDir != "" {
		errs = append(errs, os.RemoveAll(o.routeDir))
	}
	if o.sup != nil {
		o.sup.stopAll()
	}
	if o.node != nil {
		errs = append(errs, o.node.Close())
	}
	if o.nats != nil {
		o.nats.Shutdown()
	}
	if o.slo != nil {
		o.slo.client.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// publish builds the status, stores it, writes the file and calls OnStatus.
func (o *Orchestrator) publish(now time.Time, recovered, rolled []string) {
	engines := map[string]gossip.EngineView{}
	for _, v := range o.node.Engines() {
		engines[v.ID] = v
	}
	reps := o.sup.Snapshot()
	st := Status{Time: now, Gossip: o.sup.seed, NATS: o.natsURL, Recovered: recovered, Rolled: rolled}
	if o.ingress != nil {
		st.Ingress, st.IngressPID = "http://"+o.ingAddr, o.ingress.pid()
	}
	for i := range o.spec.Deployments {
		md := &o.spec.Deployments[i]
		ds := DeploymentStatus{Name: md.Name}
		pr := o.runners[md.Name]
		for j := range md.Spec.Roles {
			r := &md.Spec.Roles[j]
			desired, reason := *r.Replicas, ""
			if pr != nil {
				if d, ok := pr.last.Roles[r.Name]; ok {
					desired, reason = d.Desired, d.Reason
				} else if policyRole(&pr.ap, r.Name) != nil {
					desired = int32(len(o.sup.Replicas(md.Name, r.Name)))
				}
			}
			ds.Roles = append(ds.Roles, roleStatus(md, r, desired, reason, reps, engines))
		}
		if pr != nil {
			ds.Policy = policyStatus(pr, ds.Roles)
		}
		st.Deployments = append(st.Deployments, ds)
	}
	o.mu.Lock()
	o.status = st
	o.mu.Unlock()
	if o.cfg.StatusFile != "" {
		if err := writeStatusFile(o.cfg.StatusFile, st); err != nil {
			o.cfg.Logger.Warn("status", "err", err)
		}
	}
	if o.cfg.OnStatus != nil {
		o.cfg.OnStatus(st)
	}
}

func policyStatus(pr *policyRunner, roles []RoleStatus) *PolicyStatus {
	ps := &PolicyStatus{Name: pr.ap.Name}
	if rc := pr.ap.Spec.Ratio; rc != nil {
		ps.RatioBand = [2]float64{rc.MinRatio, rc.MaxRatio}
		var num, den int32
		for _, r := range roles {
			switch r.Name {
			case rc.NumeratorRole:
				num = r.Desired
			case rc.DenominatorRole:
				den = r.Desired
			}
		}
		if num > 0 && den > 0 {
			ps.Ratio = float64(num) / float64(den)
		}
		if rr := pr.last.Ratio; rr != nil {
			ps.RatioReason = rr.Reason
			switch {
			case rr.Infeasible:
				ps.Conditions = append(ps.Conditions, v1alpha1.ConditionRatioConstraintActive+"=Infeasible")
			case rr.Adjusted:
				ps.Conditions = append(ps.Conditions, v1alpha1.ConditionRatioConstraintActive+"=Adjusted")
			}
		}
	}
	if s := pr.last.SLO; s != nil && s.AtRisk {
		ps.Conditions = append(ps.Conditions, v1alpha1.ConditionSLOAtRisk+"=True")
	}
	for r, on := range pr.last.Panic {
		if on {
			ps.Conditions = append(ps.Conditions, "Panic="+r)
		}
	}
	return ps
}
