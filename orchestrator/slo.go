package orchestrator

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// The SLO mode's live inputs come from the ingresses: each gossips, as the
// App entry kvmesh.slo.v1, per engine the p90 TTFT and TPOT its clients saw
// over its window with the sample counts and the prompt tokens it sent
// (ingress/slo_gossip.go writes it). Per role, the orchestrator merges the
// summaries of every ingress over the role's engines: latencies are the
// count-weighted mean of the p90s (an approximation of the merged p90 that
// needs no histogram on the wire), prompt tokens per second are summed
// (each ingress sees its own requests). The format is decoded here rather
// than imported so that the orchestrator does not link the ingress.

// SLOStateName is the gossip App entry of the ingresses' latency summaries
// (ingress.SLOStateName).
const SLOStateName = "kvmesh.slo.v1"

// SLOSource returns the App blobs gossiped under a name, by origin node;
// *gossip.Node is one. It must be safe to call from any goroutine.
type SLOSource interface {
	AppStates(name string) map[string][]byte
}

var _ SLOSource = (*gossip.Node)(nil)

// sloSummary is one ingress's summary (ingress.SLOSummary on the wire).
type sloSummary struct {
	Version       int         `json:"v"`
	WindowSeconds float64     `json:"w"`
	Engines       []sloEngine `json:"e"`
}

type sloEngine struct {
	ID           string  `json:"id"`
	TTFT         float64 `json:"t"`
	TTFTN        uint64  `json:"tn"`
	TPOT         float64 `json:"p"`
	TPOTN        uint64  `json:"pn"`
	PromptTokens uint64  `json:"pt"`
}

// ErrBadSLOSummary is a gossiped summary that does not decode or is out of
// range; it is skipped and counted.
var ErrBadSLOSummary = errors.New("bad SLO summary")

// Bounds of a plausible summary: a day-long window, an hour-long latency.
const (
	maxSLOWindow  = 86400
	maxSLOLatency = 3600
	maxSLOEngines = 4096
)

func decodeSLOSummary(b []byte) (sloSummary, error) {
	var s sloSummary
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%w: %v", ErrBadSLOSummary, err)
	}
	if s.Version != 1 {
		return s, fmt.Errorf("%w: version %d", ErrBadSLOSummary, s.Version)
	}
	if !(s.WindowSeconds > 0 && s.WindowSeconds <= maxSLOWindow) || len(s.Engines) > maxSLOEngines {
		return s, fmt.Errorf("%w: window %v s, %d engines", ErrBadSLOSummary, s.WindowSeconds, len(s.Engines))
	}
	for _, e := range s.Engines {
		if e.ID == "" || !(e.TTFT >= 0 && e.TTFT <= maxSLOLatency) || !(e.TPOT >= 0 && e.TPOT <= maxSLOLatency) {
			return s, fmt.Errorf("%w: engine %q", ErrBadSLOSummary, e.ID)
		}
	}
	return s, nil
}

// roleLatency is one role's merged latency view.
type roleLatency struct {
	ttft, tpot         float64 // count-weighted p90, seconds
	ttftN, tpotN       uint64
	promptTokensPerSec float64
}

// sloView is every ingress's summary decoded once per step.
type sloView struct {
	summaries []sloSummary
}

func readSLOView(src SLOSource) sloView {
	var v sloView
	if src == nil {
		return v
	}
	for _, b := range src.AppStates(SLOStateName) {
		s, err := decodeSLOSummary(b)
		if err != nil {
			sloSummaryErrors.Inc()
			continue
		}
		v.summaries = append(v.summaries, s)
	}
	return v
}

// merge combines the summaries over one role's engines.
func (v sloView) merge(engines []string) roleLatency {
	in := make(map[string]bool, len(engines))
	for _, id := range engines {
		in[id] = true
	}
	var r roleLatency
	var ttftSum, tpotSum float64
	for _, s := range v.summaries {
		for _, e := range s.Engines {
			if !in[e.ID] {
				continue
			}
			ttftSum += e.TTFT * float64(e.TTFTN)
			tpotSum += e.TPOT * float64(e.TPOTN)
			r.ttftN += e.TTFTN
			r.tpotN += e.TPOTN
			r.promptTokensPerSec += float64(e.PromptTokens) / s.WindowSeconds
		}
	}
	if r.ttftN > 0 {
		r.ttft = ttftSum / float64(r.ttftN)
	}
	if r.tpotN > 0 {
		r.tpot = tpotSum / float64(r.tpotN)
	}
	return r
}

// observeSLO adds the mesh's latency metrics (ttftP90Seconds,
// tpotP90Seconds) to every role's observation and, with an SLO spec, builds
// the SLO mode's observation: nil (metric targets decide) while no ingress
// gossips a summary, so a missing signal never reads as "no load".
func (c *Controller) observeSLO(ap *v1alpha1.AutoscalingPolicy, targets map[string]roleTarget, engines map[string]gossip.EngineView, obs map[string]autoscale.Observation, pc *policyConds) *autoscale.SLOObservation {
	v := readSLOView(c.cfg.SLO)
	for name, t := range targets {
		l := v.merge(t.engines)
		o, ok := obs[name]
		if !ok {
			continue
		}
		if l.ttftN > 0 {
			o.Metrics[autoscale.TTFTP90] = l.ttft
		}
		if l.tpotN > 0 {
			o.Metrics[autoscale.TPOTP90] = l.tpot
		}
	}
	s := ap.Spec.SLO
	if s == nil {
		// An edit that drops the SLO drops its verdict too.
		meta.RemoveStatusCondition(&pc.st.Conditions, v1alpha1.ConditionSLOAtRisk)
		return nil
	}
	if len(v.summaries) == 0 {
		pc.set(v1alpha1.ConditionSLOAtRisk, metav1.ConditionUnknown, "NoLatencySignal", "no ingress gossips a TTFT/TPOT summary ("+SLOStateName+")")
		return nil
	}
	pre, dec := v.merge(targets[s.PrefillRole].engines), v.merge(targets[s.DecodeRole].engines)
	if s.AggregateBelow > 0 {
		// Requests served whole on decode engines are prefill work too: the
		// ingresses record their prompt tokens and TTFT on the decode engine,
		// and with the prefill role at zero they are all of it.
		pre = v.merge(append(slices.Clip(targets[s.PrefillRole].engines), targets[s.DecodeRole].engines...))
	}
	in := &autoscale.SLOObservation{PromptTokensPerSecond: pre.promptTokensPerSec, MeasuredTTFT: pre.ttft, MeasuredTPOT: dec.tpot}
	if s.PrefillTokensPerSecond <= 0 {
		rate, ok := LearnedPrefillRate(c.cfg.SLO, targets[s.PrefillRole].engines)
		if !ok {
			pc.set(v1alpha1.ConditionSLOAtRisk, metav1.ConditionUnknown, "NoThroughputSignal",
				"no prefillTokensPerSecond and no ingress gossips learned costs ("+learn.StateName+")")
			return nil
		}
		in.PrefillTokensPerReplica = rate
		sloInputs.WithLabelValues(ap.Namespace, ap.Name, "prefill_tokens_per_replica").Set(rate)
	}
	for _, id := range targets[s.DecodeRole].engines {
		if e, ok := engines[id]; ok {
			in.RunningStreams += float64(e.Running)
		}
	}
	for k, x := range map[string]float64{"ttft_p90_seconds": in.MeasuredTTFT, "tpot_p90_seconds": in.MeasuredTPOT,
		"prompt_tokens_per_second": in.PromptTokensPerSecond, "running_streams": in.RunningStreams} {
		sloInputs.WithLabelValues(ap.Namespace, ap.Name, k).Set(x)
	}
	return in
}

// LearnedPrefillRate is the prefill throughput the ingresses have learned
// for the prefill role's engines: one line fitted on all their samples
// (learn.RatesOver; the pooled estimate when none has any), from every
// ingress's own sums (gossip learn.StateName, ingress/learn_gossip.go) and
// the ingress's default prior. ok is false while no ingress shares any.
// The local backend reads its gossip with it too.
func LearnedPrefillRate(src SLOSource, engines []string) (float64, bool) {
	if src == nil {
		return 0, false
	}
	lr, bad := learn.FromShares(src.AppStates(learn.StateName))
	learnShareErrors.Add(float64(bad))
	if lr.Peers() == 0 {
		return 0, false
	}
	return lr.RatesOver(engines).PrefillRate, true
}

// sloCondition reports the SLO mode's verdict after a step. When the load
// fits aggregateBelow it says so, and says "aggregated on decode" only
// while the prefill role's decision is zero: its min, the stable window or
// the cool-down may hold it up while the sizing gives 0.
func sloCondition(pc *policyConds, slo *v1alpha1.SLOTarget, in *autoscale.SLOObservation, step autoscale.Result) {
	res := step.SLO
	if slo == nil || in == nil || res == nil {
		return
	}
	msg := fmt.Sprintf("TTFT p90 %.0f ms (target %d), TPOT p90 %.1f ms (target %d), %.0f prompt tokens/s, %.0f running streams",
		in.MeasuredTTFT*1000, slo.TTFTMilliseconds, in.MeasuredTPOT*1000, slo.TPOTMilliseconds, in.PromptTokensPerSecond, in.RunningStreams)
	if res.Aggregated {
		if d, ok := step.Roles[slo.PrefillRole]; ok && d.Desired > 0 {
			msg += fmt.Sprintf("; the load fits aggregateBelow and the SLO sizes prefill 0, but the role is held at %d (its min, stable window or cool-down; see its reason)", d.Desired)
		} else {
			msg += "; the load fits aggregateBelow: aggregated on decode, prefill sized 0"
		}
	}
	if res.AtRisk {
		pc.set(v1alpha1.ConditionSLOAtRisk, metav1.ConditionTrue, "LatencyAboveTarget", msg)
		return
	}
	pc.set(v1alpha1.ConditionSLOAtRisk, metav1.ConditionFalse, "WithinTarget", msg)
}
