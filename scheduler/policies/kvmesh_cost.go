package policies

import "github.com/kvmesh/kvmesh/scheduler"

// Terms are the parts of KVMesh's cost of serving a request on one engine,
// in seconds (see KVMesh for the model). They are exported so the P/D step
// (scheduler/pd) prices a decode engine, a prefill engine and a pair with
// the same numbers the aggregated policy uses.
type Terms struct {
	// Queue is the engine's prefill work ahead of the request.
	Queue float64
	// Prefill is the request's own uncached prefill time.
	Prefill float64
	// Stall is what the request's prefill costs the engine's running
	// streams: each of n running requests waits Prefill (continuous
	// batching), ExternalityWeight and StallWeight included.
	Stall float64
	// Behind is the delay the prefill imposes on requests queued behind it
	// plus the cache-pollution price (WaitingWeight, MissPenalty).
	Behind float64
	// Decode is the request's own decode time (DecodeWeight · output · TPOT).
	Decode float64
	// Crowd is what the request's context adds to the running streams'
	// decode steps (ExternalityWeight included).
	Crowd float64
	// TPOT is the engine's estimated time per output token with the
	// request added.
	TPOT float64
}

// Total is the aggregated cost: the request prefilled and decoded on the
// engine (what Pick minimises).
func (t Terms) Total(stepBase float64) float64 {
	return t.Queue + t.Prefill + stepBase + t.Decode + t.Stall + t.Crowd + t.Behind
}

// Cost is the request's total cost on c (lower is better): Terms(...).Total.
func (p KVMesh) Cost(r *scheduler.Request, c *scheduler.Candidate) float64 {
	_, base, _ := p.Rates(c.ID)
	return p.Terms(r, c, max(0, r.PromptTokens-c.CachedTokens)).Total(base)
}

// Rates returns engine id's prefill rate, step base and decode cost per
// context token: learned per engine when Costs is set (scheduler/learn),
// else the configured ones.
func (p KVMesh) Rates(id string) (prefillRate, stepBase, decodeSecPerToken float64) {
	if p.Costs != nil {
		e := p.Costs.Rates(id)
		return e.PrefillRate, e.StepBase, e.DecodeSecPerToken
	}
	return p.PrefillRate, p.StepBase, p.DecodeSecPerToken
}

// Output is the output length the model assumes for r.
func (p KVMesh) Output(r *scheduler.Request) int {
	if r.OutputTokens > 0 {
		return r.OutputTokens
	}
	return p.DefaultOutputTokens
}

// Terms prices r on c when uncachedTokens of its prompt must be computed
// there.
func (p KVMesh) Terms(r *scheduler.Request, c *scheduler.Candidate, uncachedTokens int) Terms {
	rate, base, perTok := p.Rates(c.ID)
	out := p.Output(r)
	ctx := float64(r.PromptTokens + out/2)
	decodeOwn := p.DecodeWeight * float64(out)
	decodeExt := p.DecodeWeight * float64(out) * perTok * ctx
	uncached := float64(uncachedTokens)
	queued := float64(max(c.QueuedPrefillTokens, c.LocalPrefillTokens))
	// Only requests already running feel this one's prefill and decode;
	// those waiting have not started (and under overload waiting dwarfs
	// running, which would make every miss look prohibitive and pile hits
	// onto one engine). The requests routed there since the snapshot are
	// waiting, not running: no report has shown the engine scheduling them,
	// and Queued already counts them. Counted as running too (in-flight
	// minus the snapshot's waiting), each was priced twice, once as a
	// stream this prefill stalls and once as a request queued behind it,
	// and within one snapshot each added 2.2 prefill times per uncached
	// token (StallWeight + WaitingWeight): a burst of short prompts was
	// sorted by size, not spread by work (docs/BENCHMARKS.md, "A burst of tiny prompts (stop 68)").
	n := float64(c.Running)
	active := float64(c.LocalActiveTokens)
	if active == 0 {
		active = n * ctx // the caller does not track tokens: assume requests like this one
	}
	tpot := base + perTok*(active+ctx)
	behind := min(float64(c.Queued()), n)
	return Terms{
		Queue:   queued / rate,
		Prefill: uncached / rate,
		Stall:   p.StallWeight * p.ExternalityWeight * n * uncached / rate,
		Behind:  (p.WaitingWeight*behind + p.MissPenalty) * uncached / rate,
		Decode:  decodeOwn * tpot,
		Crowd:   p.ExternalityWeight * n * decodeExt,
		TPOT:    tpot,
	}
}

// overBound is added to the cost of an engine past the balance bound: more
// than any cost within it (seconds; a day), so such an engine is chosen
// only when every engine is past it — impossible for the request count
// and for the queue (the least-loaded engine is at most the mean) unless
// the request's own prefill is what pushes it over everywhere.
const overBound = 86400

// cluster is what the balance bound and the saturation switch compare
// one engine against: the candidates' mean outstanding requests and queued
// prefill seconds, this request's smallest prefill anywhere, and whether
// every engine is saturated.
type cluster struct {
	meanReqs, meanWork float64
	minPrefill         float64
	saturated          bool
}

// outstanding is an engine's load as a router sees it: requests it has
// outstanding (this router's fresh in-flight count, or the snapshot's
// running + waiting when that is larger: other ingresses' requests) and
// its queued prefill in seconds (this router's own not-yet-first-token
// uncached tokens, or the engine's reported queue when exported).
func (p KVMesh) outstanding(c *scheduler.Candidate) (reqs, work float64) {
	rate, _, _ := p.Rates(c.ID)
	return float64(max(c.InFlight, c.Running+c.Waiting)), float64(max(c.QueuedPrefillTokens, c.LocalPrefillTokens)) / rate
}

func (p KVMesh) clusterLoad(r *scheduler.Request, cs []scheduler.Candidate) cluster {
	cl := cluster{saturated: p.SaturationQueue > 0 && len(cs) > 1, minPrefill: -1}
	for i := range cs {
		n, w := p.outstanding(&cs[i])
		cl.meanReqs += n
		cl.meanWork += w
		if w < p.SaturationQueue {
			cl.saturated = false
		}
		rate, _, _ := p.Rates(cs[i].ID)
		pf := float64(max(0, r.PromptTokens-cs[i].CachedTokens)) / rate
		if cl.minPrefill < 0 || pf < cl.minPrefill {
			cl.minPrefill = pf
		}
	}
	if len(cs) > 0 {
		cl.meanReqs /= float64(len(cs))
		cl.meanWork /= float64(len(cs))
	}
	return cl
}

// boundedCost is Cost with the balance bound and, when the cluster is
// saturated, least work in place of the per-request terms.
func (p KVMesh) boundedCost(r *scheduler.Request, c *scheduler.Candidate, cl *cluster) float64 {
	_, base, _ := p.Rates(c.ID)
	t := p.Terms(r, c, max(0, r.PromptTokens-c.CachedTokens))
	cost := t.Total(base)
	if cl.saturated {
		cost = t.Queue + (1+p.MissPenalty)*t.Prefill + base
	}
	if p.BalanceBound > 0 {
		n, w := p.outstanding(c)
		k := 1 + p.BalanceBound
		if n+1 > k*cl.meanReqs+p.BalanceRequests || w+t.Prefill > k*cl.meanWork+p.BalanceSeconds+cl.minPrefill {
			cost += overBound + w + t.Prefill // past the bound: only if all are, then least work
		}
	}
	return cost
}
