package des

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// An emulation of Kthena's disaggregated autoscaler (volcano-sh/kthena,
// pkg/autoscaler: algorithm/recommendation.go, algorithm/revision.go,
// algorithm/disaggregated_ratio.go, autoscaler/disaggregated_scaler.go,
// autoscaler/status.go, datastructure/sliding_window.go; defaults from
// webhook/autoscalingpolicy_mutator.go), written from reading them:
//
//  1. per role, the recommendation is HPA's: ratio = mean metric over the
//     ready pods ÷ target; within tolerance keep current, else
//     ceil(ratio × ready pods); starting pods count as zero-load pods when
//     the ratio says scale up (and then a direction flip or tolerance keeps
//     current); the maximum over metrics, clamped to [min, max]; a role
//     with no ready pod skips the whole cycle.
//  2. panic mode starts (for PanicModeHold) when recommended ≥
//     PanicThresholdPercent % of current; in panic, never below current and
//     at most +PanicPercent % of the lowest value over PanicPeriod.
//  3. otherwise scale-up is limited to the lowest recommendation within
//     the scale-up stabilization window and to max(+Instances, +Percent %)
//     of the lowest corrected value within the period (SelectPolicy Or);
//     scale-down to the highest recommendation within the scale-down
//     stabilization window and to min(−Instances, −Percent %) of the value
//     the period's window returns (upstream builds that window as a
//     minimum, so the limit is taken from the lowest corrected value; with
//     the defaults, Percent 100 lifts the limit).
//  4. the ratio constraint projects the corrected pair into [minRatio,
//     maxRatio]: a zero role beside a non-zero one is seeded to 1; the
//     denominator is searched upward from its value (raised first so a too
//     high ratio is fixed by adding denominators), the numerator clamped
//     into the band at each candidate; downward only if no candidate above.

// KthenaBehavior is AutoscalingPolicy.spec.behavior plus tolerancePercent.
type KthenaBehavior struct {
	TolerancePercent                    int32
	UpInstances, UpPercent              int32
	UpPeriod, UpStabilization           time.Duration
	DownInstances, DownPercent          int32
	DownPeriod, DownStabilization       time.Duration
	PanicPercent, PanicThresholdPercent int32
	PanicPeriod, PanicModeHold          time.Duration
}

// DefaultKthenaBehavior is what Kthena's mutating webhook fills in.
func DefaultKthenaBehavior() KthenaBehavior {
	return KthenaBehavior{
		TolerancePercent: 10,
		UpInstances:      1, UpPercent: 100, UpPeriod: 15 * time.Second, UpStabilization: 0,
		DownInstances: 1, DownPercent: 100, DownPeriod: 15 * time.Second, DownStabilization: 5 * time.Minute,
		PanicPercent: 1000, PanicThresholdPercent: 200, PanicPeriod: 0, PanicModeHold: 60 * time.Second,
	}
}

// Kthena metric names (the engine's Prometheus metrics Kthena scrapes).
const (
	KthenaWaiting = "num_requests_waiting"
	KthenaRunning = "num_requests_running"
	KthenaKVUsage = "kv_cache_usage_perc"
)

// KthenaRole is one role of a disaggregatedTarget.
type KthenaRole struct {
	Min, Max int32
	Targets  map[string]float64 // per-pod metric targets
}

// KthenaRatio is ratioConstraint (numerator prefill, denominator decode).
type KthenaRatio struct{ Min, Max float64 }

// KthenaConfig is a disaggregated AutoscalingPolicy.
type KthenaConfig struct {
	Behavior        KthenaBehavior
	Prefill, Decode KthenaRole
	Ratio           *KthenaRatio
}

// Kthena emulates Kthena's disaggregated autoscaler.
type Kthena struct {
	cfg     KthenaConfig
	p, d    kthenaStatus
	Skipped int // cycles skipped for missing metrics
}

// NewKthena validates the config.
func NewKthena(c KthenaConfig) (*Kthena, error) {
	var errs []string
	for _, r := range []KthenaRole{c.Prefill, c.Decode} {
		if r.Min < 0 || r.Max < r.Min || len(r.Targets) == 0 {
			errs = append(errs, fmt.Sprintf("role bounds [%d, %d] with %d targets", r.Min, r.Max, len(r.Targets)))
		}
	}
	// Written so that NaN, which compares false with everything, fails.
	if c.Ratio != nil && (!(c.Ratio.Min >= 0) || !(c.Ratio.Max > 0) || !(c.Ratio.Min <= c.Ratio.Max) || math.IsInf(c.Ratio.Max, 0)) {
		errs = append(errs, fmt.Sprintf("ratio [%v, %v]", c.Ratio.Min, c.Ratio.Max))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: kthena: %s", ErrConfig, strings.Join(errs, "; "))
	}
	k := &Kthena{cfg: c}
	k.p.init(c.Behavior)
	k.d.init(c.Behavior)
	return k, nil
}

// Name implements Autoscaler.
func (*Kthena) Name() string { return "kthena" }

// Setting implements Autoscaler.
func (k *Kthena) Setting() string {
	f := func(m map[string]float64) string {
		var s []string
		for _, n := range slices.Sorted(mapsKeys(m)) {
			s = append(s, fmt.Sprintf("%s %.3g", n, m[n]))
		}
		return strings.Join(s, ",")
	}
	r := ""
	if k.cfg.Ratio != nil {
		r = fmt.Sprintf(" ratio %.2g–%.2g", k.cfg.Ratio.Min, k.cfg.Ratio.Max)
	}
	return "P " + f(k.cfg.Prefill.Targets) + "; D " + f(k.cfg.Decode.Targets) + r
}

func mapsKeys(m map[string]float64) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Decide implements Autoscaler.
func (k *Kthena) Decide(now time.Duration, sig *Signals) (int, int) {
	p, d := sig.Prefill, sig.Decode
	rp, okP := k.p.scale(now, k.cfg.Behavior, k.cfg.Prefill, p)
	rd, okD := k.d.scale(now, k.cfg.Behavior, k.cfg.Decode, d)
	if !okP || !okD { // upstream returns nil: no scaling this cycle
		k.Skipped++
		return p.Replicas, d.Replicas
	}
	fp, fd := rp.corrected, rd.corrected
	if k.cfg.Ratio != nil {
		fp, fd, _ = KthenaEnforceRatio(fp, fd, k.cfg.Prefill, k.cfg.Decode, *k.cfg.Ratio)
	}
	k.p.record(now, rp)
	k.d.record(now, rd)
	return int(fp), int(fd)
}

// kthenaStatus is one role's history (upstream Status).
type kthenaStatus struct {
	panicEnds  time.Duration
	panicOn    bool
	maxRec     recordWindow // scale-down stabilization
	minRec     recordWindow // scale-up stabilization
	maxCorr    lineWindow   // scale-down period (upstream builds it as a minimum window)
	minCorrUp  lineWindow   // scale-up period
	minCorrPan lineWindow   // panic period
}

func (s *kthenaStatus) init(b KthenaBehavior) {
	s.maxRec = recordWindow{width: b.DownStabilization, better: func(a, b int32) bool { return a > b }}
	s.minRec = recordWindow{width: b.UpStabilization, better: func(a, b int32) bool { return a < b }}
	lessF := func(a, b int32) bool { return a < b }
	s.maxCorr = lineWindow{width: b.DownPeriod, better: lessF}
	s.minCorrUp = lineWindow{width: b.UpPeriod, better: lessF}
	s.minCorrPan = lineWindow{width: b.PanicPeriod, better: lessF}
}

type roleStep struct{ recommended, corrected int32 }

// scale is one role's recommendation and correction (upstream
// scaleOneTarget); ok false when the role has no ready pod to read.
func (s *kthenaStatus) scale(now time.Duration, b KthenaBehavior, r KthenaRole, sig RoleSignals) (roleStep, bool) {
	cur := int32(sig.Replicas)
	rec, ok := KthenaRecommend(cur, r, sig, float64(b.TolerancePercent)/100)
	if !ok {
		return roleStep{}, false
	}
	if b.PanicThresholdPercent > 0 && int64(rec)*100 >= int64(cur)*int64(b.PanicThresholdPercent) {
		s.panicEnds, s.panicOn = now+b.PanicModeHold, b.PanicModeHold > 0
	}
	inPanic := s.panicOn && now <= s.panicEnds
	var c int32
	switch {
	case inPanic:
		c = rec
		if past, ok := s.minCorrPan.best(now, cur); ok && past > 0 {
			c = min(c, past+int32(float64(past)*float64(b.PanicPercent)/100))
		}
		c = max(c, cur)
	case rec < cur:
		c = rec
		if best, ok := s.maxRec.best(now); ok {
			c = max(c, best)
		}
		if past, ok := s.maxCorr.best(now, cur); ok {
			c = max(c, min(past-b.DownInstances, past-past*b.DownPercent/100))
		}
		c = min(c, cur)
	case rec > cur:
		c = rec
		if best, ok := s.minRec.best(now); ok {
			c = min(c, best)
		}
		if past, ok := s.minCorrUp.best(now, cur); ok {
			c = min(c, max(past+b.UpInstances, past+past*b.UpPercent/100))
		}
		c = max(c, cur)
	default:
		c = rec
	}
	return roleStep{recommended: rec, corrected: min(max(c, r.Min), r.Max)}, true
}

func (s *kthenaStatus) record(now time.Duration, r roleStep) {
	s.maxRec.add(now, r.recommended)
	s.minRec.add(now, r.recommended)
	s.maxCorr.add(now, r.corrected)
	s.minCorrUp.add(now, r.corrected)
	s.minCorrPan.add(now, r.corrected)
}

// KthenaRecommend is upstream GetRecommendedInstances over the ready
// pods' metrics (starting pods are unready); ok false when no ready pod
// reports (upstream skips).
func KthenaRecommend(cur int32, r KthenaRole, sig RoleSignals, tol float64) (int32, bool) {
	if cur < r.Min {
		return r.Min, true
	}
	if cur > r.Max {
		return r.Max, true
	}
	unready := int32(max(sig.Replicas-sig.Ready, 0))
	best, seen := int32(0), false
	for _, name := range slices.Sorted(mapsKeys(r.Targets)) {
		if len(sig.Loads) == 0 {
			continue
		}
		sum := 0.0
		for _, l := range sig.Loads {
			sum += kthenaMetric(name, l)
		}
		d := kthenaDesired(cur, sum, int32(len(sig.Loads)), unready, r.Targets[name], tol)
		if !seen || d > best {
			best, seen = d, true
		}
	}
	if !seen {
		return 0, false
	}
	return min(max(best, r.Min), r.Max), true
}

func kthenaMetric(name string, l EngineLoad) float64 {
	switch name {
	case KthenaWaiting:
		return float64(l.Waiting)
	case KthenaRunning:
		return float64(l.Running)
	case KthenaKVUsage:
		return l.KVUsage
	}
	return 0
}

// kthenaDesired is upstream's single-instance-metric rule.
func kthenaDesired(cur int32, sum float64, reporting, unready int32, target, tol float64) int32 {
	ratio := sum / float64(reporting) / target
	up := ratio >= 1
	if !(unready > 0 && up) {
		if math.Abs(ratio-1) <= tol {
			return cur
		}
		return ceil32(ratio * float64(reporting))
	}
	n := reporting + unready
	nr := sum / float64(n) / target
	if math.Abs(nr-1) <= tol || (nr >= 1) != up {
		return cur
	}
	d := ceil32(nr * float64(n))
	if d < cur { // scaling up never lowers
		return cur
	}
	return d
}

func ceil32(v float64) int32 {
	if math.IsNaN(v) {
		return 0
	}
	return int32(min(math.Max(0, math.Ceil(v)), 1e9))
}

// KthenaEnforceRatio is upstream EnforceRoleRatio on (prefill, decode):
// clamp to bounds; both zero stay; a zero beside a non-zero is seeded to
// 1 (within bounds); then, if outside [min, max], the first feasible
// denominator from a starting point upward (then downward), with the
// numerator clamped into the band. adjusted reports any change.
func KthenaEnforceRatio(num, den int32, nr, dr KthenaRole, band KthenaRatio) (int32, int32, bool) {
	num, den = min(max(num, nr.Min), nr.Max), min(max(den, dr.Min), dr.Max)
	if num == 0 && den == 0 {
		return 0, 0, false
	}
	adjusted := false
	if num == 0 {
		num, adjusted = min(max(1, nr.Min), nr.Max), true
	}
	if den == 0 {
		den, adjusted = min(max(1, dr.Min), dr.Max), true
	}
	if den != 0 {
		q := float64(num) / float64(den)
		if q >= band.Min-1e-12 && q <= band.Max+1e-12 {
			return num, den, adjusted
		}
	}
	lo := max(1, dr.Min, int32(math.Ceil(float64(nr.Min)/band.Max-1e-12)))
	hi := dr.Max
	if band.Min > 0 {
		hi = min(hi, int32(math.Floor(float64(nr.Max)/band.Min+1e-12)))
	}
	if lo > hi { // infeasible: upstream returns an error and no scaling
		return num, den, false
	}
	fit := func(d int32) (int32, bool) {
		a := max(nr.Min, int32(math.Ceil(band.Min*float64(d)-1e-12)))
		b := min(nr.Max, int32(math.Floor(band.Max*float64(d)+1e-12)))
		if a > b {
			return 0, false
		}
		return min(max(num, a), b), true
	}
	start := min(max(den, lo), hi)
	if den != 0 && float64(num)/float64(den) > band.Max {
		start = min(max(start, int32(math.Ceil(float64(num)/band.Max-1e-12))), hi)
	}
	for d := start; d <= hi; d++ {
		if n, ok := fit(d); ok {
			return n, d, true
		}
	}
	for d := start - 1; d >= lo; d-- {
		if n, ok := fit(d); ok {
			return n, d, true
		}
	}
	return num, den, false
}

// recordWindow is upstream's RmqRecordSlidingWindow: the best value
// appended within the last width (none when width is 0). Upstream keeps a
// value while at + width ≥ now in milliseconds; its controller's syncs are
// the period plus processing time apart, so a value exactly one period old
// has expired there: here too (at + width ≤ now expires), the same for
// lineWindow.
type recordWindow struct {
	width  time.Duration
	better func(a, b int32) bool
	at     []time.Duration
	v      []int32
}

func (w *recordWindow) add(now time.Duration, v int32) {
	w.at, w.v = append(w.at, now), append(w.v, v)
}

func (w *recordWindow) best(now time.Duration) (int32, bool) {
	if w.width == 0 {
		return 0, false
	}
	for len(w.at) > 0 && w.at[0]+w.width <= now {
		w.at, w.v = w.at[1:], w.v[1:]
	}
	if len(w.v) == 0 {
		return 0, false
	}
	b := w.v[0]
	for _, x := range w.v[1:] {
		if w.better(x, b) {
			b = x
		}
	}
	return b, true
}

// lineWindow is upstream's RmqLineChartSlidingWindow: values are held
// from their append until the next one (a line chart); best(current) is
// the best of current, the value still held (for up to 2 × width) and the
// values that ended within the last width.
type lineWindow struct {
	width    time.Duration
	better   func(a, b int32) bool
	drift    int32
	driftAt  time.Duration
	hasDrift bool
	endedAt  []time.Duration
	endedVal []int32
}

func (w *lineWindow) expire(now time.Duration) {
	for len(w.endedAt) > 0 && w.endedAt[0]+w.width <= now {
		w.endedAt, w.endedVal = w.endedAt[1:], w.endedVal[1:]
	}
	if w.hasDrift && w.driftAt+2*w.width < now {
		w.hasDrift = false
	}
}

func (w *lineWindow) add(now time.Duration, v int32) {
	w.expire(now)
	if w.hasDrift {
		w.endedAt, w.endedVal = append(w.endedAt, now), append(w.endedVal, w.drift)
	}
	w.drift, w.driftAt, w.hasDrift = v, now, true
}

func (w *lineWindow) best(now time.Duration, current int32) (int32, bool) {
	if w.width == 0 {
		return 0, false
	}
	w.expire(now)
	b := current
	if w.hasDrift && w.better(w.drift, b) {
		b = w.drift
	}
	for _, x := range w.endedVal {
		if w.better(x, b) {
			b = x
		}
	}
	return b, true
}
