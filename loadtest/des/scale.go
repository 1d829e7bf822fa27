package des

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// Scaling events, numbered apart from heap.go's and pdsim.go's kinds.
const (
	evScaleTick evKind = 32 // the autoscaler's sync period
	evReady     evKind = 33 // a requested engine finished starting (arg: instance)
)

// ScaleConfig configures an autoscaling run: a P/D cluster whose role
// sizes an Autoscaler changes at run time.
type ScaleConfig struct {
	PDConfig
	// PDConfig.Roles are the replicas at the start (ready at time 0).
	// StartupDelay is how long a requested engine takes to serve (image
	// pull, weights, warm-up). It counts GPU time from the request.
	// Default 60s; negative means none.
	StartupDelay time.Duration
	// SyncPeriod is how often the autoscaler decides. Default 15s; a
	// multiple of SnapshotInterval (so it sees a snapshot of that instant).
	SyncPeriod time.Duration
	// Window is the ingress's latency and arrival window the autoscaler
	// reads. Default 60s.
	Window time.Duration
	// ReportWindow is the per-window report's width. Default 60s.
	ReportWindow time.Duration
	// MaxPerRole bounds each role (engines requested). Default 64.
	MaxPerRole int
	// Policy is the P/D router. Default "kvmesh".
	Policy string
}

// Defaults fills unset fields.
func (c *ScaleConfig) Defaults() {
	c.PDConfig.Defaults()
	if c.StartupDelay == 0 {
		c.StartupDelay = 60 * time.Second
	}
	if c.StartupDelay < 0 {
		c.StartupDelay = 0
	}
	if c.SyncPeriod == 0 {
		c.SyncPeriod = 15 * time.Second
	}
	if c.Window == 0 {
		c.Window = 60 * time.Second
	}
	if c.ReportWindow == 0 {
		c.ReportWindow = 60 * time.Second
	}
	if c.MaxPerRole == 0 {
		c.MaxPerRole = 64
	}
	if c.Policy == "" {
		c.Policy = "kvmesh"
	}
}

// Validate lists every problem.
func (c *ScaleConfig) Validate() error {
	errs := []error{c.PDConfig.Validate()}
	if c.SnapshotInterval <= 0 || c.SyncPeriod <= 0 || c.SyncPeriod%c.SnapshotInterval != 0 {
		errs = append(errs, fmt.Errorf("%w: sync period %v must be a positive multiple of the snapshot interval %v", ErrConfig, c.SyncPeriod, c.SnapshotInterval))
	}
	if c.Window <= 0 || c.ReportWindow <= 0 {
		errs = append(errs, fmt.Errorf("%w: window and report window must be > 0", ErrConfig))
	}
	if c.Roles.Mixed != 0 || c.Roles.Prefill > c.MaxPerRole || c.Roles.Decode > c.MaxPerRole || c.Roles.Decode < 1 {
		errs = append(errs, fmt.Errorf("%w: roles %v: autoscaling runs scale prefill and decode only, 1 ≤ decode, each ≤ %d", ErrConfig, c.Roles, c.MaxPerRole))
	}
	if c.Policy == "aggregated" {
		errs = append(errs, fmt.Errorf("%w: autoscaling runs need a P/D policy", ErrConfig))
	}
	return errors.Join(errs...)
}

// instance states.
const (
	stStarting = iota
	stReady
	stDraining
	stStopped
)

// instance is one engine's life: requested → ready → draining → stopped.
// GPU time runs from requested to stopped (or the end of the run).
type instance struct {
	role      scheduler.Role
	slot      int // index into pdSim's engine slices
	state     int
	requested time.Duration
	stopped   time.Duration
}

// scaleSim is one autoscaler's run: a pdSim whose engine slices grow (new
// slots, or stopped slots reused) as the autoscaler asks. Single goroutine.
type scaleSim struct {
	*pdSim
	sc    *ScaleConfig
	as    Autoscaler
	insts []instance
	slot  []int // slot → instance
	seq   int   // engine id counter
	obs   ingressWindow
	rep   scaleReport
}

func newScaleSim(cfg *ScaleConfig, reqs []workload.Request, as Autoscaler) (*scaleSim, error) {
	p, err := newPDSim(&cfg.PDConfig, reqs, cfg.Policy)
	if err != nil {
		return nil, err
	}
	s := &scaleSim{pdSim: p, sc: cfg, as: as}
	if p.prog != nil {
		p.prog.name = strings.TrimSpace(as.Name() + " " + as.Setting())
	}
	for e := range p.engines {
		s.insts = append(s.insts, instance{role: p.view[e].Role, slot: e, state: stReady})
		s.slot = append(s.slot, e)
		s.seq++
	}
	s.obs.init(cfg, reqs)
	s.rep.init(cfg)
	return s, nil
}

func (s *scaleSim) run(ctx context.Context) ScaleResult {
	start := time.Now()
	s.start()
	s.h.push(0, evScaleTick, 0)
	var now time.Duration
	for n := 0; s.h.len() > 0; n++ {
		if n&4095 == 0 {
			if ctx.Err() != nil {
				break
			}
			s.progressed(now)
		}
		ev := s.h.pop()
		now = ev.at
		switch ev.kind {
		case evArrival, evFollow:
			if s.arrived(ev) {
				s.dispatch(ev.arg, now)
			}
		case evRelease:
			s.inflight--
			s.release(now)
		case evStep:
			s.step(ev.arg, now)
			s.maybeStop(s.slot[ev.arg], now)
		case evTransferDone:
			s.transferDone(ev.arg, now)
		case evSnapshot:
			s.snapshot()
			s.snapshotted(now)
		case evScaleTick:
			s.tick(now)
			if s.pending > 0 {
				s.h.push(now+s.sc.SyncPeriod, evScaleTick, 0)
			}
		case evReady:
			s.ready(ev.arg)
		}
	}
	s.out.wall = time.Since(start)
	s.prog.done(&s.clock, now)
	for _, e := range s.engines {
		s.out.preemptions += int(e.Load().Preemptions)
	}
	end := max(now, s.out.last)
	s.obs.collect(s, end)
	s.rep.flush(s, end)
	return s.result(end)
}

// tick is one sync period: what the autoscaler sees, its decision, and
// the scaling it asks for.
func (s *scaleSim) tick(now time.Duration) {
	s.obs.collect(s, now)
	sig := s.signals(now)
	p, d := s.as.Decide(now, &sig)
	p = min(max(p, 0), s.sc.MaxPerRole)
	d = min(max(d, 1), s.sc.MaxPerRole) // a P/D cluster always keeps a decode engine
	s.scaleTo(scheduler.RolePrefill, p, now)
	s.scaleTo(scheduler.RoleDecode, d, now)
	s.rep.tick(s, now)
}

// replicas counts a role's engines that are requested and not draining.
func (s *scaleSim) replicas(role scheduler.Role) (requested, ready int) {
	for i := range s.insts {
		in := &s.insts[i]
		if in.role != role || in.state == stDraining || in.state == stStopped {
			continue
		}
		requested++
		if in.state == stReady {
			ready++
		}
	}
	return requested, ready
}

// scaleTo adds or removes engines of role until want are requested.
// Removal cancels starting engines first (newest first), then drains the
// ready engine with the least work.
func (s *scaleSim) scaleTo(role scheduler.Role, want int, now time.Duration) {
	have, _ := s.replicas(role)
	for ; have < want; have++ {
		s.add(role, now)
	}
	for ; have > want; have-- {
		if i := s.newestStarting(role); i >= 0 {
			s.stop(i, now)
			continue
		}
		if i := s.idlestReady(role); i >= 0 {
			s.insts[i].state = stDraining
			s.view[s.insts[i].slot].Healthy = false
			s.maybeStop(i, now)
		}
	}
}

func (s *scaleSim) newestStarting(role scheduler.Role) int {
	for i := len(s.insts) - 1; i >= 0; i-- {
		if s.insts[i].role == role && s.insts[i].state == stStarting {
			return i
		}
	}
	return -1
}

func (s *scaleSim) idlestReady(role scheduler.Role) int {
	best := -1
	for i := range s.insts {
		in := &s.insts[i]
		if in.role != role || in.state != stReady {
			continue
		}
		if best < 0 || s.view[in.slot].InFlight < s.view[s.insts[best].slot].InFlight {
			best = i
		}
	}
	return best
}

// add requests one engine: a fresh engine in a free slot (a stopped one
// with no step pending) or a new slot; it joins the router's view
// unhealthy and turns healthy when evReady fires.
func (s *scaleSim) add(role scheduler.Role, now time.Duration) {
	slot := -1
	for e, i := range s.slot {
		if s.insts[i].state == stStopped && !s.stepPending[e] {
			slot = e
			break
		}
	}
	if slot < 0 {
		slot = len(s.engines)
		s.engines = append(s.engines, nil)
		s.view = append(s.view, scheduler.Engine{})
		s.trans = append(s.trans, nil)
		s.stepPending = append(s.stepPending, false)
		s.awaitFirst = append(s.awaitFirst, nil)
		s.ctx = append(s.ctx, engineCtx{})
		s.lat = append(s.lat, latAcc{})
		s.legs = append(s.legs, 0)
		s.slot = append(s.slot, -1)
	}
	ec := s.cfg.Engine
	ec.HashSeed = uint64(s.seq)*0x9E3779B97F4A7C15 + 1
	eng, err := engine.New(ec, pdSink{s.pdSim, slot})
	if err != nil { // the same config built the initial engines
		panic(fmt.Sprintf("des: engine config changed during a run: %v", err))
	}
	id := role.String() + "-" + strconv.Itoa(s.seq)
	s.seq++
	s.engines[slot] = eng
	s.view[slot] = scheduler.Engine{ID: id, Model: s.cfg.Model, Role: role, GPUBlocks: ec.GPUBlocks}
	s.trans[slot] = newTranslator(s.cfg.Model, ec.BlockSize)
	s.awaitFirst[slot] = s.awaitFirst[slot][:0]
	// Per-engine ingress state starts fresh, as for a new pod (the slices
	// are pdSim's, indexed like engines).
	s.ctx[slot], s.lat[slot], s.legs[slot] = engineCtx{}, latAcc{}, 0
	s.ids[id] = slot
	s.insts = append(s.insts, instance{role: role, slot: slot, state: stStarting, requested: now})
	s.slot[slot] = len(s.insts) - 1
	s.h.push(now+s.sc.StartupDelay, evReady, len(s.insts)-1)
}

func (s *scaleSim) ready(i int) {
	in := &s.insts[i]
	if in.state != stStarting { // cancelled while starting
		return
	}
	in.state = stReady
	s.view[in.slot].Healthy = true
}

// maybeStop stops a draining instance once it has no request left (its
// prefill legs done, no transfer or decode leg bound to it).
func (s *scaleSim) maybeStop(i int, now time.Duration) {
	in := &s.insts[i]
	if in.state != stDraining || s.view[in.slot].InFlight > 0 || !s.engines[in.slot].Idle() {
		return
	}
	s.stop(i, now)
}

func (s *scaleSim) stop(i int, now time.Duration) {
	in := &s.insts[i]
	in.state, in.stopped = stStopped, now
	v := &s.view[in.slot]
	v.Healthy = false
	s.idx.ClearEngine(v.ID)
	delete(s.ids, v.ID)
}

// gpuSeconds sums every instance's GPU time up to end, per role.
func (s *scaleSim) gpuSeconds(end time.Duration) (prefill, decode float64) {
	for i := range s.insts {
		in := &s.insts[i]
		stop := end
		if in.state == stStopped {
			stop = in.stopped
		}
		sec := (stop - in.requested).Seconds()
		if in.role == scheduler.RolePrefill {
			prefill += sec
		} else {
			decode += sec
		}
	}
	return prefill, decode
}
