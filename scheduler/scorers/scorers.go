// Package scorers holds kvmesh's scheduler scorers. Each writes one score
// per candidate in [0,1] (1 best); the framework clamps and weights. They
// are stateless values, safe for concurrent use, allocation-free. The
// package must not touch the index (the framework has already attached each
// candidate's Match and Hit), the network or the policies.
package scorers

import (
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
)

var (
	_ scheduler.Scorer = Prefix{}
	_ scheduler.Scorer = Load{}
	_ scheduler.Scorer = Queue{}
	_ scheduler.Scorer = KVUsage{}
	_ scheduler.Scorer = Latency{}
	_ scheduler.Scorer = LoRA{}
	_ scheduler.Scorer = Session{}
)

// Prefix scores the tier-weighted matched fraction of the prompt (Hit).
type Prefix struct{}

// Name implements scheduler.Scorer.
func (Prefix) Name() string { return "prefix" }

// Score implements scheduler.Scorer.
func (Prefix) Score(_ *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		out[i] = cs[i].Hit
	}
}

// Load scores outstanding work: in-flight requests from every ingress
// (gossip) and the engine's running and waiting counts (snapshot), min-max
// normalised so the least loaded engine scores 1 and the most loaded 0.
// The two views count the same requests, so they are not added: the larger
// of in-flight and running+waiting is the outstanding count (in-flight is
// fresher; the snapshot also sees requests other routers sent), and waiting
// is added once more because a queued request costs a newcomer its whole
// prefill and a running one only a share of each step.
type Load struct{}

// Name implements scheduler.Scorer.
func (Load) Name() string { return "load" }

// Score implements scheduler.Scorer.
func (Load) Score(_ *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		out[i] = float64(max(cs[i].InFlight, cs[i].Running+cs[i].Waiting) + cs[i].Waiting)
	}
	invMinMax(out)
}

// Queue scores the engine's waiting queue (snapshot), min-max normalised
// (llm-d's queue-scorer).
type Queue struct{}

// Name implements scheduler.Scorer.
func (Queue) Name() string { return "queue" }

// Score implements scheduler.Scorer.
func (Queue) Score(_ *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		out[i] = float64(cs[i].Waiting)
	}
	invMinMax(out)
}

// invMinMax maps values to (max-v)/(max-min); all 1 when max == min.
func invMinMax(v []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	for i, x := range v {
		if hi == lo {
			v[i] = 1
		} else {
			v[i] = (hi - x) / (hi - lo)
		}
	}
}

// KVUsage scores free KV cache: 1 - usage (snapshot).
type KVUsage struct{}

// Name implements scheduler.Scorer.
func (KVUsage) Name() string { return "kv-usage" }

// Score implements scheduler.Scorer.
func (KVUsage) Score(_ *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		out[i] = 1 - cs[i].KVUsage
	}
}

// Latency scores observed TTFT and TPOT: the fastest engine 1, others by
// ratio. Engines with no samples yet score as well as the best (a new
// engine must get traffic to be measured).
// A request waits its TTFT plus ~OutputTokens TPOTs, so that is the sum
// compared.
type Latency struct{}

// Name implements scheduler.Scorer.
func (Latency) Name() string { return "latency" }

// Score implements scheduler.Scorer.
func (Latency) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	outTok := float64(max(r.OutputTokens, 1))
	best := math.Inf(1)
	for i := range cs {
		out[i] = -1
		if cs[i].TTFT == 0 && cs[i].TPOT == 0 {
			continue
		}
		out[i] = secs(cs[i].TTFT) + outTok*secs(cs[i].TPOT)
		best = min(best, out[i])
	}
	for i, v := range out {
		switch {
		case v < 0 || v <= best:
			out[i] = 1
		default:
			out[i] = best / v
		}
	}
}

func secs(d time.Duration) float64 { return d.Seconds() }

// LoRA scores 1 for engines with the request's adapter loaded (or a
// base-model request), 0 otherwise.
type LoRA struct{}

// Name implements scheduler.Scorer.
func (LoRA) Name() string { return "lora-affinity" }

// Score implements scheduler.Scorer.
func (LoRA) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		if r.LoRA == "" || slices.Contains(cs[i].LoRAs, r.LoRA) {
			out[i] = 1
		} else {
			out[i] = 0
		}
	}
}

// Session scores 1 for the engine the session's previous turn went to.
type Session struct{}

// Name implements scheduler.Scorer.
func (Session) Name() string { return "session-affinity" }

// Score implements scheduler.Scorer.
func (Session) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	for i := range cs {
		if r.SessionEngine != "" && cs[i].ID == r.SessionEngine {
			out[i] = 1
		} else {
			out[i] = 0
		}
	}
}
