package des

import (
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
)

// EngineLoad is one ready engine's load as the router's snapshot holds
// it (vLLM's /metrics as a Prometheus-scraping autoscaler reads them).
// QueuedPrefillTokens stays 0 while pdSim's snapshot follows vLLM, which
// exports no such metric.
type EngineLoad struct {
	Waiting, Running    int
	KVUsage             float64
	QueuedPrefillTokens int
}

// RoleSignals is one role's state: engines requested (starting + ready,
// not draining), ready, and the ready engines' loads.
type RoleSignals struct {
	Replicas, Ready int
	Loads           []EngineLoad
}

// Signals is everything an autoscaler sees at a sync: the roles' gossip
// and what the ingress observed over the last Window. Nothing about the
// future load, the engines' timing model or requests' output lengths.
type Signals struct {
	Prefill, Decode RoleSignals
	Window          time.Duration
	// Arrivals over the window: requests/s, prompt tokens/s, and the
	// prompts' mean and p90 length.
	ArrivalRate, PromptTokensPerSecond float64
	MeanPrompt, P90Prompt              float64
	// CachedFraction is prompt tokens served from a prefix cache over
	// prompt tokens, for requests finished in the window (usage's
	// cached_tokens as the ingress reads it).
	CachedFraction float64
	// TTFTP90 and TPOTP90 of requests finished in the window (0: none).
	TTFTP90, TPOTP90 float64
	Finished         int
	// PrefillTokensPerReplica is the router's learned prefill rate fitted
	// on the ready prefill engines' samples (learn.RatesOver; what the
	// controller fits from the ingresses' gossip; 0 without a learner or a
	// ready prefill engine).
	PrefillTokensPerReplica float64
}

// bucket is what the ingress saw between two collections.
type bucket struct {
	at             time.Duration
	arrivals       int
	prompts        []float64
	ttft, tpot     []float64
	good, finished int
	cached, prompt int
}

// ingressWindow turns the run's per-request records into what an ingress
// observes: arrivals by time, and finished requests' latencies.
type ingressWindow struct {
	reqs       []workload.Request
	arr, done  int
	cached     int
	prompt     int
	window     time.Duration
	ttft, tpot float64 // SLOs, seconds
	buckets    []bucket
}

func (w *ingressWindow) init(cfg *ScaleConfig, reqs []workload.Request) {
	w.reqs, w.window = reqs, cfg.Window
	w.ttft, w.tpot = cfg.SLOTTFT.Seconds(), cfg.SLOTPOT.Seconds()
}

// collect closes a bucket at now and hands it to the report.
func (w *ingressWindow) collect(s *scaleSim, now time.Duration) {
	b := bucket{at: now}
	for ; w.arr < len(w.reqs) && w.reqs[w.arr].Arrival <= now; w.arr++ {
		b.arrivals++
		b.prompts = append(b.prompts, float64(w.reqs[w.arr].PromptTokens))
	}
	for _, g := range s.out.goodCandidates[w.done:] {
		b.finished++
		b.ttft = append(b.ttft, g[0])
		if g[1] > 0 {
			b.tpot = append(b.tpot, g[1])
		}
		if meetsSLO(g, w.ttft, w.tpot) {
			b.good++
		}
	}
	w.done = len(s.out.goodCandidates)
	b.cached, b.prompt = s.out.cached-w.cached, s.out.prompt-w.prompt
	w.cached, w.prompt = s.out.cached, s.out.prompt
	w.buckets = append(w.buckets, b)
	cut := 0
	for cut < len(w.buckets) && w.buckets[cut].at <= now-w.window {
		cut++
	}
	w.buckets = w.buckets[cut:]
	s.rep.absorb(&b)
}

func (s *scaleSim) signals(now time.Duration) Signals {
	sig := Signals{Window: s.sc.Window}
	sig.Prefill = s.roleSignals(scheduler.RolePrefill)
	sig.Decode = s.roleSignals(scheduler.RoleDecode)
	var prompts, ttft, tpot []float64
	cached, prompt := 0, 0
	for i := range s.obs.buckets {
		b := &s.obs.buckets[i]
		prompts = append(prompts, b.prompts...)
		ttft = append(ttft, b.ttft...)
		tpot = append(tpot, b.tpot...)
		cached += b.cached
		prompt += b.prompt
	}
	span := min(s.sc.Window, now).Seconds()
	if span > 0 {
		sig.ArrivalRate = float64(len(prompts)) / span
		for _, p := range prompts {
			sig.PromptTokensPerSecond += p / span
		}
	}
	if len(prompts) > 0 {
		slices.Sort(prompts)
		sig.MeanPrompt, sig.P90Prompt = mean(prompts), report.Quantile(prompts, 0.9)
	}
	if prompt > 0 {
		sig.CachedFraction = float64(cached) / float64(prompt)
	}
	sig.Finished = len(ttft)
	if len(ttft) > 0 {
		slices.Sort(ttft)
		sig.TTFTP90 = report.Quantile(ttft, 0.9)
	}
	if len(tpot) > 0 {
		slices.Sort(tpot)
		sig.TPOTP90 = report.Quantile(tpot, 0.9)
	}
	if s.learner != nil {
		var ids []string
		for _, in := range s.insts {
			if in.state == stReady && s.view[in.slot].Role == scheduler.RolePrefill {
				ids = append(ids, s.view[in.slot].ID)
			}
		}
		if len(ids) > 0 {
			sig.PrefillTokensPerReplica = s.learner.RatesOver(ids).PrefillRate
		}
	}
	return sig
}

func (s *scaleSim) roleSignals(role scheduler.Role) RoleSignals {
	var r RoleSignals
	r.Replicas, r.Ready = s.replicas(role)
	for i := range s.insts {
		in := &s.insts[i]
		if in.role != role || in.state != stReady {
			continue
		}
		v := &s.view[in.slot]
		r.Loads = append(r.Loads, EngineLoad{Waiting: v.Waiting, Running: v.Running, KVUsage: v.KVUsage, QueuedPrefillTokens: v.QueuedPrefillTokens})
	}
	return r
}
