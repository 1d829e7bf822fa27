package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/orchestrator/local"
)

// AutoscaleConfig is `kvmesh demo --autoscale`: a P/D ModelDeployment run
// by the local backend (orchestrator/local: sim + sidecar processes, an
// ingress, an AutoscalingPolicy with a ratio band), and a load ramp through
// the ingress: up, hold, down, then a low tail while the roles come back.
type AutoscaleConfig struct {
	// Exe is the kvmesh binary the local backend runs. Default: this
	// process's executable (the demo is `kvmesh demo`).
	Exe string
	// Duration of the whole ramp. Default 75s: up 30 %, hold 25 %, down
	// 15 %, low tail 30 % (scale-down waits out the policy's windows).
	Duration time.Duration
	// BaseRate and PeakRate are the arrival rates (req/s, Poisson) at the
	// ends and at the hold. Default 1 and 24.
	BaseRate, PeakRate float64
	// PromptTokens and OutputTokens of every request (distinct prompts: no
	// prefix hits, so prefill works for every request). Default 2048 and 64.
	PromptTokens, OutputTokens int
	// TTFT and TPOT are the SLO targets attainment is measured against.
	// Default 1s and 50ms.
	TTFT, TPOT time.Duration
	// MaxReplicas per role. Default 4.
	MaxReplicas int
	// RatioMin and RatioMax bound prefill/decode replicas. Default 0.5, 2.
	RatioMin, RatioMax float64
	// Interval of the orchestrator's step. Default 1s.
	Interval time.Duration
	// ViewInterval of the live view. Default 2s.
	ViewInterval time.Duration
	// Settle bounds how long the low tail goes on after Duration while a
	// role is still above its starting replicas (a busy machine slows the
	// scale-down). Default 30s; negative: stop at Duration.
	Settle time.Duration
	// SimArgs are the engines' extra `kvmesh sim` flags. Default
	// "--profile 7b-h100".
	SimArgs string
	// View, when set, gets every sample as it is taken.
	View func(AutoscaleSample)
	// Logger for the orchestrator; ChildStderr for the children's logs.
	Logger      *slog.Logger
	ChildStderr io.Writer
}

func (c AutoscaleConfig) withDefaults() AutoscaleConfig {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Duration == 0 {
		c.Duration = 75 * time.Second
	}
	def(&c.BaseRate, 1)
	def(&c.PeakRate, 24)
	def(&c.RatioMin, 0.5)
	def(&c.RatioMax, 2)
	if c.PromptTokens == 0 {
		c.PromptTokens = 2048
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = 64
	}
	if c.TTFT == 0 {
		c.TTFT = time.Second
	}
	if c.TPOT == 0 {
		c.TPOT = 50 * time.Millisecond
	}
	if c.MaxReplicas == 0 {
		c.MaxReplicas = 4
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.ViewInterval == 0 {
		c.ViewInterval = 2 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = 30 * time.Second
	}
	if c.SimArgs == "" {
		c.SimArgs = "--profile 7b-h100"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate lists every problem.
func (c AutoscaleConfig) Validate() error {
	var errs []error
	if c.Duration < 20*time.Second || c.Duration > time.Hour {
		errs = append(errs, fmt.Errorf("duration %v: want 20s to 1h (the policy's windows need time to scale down)", c.Duration))
	}
	if c.BaseRate < 0 || c.PeakRate <= c.BaseRate || c.PeakRate > 1000 {
		errs = append(errs, fmt.Errorf("rates %v → %v: want 0 ≤ base < peak ≤ 1000", c.BaseRate, c.PeakRate))
	}
	if c.PromptTokens < 1 || c.OutputTokens < 2 || c.TTFT <= 0 || c.TPOT <= 0 {
		errs = append(errs, errors.New("prompt ≥ 1 and output ≥ 2 tokens, positive SLO targets"))
	}
	if c.MaxReplicas < 2 || c.MaxReplicas > 8 {
		errs = append(errs, fmt.Errorf("max replicas %d: want 2..8", c.MaxReplicas))
	}
	if c.RatioMin <= 0 || c.RatioMax < c.RatioMin {
		errs = append(errs, fmt.Errorf("ratio band [%v, %v]: want 0 < min ≤ max", c.RatioMin, c.RatioMax))
	}
	return errors.Join(errs...)
}

// Roles of the demo's deployment.
const (
	PrefillRole = "prefill"
	DecodeRole  = "decode"
)

// RoleSample is one role at a sample.
type RoleSample struct{ Desired, Ready int32 }

// AutoscaleSample is one line of the live view.
type AutoscaleSample struct {
	Elapsed    time.Duration
	Phase      string
	TargetRate float64 // offered req/s now
	Rate       float64 // completed req/s over the view interval
	Prefill    RoleSample
	Decode     RoleSample
	// Ratio is prefill/decode desired replicas (0 when either is 0).
	Ratio float64
	// Attainment is the share of the interval's requests within both the
	// TTFT and the TPOT target (failed requests count as misses); NaN when
	// none completed.
	Attainment       float64
	TTFTp90, TPOTp90 time.Duration
	Sent, OK, Failed int
}

// AutoscaleResult is the whole run.
type AutoscaleResult struct {
	Samples          []AutoscaleSample
	Band             [2]float64
	Sent, OK, Failed int
	// Attainment over every request of the run.
	Attainment float64
	// LastError is the last failed request's error ("" when none failed).
	LastError string
	Wall      time.Duration
}

// RunAutoscale runs the demo and stops everything it started (every child
// process of the local backend included) before it returns.
func RunAutoscale(ctx context.Context, cfg AutoscaleConfig) (*AutoscaleResult, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo --autoscale: %w", err)
	}
	dir, err := os.MkdirTemp("", "kvmesh-demo-autoscale-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	spec := filepath.Join(dir, "pd.yaml")
	if err := os.WriteFile(spec, []byte(autoscaleSpec(cfg)), 0o600); err != nil {
		return nil, err
	}
	lc := local.DefaultConfig()
	lc.File, lc.Exe, lc.Ingress, lc.Interval = spec, cfg.Exe, true, cfg.Interval
	lc.Logger, lc.ChildStderr, lc.SLO = cfg.Logger, cfg.ChildStderr, false
	lc.DrainTimeout = 10 * time.Second
	o, err := local.New(lc)
	if err != nil {
		return nil, fmt.Errorf("demo --autoscale: %w", err)
	}
	// Not cancelled with ctx: a stopped run (Ctrl-C) ends its load first,
	// whose requests in flight finish (rampGen.run), and only then the
	// engines under them; cancelled together, those requests failed.
	octx, stopOrch := context.WithCancel(context.WithoutCancel(ctx))
	orchDone := make(chan error, 1)
	go func() { orchDone <- o.Run(octx) }() // owned here: stopOrch + <-orchDone below
	res, runErr := driveAutoscale(ctx, cfg, o, orchDone)
	stopOrch()
	if err := <-orchDone; err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("local backend: %w", err))
	}
	return res, runErr
}

// driveAutoscale waits for the deployment, runs the ramp and samples the
// view; orchDone reports the backend stopping early.
func driveAutoscale(ctx context.Context, cfg AutoscaleConfig, o *local.Orchestrator, orchDone chan error) (*AutoscaleResult, error) {
	select {
	case <-o.Started():
	case err := <-orchDone:
		orchDone <- err
		return nil, fmt.Errorf("local backend stopped at start: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := waitReady(ctx, o, orchDone); err != nil {
		return nil, err
	}
	st := o.Status()
	gen := newRampGen(cfg, st.Ingress)
	res := &AutoscaleResult{Band: [2]float64{cfg.RatioMin, cfg.RatioMax}}
	start := time.Now()
	genCtx, stopGen := context.WithCancel(ctx)
	genDone := make(chan struct{})
	go func() { defer close(genDone); gen.run(genCtx, start) }() // owned here: stopGen + <-genDone
	tick := time.NewTicker(cfg.ViewInterval)
	defer tick.Stop()
	end := time.NewTimer(cfg.Duration + max(cfg.Settle, 0))
	defer end.Stop()
	var err error
loop:
	for {
		select {
		case <-tick.C:
			s := sample(cfg, o.Status(), gen, time.Since(start))
			res.Samples = append(res.Samples, s)
			if cfg.View != nil {
				cfg.View(s)
			}
			if s.Elapsed >= cfg.Duration && settled(res) {
				break loop
			}
		case <-end.C:
			break loop
		case err = <-orchDone:
			orchDone <- err
			err = fmt.Errorf("local backend stopped: %w", err)
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		}
	}
	stopGen()
	<-genDone
	res.Sent, res.OK, res.Failed, res.Attainment = gen.totals()
	res.LastError = gen.lastError()
	res.Wall = time.Since(start)
	return res, err
}

// settled reports whether both roles are back at their first sample's
// replicas (the ramp's work is done).
func settled(r *AutoscaleResult) bool {
	for _, role := range []string{PrefillRole, DecodeRole} {
		if first, _, last := r.Peak(role); last > first {
			return false
		}
	}
	return true
}

// waitReady waits until both roles have their initial replica ready and
// the ingress knows them.
func waitReady(ctx context.Context, o *local.Orchestrator, orchDone chan error) error {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		st := o.Status()
		p, _ := st.Role(autoscaleDeployment, PrefillRole)
		d, _ := st.Role(autoscaleDeployment, DecodeRole)
		if p.Ready >= 1 && d.Ready >= 1 && ingressReady(st.Ingress, 2) {
			return nil
		}
		select {
		case <-tick.C:
		case err := <-orchDone:
			orchDone <- err
			return fmt.Errorf("local backend stopped: %w", err)
		case <-deadline.C:
			return fmt.Errorf("demo --autoscale: engines not ready within a minute: %w", ErrTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

const autoscaleDeployment = "autoscale-demo"

// autoscaleSpec is the demo's ModelDeployment and AutoscalingPolicy: short
// windows so a minute-long ramp shows both directions. Prefill scales on
// its queue (waiting requests and queued prefill tokens), decode on its
// running streams; the band keeps prefill/decode within [min, max].
func autoscaleSpec(c AutoscaleConfig) string {
	return fmt.Sprintf(`apiVersion: kvmesh.io/v1alpha1
kind: ModelDeployment
metadata:
  name: %[1]s
  annotations:
    kvmesh.io/local-sim-args: %[2]q
spec:
  model: kvmesh-sim
  engine: vllm
  recoveryPolicy: RoleRecreate
  roles:
    - {name: prefill, kind: prefill, replicas: 1, template: {}}
    - {name: decode, kind: decode, replicas: 1, template: {}}
---
apiVersion: kvmesh.io/v1alpha1
kind: AutoscalingPolicy
metadata:
  name: %[1]s
spec:
  target: %[1]s
  tolerancePercent: 10
  stableWindowSeconds: 8
  panicWindowSeconds: 4
  panicThresholdPercent: 200
  maxScaleUpRate: 2
  maxScaleDownRate: 2
  scaleDownCooldownSeconds: 6
  roles:
    - name: prefill
      minReplicas: 1
      maxReplicas: %[3]d
      metrics:
        - {name: runningRequests, target: 1}
        - {name: prefillQueueTokens, target: %[4]d}
    - name: decode
      minReplicas: 1
      maxReplicas: %[3]d
      metrics:
        - {name: runningRequests, target: 3}
  ratio: {numeratorRole: prefill, denominatorRole: decode, minRatio: %[5]g, maxRatio: %[6]g}
`, autoscaleDeployment, c.SimArgs, c.MaxReplicas, 2*c.PromptTokens, c.RatioMin, c.RatioMax)
}

// phase and offered rate at elapsed t.
func (c AutoscaleConfig) rateAt(t time.Duration) (string, float64) {
	f := t.Seconds() / c.Duration.Seconds()
	lerp := func(a, b, x float64) float64 { return a + (b-a)*min(max(x, 0), 1) }
	switch {
	case f < 0.30:
		return "up", lerp(c.BaseRate, c.PeakRate, f/0.30)
	case f < 0.55:
		return "hold", c.PeakRate
	case f < 0.70:
		return "down", lerp(c.PeakRate, c.BaseRate, (f-0.55)/0.15)
	default:
		return "tail", c.BaseRate
	}
}

func sample(cfg AutoscaleConfig, st local.Status, gen *rampGen, at time.Duration) AutoscaleSample {
	s := AutoscaleSample{Elapsed: at}
	s.Phase, s.TargetRate = cfg.rateAt(at)
	p, _ := st.Role(autoscaleDeployment, PrefillRole)
	d, _ := st.Role(autoscaleDeployment, DecodeRole)
	s.Prefill, s.Decode = RoleSample{p.Desired, p.Ready}, RoleSample{d.Desired, d.Ready}
	if p.Desired > 0 && d.Desired > 0 {
		s.Ratio = float64(p.Desired) / float64(d.Desired)
	}
	w := gen.window()
	s.Rate = float64(len(w.ok)+w.failed) / cfg.ViewInterval.Seconds()
	s.Attainment, s.TTFTp90, s.TPOTp90 = w.attainment(cfg), p90(w.ok, func(r reqResult) time.Duration { return r.ttft }), p90(w.ok, func(r reqResult) time.Duration { return r.tpot })
	s.Sent, s.OK, s.Failed, _ = gen.totals()
	return s
}

func p90(rs []reqResult, f func(reqResult) time.Duration) time.Duration {
	if len(rs) == 0 {
		return 0
	}
	xs := make([]time.Duration, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i] < xs[j] })
	return xs[min(len(xs)-1, int(math.Ceil(0.9*float64(len(xs))))-1)]
}

// Line is the sample as one plain line of the live view.
func (s AutoscaleSample) Line() string {
	att := "   -  "
	if !math.IsNaN(s.Attainment) {
		att = fmt.Sprintf("%5.1f%%", 100*s.Attainment)
	}
	return fmt.Sprintf("[%5.1fs] %-4s offered %5.1f req/s done %5.1f | prefill %d/%d decode %d/%d (desired/ready) ratio %4.2f | SLO %s TTFT p90 %4.0fms TPOT p90 %3.0fms | ok %d failed %d",
		s.Elapsed.Seconds(), s.Phase, s.TargetRate, s.Rate, s.Prefill.Desired, s.Prefill.Ready, s.Decode.Desired, s.Decode.Ready, s.Ratio,
		att, msOf(s.TTFTp90), msOf(s.TPOTp90), s.OK, s.Failed)
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Peak is the most desired replicas of a role over the run; First and Last
// its value at the first and the last sample.
func (r *AutoscaleResult) Peak(role string) (first, peak, last int32) {
	for i, s := range r.Samples {
		v := s.Prefill.Desired
		if role == DecodeRole {
			v = s.Decode.Desired
		}
		if i == 0 {
			first = v
		}
		peak, last = max(peak, v), v
	}
	return first, peak, last
}

// Check is what the demo shows: both roles scaled up under the ramp and
// back down after it, and prefill/decode stayed within the band at every
// sample. It lists every claim that does not hold.
func (r *AutoscaleResult) Check() error {
	var errs []error
	if len(r.Samples) < 3 {
		return fmt.Errorf("%d samples: too few to judge", len(r.Samples))
	}
	for _, role := range []string{PrefillRole, DecodeRole} {
		first, peak, last := r.Peak(role)
		if peak <= first {
			errs = append(errs, fmt.Errorf("%s never scaled up (%d replicas throughout)", role, first))
		} else if last >= peak {
			errs = append(errs, fmt.Errorf("%s did not come back down (peak %d, last %d)", role, peak, last))
		}
	}
	for _, s := range r.Samples {
		if s.Ratio != 0 && (s.Ratio < r.Band[0]-1e-9 || s.Ratio > r.Band[1]+1e-9) {
			errs = append(errs, fmt.Errorf("at %v the ratio %.2f left the band [%v, %v]", s.Elapsed.Round(time.Second), s.Ratio, r.Band[0], r.Band[1]))
			break
		}
	}
	return errors.Join(errs...)
}

// WriteSummary writes the run's outcome.
func (r *AutoscaleResult) WriteSummary(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kvmesh demo --autoscale: %d requests (%d ok, %d failed) in %v, SLO attainment %.1f%%\n", r.Sent, r.OK, r.Failed, r.Wall.Round(time.Second), 100*r.Attainment)
	if r.LastError != "" {
		fmt.Fprintf(&b, "  last failure: %s\n", r.LastError)
	}
	for _, role := range []string{PrefillRole, DecodeRole} {
		first, peak, last := r.Peak(role)
		fmt.Fprintf(&b, "  %-7s replicas %d → peak %d → %d\n", role, first, peak, last)
	}
	lo, hi := math.Inf(1), 0.0
	for _, s := range r.Samples {
		if s.Ratio > 0 {
			lo, hi = min(lo, s.Ratio), max(hi, s.Ratio)
		}
	}
	if hi > 0 {
		fmt.Fprintf(&b, "  prefill/decode ratio within [%.2f, %.2f] (band [%g, %g])\n", lo, hi, r.Band[0], r.Band[1])
	}
	_, err := io.WriteString(w, b.String())
	return err
}
