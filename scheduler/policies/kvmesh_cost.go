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
	// batching), ExternalityWeight included.
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
	// onto one engine).
	n := float64(max(c.Running, c.InFlight-c.Waiting))
	active := float64(c.LocalActiveTokens)
	if active == 0 {
		active = n * ctx // the caller does not track tokens: assume requests like this one
	}
	tpot := base + perTok*(active+ctx)
	behind := min(float64(max(c.Waiting, c.InFlight-c.Running)), n)
	return Terms{
		Queue:   queued / rate,
		Prefill: uncached / rate,
		Stall:   p.ExternalityWeight * n * uncached / rate,
		Behind:  (p.WaitingWeight*behind + p.MissPenalty) * uncached / rate,
		Decode:  decodeOwn * tpot,
		Crowd:   p.ExternalityWeight * n * decodeExt,
		TPOT:    tpot,
	}
}
